// Which implicit-GEMM kernel takes a validated convolution (implicit_gemm.hpp): a pure function
// of the problem, the dtype, the device's compute capability and the tensors' base addresses,
// so that the CPU tests check every decision and every reason.
#include <cstdint>
#include <limits>
#include <string>

#include "conv/implicit_gemm.hpp"

namespace rudnn::conv::ig {

namespace {

constexpr std::size_t kAlign = 256;    // workspace sub-buffer alignment
constexpr i64 kInt32Max = std::numeric_limits<std::int32_t>::max();

std::string axes_list(const int (&v)[kAxes]) {
  return "[" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + "]";
}

// Whether strides s describe the packed channels-last layout of a (lead, channels, *sizes)
// tensor; the stride of an axis of size 1 never matters.
bool packed_channels_last(const Strides& s, i64 lead, i64 channels, const i64 (&sizes)[kAxes]) {
  if (channels != 1 && s.c != 1) return false;
  i64 step = channels;
  for (int a = kAxes - 1; a >= 0; --a) {
    if (sizes[a] != 1 && s.sp[a] != step) return false;
    step *= sizes[a];
  }
  return lead == 1 || s.n == step;
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

std::size_t round_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

Extents shape_of(const Geometry& g) {
  Extents s;
  s.n = int(g.batch);
  s.c = int(g.in_channels);
  s.k = int(g.out_channels);
  for (int a = 0; a < kAxes; ++a) {
    s.in[a] = int(g.in[a]);
    s.out[a] = int(g.out[a]);
    s.kernel[a] = int(g.kernel[a]);
    s.pad_before[a] = int(g.pad[a]);
    s.stride[a] = int(g.stride[a]);
    s.dilation[a] = int(g.dilation[a]);
    // The smallest upper padding >= 0 that gives the same output size (the floor of the
    // output-size formula may have dropped some of the caller's padding).
    const i64 extent = g.dilation[a] * (g.kernel[a] - 1) + 1;
    const i64 after = (g.out[a] - 1) * g.stride[a] + extent - g.in[a] - g.pad[a];
    s.pad_after[a] = int(after > 0 ? after : 0);
  }
  return s;
}

// Why the sm80 kernels cannot take the problem ("" when they can).
std::string sm80_refusal(const Extents& s, Op op) {
  for (int a = 0; a < kAxes; ++a)
    if (s.kernel[a] > 32)
      return "the sm80 kernels take kernel extents <= 32 per axis, got " + axes_list(s.kernel);
  if (op == Op::data_backward) {
    for (int a = 0; a < kAxes; ++a)
      if (s.dilation[a] != 1)
        return "the sm80 data-gradient kernels take dilation 1, got " + axes_list(s.dilation);
    if (s.deep())
      for (int a = 0; a < kAxes; ++a)
        if (s.stride[a] != 1)
          return "the sm80 3-D data-gradient kernel takes stride 1, got " + axes_list(s.stride);
  }
  return "";
}

// Why the sm90 kernels (NDHWC, TMA im2col) cannot take the problem ("" when they can): the
// limits CUTLASS 3.x's can_implement checks for three spatial dims, checked here first so that
// "auto" decides on the host.
std::string sm90_refusal(const Extents& s, Op op) {
  constexpr int kPadLimit = 16, kCorner = 16, kOffsetLimit = 31;  // 2^(16/3 - 1), 2^(16/3) - 1
  constexpr int kMaxTraversalStride = 8;
  if (op == Op::data_backward)
    for (int a = 0; a < kAxes; ++a)
      if (s.stride[a] != 1)
        return "the sm90 data-gradient kernel is used with stride 1 only, got " + axes_list(s.stride);
  for (int a = 0; a < kAxes; ++a) {
    const int reach = (s.kernel[a] - 1) * s.dilation[a];
    // The stride is the im2col descriptor's traversal stride (cute's make_im2col_tma_copy), which
    // cuTensorMapEncodeIm2col takes up to 8; CUTLASS's can_implement does not check it.
    if (s.stride[a] > kMaxTraversalStride)
      return "the sm90 kernels' TMA im2col loads take stride <= 8, got " + axes_list(s.stride);
    if (s.pad_before[a] > kPadLimit || s.pad_after[a] > kPadLimit)
      return "the sm90 kernels' TMA im2col loads take padding <= 16, got " + axes_list(s.pad_before);
    if (reach >= kOffsetLimit)
      return "the sm90 kernels' TMA im2col loads take (kernel - 1) * dilation < 31, got kernel " +
             axes_list(s.kernel) + ", dilation " + axes_list(s.dilation);
    int lower = -s.pad_before[a], upper = s.pad_after[a] - reach;
    if (op == Op::data_backward) {
      lower = s.pad_before[a] - reach;
      upper = s.pad_before[a] - reach + s.in[a] - s.out[a];
    }
    if (lower < -kCorner || lower >= kCorner || upper < -kCorner || upper >= kCorner)
      return "the sm90 kernels' TMA im2col box corners must lie in [-16, 15] (padding, kernel and dilation give " +
             std::to_string(lower) + " and " + std::to_string(upper) + " on axis " + std::to_string(a) + ")";
  }
  return "";
}

}  // namespace

Kernel kernel_family(int cc_major, int cc_minor) {
  if (cc_major == 9 && cc_minor == 0) return Kernel::sm90;
  return cc_major >= 8 ? Kernel::sm80 : Kernel::none;
}

const char* Plan::name() const {
  switch (kernel) {
    case Kernel::sm80: return "implicit_gemm_sm80";
    case Kernel::sm90: return "implicit_gemm_sm90";
    default: return "direct";
  }
}

Plan plan(const Problem& p, Op op, DType dtype, int cc_major, int cc_minor, const Bases& bases) {
  Plan r;
  const Geometry& g = p.g;
  auto refuse = [&](std::string why) {
    r.kernel = Kernel::none;
    r.why = std::move(why);
    return r;
  };
  if (cc_major == 0) return refuse("CUTLASS implicit GEMM runs on CUDA devices only (the tensors are on the CPU)");
  const Kernel family = kernel_family(cc_major, cc_minor);
  if (family == Kernel::none)
    return refuse("CUTLASS implicit GEMM needs a GPU of compute capability 8.0 or newer, this one is " +
                  std::to_string(cc_major) + "." + std::to_string(cc_minor));
  if (dtype != DType::f16 && dtype != DType::bf16 && dtype != DType::f32)
    return refuse(std::string("CUTLASS implicit GEMM takes float16, bfloat16 and float32 (as TF32), got ") +
                  dtype_name(dtype));
  const std::size_t esize = dtype == DType::f32 ? 4 : 2;
  const i64 vector = i64(16 / esize);  // elements in the kernels' 16-byte accesses
  if (g.groups != 1)
    return refuse("CUTLASS implicit GEMM takes groups == 1, got " + std::to_string(g.groups) +
                  " (grouped and depthwise convolutions run the direct kernels)");
  if (g.in_channels % vector != 0 || g.out_channels % vector != 0)
    return refuse("CUTLASS implicit GEMM needs input and output channels that are multiples of " +
                  std::to_string(vector) + " (16-byte accesses), got Cin = " + std::to_string(g.in_channels) +
                  ", Cout = " + std::to_string(g.out_channels));
  const i64 x_elems = g.batch * g.in_channels * g.in_plane(), y_elems = g.batch * g.out_channels * g.out_plane();
  const i64 w_elems = g.out_channels * g.in_channels * g.kernel_volume();
  if (x_elems > kInt32Max || y_elems > kInt32Max || w_elems > kInt32Max || g.batch == 0)
    return refuse(g.batch == 0 ? std::string("an empty batch runs the direct kernels (nothing to compute)")
                               : std::string("CUTLASS implicit GEMM takes tensors of fewer than 2^31 elements"));
  r.shape = shape_of(g);
  const std::string refusal80 = sm80_refusal(r.shape, op);
  if (family == Kernel::sm90 && dtype != DType::f32) {  // TF32 is built for the sm80 kernels only
    const std::string refusal90 = sm90_refusal(r.shape, op);
    if (refusal90.empty())
      r.kernel = Kernel::sm90;
    else if (refusal80.empty())
      r.kernel = Kernel::sm80;  // from its PTX (the driver compiles it at first use)
    else
      return refuse(refusal90 + "; " + refusal80);
  } else {
    if (!refusal80.empty()) return refuse(refusal80);
    r.kernel = Kernel::sm80;
  }

  // Copies for tensors that cannot be used in place.
  r.copy_x = !packed_channels_last(p.x, g.batch, g.in_channels, g.in) || !aligned(bases.x);
  r.copy_y = !packed_channels_last(p.y, g.batch, g.out_channels, g.out) || !aligned(bases.y);
  r.copy_w = !packed_channels_last(p.w, g.out_channels, g.in_channels, g.kernel) || !aligned(bases.w);
  r.copy_bias = op == Op::forward && p.has_bias && (p.bias_stride != 1 || !aligned(bases.bias));
  std::size_t at = 0;
  auto take = [&](bool used, i64 elems, std::size_t& offset) {
    if (!used) return;
    offset = at;
    at += round_up(std::size_t(elems) * esize);
  };
  take(r.copy_x, x_elems, r.x_at);
  take(r.copy_w, w_elems, r.w_at);
  take(r.copy_y, y_elems, r.y_at);
  take(r.copy_bias, g.out_channels, r.bias_at);
  r.workspace_bytes = at;
  return r;
}

}  // namespace rudnn::conv::ig
