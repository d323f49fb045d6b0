// Host emulator of the conv CUDA direct kernels (tests/test_conv_emulation.py builds and runs it).
// The kernels' own source (cpp/src/conv/conv_direct_cuda.cu up to its launch code, extracted by
// the test into kernels.inc) runs on the CPU through emu_runtime.hpp, a std::thread per CUDA
// thread, on a grid of 3 blocks so that the grid-stride loops wrap. Each case runs the forward,
// data, weight and bias gradient kernels and compares them bitwise with the CPU backend (which
// tests/test_conv.py checks against torch). The inputs are multiples of 1/64 in [-2, 2) and the
// sums short, so every float32 sum is exact whatever its order: the block reductions of the
// weight and bias gradients must match the CPU's sequential sums bit for bit too. Prints one
// line per case (with the forward path the CUDA backend would pick: packed or scalar); exits 1
// on a mismatch.
#include "emu_runtime.hpp"

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "conv/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "conv/cpu.cpp"
#include "conv/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"

// namespace rudnn::conv { namespace emu_k { ...the kernels of conv_direct_cuda.cu... } } and
// namespace rudnn::conv::ig { namespace emu_ig { ...the layout copies of conv_ig_cuda.cu... } }
#include "kernels.inc"

#include "emu_arrays.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::conv;

constexpr unsigned kEmuBlocks = 3;

using emu::Array;
using emu::dims_of;
using emu::make;
using emu::same_bytes;



template <class F>
decltype(auto) device_types(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

bool channels_densest(const Strides& s, i64 channels) { return channels > 1 && s.c == 1; }

struct Case {
  const char* name;
  DType dtype;
  ConvLayout layout;
  std::vector<i64> x, w;  // in the layout's order
  std::vector<i64> stride, pad_before, pad_after, dilation;
  i64 groups;
  bool bias;
};

bool run_case(const Case& c) {
  ConvOptions o;
  o.dims = int(c.stride.size());
  for (int i = 0; i < o.dims; ++i) {
    o.stride[i] = c.stride[i];
    o.padding_before[i] = c.pad_before[i];
    o.padding_after[i] = c.pad_after[i];
    o.dilation[i] = c.dilation[i];
  }
  o.groups = c.groups;
  o.layout = c.layout;
  Array x = make(c.dtype, c.x, 1), w = make(c.dtype, c.w, 2), b = make(c.dtype, {c.w[0]}, 3);

  ConvForwardArgs fa;
  fa.options = o;
  fa.x = x.t;
  fa.w = w.t;
  fa.bias = c.bias ? &b.t : nullptr;
  const std::vector<i64> y_shape = dims_of(output_shape(validate_forward(fa, false).g, o.dims, o.layout));
  Array y_cpu = make(c.dtype, y_shape, 0, false), y_emu = make(c.dtype, y_shape, 0, false);
  fa.y = y_cpu.t;
  const Problem fp = validate_forward(fa);
  forward_cpu(fp, x.t, w.t, fa.bias, y_cpu.t);

  Array dy = make(c.dtype, y_shape, 4);
  Array dx_cpu = make(c.dtype, c.x, 0, false), dx_emu = make(c.dtype, c.x, 0, false);
  Array dw_cpu = make(c.dtype, c.w, 0, false), dw_emu = make(c.dtype, c.w, 0, false);
  Array db_cpu = make(c.dtype, {c.w[0]}, 0, false), db_emu = make(c.dtype, {c.w[0]}, 0, false);
  const Problem dp = validate_data_backward(ConvDataBackwardArgs{o, dy.t, w.t, dx_cpu.t});
  data_backward_cpu(dp, dy.t, w.t, dx_cpu.t);
  const Problem wp = validate_weight_backward(ConvWeightBackwardArgs{o, dy.t, x.t, dw_cpu.t});
  weight_backward_cpu(wp, dy.t, x.t, dw_cpu.t);
  const Problem bp = validate_bias_backward(ConvBiasBackwardArgs{o.dims, o.layout, dy.t, db_cpu.t});
  bias_backward_cpu(bp, dy.t, db_cpu.t);

  bool packed = false;
  device_types(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* bias = c.bias ? b.t.ptr<T>() : nullptr;
    const bool cl = channels_densest(fp.y, fp.g.out_channels);
    packed = emu_k::forward_packed_path<T>(fp, x.t.data, w.t.data);
    emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
      if (packed)
        emu_k::conv_forward_kernel<T, emu_k::kPackLanes<T>>(fp, cl, x.t.ptr<T>(), w.t.ptr<T>(), bias, y_emu.t.ptr<T>(),
                                                           fp.outputs());
      else
        emu_k::conv_forward_kernel<T, 1>(fp, cl, x.t.ptr<T>(), w.t.ptr<T>(), bias, y_emu.t.ptr<T>(), fp.outputs());
    });
    emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::conv_data_backward_kernel<T>(dp, channels_densest(dp.x, dp.g.in_channels), dy.t.ptr<T>(), w.t.ptr<T>(),
                                          dx_emu.t.ptr<T>(), dp.inputs());
    });
    emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::conv_weight_backward_kernel<T>(wp, dy.t.ptr<T>(), x.t.ptr<T>(), dw_emu.t.ptr<T>());
    });
    emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::conv_bias_backward_kernel<T>(bp, dy.t.ptr<T>(), db_emu.t.ptr<T>());
    });
  });
  const bool fwd = same_bytes(y_cpu.t, y_emu.t), data = same_bytes(dx_cpu.t, dx_emu.t);
  const bool weight = same_bytes(dw_cpu.t, dw_emu.t), bias = same_bytes(db_cpu.t, db_emu.t);
  const bool ok = fwd && data && weight && bias;
  std::printf("%s path=%s forward=%d data=%d weight=%d bias=%d %s\n", c.name, packed ? "packed" : "scalar", fwd,
              data, weight, bias, ok ? "ok" : "MISMATCH");
  return ok;
}

// The implicit-GEMM strategy's layout copies (conv_ig_cuda.cu's repack kernel): an NCHW x, an
// NCHW weight and a stride-2 bias packed into channels-last order, checked element by element
// against the index math of a packed (n, h, w, c) tensor, then unpacked into fresh arrays that
// must equal the originals bit for bit.
template <class Bits>
bool run_repack_case(DType dtype) {
  const i64 N = 2, C = 16, H = 5, W = 7, K = 8, R = 3, S = 3;
  Array x = make(dtype, {N, C, H, W}, 11), w = make(dtype, {K, C, R, S}, 12);
  Array bias_storage = make(dtype, {2 * K}, 13);
  ConvForwardArgs fa;
  fa.options.dims = 2;
  fa.x = x.t;
  fa.w = w.t;
  const Problem p = validate_forward(fa, false);
  bool ok = true;
  auto check = [&](const Tensor& t, const Strides& strided, i64 lead, i64 channels, i64 rows, i64 cols,
                   const char* what) {
    ig::emu_ig::Grid grid;
    grid.lead = lead;
    grid.channels = channels;
    grid.sizes[1] = rows;
    grid.sizes[2] = cols;
    const i64 n = lead * channels * rows * cols;
    std::vector<Bits> packed(std::size_t(n), Bits(~Bits(0)));
    Array back = make(dtype, {n + 2 * channels}, 0, false);  // room for the bias's stride 2
    emu_launch(EmuDim3{kEmuBlocks, 1, 1}, ig::emu_ig::kThreads, 1, 0,
               [&] { ig::emu_ig::repack_kernel<Bits>(t.ptr<Bits>(), packed.data(), strided, grid, true); });
    bool good = true;
    for (i64 a = 0; a < lead; ++a)
      for (i64 c = 0; c < channels; ++c)
        for (i64 r = 0; r < rows; ++r)
          for (i64 q = 0; q < cols; ++q) {
            const i64 from = a * strided.n + c * strided.c + r * strided.sp[1] + q * strided.sp[2];
            good = good && packed[std::size_t(((a * rows + r) * cols + q) * channels + c)] == t.ptr<Bits>()[from];
          }
    emu_launch(EmuDim3{kEmuBlocks, 1, 1}, ig::emu_ig::kThreads, 1, 0,
               [&] { ig::emu_ig::repack_kernel<Bits>(packed.data(), back.t.ptr<Bits>(), strided, grid, false); });
    for (i64 a = 0; a < lead; ++a)
      for (i64 c = 0; c < channels; ++c)
        for (i64 r = 0; r < rows; ++r)
          for (i64 q = 0; q < cols; ++q) {
            const i64 at = a * strided.n + c * strided.c + r * strided.sp[1] + q * strided.sp[2];
            good = good && back.t.ptr<Bits>()[at] == t.ptr<Bits>()[at];
          }
    std::printf("repack_%s_%s %s\n", what, dtype == DType::f32 ? "f32" : "bf16", good ? "ok" : "MISMATCH");
    ok = ok && good;
  };
  check(x.t, p.x, N, C, H, W, "nchw_x");
  check(w.t, p.w, K, C, R, S, "nchw_w");
  Strides bias_strides;
  bias_strides.c = 2;
  check(bias_storage.t, bias_strides, 1, K, 1, 1, "strided_bias");
  return ok;
}

}  // namespace

int main() {
  const auto cf = ConvLayout::channels_first, cl = ConvLayout::channels_last;
  std::vector<Case> cases = {
      {"conv2d_nchw_f32", DType::f32, cf, {2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {"conv2d_nhwc_bf16_groups", DType::bf16, cl, {1, 8, 7, 4}, {6, 3, 2, 2}, {2, 1}, {1, 0}, {1, 1}, {1, 2}, 2,
       true},
      {"conv2d_nhwc_f16_depthwise", DType::f16, cl, {2, 6, 5, 5}, {5, 3, 3, 1}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 5,
       false},
      {"conv1d_nchw_bf16_same_even", DType::bf16, cf, {2, 4, 11}, {4, 2, 4}, {1}, {1}, {2}, {1}, 2, true},
      {"conv3d_nchw_f32_stride", DType::f32, cf, {1, 2, 5, 4, 6}, {3, 2, 2, 3, 2}, {2, 1, 3}, {1, 0, 1}, {0, 1, 1},
       {1, 1, 2}, 1, true},
      {"conv2d_nhwc_f16_packed_groups", DType::f16, cl, {2, 5, 6, 16}, {6, 3, 2, 8}, {1, 2}, {1, 0}, {1, 1},
       {1, 2}, 2, true},
      {"conv3d_nhwc_f32_packed", DType::f32, cl, {1, 3, 4, 5, 8}, {3, 2, 2, 3, 8}, {1, 1, 2}, {1, 0, 1}, {0, 1, 1},
       {2, 1, 1}, 1, false},
      {"conv1d_nhwc_bf16_packed_depthwise_like", DType::bf16, cl, {2, 9, 16}, {4, 3, 8}, {2}, {1}, {1}, {1}, 2,
       true},
      // 800 terms per weight gradient element: each thread sums a run of 4 across rows and images.
      {"conv2d_nchw_f32_long_runs", DType::f32, cf, {2, 2, 20, 20}, {2, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1,
       true},
      {"conv2d_nchw_f16_stride_gt_kernel", DType::f16, cf, {1, 2, 7, 7}, {2, 2, 2, 2}, {3, 3}, {0, 0}, {0, 0},
       {1, 1}, 1, false},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  ok = run_repack_case<std::uint16_t>(DType::bf16) && ok;
  ok = run_repack_case<std::uint32_t>(DType::f32) && ok;
  return ok ? 0 : 1;
}
