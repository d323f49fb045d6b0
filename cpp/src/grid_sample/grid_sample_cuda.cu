// CUDA backend of grid_sample, running the tap math of problem.hpp that the CPU backend runs.
//
// forward:   one thread per (n, grid point, group of channels): the taps and weights are computed
//            once per thread for its channels. Threads walk y in memory order: for channels-last x
//            the channel groups fastest, so a warp's loads and stores are adjacent channels; for
//            channels-first x the points fastest (groups of 16 channels), so stores coalesce.
//            Channels-last problems whose channel count and strides allow it take the vector path:
//            each thread owns 16 bytes of adjacent channels (4 f32, 8 f16/bf16), moved as one
//            16-byte access per tap; otherwise groups of 4 channels, one element at a time.
// backward:  one thread per (n, grid point) over all channels in order: dgrid (one writer per point,
//            deterministic) and, by default, dx by float32 atomicAdd into the workspace.
//            deterministic: one thread per (n, c) plane walks the grid points in order and adds
//            into its own plane of the workspace (one writer per element, no atomics; the CPU's
//            order). Then one pass rounds the workspace into dx.
// The workspace is float32, dense, channels innermost (coalesced across the plane owners, which
// are adjacent channels); the store walks dx in its own memory order.
//
// Instantiations: dtype x taps per axis (the mode: 1, 2, 4) x {forward scalar, forward vector,
// backward per point, dx per plane}, and dtype x the dx store; the padding and the rank are run-time values. The tap count
// is a template parameter so that a point's taps stay in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/convert.cuh"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "pooling/lanes.cuh"
#include "grid_sample/problem.hpp"

namespace rudnn::gs {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // grid-stride loops over a grid of 8 blocks (2048 threads) per SM

// The 16-byte channel packs (pooling/lanes.cuh).
using pooling::kVecLanes;
using pooling::load_lanes;
using pooling::Pack;
using pooling::store_lanes;

__device__ __forceinline__ i64 min_c(i64 a, i64 b) { return a < b ? a : b; }

// How the forward's threads split the work: `groups` channel groups of `chunk` per point.
struct Walk {
  i64 groups, chunk;
  bool channels_last;
};

__device__ __forceinline__ void walk_at(i64 t, const Problem& p, const Walk& w, i64& n, i64& g, i64& o) {
  const i64 plane = p.out_plane();
  if (w.channels_last) {
    g = t % w.groups;
    t /= w.groups;
    o = t % plane;
    n = t / plane;
  } else {
    o = t % plane;
    t /= plane;
    g = t % w.groups;
    n = t / w.groups;
  }
}

// One thread per (n, grid point, channel group). L > 1 (the vector path): the group is L adjacent
// channels moved as 16-byte packs; L = 1: up to w.chunk channels one at a time.
template <class T, int K, int L>
__global__ void __launch_bounds__(kThreads)
    grid_sample_forward_kernel(const Problem p, const Walk w, const T* __restrict__ x, const T* __restrict__ grid,
                               T* __restrict__ y, i64 total) {
  const auto load_grid = [grid](i64 off) { return core::to_float(grid[off]); };
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    i64 n, g, o, pos[kAxes];
    walk_at(t, p, w, n, g, o);
    plane_position(p, o, pos);
    const PointTaps<K> taps = point_taps<K>(p, n, pos, false, load_grid);
    if constexpr (L > 1) {
      const i64 c = g * L;
      const auto load_x = [x](i64 off) { return load_lanes<T, L>(x, off); };
      store_lanes<T, L>(y, p.y.offset(n, c, pos), sample<K, L>(p, taps, n, c, load_x));
    } else {
      const auto load_x = [x](i64 off) { return Lanes<1>{{core::to_float(x[off])}}; };
      const i64 end = min_c(p.channels, (g + 1) * w.chunk);
      for (i64 c = g * w.chunk; c < end; ++c)
        y[p.y.offset(n, c, pos)] = core::from_float<T>(sample<K, 1>(p, taps, n, c, load_x).v[0]);
    }
  }
}

// One thread per (n, grid point): dgrid (when given) and the atomic dx (when ws is given).
template <class T, int K>
__global__ void __launch_bounds__(kThreads)
    grid_sample_backward_point_kernel(const Problem p, const T* __restrict__ dy, const T* __restrict__ x,
                                      const T* __restrict__ grid, T* __restrict__ dgrid, float* __restrict__ ws,
                                      i64 total) {
  const auto load_x = [x](i64 off) { return core::to_float(x[off]); };
  const auto load_grid = [grid](i64 off) { return core::to_float(grid[off]); };
  const i64 plane = p.out_plane();
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const i64 n = t / plane;
    i64 pos[kAxes];
    plane_position(p, t % plane, pos);
    const PointTaps<K> taps = point_taps<K>(p, n, pos, dgrid != nullptr, load_grid);
    float g[kAxes] = {0.0f, 0.0f, 0.0f};
    for (i64 c = 0; c < p.channels; ++c) {
      const float d = core::to_float(dy[p.y.offset(n, c, pos)]);
      if (dgrid) grid_grad(p, taps, n, c, d, load_x, g);
      if (ws)
        scatter(taps, d, [&](i64 id, i64 ih, i64 iw, float v) {
          const i64 at[kAxes] = {id, ih, iw};
          atomicAdd(ws + p.ws.offset(n, c, at), v);
        });
    }
    if (dgrid) {
      const i64 base = p.dgrid.offset(n, pos);
      store_grid_grad(p, taps, g, [&](int k, float v) { dgrid[base + k * p.dgrid.k] = core::from_float<T>(v); });
    }
  }
}

// Deterministic dx: one thread per (n, c) plane (c fastest), the grid points in order.
template <class T, int K>
__global__ void __launch_bounds__(kThreads)
    grid_sample_dx_plane_kernel(const Problem p, const T* __restrict__ dy, const T* __restrict__ grid,
                                float* __restrict__ ws, i64 total) {
  const auto load_grid = [grid](i64 off) { return core::to_float(grid[off]); };
  const i64 plane = p.out_plane();
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const i64 c = t % p.channels, n = t / p.channels;
    for (i64 o = 0; o < plane; ++o) {
      i64 pos[kAxes];
      plane_position(p, o, pos);
      const PointTaps<K> taps = point_taps<K>(p, n, pos, false, load_grid);
      const float d = core::to_float(dy[p.y.offset(n, c, pos)]);
      scatter(taps, d, [&](i64 id, i64 ih, i64 iw, float v) {
        const i64 at[kAxes] = {id, ih, iw};
        ws[p.ws.offset(n, c, at)] += v;
      });
    }
  }
}

// dx = the workspace rounded to T, walked in dx's memory order (channels fastest for
// channels-last x, else w fastest).
template <class T>
__global__ void __launch_bounds__(kThreads)
    grid_sample_dx_store_kernel(const Problem p, const float* __restrict__ ws, T* __restrict__ dx, i64 total) {
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    i64 r = t, c = 0, pos[kAxes];
    if (p.channels_last) {
      c = r % p.channels;
      r /= p.channels;
    }
    pos[2] = r % p.in[2];
    r /= p.in[2];
    pos[1] = r % p.in[1];
    r /= p.in[1];
    pos[0] = r % p.in[0];
    r /= p.in[0];
    if (!p.channels_last) {
      c = r % p.channels;
      r /= p.channels;
    }
    dx[p.dx.offset(r, c, pos)] = core::from_float<T>(ws[p.ws.offset(r, c, pos)]);
  }
}

// Whether a tensor's channel groups of L can be read as packs: dense channels, every other
// stride a multiple of L, the data aligned to the pack.
template <class T, int L>
bool packable(const void* data, const Strides& s) {
  if (reinterpret_cast<std::uintptr_t>(data) % alignof(Pack<T, L>) != 0) return false;
  return s.c == 1 && s.n % L == 0 && s.sp[0] % L == 0 && s.sp[1] % L == 0 && s.sp[2] % L == 0;
}

// The forward's vector path: channels-last x and y whose channel count and strides allow packs.
template <class T>
bool vector_path(const Problem& p, const void* x, const void* y) {
  constexpr int L = kVecLanes<T>;
  return p.channels_last && p.channels % L == 0 && packable<T, L>(x, p.x) && packable<T, L>(y, p.y);
}

// The forward's split: groups of `lanes` channels on the vector path, else of 4 channels for
// channels-last x and of 16 otherwise.
Walk walk_for(const Problem& p, int lanes) {
  const i64 chunk = lanes > 1 ? lanes : std::max<i64>(1, std::min<i64>(p.channels, p.channels_last ? 4 : 16));
  return Walk{(p.channels + chunk - 1) / chunk, chunk, p.channels_last};
}

// (tests/emulation/grid_sample_emu.cpp runs everything above this line on the CPU.)
int blocks_for(i64 threads) {
  const int sms = core::device_props(core::current_device()).sm_count;
  return int(std::max<i64>(1, std::min<i64>((threads + kThreads - 1) / kThreads, i64(sms) * kBlocksPerSm)));
}

template <class F>
void dispatch(DType dtype, F&& f) {
  core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

}  // namespace

void forward_cuda(const Problem& p, const Tensor& x, const Tensor& grid, const Tensor& y, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_taps(p.mode, [&](auto taps) {
      constexpr int K = decltype(taps)::value;
      auto launch = [&](auto lanes) {
        constexpr int L = decltype(lanes)::value;
        const Walk w = walk_for(p, L);
        const i64 total = p.batch * w.groups * p.out_plane();
        grid_sample_forward_kernel<T, K, L><<<blocks_for(total), kThreads, 0, s>>>(p, w, x.ptr<T>(), grid.ptr<T>(),
                                                                                   y.ptr<T>(), total);
        RUDNN_CUDA_CHECK_LAUNCH("grid_sample_forward_kernel");
      };
      if (vector_path<T>(p, x.data, y.data)) launch(std::integral_constant<int, kVecLanes<T>>{});
      else launch(std::integral_constant<int, 1>{});
    });
  });
}

void backward_cuda(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& grid, const Tensor* dx,
                   const Tensor* dgrid, const Tensor* workspace, bool deterministic, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  float* ws = dx ? workspace->ptr<float>() : nullptr;
  const i64 ws_count = p.batch * p.channels * p.in_plane();
  if (ws) RUDNN_CUDA_CHECK(cudaMemsetAsync(ws, 0, std::size_t(ws_count) * sizeof(float), s));
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const i64 points = p.batch * p.out_plane();
    T* dgrid_ptr = dgrid ? dgrid->ptr<T>() : nullptr;
    float* atomic_ws = deterministic ? nullptr : ws;
    const i64 planes = p.batch * p.channels;
    with_taps(p.mode, [&](auto taps) {
      constexpr int K = decltype(taps)::value;
      if (points > 0 && (dgrid_ptr || atomic_ws)) {
        grid_sample_backward_point_kernel<T, K><<<blocks_for(points), kThreads, 0, s>>>(
            p, dy.ptr<T>(), x.ptr<T>(), grid.ptr<T>(), dgrid_ptr, atomic_ws, points);
        RUDNN_CUDA_CHECK_LAUNCH("grid_sample_backward_point_kernel");
      }
      if (ws && deterministic && points > 0) {
        grid_sample_dx_plane_kernel<T, K><<<blocks_for(planes), kThreads, 0, s>>>(p, dy.ptr<T>(), grid.ptr<T>(), ws,
                                                                                  planes);
        RUDNN_CUDA_CHECK_LAUNCH("grid_sample_dx_plane_kernel");
      }
    });
    if (!ws) return;
    grid_sample_dx_store_kernel<T><<<blocks_for(ws_count), kThreads, 0, s>>>(p, ws, dx->ptr<T>(), ws_count);
    RUDNN_CUDA_CHECK_LAUNCH("grid_sample_dx_store_kernel");
  });
}

}  // namespace rudnn::gs
