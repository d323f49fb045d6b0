// Every check of the norm/softmax family, run once before either backend.
#include <string>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "norm/problem.hpp"

namespace rudnn::norm {

using core::fail;

namespace {

const char* op_name(NormKind kind) { return kind == NormKind::layer ? "layer_norm" : "rms_norm"; }

// x: float tensor of rank >= 1 with a non-empty, contiguous last axis.
void check_rows_input(const Tensor& x, const std::string& name) {
  core::expect_float(x, name);
  if (x.rank < 1) fail(ErrorKind::shape, name + ": expected at least one axis, got a scalar");
  if (x.shape[x.rank - 1] < 1)
    fail(ErrorKind::shape, name + ": the last axis must have size >= 1, got shape " + x.shape_str());
  core::expect_last_dim_contiguous(x, name);
}

// A tensor that must look exactly like x (same shape, dtype, device; last axis dense).
void check_like(const Tensor& t, const Tensor& x, const std::string& name, const std::string& x_name) {
  core::expect_same_device(t, x, name, x_name);
  if (t.dtype != x.dtype)
    fail(ErrorKind::dtype, name + ": expected the dtype of " + x_name + " (" + dtype_name(x.dtype) + "), got " +
                               dtype_name(t.dtype));
  core::expect_same_shape(t, x, name, x_name);
  core::expect_last_dim_contiguous(t, name);
}

// weight / bias: dense [H], float32 or x's dtype; both of one dtype.
void check_param(const Tensor& t, const Tensor& x, const std::string& name) {
  core::expect_same_device(t, x, name, "x");
  const std::int64_t hidden = x.shape[x.rank - 1];
  if (t.rank != 1 || t.shape[0] != hidden)
    fail(ErrorKind::shape, name + ": expected shape [" + std::to_string(hidden) + "] (the last axis of x), got " +
                               t.shape_str());
  if (t.dtype != DType::f32 && t.dtype != x.dtype)
    fail(ErrorKind::dtype, name + ": expected float32 or the dtype of x (" + dtype_name(x.dtype) + "), got " +
                               dtype_name(t.dtype));
  core::expect_last_dim_contiguous(t, name);
}

DType param_dtype(const Tensor* weight, const Tensor* bias, const std::string& op) {
  if (weight && bias && weight->dtype != bias->dtype)
    fail(ErrorKind::dtype, op + ": weight and bias must have the same dtype, got " +
                               std::string(dtype_name(weight->dtype)) + " and " + dtype_name(bias->dtype));
  return weight ? weight->dtype : bias ? bias->dtype : DType::f32;
}

// mean / rstd: float32 with shape x.shape[:-1].
void check_stat(const Tensor& t, const Tensor& x, const std::string& name) {
  core::expect_same_device(t, x, name, "x");
  core::expect_dtype(t, DType::f32, name);
  bool same = t.rank == x.rank - 1;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == x.shape[d];
  if (!same) {
    Tensor lead = x;
    lead.rank = x.rank - 1;
    fail(ErrorKind::shape, name + ": expected shape " + lead.shape_str() + " (x.shape[:-1]), got " + t.shape_str());
  }
}

// A [H] float32 gradient output of a parameter.
void check_param_grad(const Tensor& t, const Tensor& x, const std::string& name) {
  core::expect_same_device(t, x, name, "x");
  core::expect_dtype(t, DType::f32, name);
  const std::int64_t hidden = x.shape[x.rank - 1];
  if (t.rank != 1 || t.shape[0] != hidden)
    fail(ErrorKind::shape, name + ": expected shape [" + std::to_string(hidden) + "], got " + t.shape_str());
  core::expect_last_dim_contiguous(t, name);
}

std::int64_t row_count(const Tensor& x) {
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < x.rank; ++d) rows *= x.shape[d];
  return rows;
}

}  // namespace

ForwardProblem validate_forward(const NormForwardArgs& a) {
  const std::string op = op_name(a.kind);
  check_rows_input(a.x, op + ": x");
  if (a.kind == NormKind::rms && a.bias) fail(ErrorKind::value, "rms_norm: bias is not supported (RMSNorm has no bias)");
  if (a.kind == NormKind::rms && a.mean) fail(ErrorKind::value, "rms_norm: there is no mean statistic");
  if (a.weight) check_param(*a.weight, a.x, op + ": weight");
  if (a.bias) check_param(*a.bias, a.x, op + ": bias");
  if (a.residual) check_like(*a.residual, a.x, op + ": residual", "x");
  if (bool(a.residual) != bool(a.residual_out))
    fail(ErrorKind::value, op + ": residual and residual_out must be given together");
  if (a.residual_out) check_like(*a.residual_out, a.x, op + ": residual_out", "x");
  core::expect_positive_finite(a.eps, op + ": eps");
  check_like(a.y, a.x, op + ": out", "x");
  if (a.mean) check_stat(*a.mean, a.x, op + ": mean");
  if (a.rstd) check_stat(*a.rstd, a.x, op + ": rstd");
  core::expect_outputs_apart({{a.y, op + ": out"}, {a.residual_out, op + ": residual_out"}, {a.mean, op + ": mean"},
                              {a.rstd, op + ": rstd"}},
                             {{a.x, op + ": x", a.residual ? core::InPlace::refused : core::InPlace::allowed},
                              {a.weight, op + ": weight"}, {a.bias, op + ": bias"}, {a.residual, op + ": residual"}});

  ForwardProblem p;
  p.rows = row_count(a.x);
  p.hidden = a.x.shape[a.x.rank - 1];
  p.param_dtype = param_dtype(a.weight, a.bias, op);
  const int lead = a.x.rank - 1;
  p.x = core::make_row_indexer(a.x, lead);
  p.y = core::make_row_indexer(a.y, lead);
  if (a.residual) p.residual = core::make_row_indexer(*a.residual, lead);
  if (a.residual_out) p.residual_out = core::make_row_indexer(*a.residual_out, lead);
  if (a.mean) p.mean = core::make_row_indexer(*a.mean, lead);
  if (a.rstd) p.rstd = core::make_row_indexer(*a.rstd, lead);
  return p;
}

BackwardProblem validate_backward(const NormBackwardArgs& a) {
  const std::string op = std::string(op_name(a.kind)) + "_backward";
  check_rows_input(a.x, op + ": x");
  check_like(a.dy, a.x, op + ": dy", "x");
  if (a.weight) check_param(*a.weight, a.x, op + ": weight");
  if (a.kind == NormKind::layer && !a.mean) fail(ErrorKind::value, op + ": mean is required");
  if (a.kind == NormKind::rms && a.mean) fail(ErrorKind::value, op + ": there is no mean statistic");
  if (a.mean) check_stat(*a.mean, a.x, op + ": mean");
  check_stat(a.rstd, a.x, op + ": rstd");
  check_like(a.dx, a.x, op + ": dx", "x");
  if (a.dweight) {
    if (!a.weight) fail(ErrorKind::value, op + ": dweight requested but weight is None");
    check_param_grad(*a.dweight, a.x, op + ": dweight");
  }
  if (a.dbias) {
    if (a.kind == NormKind::rms) fail(ErrorKind::value, op + ": there is no bias gradient");
    check_param_grad(*a.dbias, a.x, op + ": dbias");
  }
  if (a.workspace) {
    core::expect_same_device(*a.workspace, a.x, op + ": workspace", "x");
    core::expect_dtype(*a.workspace, DType::u8, op + ": workspace");
  }
  core::expect_outputs_apart({{a.dx, op + ": dx"}, {a.dweight, op + ": dweight"}, {a.dbias, op + ": dbias"},
                              {a.workspace, op + ": workspace"}},
                             {{a.x, op + ": x"}, {a.dy, op + ": dy"}, {a.weight, op + ": weight"},
                              {a.mean, op + ": mean"}, {a.rstd, op + ": rstd"}});

  BackwardProblem p;
  p.rows = row_count(a.x);
  p.hidden = a.x.shape[a.x.rank - 1];
  p.param_dtype = param_dtype(a.weight, nullptr, op);
  const int lead = a.x.rank - 1;
  p.x = core::make_row_indexer(a.x, lead);
  p.dy = core::make_row_indexer(a.dy, lead);
  p.dx = core::make_row_indexer(a.dx, lead);
  if (a.mean) p.mean = core::make_row_indexer(*a.mean, lead);
  p.rstd = core::make_row_indexer(a.rstd, lead);
  return p;
}

SoftmaxProblem validate_softmax_forward(const Tensor& x, const Tensor& y) {
  check_rows_input(x, "softmax: x");
  check_like(y, x, "softmax: out", "x");
  core::expect_outputs_apart({{y, "softmax: out"}}, {{x, "softmax: x", core::InPlace::allowed}});
  SoftmaxProblem p;
  p.rows = row_count(x);
  p.hidden = x.shape[x.rank - 1];
  p.a = core::make_row_indexer(x, x.rank - 1);
  p.out = core::make_row_indexer(y, x.rank - 1);
  return p;
}

SoftmaxProblem validate_softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx) {
  check_rows_input(y, "softmax_backward: y");
  check_like(dy, y, "softmax_backward: dy", "y");
  check_like(dx, y, "softmax_backward: dx", "y");
  core::expect_outputs_apart({{dx, "softmax_backward: dx"}}, {{dy, "softmax_backward: dy"}, {y, "softmax_backward: y"}});
  SoftmaxProblem p;
  p.rows = row_count(y);
  p.hidden = y.shape[y.rank - 1];
  p.a = core::make_row_indexer(dy, y.rank - 1);
  p.b = core::make_row_indexer(y, y.rank - 1);
  p.out = core::make_row_indexer(dx, y.rank - 1);
  return p;
}

}  // namespace rudnn::norm
