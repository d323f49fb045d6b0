// Host emulator of the grid_sample CUDA kernels (tests/test_grid_sample_emulation.py builds and
// runs it). The kernels' own source (cpp/src/grid_sample/grid_sample_cuda.cu up to its launch
// code, extracted by the test into kernels.inc) runs on the CPU through emu_runtime.hpp, a
// std::thread per CUDA thread, on a small grid so that the grid-stride loops wrap. Each case runs
// the forward (on the path the CUDA backend picks: vector or scalar), the backward per point (dgrid with the atomic dx), the deterministic per-plane dx
// and the store, and compares them with the CPU backend (which tests/test_grid_sample.py checks
// against torch): y, dgrid and the deterministic dx bitwise, the atomic dx within a few ulps of
// its dtype (its additions run in the threads' order). Prints one line per case; exits 1 on a
// mismatch.
#include "emu_runtime.hpp"

#include <atomic>
#include <cmath>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "grid_sample/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "grid_sample/cpu.cpp"
#include "grid_sample/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"
#include "pooling/lanes.cuh"

// namespace rudnn::gs { namespace emu_k { ...the kernels of grid_sample_cuda.cu... } }
#include "kernels.inc"

#include "emu_arrays.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::gs;

constexpr unsigned kEmuBlocks = 3;  // fewer blocks than elements: every thread loops

using emu::Array;
using emu::dims_of;
using emu::make;
using emu::same_bytes;

using emu::value_at;



// Within a few ulps of the dtype relative to max |b|.
bool close(const Tensor& a, const Tensor& b) {
  float scale = 1e-30f;
  for (i64 i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(value_at(b, i)));
  const float tol = (a.dtype == DType::f32 ? 1e-5f : a.dtype == DType::f16 ? 2e-3f : 1.6e-2f) * scale;
  for (i64 i = 0; i < b.numel(); ++i)
    if (!(std::fabs(value_at(a, i) - value_at(b, i)) <= tol)) return false;
  return true;
}

struct Case {
  const char* name;
  DType dtype;
  PoolLayout layout;
  std::vector<i64> x_shape, grid_shape;
  GridSampleMode mode;
  GridSamplePadding padding;
  bool align_corners;
};

template <class F>
void on_dtype(DType dtype, F&& f) {
  core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

bool run_case(const Case& c) {
  const GridSampleOptions o{c.mode, c.padding, c.align_corners, c.layout};
  Array x = make(c.dtype, c.x_shape, 1), grid = make(c.dtype, c.grid_shape, 3, true, 0.7f);  // points in [-1.4, 1.4)
  GridSampleArgs fa{o, x.t, grid.t, Tensor{}};
  const GridSampleShape shape = output_shape(x.t, validate_forward(fa, false), c.layout);
  Array y_cpu = make(c.dtype, dims_of(shape), 0, false), y_emu = make(c.dtype, dims_of(shape), 0, false);
  fa.y = y_cpu.t;
  forward_cpu(validate_forward(fa), x.t, grid.t, y_cpu.t);
  fa.y = y_emu.t;
  const Problem pf = validate_forward(fa);
  bool vector = false;
  on_dtype(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vector = emu_k::vector_path<T>(pf, x.t.data, y_emu.t.data);
    with_taps(pf.mode, [&](auto taps) {
      constexpr int K = decltype(taps)::value;
      auto launch = [&](auto lanes) {
        constexpr int L = decltype(lanes)::value;
        const emu_k::Walk w = emu_k::walk_for(pf, L);
        const i64 total = pf.batch * w.groups * pf.out_plane();
        emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
          emu_k::grid_sample_forward_kernel<T, K, L>(pf, w, x.t.ptr<T>(), grid.t.ptr<T>(), y_emu.t.ptr<T>(), total);
        });
      };
      if (vector) launch(std::integral_constant<int, emu_k::kVecLanes<T>>{});
      else launch(std::integral_constant<int, 1>{});
    });
  });
  const bool y_ok = same_bytes(y_cpu.t, y_emu.t);

  Array dy = make(c.dtype, dims_of(shape), 2);
  Array dx_cpu = make(c.dtype, dims_of(x.t), 0, false), dgrid_cpu = make(c.dtype, dims_of(grid.t), 0, false);
  GridSampleBackwardArgs ba;
  ba.options = o;
  ba.dy = dy.t;
  ba.x = x.t;
  ba.grid = grid.t;
  ba.dx = &dx_cpu.t;
  ba.dgrid = &dgrid_cpu.t;
  backward_cpu(validate_backward(ba), dy.t, x.t, grid.t, &dx_cpu.t, &dgrid_cpu.t);

  bool dgrid_ok = true, atomic_ok = true, det_ok = true;
  for (const bool deterministic : {false, true}) {
    Array dx_emu = make(c.dtype, dims_of(x.t), 0, false), dgrid_emu = make(c.dtype, dims_of(grid.t), 0, false);
    ba.dx = &dx_emu.t;
    ba.dgrid = &dgrid_emu.t;
    const Problem p = validate_backward(ba);
    std::vector<float> ws(std::size_t(p.batch * p.channels * p.in_plane()), 0.0f);
    on_dtype(c.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const i64 points = p.batch * p.out_plane(), planes = p.batch * p.channels, count = i64(ws.size());
      with_taps(p.mode, [&](auto taps) {
        constexpr int K = decltype(taps)::value;
        emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
          emu_k::grid_sample_backward_point_kernel<T, K>(p, dy.t.ptr<T>(), x.t.ptr<T>(), grid.t.ptr<T>(),
                                                         dgrid_emu.t.ptr<T>(), deterministic ? nullptr : ws.data(),
                                                         points);
        });
        if (deterministic)
          emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
            emu_k::grid_sample_dx_plane_kernel<T, K>(p, dy.t.ptr<T>(), grid.t.ptr<T>(), ws.data(), planes);
          });
      });
      emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
        emu_k::grid_sample_dx_store_kernel<T>(p, ws.data(), dx_emu.t.ptr<T>(), count);
      });
    });
    dgrid_ok = dgrid_ok && same_bytes(dgrid_cpu.t, dgrid_emu.t);
    if (deterministic) det_ok = same_bytes(dx_cpu.t, dx_emu.t);
    else atomic_ok = close(dx_emu.t, dx_cpu.t);
  }
  const bool ok = y_ok && dgrid_ok && atomic_ok && det_ok;
  std::printf("%s forward=%s y=%d dgrid=%d dx_atomic=%d dx_deterministic=%d %s\n", c.name,
              vector ? "vector" : "scalar", y_ok, dgrid_ok, atomic_ok, det_ok, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  using M = GridSampleMode;
  using P = GridSamplePadding;
  const auto cf = PoolLayout::channels_first, cl = PoolLayout::channels_last;
  std::vector<Case> cases = {
      {"bilinear2d_zeros_nchw_f32", DType::f32, cf, {2, 3, 5, 7}, {2, 4, 6, 2}, M::bilinear, P::zeros, false},
      {"bilinear2d_border_nhwc_bf16_c5", DType::bf16, cl, {2, 5, 7, 5}, {2, 4, 6, 2}, M::bilinear, P::border, true},
      {"nearest2d_reflection_nchw_f16_c19", DType::f16, cf, {1, 19, 6, 5}, {1, 7, 3, 2}, M::nearest, P::reflection, false},
      {"bicubic2d_reflection_nhwc_f32_c6", DType::f32, cl, {2, 6, 5, 6}, {2, 5, 4, 2}, M::bicubic, P::reflection, true},
      {"bicubic2d_zeros_nchw_bf16", DType::bf16, cf, {1, 2, 7, 6}, {1, 6, 5, 2}, M::bicubic, P::zeros, false},
      {"trilinear3d_reflection_nchw_f32", DType::f32, cf, {2, 3, 4, 5, 3}, {2, 3, 2, 5, 3}, M::bilinear, P::reflection, false},
      {"trilinear3d_zeros_nhwc_f16_c8", DType::f16, cl, {1, 3, 4, 5, 8}, {1, 2, 3, 4, 3}, M::bilinear, P::zeros, true},
      {"nearest3d_border_nhwc_f32_c3", DType::f32, cl, {1, 4, 3, 5, 3}, {1, 3, 2, 4, 3}, M::nearest, P::border, false},
      {"bilinear2d_zeros_nhwc_f32_c8", DType::f32, cl, {2, 5, 7, 8}, {2, 4, 6, 2}, M::bilinear, P::zeros, false},
      {"bicubic2d_border_nhwc_bf16_c16", DType::bf16, cl, {1, 6, 5, 16}, {1, 5, 4, 2}, M::bicubic, P::border, true},
      {"nearest2d_reflection_nhwc_f16_c8", DType::f16, cl, {2, 4, 6, 8}, {2, 3, 5, 2}, M::nearest, P::reflection, true},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
