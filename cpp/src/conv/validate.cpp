// Every check of the convolution family, run once before either backend. Sizes are checked for
// int64 overflow as they are computed, so that no backend index can wrap.
#include <string>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "core/checked_math.hpp"
#include "conv/problem.hpp"

namespace rudnn::conv {

using core::checked_add;
using core::checked_mul;
using core::fail;

namespace {

std::string list_str(const i64* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const char* const kSpatialNames[3][3] = {{"L"}, {"H", "W"}, {"D", "H", "W"}};

// "[N, C, H, W]" / "[N, H, W, C]" for activations; "[Cout, Cin/groups, kH, kW]" /
// "[Cout, kH, kW, Cin/groups]" for weights.
std::string axes_str(int dims, ConvLayout layout, bool weight) {
  std::string s = weight ? "[Cout, " : "[N, ";
  const std::string channels = weight ? "Cin/groups" : "C";
  if (layout == ConvLayout::channels_first) s += channels + ", ";
  for (int i = 0; i < dims; ++i) s += std::string(i ? ", " : "") + (weight ? "k" : "") + kSpatialNames[dims - 1][i];
  if (layout == ConvLayout::channels_last) s += ", " + channels;
  return s + "]";
}

const char* layout_name(ConvLayout layout) { return layout == ConvLayout::channels_last ? "NHWC" : "NCHW"; }

// The axis of an activation (or weight) holding its channels (input channels) and spatial axis i.
struct AxisMap {
  int c = 1, sp[kAxes] = {2, 3, 4};
};

AxisMap axis_map(int dims, ConvLayout layout) {
  AxisMap m;
  if (layout == ConvLayout::channels_first) {
    m.c = 1;
    for (int i = 0; i < dims; ++i) m.sp[i] = 2 + i;
  } else {
    for (int i = 0; i < dims; ++i) m.sp[i] = 1 + i;
    m.c = dims + 1;
  }
  return m;
}

// Canonical strides (n, c, d, h, w) of an activation, or (co, ci, kd, kh, kw) of a weight.
Strides strides_of(const Tensor& t, int dims, ConvLayout layout) {
  const AxisMap m = axis_map(dims, layout);
  Strides s;
  s.n = t.strides[0];
  s.c = t.strides[m.c];
  for (int i = 0; i < dims; ++i) s.sp[kAxes - dims + i] = t.strides[m.sp[i]];
  return s;
}

std::string rank_expectation(int dims, ConvLayout layout) {
  return std::to_string(dims + 2) + " axes (" + axes_str(dims, layout, false) + ")";
}

void check_options(const ConvOptions& o, const std::string& op) {
  const int n = o.dims;
  for (int i = 0; i < n; ++i) {
    if (o.stride[i] < 1) fail(ErrorKind::value, op + ": stride: expected values >= 1, got " + list_str(o.stride, n));
    if (o.dilation[i] < 1)
      fail(ErrorKind::value, op + ": dilation: expected values >= 1, got " + list_str(o.dilation, n));
    if (o.padding_before[i] < 0 || o.padding_after[i] < 0)
      fail(ErrorKind::value, op + ": padding: negative padding is not supported, got " +
                                 (list_str(o.padding_before, n) == list_str(o.padding_after, n)
                                      ? list_str(o.padding_before, n)
                                      : "before " + list_str(o.padding_before, n) + ", after " +
                                            list_str(o.padding_after, n)));
  }
  if (o.groups < 1) fail(ErrorKind::value, op + ": groups: expected an integer >= 1, got " + std::to_string(o.groups));
}

// x (or what stands for its shape): a float activation of rank dims + 2, sizes >= 1 but the batch.
void read_activation(const Tensor& x, const ConvOptions& o, const std::string& name, Geometry& g) {
  const int dims = o.dims;
  if (x.rank != dims + 2)
    fail(ErrorKind::shape, name + ": expected " + rank_expectation(dims, o.layout) + " for a " +
                               std::to_string(dims) + "-D convolution, got shape " + x.shape_str());
  for (int d = 1; d < x.rank; ++d)
    if (x.shape[d] < 1)
      fail(ErrorKind::shape, name + ": expected sizes >= 1 on every axis but the batch axis, got shape " + x.shape_str());
  const AxisMap m = axis_map(dims, o.layout);
  g.batch = x.shape[0];
  g.in_channels = x.shape[m.c];
  for (int i = 0; i < dims; ++i) g.in[kAxes - dims + i] = x.shape[m.sp[i]];
}

// w (or what stands for its shape) against the input channels and groups; fills the kernel.
void read_weight(const Tensor& w, const ConvOptions& o, const std::string& w_name, const std::string& x_name,
                 Geometry& g, const std::string& op) {
  const std::string name = op + ": " + w_name;
  const int dims = o.dims;
  if (w.rank != dims + 2)
    fail(ErrorKind::shape, name + ": expected " + std::to_string(dims + 2) + " axes " +
                               axes_str(dims, o.layout, true) + " like " + x_name + " (layout " +
                               layout_name(o.layout) + "), got shape " + w.shape_str());
  for (int d = 0; d < w.rank; ++d)
    if (w.shape[d] < 1) fail(ErrorKind::shape, name + ": expected sizes >= 1 on every axis, got shape " + w.shape_str());
  const AxisMap m = axis_map(dims, o.layout);
  g.groups = o.groups;
  g.out_channels = w.shape[0];
  if (g.in_channels % g.groups != 0)
    fail(ErrorKind::value, op + ": groups: expected a divisor of the input channels (" + std::to_string(g.in_channels) +
                               " in " + x_name + "), got " + std::to_string(g.groups));
  if (g.out_channels % g.groups != 0)
    fail(ErrorKind::value, op + ": groups: expected a divisor of the output channels (Cout = " +
                               std::to_string(g.out_channels) + " in " + w_name + "), got " + std::to_string(g.groups));
  g.cin_g = g.in_channels / g.groups;
  g.cout_g = g.out_channels / g.groups;
  if (w.shape[m.c] != g.cin_g) {
    std::string hint;
    const AxisMap other = axis_map(dims, o.layout == ConvLayout::channels_first ? ConvLayout::channels_last
                                                                                 : ConvLayout::channels_first);
    if (w.shape[other.c] == g.cin_g)
      hint = std::string("; it looks like the ") +
             layout_name(o.layout == ConvLayout::channels_first ? ConvLayout::channels_last
                                                                : ConvLayout::channels_first) +
             " weight layout " +
             axes_str(dims, o.layout == ConvLayout::channels_first ? ConvLayout::channels_last
                                                                    : ConvLayout::channels_first,
                      true) +
             " (layout mismatch: pass the layout the weight is in)";
    fail(ErrorKind::shape, name + ": channel mismatch: expected " + std::to_string(g.cin_g) +
                               " input channels per group on axis " + std::to_string(m.c) + " of " +
                               axes_str(dims, o.layout, true) + " (" + x_name + " has " +
                               std::to_string(g.in_channels) + " channels, groups = " + std::to_string(g.groups) +
                               "), got shape " + w.shape_str() + hint);
  }
  for (int i = 0; i < dims; ++i) g.kernel[kAxes - dims + i] = w.shape[m.sp[i]];
}

// Strides, padding and dilation into g, and the output sizes.
void read_window(const ConvOptions& o, const std::string& w_name, Geometry& g, const std::string& op) {
  const int n = o.dims;
  i64 out_count = checked_mul(g.batch, g.out_channels, op + ": the number of output elements");
  for (int i = 0; i < n; ++i) {
    const int a = kAxes - n + i;
    g.stride[a] = o.stride[i];
    g.pad[a] = o.padding_before[i];
    g.dilation[a] = o.dilation[i];
    const std::string what = op + ": the window size along spatial axis " + std::to_string(i);
    const i64 extent = checked_add(checked_mul(o.dilation[i], g.kernel[a] - 1, what), 1, what);
    const i64 padded = checked_add(checked_add(g.in[a], o.padding_before[i], what), o.padding_after[i], what);
    if (extent > padded)
      fail(ErrorKind::shape, op + ": " + w_name + ": the kernel (extent " + std::to_string(extent) +
                                 " = dilation * (kernel - 1) + 1 along spatial axis " + std::to_string(i) +
                                 ") is larger than the padded input (size " + std::to_string(padded) +
                                 "), so the output size would be < 1");
    g.out[a] = (padded - extent) / o.stride[i] + 1;
    out_count = checked_mul(out_count, g.out[a], op + ": the number of output elements");
  }
  // The weight box, the input and the per-element offsets stay far below int64 (their tensors exist).
}


bool same_shape(const Tensor& t, const ConvShape& s) {
  bool same = t.rank == s.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == s.dims[d];
  return same;
}

std::string shape_str(const ConvShape& s) {
  return list_str(s.dims, s.rank);
}

// The geometry of a call from x's shape (x or dx), w's shape (w or dw) and the options.
Geometry geometry(const ConvOptions& o, const Tensor& x, const std::string& x_name, const Tensor& w,
                  const std::string& w_name, const std::string& op) {
  if (o.dims < 1 || o.dims > kAxes)
    fail(ErrorKind::shape, op + ": " + x_name + ": expected 3, 4 or 5 axes ([N, C, L], [N, C, H, W] or [N, C, D, H, W]), got " +
                               std::to_string(o.dims + 2));
  check_options(o, op);
  Geometry g;
  read_activation(x, o, op + ": " + x_name, g);
  read_weight(w, o, w_name, x_name, g, op);
  read_window(o, w_name, g, op);
  return g;
}

// dy (or y): the forward's output shape, `dtype`, the device of `ref`.
void check_output_like(const Tensor& t, const Geometry& g, const ConvOptions& o, const Tensor& ref,
                       const std::string& ref_name, const std::string& name, const std::string& what) {
  core::expect_same_device(t, ref, name, ref_name);
  core::expect_dtype_of(t, ref, name, ref_name);
  const ConvShape s = output_shape(g, o.dims, o.layout);
  if (!same_shape(t, s))
    fail(ErrorKind::shape, name + ": expected shape " + shape_str(s) + " (" + what + "), got " + t.shape_str());
}

Problem problem(const Geometry& g, const ConvOptions& o, const Tensor& x, const Tensor& y, const Tensor& w) {
  Problem p;
  p.g = g;
  p.x = strides_of(x, o.dims, o.layout);
  p.y = strides_of(y, o.dims, o.layout);
  p.w = strides_of(w, o.dims, o.layout);
  return p;
}

}  // namespace

ConvShape output_shape(const Geometry& g, int dims, ConvLayout layout) {
  const AxisMap m = axis_map(dims, layout);
  ConvShape s;
  s.rank = dims + 2;
  s.dims[0] = g.batch;
  s.dims[m.c] = g.out_channels;
  for (int i = 0; i < dims; ++i) s.dims[m.sp[i]] = g.out[kAxes - dims + i];
  return s;
}

Problem validate_forward(const ConvForwardArgs& a, bool check_outputs) {
  const std::string op = "conv";
  const ConvOptions& o = a.options;
  if (o.dims >= 1 && o.dims <= kAxes) core::expect_float(a.x, op + ": x");
  const Geometry g = geometry(o, a.x, "x", a.w, "w", op);
  core::expect_same_device(a.w, a.x, op + ": w", "x");
  core::expect_dtype_of(a.w, a.x, op + ": w", "x");
  if (a.bias) {
    core::expect_same_device(*a.bias, a.x, op + ": bias", "x");
    core::expect_dtype_of(*a.bias, a.x, op + ": bias", "x");
    core::expect_shape(*a.bias, {g.out_channels}, op + ": bias", "([Cout], Cout from w)");
  }
  if (check_outputs) {
    check_output_like(a.y, g, o, a.x, "x", op + ": y", "the output shape for x and w");
    core::expect_data(a.y, op + ": y");
    core::expect_outputs_apart({{a.y, op + ": y"}}, {{a.x, op + ": x"}, {a.w, op + ": w"}, {a.bias, op + ": bias"}});
  }
  Problem p = problem(g, o, a.x, check_outputs ? a.y : a.x, a.w);
  if (a.bias) {
    p.has_bias = true;
    p.bias_stride = a.bias->strides[0];
  }
  return p;
}

Problem validate_data_backward(const ConvDataBackwardArgs& a) {
  const std::string op = "conv_data_backward";
  const ConvOptions& o = a.options;
  core::expect_float(a.dy, op + ": dy");
  // dx carries x_shape.
  const Geometry g = geometry(o, a.dx, "x_shape", a.w, "w", op);
  core::expect_same_device(a.w, a.dy, op + ": w", "dy");
  core::expect_dtype_of(a.w, a.dy, op + ": w", "dy");
  check_output_like(a.dy, g, o, a.w, "w", op + ": dy", "the conv output shape for x_shape and w");
  core::expect_same_device(a.dx, a.dy, op + ": dx", "dy");
  core::expect_dtype_of(a.dx, a.dy, op + ": dx", "dy");
  core::expect_data(a.dx, op + ": dx");
  core::expect_outputs_apart({{a.dx, op + ": dx"}}, {{a.dy, op + ": dy"}, {a.w, op + ": w"}});
  return problem(g, o, a.dx, a.dy, a.w);
}

Problem validate_weight_backward(const ConvWeightBackwardArgs& a) {
  const std::string op = "conv_weight_backward";
  const ConvOptions& o = a.options;
  core::expect_float(a.dy, op + ": dy");
  // dw carries w_shape.
  const Geometry g = geometry(o, a.x, "x", a.dw, "w_shape", op);
  core::expect_same_device(a.x, a.dy, op + ": x", "dy");
  core::expect_dtype_of(a.x, a.dy, op + ": x", "dy");
  check_output_like(a.dy, g, o, a.x, "x", op + ": dy", "the conv output shape for x and w_shape");
  core::expect_same_device(a.dw, a.dy, op + ": dw", "dy");
  core::expect_dtype_of(a.dw, a.dy, op + ": dw", "dy");
  core::expect_data(a.dw, op + ": dw");
  core::expect_outputs_apart({{a.dw, op + ": dw"}}, {{a.dy, op + ": dy"}, {a.x, op + ": x"}});
  return problem(g, o, a.x, a.dy, a.dw);
}

Problem validate_bias_backward(const ConvBiasBackwardArgs& a) {
  const std::string op = "conv_bias_backward";
  core::expect_float(a.dy, op + ": dy");
  ConvOptions o;
  o.dims = a.dims;
  o.layout = a.layout;
  if (o.dims < 1 || o.dims > kAxes || a.dy.rank != o.dims + 2)
    fail(ErrorKind::shape, op + ": dy: expected 3, 4 or 5 axes ([N, C, *spatial] or [N, *spatial, C]), got shape " +
                               a.dy.shape_str());
  Geometry g;
  const AxisMap m = axis_map(o.dims, o.layout);
  g.batch = a.dy.shape[0];
  g.out_channels = a.dy.shape[m.c];
  for (int i = 0; i < o.dims; ++i) g.out[kAxes - o.dims + i] = a.dy.shape[m.sp[i]];
  core::expect_same_device(a.db, a.dy, op + ": db", "dy");
  core::expect_dtype_of(a.db, a.dy, op + ": db", "dy");
  core::expect_shape(a.db, {g.out_channels}, op + ": db", "([C], the channels of dy)");
  core::expect_data(a.db, op + ": db");
  core::expect_outputs_apart({{a.db, op + ": db"}}, {{a.dy, op + ": dy"}});
  Problem p;
  p.g = g;
  p.y = strides_of(a.dy, o.dims, o.layout);
  p.bias_stride = a.db.strides[0];
  return p;
}

}  // namespace rudnn::conv
