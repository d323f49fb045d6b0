// CUDA backend of the pooling family. Memory-bound and simple: one thread per output element
// (forward) and one per input element (backward, a gather: one writer per element, no
// atomics), each running the window computation of problem.hpp that the CPU backend runs.
//
// Threads walk the written tensor in its memory order (channels fastest when they are its
// densest axis), so that a warp's stores are coalesced, and for channels-last tensors its loads
// too. Channels-last tensors whose channel count and strides allow it take the vector path:
// each thread owns L = 16 bytes / sizeof(T) adjacent channels, read and written with 16-byte
// accesses, and computes the window bounds once for all of them.
//
// Instantiations: dtype x {max, average} x {scalar, vector}, forward and backward; spatial rank,
// kernel size and adaptive vs fixed windows are run-time values.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/convert.cuh"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "pooling/lanes.cuh"
#include "pooling/problem.hpp"

namespace rudnn::pooling {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // grid-stride loops over a grid of 8 blocks (2048 threads) per SM

template <class T, int L>
inline constexpr int kPackAlign = int(alignof(Pack<T, L>));

// q = n / d and r = n % d for n >= 0, the divisions of the element decode. 64-bit division is a
// subroutine call on the GPU and the decode would be much of a small window's work, so while n
// and d are below 2^31 the quotient is a multiply-high and a shift by a multiplier the host
// computes once: m = ceil(2^p / d) with p = 31 + ceil(log2 d), exact for every such n.
struct FastDivmod {
  i64 d = 1;
  std::uint32_t multiplier = 0;
  int shift = 0;      // p - 32
  bool fast = false;  // 2 <= d < 2^31

  RUDNN_HD i64 divmod(i64 n, i64& r) const {
    i64 q;
    if (d == 1) q = n;
    else if (fast && n < (i64(1) << 31))
      q = i64(std::uint32_t((std::uint64_t(std::uint32_t(n)) * multiplier) >> 32) >> shift);
    else q = n / d;
    r = n - q * d;
    return q;
  }
};

inline FastDivmod make_divmod(i64 d) {
  FastDivmod f;
  f.d = d;
  if (d < 2 || d >= (i64(1) << 31)) return f;
  int log2_ceil = 0;
  while ((i64(1) << log2_ceil) < d) ++log2_ceil;
  const int p = 31 + log2_ceil;
  f.multiplier = std::uint32_t(((std::uint64_t(1) << p) + std::uint64_t(d) - 1) / std::uint64_t(d));
  f.shift = p - 32;
  f.fast = true;
  return f;
}

// How a thread's linear index t maps to an element of a (batch, groups of L channels, *size)
// grid walked in memory order (channel groups fastest when channels_last).
struct GridDecoder {
  FastDivmod groups, size[kAxes];
  int lanes = 1;
  bool channels_last = false;
};

inline GridDecoder make_decoder(i64 channels, int lanes, const i64 (&size)[kAxes], bool channels_last) {
  GridDecoder dec;
  dec.groups = make_divmod(channels / lanes);
  for (int a = 0; a < kAxes; ++a) dec.size[a] = make_divmod(size[a]);
  dec.lanes = lanes;
  dec.channels_last = channels_last;
  return dec;
}

struct Element {
  i64 n, c;
  i64 pos[kAxes];
};

__device__ __forceinline__ Element element_at(i64 t, const GridDecoder& dec) {
  Element e;
  i64 r;
  if (dec.channels_last) {
    t = dec.groups.divmod(t, r);
    e.c = r * dec.lanes;
  }
  t = dec.size[2].divmod(t, e.pos[2]);
  t = dec.size[1].divmod(t, e.pos[1]);
  t = dec.size[0].divmod(t, e.pos[0]);
  if (!dec.channels_last) {
    t = dec.groups.divmod(t, r);
    e.c = r * dec.lanes;
  }
  e.n = t;
  return e;
}

template <class I, int L>
__device__ __forceinline__ IndexLanes<L> load_index_pack(const void* data, i64 offset) {
  const Pack<I, L> pack = *reinterpret_cast<const Pack<I, L>*>(static_cast<const I*>(data) + offset);
  IndexLanes<L> out;
#pragma unroll
  for (int l = 0; l < L; ++l) out.v[l] = i64(pack.v[l]);
  return out;
}

template <class I, int L>
__device__ __forceinline__ void store_index_pack(void* data, i64 offset, const IndexLanes<L>& values) {
  Pack<I, L> pack;
#pragma unroll
  for (int l = 0; l < L; ++l) pack.v[l] = I(values.v[l]);
  *reinterpret_cast<Pack<I, L>*>(static_cast<I*>(data) + offset) = pack;
}

// Indices are int64 or int32 (a uniform run-time branch, not one more instantiation).
template <int L>
__device__ __forceinline__ IndexLanes<L> load_indices(const IndexArray& a, i64 offset) {
  return a.i32 ? load_index_pack<std::int32_t, L>(a.data, offset) : load_index_pack<i64, L>(a.data, offset);
}

template <int L>
__device__ __forceinline__ void store_indices(const IndexArray& a, i64 offset, const IndexLanes<L>& values) {
  if (a.i32) store_index_pack<std::int32_t, L>(a.data, offset, values);
  else store_index_pack<i64, L>(a.data, offset, values);
}

// One thread per output element (L channels of it); indices may be null.
template <class T, bool Max, int L>
__global__ void __launch_bounds__(kThreads)
    pool_forward_kernel(const ForwardProblem p, const GridDecoder dec, const T* __restrict__ x,
                        T* __restrict__ y, const IndexArray indices, i64 total) {
  const Geometry& g = p.g;
  const auto load = [x](i64 offset) { return load_lanes<T, L>(x, offset); };
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Element e = element_at(t, dec);
    const AxisSpan s[kAxes] = {axis_span(g, 0, e.pos[0]), axis_span(g, 1, e.pos[1]), axis_span(g, 2, e.pos[2])};
    IndexLanes<L> best_at;
    const Lanes<L> result = pool_window<Max, L>(g, p.x, e.n, e.c, s, load, best_at);
    store_lanes<T, L>(y, p.y.offset(e.n, e.c, e.pos), result);
    if (Max && p.has_indices) store_indices<L>(indices, p.indices.offset(e.n, e.c, e.pos), best_at);
  }
}

// One thread per input element (L channels of it): the gather of the windows that cover it.
template <class T, bool Max, int L>
__global__ void __launch_bounds__(kThreads)
    pool_backward_kernel(const BackwardProblem p, const GridDecoder dec, const T* __restrict__ dy,
                         const IndexArray indices, T* __restrict__ dx, i64 total) {
  const Geometry& g = p.g;
  const auto load_dy = [dy](i64 offset) { return load_lanes<T, L>(dy, offset); };
  const auto load_index = [indices](i64 offset) { return load_indices<L>(indices, offset); };
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Element e = element_at(t, dec);
    const Lanes<L> grad = gather_window_grads<Max, L>(g, p.dy, p.indices, e.n, e.c, e.pos, load_dy, load_index);
    store_lanes<T, L>(dx, p.dx.offset(e.n, e.c, e.pos), grad);
  }
}

// Whether a tensor's channel groups of L can be read as packs: dense channels, every other
// stride a multiple of L, the data aligned to the pack.
template <class T, int L>
bool packable(const void* data, const Strides& s) {
  if (data == nullptr) return true;
  if (reinterpret_cast<std::uintptr_t>(data) % kPackAlign<T, L> != 0) return false;
  return s.c == 1 && s.n % L == 0 && s.sp[0] % L == 0 && s.sp[1] % L == 0 && s.sp[2] % L == 0;
}

template <int L>
bool indices_packable(const IndexArray& a, const Strides& s) {
  return a.i32 ? packable<std::int32_t, L>(a.data, s) : packable<i64, L>(a.data, s);
}

// The vector path (kVecLanes<T> channels per thread) for channels-last problems whose tensors
// all pack; the scalar path otherwise.
template <class T>
bool forward_vector_path(const ForwardProblem& p, const void* x, const void* y, const IndexArray& indices) {
  constexpr int L = kVecLanes<T>;
  return p.channels_last && p.g.channels % L == 0 && packable<T, L>(x, p.x) && packable<T, L>(y, p.y) &&
         indices_packable<L>(indices, p.indices);
}

template <class T>
bool backward_vector_path(const BackwardProblem& p, const void* dy, const void* dx, const IndexArray& indices) {
  constexpr int L = kVecLanes<T>;
  return p.channels_last && p.g.channels % L == 0 && packable<T, L>(dy, p.dy) && packable<T, L>(dx, p.dx) &&
         indices_packable<L>(indices, p.indices);
}

// The element decode of the forward (outputs) and backward (inputs) kernels.
template <int L>
GridDecoder forward_decoder(const ForwardProblem& p) {
  return make_decoder(p.g.channels, L, p.g.out, p.channels_last);
}

template <int L>
GridDecoder backward_decoder(const BackwardProblem& p) {
  return make_decoder(p.g.channels, L, p.g.in, p.channels_last);
}

// (tests/emulation/pooling_emu.cpp runs everything above this line on the CPU.)
int grid_for(i64 threads) {
  const int sms = core::device_props(core::current_device()).sm_count;
  return int(std::max<i64>(1, std::min<i64>((threads + kThreads - 1) / kThreads, i64(sms) * kBlocksPerSm)));
}

template <class T, bool Max, int L>
void launch_forward(const ForwardProblem& p, const T* x, T* y, const IndexArray& indices, cudaStream_t stream) {
  const i64 total = p.outputs() / L;
  pool_forward_kernel<T, Max, L><<<grid_for(total), kThreads, 0, stream>>>(p, forward_decoder<L>(p), x, y, indices,
                                                                           total);
  RUDNN_CUDA_CHECK_LAUNCH("pool_forward_kernel");
}

template <class T, bool Max, int L>
void launch_backward(const BackwardProblem& p, const T* dy, const IndexArray& indices, T* dx, cudaStream_t stream) {
  const i64 total = p.inputs() / L;
  pool_backward_kernel<T, Max, L><<<grid_for(total), kThreads, 0, stream>>>(p, backward_decoder<L>(p), dy, indices,
                                                                            dx, total);
  RUDNN_CUDA_CHECK_LAUNCH("pool_backward_kernel");
}

template <class T, int L>
void forward_typed(const ForwardProblem& p, const T* x, T* y, const IndexArray& indices, cudaStream_t stream) {
  if (p.g.max) launch_forward<T, true, L>(p, x, y, indices, stream);
  else launch_forward<T, false, L>(p, x, y, indices, stream);
}

template <class T, int L>
void backward_typed(const BackwardProblem& p, const T* dy, const IndexArray& indices, T* dx, cudaStream_t stream) {
  if (p.g.max) launch_backward<T, true, L>(p, dy, indices, dx, stream);
  else launch_backward<T, false, L>(p, dy, indices, dx, stream);
}

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

}  // namespace

void forward_cuda(const ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int L = kVecLanes<T>;
    const IndexArray idx{indices ? indices->data : nullptr, p.indices_i32};
    if (forward_vector_path<T>(p, x.data, y.data, idx)) forward_typed<T, L>(p, x.ptr<T>(), y.ptr<T>(), idx, s);
    else forward_typed<T, 1>(p, x.ptr<T>(), y.ptr<T>(), idx, s);
  });
}

void backward_cuda(const BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx,
                   Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int L = kVecLanes<T>;
    const IndexArray idx{indices ? indices->data : nullptr, p.indices_i32};
    if (backward_vector_path<T>(p, dy.data, dx.data, idx)) backward_typed<T, L>(p, dy.ptr<T>(), idx, dx.ptr<T>(), s);
    else backward_typed<T, 1>(p, dy.ptr<T>(), idx, dx.ptr<T>(), s);
  });
}

}  // namespace rudnn::pooling
