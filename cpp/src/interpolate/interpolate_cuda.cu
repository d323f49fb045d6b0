// CUDA backend of interpolate. Memory-bound and simple: one thread per output element (forward)
// and one per input element (backward, a gather: one writer per element, no atomics), each
// running the tap math of problem.hpp that the CPU backend runs.
//
// Threads walk the written tensor in its memory order (channels fastest when they are its densest
// axis), so that a warp's stores are coalesced, and for channels-last tensors its loads too.
// Channels-last problems whose channel count and strides allow it take the vector path: each
// thread owns L = 16 bytes / sizeof(T) adjacent channels, moved with 16-byte accesses, and
// computes the taps and weights once for all of them.
//
// Instantiations: dtype x {scalar, vector}, forward and backward; the method and the spatial
// rank are run-time values.
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
#include "interpolate/problem.hpp"

namespace rudnn::interp {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // grid-stride loops over a grid of 8 blocks (2048 threads) per SM

// The 16-byte channel packs (pooling/lanes.cuh).
using pooling::kVecLanes;
using pooling::load_lanes;
using pooling::Pack;
using pooling::store_lanes;

// The sizes of the grid a kernel walks: (batch, channel groups of L, *size), in memory order.
struct Grid {
  i64 groups, size[kAxes];
  int lanes;
  bool channels_last;
};

struct Element {
  i64 n, c;
  i64 pos[kAxes];
};

__device__ __forceinline__ Element element_at(i64 t, const Grid& g) {
  Element e;
  if (g.channels_last) {
    e.c = t % g.groups * g.lanes;
    t /= g.groups;
  }
  for (int a = kAxes - 1; a >= 0; --a) {
    e.pos[a] = t % g.size[a];
    t /= g.size[a];
  }
  if (!g.channels_last) {
    e.c = t % g.groups * g.lanes;
    t /= g.groups;
  }
  e.n = t;
  return e;
}

// One thread per output element (L channels of it).
template <class T, int L>
__global__ void __launch_bounds__(kThreads)
    interpolate_forward_kernel(const Problem p, const Grid grid, const T* __restrict__ x, T* __restrict__ y,
                               i64 total) {
  const auto load = [x](i64 offset) { return load_lanes<T, L>(x, offset); };
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Element e = element_at(t, grid);
    store_lanes<T, L>(y, p.dst.offset(e.n, e.c, e.pos), resample_point<L>(p, e.n, e.c, e.pos, load));
  }
}

// One thread per input element (L channels of it): the gather of the outputs that read it.
template <class T, int L>
__global__ void __launch_bounds__(kThreads)
    interpolate_backward_kernel(const Problem p, const Grid grid, const T* __restrict__ dy, T* __restrict__ dx,
                                i64 total) {
  const auto load = [dy](i64 offset) { return load_lanes<T, L>(dy, offset); };
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Element e = element_at(t, grid);
    store_lanes<T, L>(dx, p.dst.offset(e.n, e.c, e.pos), gather_point<L>(p, e.n, e.c, e.pos, load));
  }
}

// Whether a tensor's channel groups of L can be read as packs: dense channels, every other
// stride a multiple of L, the data aligned to the pack.
template <class T, int L>
bool packable(const void* data, const Strides& s) {
  if (reinterpret_cast<std::uintptr_t>(data) % alignof(Pack<T, L>) != 0) return false;
  return s.c == 1 && s.n % L == 0 && s.sp[0] % L == 0 && s.sp[1] % L == 0 && s.sp[2] % L == 0;
}

template <class T>
bool vector_path(const Problem& p, const void* src, const void* dst) {
  constexpr int L = kVecLanes<T>;
  return p.channels_last && p.channels % L == 0 && packable<T, L>(src, p.src) && packable<T, L>(dst, p.dst);
}

// The grid over outputs (forward) or inputs (backward).
Grid grid_of(const Problem& p, int lanes, bool outputs) {
  Grid g{p.channels / lanes, {}, lanes, p.channels_last};
  for (int a = 0; a < kAxes; ++a) g.size[a] = outputs ? p.ax[a].out : p.ax[a].in;
  return g;
}

// (tests/emulation/interpolate_emu.cpp runs everything above this line on the CPU.)
int grid_for(i64 threads) {
  const int sms = core::device_props(core::current_device()).sm_count;
  return int(std::max<i64>(1, std::min<i64>((threads + kThreads - 1) / kThreads, i64(sms) * kBlocksPerSm)));
}

template <class T, int L>
void launch(const Problem& p, const T* src, T* dst, bool forward, cudaStream_t stream) {
  const Grid grid = grid_of(p, L, forward);
  const i64 total = p.batch * grid.groups * grid.size[0] * grid.size[1] * grid.size[2];
  if (forward) {
    interpolate_forward_kernel<T, L><<<grid_for(total), kThreads, 0, stream>>>(p, grid, src, dst, total);
    RUDNN_CUDA_CHECK_LAUNCH("interpolate_forward_kernel");
  } else {
    interpolate_backward_kernel<T, L><<<grid_for(total), kThreads, 0, stream>>>(p, grid, src, dst, total);
    RUDNN_CUDA_CHECK_LAUNCH("interpolate_backward_kernel");
  }
}

void run(const Problem& p, const Tensor& src, const Tensor& dst, bool forward, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  core::dispatch_float<__half, __nv_bfloat16>(dst.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vector_path<T>(p, src.data, dst.data)) launch<T, kVecLanes<T>>(p, src.ptr<T>(), dst.ptr<T>(), forward, s);
    else launch<T, 1>(p, src.ptr<T>(), dst.ptr<T>(), forward, s);
  });
}

}  // namespace

void forward_cuda(const Problem& p, const Tensor& x, const Tensor& y, Stream stream) { run(p, x, y, true, stream); }

void backward_cuda(const Problem& p, const Tensor& dy, const Tensor& dx, Stream stream) {
  run(p, dy, dx, false, stream);
}

}  // namespace rudnn::interp
