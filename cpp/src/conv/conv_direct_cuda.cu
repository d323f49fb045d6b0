// CUDA direct backend of the convolution family: the per-element computations of
// problem.hpp that the CPU backend runs, one thread per written element for the forward (one
// output element) and the data gradient (one input element: a gather, one writer per element),
// one block per written element for the weight and bias gradients (each thread sums a fixed,
// strided share of the element's terms; a shared-memory tree then adds the shares in a fixed
// order: no atomics, bitwise deterministic run to run).
//
// Threads walk the written activation in its memory order (channels fastest when they are its
// densest axis) so that a warp's stores are coalesced.
//
// Instantiations: dtype x {forward, data, weight, bias}: 12 kernels. Layout, rank, groups,
// kernel size, stride and dilation are run-time values.
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

// An element (n, c, pos) of a (batch, channels, *size) grid from its linear index in memory
// order: (n, c, d, h, w), or (n, d, h, w, c) when channels_last.
struct Decoded {
  i64 n, c;
  i64 pos[kAxes];
};

__device__ __forceinline__ Decoded decode(i64 t, i64 channels, const i64 (&size)[kAxes], bool channels_last) {
  Decoded e;
  if (channels_last) {
    e.c = t % channels;
    t /= channels;
  }
  for (int a = kAxes - 1; a >= 0; --a) {
    e.pos[a] = t % size[a];
    t /= size[a];
  }
  if (!channels_last) {
    e.c = t % channels;
    t /= channels;
  }
  e.n = t;
  return e;
}

template <class T>
struct Loader {
  const T* data;
  __device__ __forceinline__ float operator()(i64 offset) const { return core::to_float(data[offset]); }
};

template <class T>
__global__ void __launch_bounds__(kThreads) conv_forward_kernel(Problem p, bool channels_last, const T* x,
                                                                 const T* w, const T* bias, T* y, i64 total) {
  const Loader<T> load_x{x}, load_w{w};
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Decoded e = decode(t, p.g.out_channels, p.g.out, channels_last);
    float v = forward_element(p, e.n, e.c, e.pos, load_x, load_w);
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
    float acc = 0.0f;
    for (i64 l = threadIdx.x; l < terms.count; l += kThreads) acc += weight_term(p, terms, l, load_dy, load_x);
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
    float acc = 0.0f;
    for (i64 l = threadIdx.x; l < count; l += kThreads) acc += bias_term(p, co, l, load_dy);
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

void forward_cuda(const Problem& p, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                  Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const i64 total = p.outputs();
    conv_forward_kernel<T><<<grid_for_threads(total), kThreads, 0, s>>>(
        p, channels_densest(p.y, p.g.out_channels), x.ptr<T>(), w.ptr<T>(), bias ? bias->ptr<T>() : nullptr,
        y.ptr<T>(), total);
    RUDNN_CUDA_CHECK_LAUNCH("conv_forward_kernel");
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
