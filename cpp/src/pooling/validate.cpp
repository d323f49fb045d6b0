// Every check of the pooling family, run once before either backend. Sizes are checked for
// int64 overflow as they are computed, so that no backend index can wrap.
#include <climits>
#include <string>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "core/checked_math.hpp"
#include "pooling/problem.hpp"

namespace rudnn::pooling {

using core::fail;

using core::checked_add;
using core::checked_mul;

namespace {

std::string list_str(const i64* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The spatial axis names of a layout, e.g. "[N, C, H, W]" or "[H, W, C]" (without the batch).
std::string axes_str(int dims, PoolLayout layout, bool batch) {
  static const char* names[3][3] = {{"L"}, {"H", "W"}, {"D", "H", "W"}};
  std::string s = batch ? "[N, " : "[";
  if (layout == PoolLayout::channels_first) s += "C, ";
  for (int i = 0; i < dims; ++i) s += std::string(i ? ", " : "") + names[dims - 1][i];
  if (layout == PoolLayout::channels_last) s += ", C";
  return s + "]";
}

void check_dims(int dims, const std::string& op) {
  if (dims < 1 || dims > kAxes)
    fail(ErrorKind::value, op + ": expected 1, 2 or 3 spatial dims, got " + std::to_string(dims));
}

// The axis of t holding channel / spatial axis i (i < dims) / batch, by layout and batch-ness.
struct AxisMap {
  int n = -1, c = 0, sp[kAxes] = {0, 0, 0};  // sp[i] for the caller's spatial axis i
};

AxisMap axis_map(int rank, int dims, PoolLayout layout) {
  AxisMap m;
  const int lead = rank - dims - 1;  // 1 with a batch axis, 0 without
  m.n = lead ? 0 : -1;
  if (layout == PoolLayout::channels_first) {
    m.c = lead;
    for (int i = 0; i < dims; ++i) m.sp[i] = lead + 1 + i;
  } else {
    for (int i = 0; i < dims; ++i) m.sp[i] = lead + i;
    m.c = rank - 1;
  }
  return m;
}

// The canonical strides of t (rank dims + 1 or dims + 2); unused leading axes get stride 0.
Strides strides_of(const Tensor& t, int dims, PoolLayout layout) {
  const AxisMap m = axis_map(t.rank, dims, layout);
  Strides s;
  s.n = m.n >= 0 ? t.strides[m.n] : 0;
  s.c = t.strides[m.c];
  for (int i = 0; i < dims; ++i) s.sp[kAxes - dims + i] = t.strides[m.sp[i]];
  return s;
}

// x: a float pooling input of rank dims + 1 or dims + 2 with every axis but the batch >= 1.
// Fills the batch, channel and input sizes of g.
void read_input(const Tensor& x, int dims, PoolLayout layout, const std::string& name, Geometry& g) {
  if (x.rank != dims + 1 && x.rank != dims + 2)
    fail(ErrorKind::shape, name + ": expected " + std::to_string(dims + 1) + " or " + std::to_string(dims + 2) +
                               " axes (" + axes_str(dims, layout, false) + " or " + axes_str(dims, layout, true) +
                               ") for " + std::to_string(dims) + " spatial dims, got shape " + x.shape_str());
  const AxisMap m = axis_map(x.rank, dims, layout);
  for (int d = 0; d < x.rank; ++d)
    if (d != m.n && x.shape[d] < 1)
      fail(ErrorKind::shape, name + ": expected sizes >= 1 on every axis but the batch axis, got shape " +
                                 x.shape_str());
  g.batch = m.n >= 0 ? x.shape[m.n] : 1;
  g.channels = x.shape[m.c];
  for (int i = 0; i < dims; ++i) g.in[kAxes - dims + i] = x.shape[m.sp[i]];
}

void check_float_input(const Tensor& x, int dims, PoolLayout layout, const std::string& name, Geometry& g) {
  core::expect_float(x, name);
  read_input(x, dims, layout, name, g);
}

// kernel, stride, padding, dilation and ceil_mode into g, and the output sizes.
void read_window(const PoolWindow& w, bool allow_dilation, const std::string& op, Geometry& g) {
  const int n = w.dims;
  for (int i = 0; i < n; ++i) {
    if (w.kernel[i] < 1) fail(ErrorKind::value, op + ": kernel: expected values >= 1, got " + list_str(w.kernel, n));
    if (w.stride[i] < 1) fail(ErrorKind::value, op + ": stride: expected values >= 1, got " + list_str(w.stride, n));
    if (w.padding[i] < 0)
      fail(ErrorKind::value, op + ": padding: expected values >= 0, got " + list_str(w.padding, n));
    if (w.dilation[i] < 1)
      fail(ErrorKind::value, op + ": dilation: expected values >= 1, got " + list_str(w.dilation, n));
    if (!allow_dilation && w.dilation[i] != 1)
      fail(ErrorKind::value, op + ": dilation: average pooling takes dilation 1 only, got " + list_str(w.dilation, n));
  }
  for (int i = 0; i < n; ++i)
    if (w.padding[i] > w.kernel[i] / 2) {
      i64 half[kAxes];
      for (int j = 0; j < n; ++j) half[j] = w.kernel[j] / 2;
      fail(ErrorKind::value, op + ": padding: expected at most half the kernel (" + list_str(half, n) + " for kernel " +
                                 list_str(w.kernel, n) + "), got " + list_str(w.padding, n));
    }
  for (int i = 0; i < n; ++i) {
    const int a = kAxes - n + i;
    g.kernel[a] = w.kernel[i];
    g.stride[a] = w.stride[i];
    g.pad[a] = w.padding[i];
    g.dilation[a] = w.dilation[i];
    const std::string what = op + ": the window size along spatial axis " + std::to_string(i);
    const i64 extent = checked_add(checked_mul(w.dilation[i], w.kernel[i] - 1, what), 1, what);
    const i64 padded = checked_add(g.in[a], checked_mul(2, w.padding[i], what), what);
    if (extent > padded)
      fail(ErrorKind::shape, op + ": kernel: the window (extent " + std::to_string(extent) + " along spatial axis " +
                                 std::to_string(i) + ") is larger than the padded input (size " +
                                 std::to_string(padded) + "), so the output size would be < 1");
    // torch's rule: floor or ceil of (padded - extent) / stride, plus one; in ceil mode the
    // last window must start inside the input or its left padding.
    const i64 span = padded - extent;
    i64 out = (w.ceil_mode ? span / w.stride[i] + (span % w.stride[i] != 0) : span / w.stride[i]) + 1;
    // (out - 1) * stride >= in + padding, without a product that could overflow:
    if (w.ceil_mode && out - 1 > (g.in[a] + w.padding[i] - 1) / w.stride[i]) --out;
    g.out[a] = out;
  }
}

i64 checked_outputs(const Geometry& g, const std::string& op) {
  const std::string what = op + ": the number of output elements";
  i64 n = checked_mul(g.batch, g.channels, what);
  for (int a = 0; a < kAxes; ++a) n = checked_mul(n, g.out[a], what);
  return n;
}

// t: the pooled output (or its gradient) of x: the shape output_shape gives, x's dtype and device.
void check_pooled(const Tensor& t, const Tensor& x, const Geometry& g, int dims, PoolLayout layout, DType dtype,
                  const std::string& name, const std::string& what) {
  core::expect_same_device(t, x, name, "x");
  if (t.dtype != dtype)
    fail(ErrorKind::dtype, name + ": expected " + dtype_name(dtype) + (dtype == x.dtype && is_float(dtype) ? " (the dtype of x)" : "") +
                               ", got " + dtype_name(t.dtype));
  const PoolShape shape = output_shape(x, g, dims, layout);
  bool same = t.rank == shape.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == shape.dims[d];
  if (!same) {
    Tensor expected = x;
    for (int d = 0; d < shape.rank; ++d) expected.shape[d] = shape.dims[d];
    fail(ErrorKind::shape, name + ": expected shape " + expected.shape_str() + " (" + what + "), got " + t.shape_str());
  }
}

// Indices are int64 (torch's) or int32 (JAX's without x64), which must hold every flat index.
void check_index_dtype(const Tensor& t, const Geometry& g, const std::string& name) {
  if (t.dtype != DType::i64 && t.dtype != DType::i32)
    fail(ErrorKind::dtype, name + ": expected int64 or int32, got " + dtype_name(t.dtype));
  if (t.dtype == DType::i32 && g.in_plane() > INT32_MAX)
    fail(ErrorKind::dtype, name + ": int32 cannot hold the flat indices of an input plane of " +
                               std::to_string(g.in_plane()) + " elements; use int64");
}

// The strides and index type of an (optional) indices tensor; whether there is one.
bool read_indices(const Tensor* indices, int dims, PoolLayout layout, Strides& strides, bool& i32) {
  if (!indices) return false;
  strides = strides_of(*indices, dims, layout);
  i32 = indices->dtype == DType::i32;
  return true;
}

ForwardProblem forward_problem(const Geometry& g, int dims, PoolLayout layout, const Tensor& x, const Tensor& y,
                               const Tensor* indices) {
  ForwardProblem p;
  p.g = g;
  p.x = strides_of(x, dims, layout);
  p.y = strides_of(y, dims, layout);
  p.has_indices = read_indices(indices, dims, layout, p.indices, p.indices_i32);
  p.channels_last = g.channels > 1 && p.y.c == 1;
  return p;
}

void check_forward_outputs(const Geometry& g, int dims, PoolLayout layout, const Tensor& x, const Tensor& y,
                           const Tensor* indices, const std::string& op) {
  check_pooled(y, x, g, dims, layout, x.dtype, op + ": y", "the pooled shape of x");
  core::expect_data(y, op + ": y");
  if (indices) {
    check_index_dtype(*indices, g, op + ": indices");
    check_pooled(*indices, x, g, dims, layout, indices->dtype, op + ": indices", "the shape of y");
    core::expect_data(*indices, op + ": indices");
  }
  core::expect_outputs_apart({{y, op + ": y"}, {indices, op + ": indices"}}, {{x, op + ": x"}});
}

Geometry fixed_geometry(const PoolWindow& w, PoolLayout layout, const Tensor& x, bool max, const std::string& op,
                        const std::string& x_name) {
  check_dims(w.dims, op);
  Geometry g;
  g.max = max;
  g.rule = WindowRule::fixed;
  check_float_input(x, w.dims, layout, op + ": " + x_name, g);
  read_window(w, max, op, g);
  checked_outputs(g, op);
  return g;
}

void read_divisor(const AvgPoolDivisor& d, const std::string& op, Geometry& g) {
  if (d.has_divisor_override && d.divisor_override == 0)
    fail(ErrorKind::value, op + ": divisor_override: expected a nonzero integer or None, got 0");
  g.count_include_pad = d.count_include_pad;
  g.divisor_override = d.has_divisor_override ? d.divisor_override : 0;
}

Geometry adaptive_geometry(AdaptivePoolKind kind, int dims, const i64* output_size, PoolLayout layout,
                           const Tensor& x, const std::string& op, const std::string& x_name) {
  check_dims(dims, op);
  Geometry g;
  g.rule = WindowRule::adaptive;
  g.max = kind == AdaptivePoolKind::max;
  check_float_input(x, dims, layout, op + ": " + x_name, g);
  for (int i = 0; i < dims; ++i)
    if (output_size[i] < 0)
      fail(ErrorKind::value, op + ": output_size: expected values >= 0, got " + list_str(output_size, dims));
  for (int i = 0; i < dims; ++i) {
    const int a = kAxes - dims + i;
    g.out[a] = output_size[i];
    // The window bounds compute (o + 1) * in + out - 1 and (p + 1) * out + in - 1, both below
    // (out + 1) * (in + 1).
    const std::string what = op + ": output_size * input size along spatial axis " + std::to_string(i);
    checked_mul(checked_add(g.out[a], 1, what), checked_add(g.in[a], 1, what), what);
  }
  checked_outputs(g, op);
  return g;
}

const char* adaptive_name(AdaptivePoolKind kind) {
  return kind == AdaptivePoolKind::max ? "adaptive_max_pool" : "adaptive_avg_pool";
}

BackwardProblem backward_problem(const Geometry& g, int dims, PoolLayout layout, const Tensor& dy, const Tensor& dx,
                                 const Tensor* indices) {
  BackwardProblem p;
  p.g = g;
  p.dy = strides_of(dy, dims, layout);
  p.dx = strides_of(dx, dims, layout);
  read_indices(indices, dims, layout, p.indices, p.indices_i32);
  p.channels_last = g.channels > 1 && p.dx.c == 1;
  return p;
}

// dx of a backward pass: dy's dtype and device, x's shape (x: null when dx stands for x_shape),
// apart from the inputs.
void check_dx(const Tensor& dx, const Tensor* x, const Tensor& dy, const Tensor* indices, const std::string& op) {
  core::expect_same_device(dx, dy, op + ": dx", "dy");
  core::expect_dtype_of(dx, dy, op + ": dx", "dy");
  if (x) core::expect_same_shape(dx, *x, op + ": dx", "x");
  core::expect_data(dx, op + ": dx");
  core::expect_outputs_apart({{dx, op + ": dx"}}, {{dy, op + ": dy"}, {x, op + ": x"}, {indices, op + ": indices"}});
}

void check_indices_like(const Tensor& indices, const Tensor& dy, const Geometry& g, const std::string& op) {
  core::expect_same_device(indices, dy, op + ": indices", "dy");
  check_index_dtype(indices, g, op + ": indices");
  core::expect_same_shape(indices, dy, op + ": indices", "dy");
}

}  // namespace

PoolShape output_shape(const Tensor& x, const Geometry& g, int dims, PoolLayout layout) {
  const AxisMap m = axis_map(x.rank, dims, layout);
  PoolShape s;
  s.rank = x.rank;
  for (int d = 0; d < x.rank; ++d) s.dims[d] = x.shape[d];
  for (int i = 0; i < dims; ++i) s.dims[m.sp[i]] = g.out[kAxes - dims + i];
  return s;
}

ForwardProblem validate_max_pool(const MaxPoolArgs& a, bool check_outputs) {
  const std::string op = "max_pool";
  const Geometry g = fixed_geometry(a.window, a.layout, a.x, true, op, "x");
  if (check_outputs) check_forward_outputs(g, a.window.dims, a.layout, a.x, a.y, a.indices, op);
  return forward_problem(g, a.window.dims, a.layout, a.x, check_outputs ? a.y : a.x,
                         check_outputs ? a.indices : nullptr);
}

ForwardProblem validate_avg_pool(const AvgPoolArgs& a, bool check_outputs) {
  const std::string op = "avg_pool";
  Geometry g = fixed_geometry(a.window, a.layout, a.x, false, op, "x");
  read_divisor(a.divisor, op, g);
  if (check_outputs) check_forward_outputs(g, a.window.dims, a.layout, a.x, a.y, nullptr, op);
  return forward_problem(g, a.window.dims, a.layout, a.x, check_outputs ? a.y : a.x, nullptr);
}

ForwardProblem validate_adaptive_pool(const AdaptivePoolArgs& a, bool check_outputs) {
  const std::string op = adaptive_name(a.kind);
  const Geometry g = adaptive_geometry(a.kind, a.dims, a.output_size, a.layout, a.x, op, "x");
  if (a.indices && a.kind != AdaptivePoolKind::max)
    fail(ErrorKind::value, op + ": indices: only adaptive max pooling returns indices");
  if (check_outputs) check_forward_outputs(g, a.dims, a.layout, a.x, a.y, a.indices, op);
  return forward_problem(g, a.dims, a.layout, a.x, check_outputs ? a.y : a.x, check_outputs ? a.indices : nullptr);
}

BackwardProblem validate_max_pool_backward(const MaxPoolBackwardArgs& a) {
  const std::string op = "max_pool_backward";
  const int dims = a.window.dims;
  const Geometry g = fixed_geometry(a.window, a.layout, a.x, true, op, "x");
  check_pooled(a.dy, a.x, g, dims, a.layout, a.x.dtype, op + ": dy", "the output of max_pool for x");
  check_indices_like(a.indices, a.dy, g, op);
  check_dx(a.dx, &a.x, a.dy, &a.indices, op);
  return backward_problem(g, dims, a.layout, a.dy, a.dx, &a.indices);
}

BackwardProblem validate_avg_pool_backward(const AvgPoolBackwardArgs& a) {
  const std::string op = "avg_pool_backward";
  const int dims = a.window.dims;
  check_dims(dims, op);
  core::expect_float(a.dy, op + ": dy");
  // dx carries x_shape; its dtype must be dy's.
  Geometry g = fixed_geometry(a.window, a.layout, a.dx, false, op, "x_shape");
  read_divisor(a.divisor, op, g);
  check_pooled(a.dy, a.dx, g, dims, a.layout, a.dx.dtype, op + ": dy", "the output of avg_pool for x_shape");
  check_dx(a.dx, nullptr, a.dy, nullptr, op);
  return backward_problem(g, dims, a.layout, a.dy, a.dx, nullptr);
}

BackwardProblem validate_adaptive_pool_backward(const AdaptivePoolBackwardArgs& a) {
  const bool max = a.kind == AdaptivePoolKind::max;
  const std::string op = std::string(adaptive_name(a.kind)) + "_backward";
  check_dims(a.dims, op);
  if (max != bool(a.x) || max != bool(a.indices))
    fail(ErrorKind::value, op + ": x and indices are given for adaptive max pooling only (and then both)");
  core::expect_float(a.dy, op + ": dy");
  const Tensor& input = max ? *a.x : a.dx;
  const std::string input_name = max ? "x" : "x_shape";
  Geometry probe;
  check_float_input(input, a.dims, a.layout, op + ": " + input_name, probe);
  if (a.dy.rank != input.rank)
    fail(ErrorKind::shape, op + ": dy: expected " + std::to_string(input.rank) + " axes like " + input_name + " " +
                               input.shape_str() + ", got shape " + a.dy.shape_str());
  // The output size is dy's (it may be 0 along an axis).
  const AxisMap m = axis_map(a.dy.rank, a.dims, a.layout);
  i64 output_size[kAxes] = {1, 1, 1};
  for (int i = 0; i < a.dims; ++i) output_size[i] = a.dy.shape[m.sp[i]];
  const Geometry g = adaptive_geometry(a.kind, a.dims, output_size, a.layout, input, op, input_name);
  check_pooled(a.dy, input, g, a.dims, a.layout, input.dtype, op + ": dy",
               "the batch and channels of " + input_name + ", any output size");
  if (max) check_indices_like(*a.indices, a.dy, g, op);
  check_dx(a.dx, a.x, a.dy, a.indices, op);
  return backward_problem(g, a.dims, a.layout, a.dy, a.dx, a.indices);
}

}  // namespace rudnn::pooling
