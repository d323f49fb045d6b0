// CUDA direct backend of the convolution family: the per-element computations of
// problem.hpp that the CPU backend runs, one thread per written element for the forward (one
// output element) and the data gradient (one input element: a gather, one writer per element),
// one block per written element for the weight and bias gradients (each thread sums a contiguous
// run of the element's terms, stepping its offsets; a shared-memory tree then adds the runs in a
// fixed order: no atomics, bitwise deterministic run to run).
//
// Threads walk the written activation in its memory order (channels fastest when they are its
// densest axis) so that a warp's stores are coalesced. A forward whose x and w are dense along
// the input channels (NHWC, torch channels_last) with whole 16-byte packs of them per group
// reads both in packs.
//
// Instantiations: dtype x {forward, packed forward, data, weight, bias}: 15 kernels. Layout,
// rank, groups, kernel size, stride and dilation are run-time values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "conv/problem.hpp"
#include "core/convert.cuh"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"

namespace rudnn::conv {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // grid-stride loops over a grid of 8 blocks (2048 threads) per SM

template <class T>
struct Loader {
  const T* data;
  __device__ __forceinline__ float operator()(i64 offset) const { return core::to_float(data[offset]); }
};

// L elements of T read as one 16-byte access.
template <class T, int L>
struct alignas(sizeof(T) * L) Pack {
  T v[L];
};

template <class T>
inline constexpr int kPackLanes = 16 / int(sizeof(T));

// The forward of one output element with the group's input channels read L at a time (16-byte
// loads of x and w, both dense along the input channels): taps outer, channels inner, L partial
// sums added in lane order at the end.
template <class T, int L>
__device__ __forceinline__ float forward_element_packed(const Problem& p, i64 n, i64 co, const i64 (&o)[kAxes],
                                                        const T* x, const T* w) {
  const Geometry& g = p.g;
  i64 lo[kAxes], hi[kAxes];
  for (int a = 0; a < kAxes; ++a) tap_range(g, a, o[a], lo[a], hi[a]);
  // Offsets advance by one tap per step (no position arrays live across the loops).
  i64 x_at[kAxes], w_at[kAxes];
  for (int a = 0; a < kAxes; ++a) {
    x_at[a] = (o[a] * g.stride[a] - g.pad[a] + lo[a] * g.dilation[a]) * p.x.sp[a];
    w_at[a] = lo[a] * p.w.sp[a];
  }
  const T* x_base = x + n * p.x.n + co / g.cout_g * g.cin_g;  // p.x.c == 1
  const T* w_base = w + co * p.w.n;                             // p.w.c == 1
  const i64 packs = g.cin_g / L;
  float acc[L];
  for (int l = 0; l < L; ++l) acc[l] = 0.0f;
  i64 x0 = x_at[0], w0 = w_at[0];
#pragma unroll 1
  for (i64 k0 = lo[0]; k0 < hi[0]; ++k0, x0 += g.dilation[0] * p.x.sp[0], w0 += p.w.sp[0]) {
    i64 x1 = x0 + x_at[1], w1 = w0 + w_at[1];
#pragma unroll 1
    for (i64 k1 = lo[1]; k1 < hi[1]; ++k1, x1 += g.dilation[1] * p.x.sp[1], w1 += p.w.sp[1]) {
      i64 x2 = x1 + x_at[2], w2 = w1 + w_at[2];
#pragma unroll 1
      for (i64 k2 = lo[2]; k2 < hi[2]; ++k2, x2 += g.dilation[2] * p.x.sp[2], w2 += p.w.sp[2]) {
        const Pack<T, L>* xp = reinterpret_cast<const Pack<T, L>*>(x_base + x2);
        const Pack<T, L>* wp = reinterpret_cast<const Pack<T, L>*>(w_base + w2);
#pragma unroll 1
        for (i64 j = 0; j < packs; ++j) {
          const Pack<T, L> xv = xp[j], wv = wp[j];
#pragma unroll
          for (int l = 0; l < L; ++l) acc[l] += core::to_float(xv.v[l]) * core::to_float(wv.v[l]);
        }
      }
    }
  }
  float sum = 0.0f;
  for (int l = 0; l < L; ++l) sum += acc[l];
  return sum;
}

// Whether the forward can read x and w in 16-byte packs of L = 16 / sizeof(T) input channels:
// both dense along the channels, every other stride, the channels per group and both addresses
// multiples of a pack.
template <class T>
bool forward_packed_path(const Problem& p, const void* x, const void* w) {
  constexpr i64 L = kPackLanes<T>;
  const auto whole = [](i64 v) { return v % L == 0; };
  bool ok = p.g.cin_g % L == 0 && p.x.c == 1 && p.w.c == 1 && whole(p.x.n) && whole(p.w.n);
  for (int a = 0; a < kAxes; ++a) ok = ok && whole(p.x.sp[a]) && whole(p.w.sp[a]);
  return ok && reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0;
}

// L = 1: the per-element computation of problem.hpp (any strides); L > 1: the packed one.
template <class T, int L>
__global__ void __launch_bounds__(kThreads) conv_forward_kernel(Problem p, bool channels_last, const T* x,
                                                                 const T* w, const T* bias, T* y, i64 total) {
  const Loader<T> load_x{x}, load_w{w};
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Decoded e = decode(t, p.g.out_channels, p.g.out, channels_last);
    float v;
    if constexpr (L == 1) v = forward_element(p, e.n, e.c, e.pos, load_x, load_w);
    else v = forward_element_packed<T, L>(p, e.n, e.c, e.pos, x, w);
    if (bias) v += core::to_float(bias[e.c * p.bias_stride]);
    y[p.y.offset(e.n, e.c, e.pos)] = core::from_float<T>(v);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) conv_data_backward_kernel(Problem p, bool channels_last, const T* dy,
                                                                       const T* w, T* dx, i64 total) {
  const Loader<T> load_dy{dy}, load_w{w};
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Decoded e = decode(t, p.g.in_channels, p.g.in, channels_last);
    dx[p.x.offset(e.n, e.c, e.pos)] = core::from_float<T>(data_backward_element(p, e.n, e.c, e.pos, load_dy, load_w));
  }
}

// The block's sum of every thread's `v`, in a fixed order (a tree over thread indices); valid
// in thread 0. Ends with a barrier so that `scratch` may be reused.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  const float sum = scratch[0];
  __syncthreads();
  return sum;
}

template <class T>
__global__ void __launch_bounds__(kThreads) conv_weight_backward_kernel(Problem p, const T* dy, const T* x, T* dw) {
  __shared__ float scratch[kThreads];
  const Loader<T> load_dy{dy}, load_x{x};
  for (i64 index = blockIdx.x; index < p.weights(); index += gridDim.x) {
    const WeightTerms terms = weight_terms(p, index);
    // Each thread sums a contiguous run of the terms (stepping, no division per term).
    const i64 run = (terms.count + kThreads - 1) / kThreads, begin = threadIdx.x * run;
    const float acc = weight_terms_sum(p, terms, begin, begin + run < terms.count ? begin + run : terms.count,
                                       load_dy, load_x);
    const float sum = block_sum(acc, scratch);
    if (threadIdx.x == 0) {
      const i64 ci = terms.c - terms.co / p.g.cout_g * p.g.cin_g;
      dw[p.w.offset(terms.co, ci, terms.k)] = core::from_float<T>(sum);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) conv_bias_backward_kernel(Problem p, const T* dy, T* db) {
  __shared__ float scratch[kThreads];
  const Loader<T> load_dy{dy};
  const i64 count = p.g.batch * p.g.out_plane();
  for (i64 co = blockIdx.x; co < p.g.out_channels; co += gridDim.x) {
    const i64 run = (count + kThreads - 1) / kThreads, begin = threadIdx.x * run;
    const float acc = bias_terms_sum(p, co, begin, begin + run < count ? begin + run : count, load_dy);
    const float sum = block_sum(acc, scratch);
    if (threadIdx.x == 0) db[co * p.bias_stride] = core::from_float<T>(sum);
  }
}

// (tests/emulation/conv_emu.cpp runs everything above this line on the CPU.)
int max_blocks() { return core::device_props(core::current_device()).sm_count * kBlocksPerSm; }

int grid_for_threads(i64 threads) {
  return int(std::max<i64>(1, std::min<i64>((threads + kThreads - 1) / kThreads, max_blocks())));
}

int grid_for_blocks(i64 blocks) { return int(std::max<i64>(1, std::min<i64>(blocks, max_blocks()))); }

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

// Channels are the densest axis of an activation (threads then walk them fastest).
bool channels_densest(const Strides& s, i64 channels) { return channels > 1 && s.c == 1; }

}  // namespace

const char* forward_cuda(const Problem& p, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                         Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const i64 total = p.outputs();
    const bool cl = channels_densest(p.y, p.g.out_channels);
    const T* b = bias ? bias->ptr<T>() : nullptr;
    const bool packed = forward_packed_path<T>(p, x.data, w.data);
    if (packed)
      conv_forward_kernel<T, kPackLanes<T>><<<grid_for_threads(total), kThreads, 0, s>>>(p, cl, x.ptr<T>(), w.ptr<T>(),
                                                                                         b, y.ptr<T>(), total);
    else
      conv_forward_kernel<T, 1><<<grid_for_threads(total), kThreads, 0, s>>>(p, cl, x.ptr<T>(), w.ptr<T>(), b,
                                                                              y.ptr<T>(), total);
    RUDNN_CUDA_CHECK_LAUNCH("conv_forward_kernel");
    return packed ? "direct_packed" : "direct";
  });
}

void data_backward_cuda(const Problem& p, const Tensor& dy, const Tensor& w, const Tensor& dx, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const i64 total = p.inputs();
    conv_data_backward_kernel<T><<<grid_for_threads(total), kThreads, 0, s>>>(
        p, channels_densest(p.x, p.g.in_channels), dy.ptr<T>(), w.ptr<T>(), dx.ptr<T>(), total);
    RUDNN_CUDA_CHECK_LAUNCH("conv_data_backward_kernel");
  });
}

void weight_backward_cuda(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& dw, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    conv_weight_backward_kernel<T><<<grid_for_blocks(p.weights()), kThreads, 0, s>>>(p, dy.ptr<T>(), x.ptr<T>(),
                                                                                      dw.ptr<T>());
    RUDNN_CUDA_CHECK_LAUNCH("conv_weight_backward_kernel");
  });
}

void bias_backward_cuda(const Problem& p, const Tensor& dy, const Tensor& db, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    conv_bias_backward_kernel<T><<<grid_for_blocks(p.g.out_channels), kThreads, 0, s>>>(p, dy.ptr<T>(),
                                                                                         db.ptr<T>());
    RUDNN_CUDA_CHECK_LAUNCH("conv_bias_backward_kernel");
  });
}

}  // namespace rudnn::conv
