// Host emulator of the interpolate CUDA kernels (tests/test_interpolate_emulation.py builds and runs
// it). The kernels' own source (cpp/src/interpolate/interpolate_cuda.cu up to its launch code,
// extracted by the test into kernels.inc) runs on the CPU through emu_runtime.hpp, a std::thread
// per CUDA thread, on a small grid so that the grid-stride loops wrap. Each case runs the forward
// and the backward kernels on the path the CUDA backend would pick (vector or scalar) and compares
// them bitwise with the CPU backend (which tests/test_interpolate.py checks against torch). Prints
// one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "interpolate/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "interpolate/cpu.cpp"
#include "interpolate/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"
#include "pooling/lanes.cuh"

// namespace rudnn::interp { namespace emu_k { ...the kernels of interpolate_cuda.cu... } }
#include "kernels.inc"

#include "emu_arrays.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::interp;

constexpr unsigned kEmuBlocks = 3;  // fewer blocks than elements: every thread loops

using emu::Array;
using emu::dims_of;
using emu::make;
using emu::same_bytes;

struct Case {
  const char* name;
  DType dtype;
  PoolLayout layout;
  std::vector<i64> shape;
  InterpolateOptions options;  // layout and dims filled from the case
};

InterpolateOptions sized(InterpolateMode mode, std::vector<i64> size, OptionalBool align = OptionalBool::unset,
                         bool antialias = false) {
  InterpolateOptions o;
  o.mode = mode;
  o.has_size = true;
  o.dims = int(size.size());
  for (int i = 0; i < o.dims; ++i) o.size[i] = size[i];
  o.align_corners = align;
  o.antialias = antialias;
  return o;
}

InterpolateOptions scaled(InterpolateMode mode, std::vector<double> scale, OptionalBool align = OptionalBool::unset,
                          bool antialias = false) {
  InterpolateOptions o;
  o.mode = mode;
  o.has_scale_factor = true;
  o.dims = int(scale.size());
  for (int i = 0; i < o.dims; ++i) o.scale_factor[i] = scale[i];
  o.align_corners = align;
  o.antialias = antialias;
  return o;
}

// Runs the kernel the CUDA backend would pick; returns whether it took the vector path.
bool run_kernel(const Problem& p, const Tensor& src, const Tensor& dst, bool forward) {
  return core::dispatch_float<__half, __nv_bfloat16>(dst.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vector = emu_k::vector_path<T>(p, src.data, dst.data);
    auto launch = [&](auto lanes) {
      constexpr int L = decltype(lanes)::value;
      const emu_k::Grid grid = emu_k::grid_of(p, L, forward);
      const i64 total = p.batch * grid.groups * grid.size[0] * grid.size[1] * grid.size[2];
      emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
        if (forward) emu_k::interpolate_forward_kernel<T, L>(p, grid, src.ptr<T>(), dst.ptr<T>(), total);
        else emu_k::interpolate_backward_kernel<T, L>(p, grid, src.ptr<T>(), dst.ptr<T>(), total);
      });
    };
    if (vector) launch(std::integral_constant<int, emu_k::kVecLanes<T>>{});
    else launch(std::integral_constant<int, 1>{});
    return vector;
  });
}

bool run_case(Case c) {
  c.options.layout = c.layout;
  Array x = make(c.dtype, c.shape, 1);
  InterpolateArgs fa{c.options, x.t, Tensor{}};
  const InterpolateShape shape = output_shape(x.t, validate_forward(fa, false), c.layout);
  Array y_cpu = make(c.dtype, dims_of(shape), 0, false), y_emu = make(c.dtype, dims_of(shape), 0, false);
  fa.y = y_cpu.t;
  forward_cpu(validate_forward(fa), x.t, y_cpu.t);
  fa.y = y_emu.t;
  const bool fwd_vector = run_kernel(validate_forward(fa), x.t, y_emu.t, true);
  bool ok = same_bytes(y_cpu.t, y_emu.t);

  Array dy = make(c.dtype, dims_of(shape), 2);
  Array dx_cpu = make(c.dtype, dims_of(x.t), 0, false), dx_emu = make(c.dtype, dims_of(x.t), 0, false);
  backward_cpu(validate_backward(InterpolateBackwardArgs{c.options, dy.t, dx_cpu.t}), dy.t, dx_cpu.t);
  const bool bwd_vector =
      run_kernel(validate_backward(InterpolateBackwardArgs{c.options, dy.t, dx_emu.t}), dy.t, dx_emu.t, false);
  ok = ok && same_bytes(dx_cpu.t, dx_emu.t);
  std::printf("%s forward=%s backward=%s %s\n", c.name, fwd_vector ? "vector" : "scalar",
              bwd_vector ? "vector" : "scalar", ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  using M = InterpolateMode;
  const auto cf = PoolLayout::channels_first, cl = PoolLayout::channels_last;
  const auto yes = OptionalBool::yes;
  std::vector<Case> cases = {
      {"nearest1d_nchw_f32", DType::f32, cf, {2, 3, 7}, scaled(M::nearest, {1.7})},
      {"nearest_exact2d_nhwc_bf16_c8", DType::bf16, cl, {2, 5, 6, 8}, scaled(M::nearest_exact, {0.6, 1.45})},
      {"linear1d_nhwc_f32_c4_align", DType::f32, cl, {1, 9, 4}, sized(M::linear, {13}, yes)},
      {"bilinear2d_nchw_f16", DType::f16, cf, {2, 2, 5, 7}, scaled(M::bilinear, {1.7, 0.55})},
      {"bilinear2d_nhwc_f16_c3", DType::f16, cl, {1, 5, 7, 3}, sized(M::bilinear, {8, 4})},
      {"trilinear3d_nhwc_f32_c8", DType::f32, cl, {1, 3, 4, 5, 8}, sized(M::trilinear, {5, 3, 7}, yes)},
      {"bicubic2d_nhwc_bf16_c16", DType::bf16, cl, {1, 6, 5, 16}, scaled(M::bicubic, {1.6, 2.3})},
      {"bicubic2d_nchw_f32_align", DType::f32, cf, {2, 3, 7, 6}, sized(M::bicubic, {4, 9}, yes)},
      {"area3d_nchw_f16", DType::f16, cf, {1, 2, 5, 6, 7}, sized(M::area, {2, 4, 3})},
      {"area2d_nhwc_f32_c4", DType::f32, cl, {2, 7, 9, 4}, sized(M::area, {3, 4})},
      {"aa_bilinear2d_nhwc_bf16_c8", DType::bf16, cl, {1, 13, 11, 8}, sized(M::bilinear, {4, 5}, OptionalBool::unset, true)},
      {"aa_bicubic2d_nchw_f32", DType::f32, cf, {1, 2, 13, 9}, scaled(M::bicubic, {0.3, 1.7}, OptionalBool::unset, true)},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
