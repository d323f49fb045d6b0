// Every check of the MoE family, run once before either backend. Messages start with the
// Python name of the operation ("moe.route: top_k: ...").
#include <cmath>
#include <string>
#include <vector>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "moe/problem.hpp"

namespace rudnn::moe {

using core::fail;

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

std::string shape_of(std::int64_t a, std::int64_t b) { return "[" + str(a) + ", " + str(b) + "]"; }
std::string shape_of(std::int64_t a, std::int64_t b, std::int64_t c) {
  return "[" + str(a) + ", " + str(b) + ", " + str(c) + "]";
}

// A rank-2 array with a dense last axis.
void expect_matrix(const Tensor& t, const std::string& name) {
  if (t.rank != 2) fail(ErrorKind::shape, name + ": expected 2 axes, got shape " + t.shape_str());
  core::expect_last_dim_contiguous(t, name);
}

void expect_shape(const Tensor& t, const std::string& expected, const std::string& what, const std::string& name) {
  if (t.shape_str() != expected)
    fail(ErrorKind::shape, name + ": expected shape " + expected + " (" + what + "), got " + t.shape_str());
}

// Outputs and index arrays written or read as flat arrays must be dense.
void expect_dense(const Tensor& t, const std::string& name) {
  if (t.numel() > 0 && !t.is_contiguous()) fail(ErrorKind::shape, name + ": expected a dense (contiguous) array");
}

void expect_index_dtype(const Tensor& t, const std::string& name) {
  if (t.dtype != DType::u32 && t.dtype != DType::i32 && t.dtype != DType::i64)
    fail(ErrorKind::dtype, name + ": expected uint32, int32 or int64, got " + dtype_name(t.dtype));
}

void expect_like_dtype(const Tensor& t, DType dtype, const std::string& name, const std::string& ref) {
  if (t.dtype != dtype)
    fail(ErrorKind::dtype, name + ": expected the dtype of " + ref + " (" + dtype_name(dtype) + "), got " +
                               dtype_name(t.dtype));
}

// An output array: same device as `ref`, given dtype, exact shape, dense.
void check_output(const Tensor& t, const Tensor& ref, const std::string& ref_name, DType dtype,
                  const std::string& shape, const std::string& what, const std::string& name) {
  core::expect_same_device(t, ref, name, ref_name);
  core::expect_dtype(t, dtype, name);
  expect_shape(t, shape, what, name);
  expect_dense(t, name);
}

// logits [T, E]: float, rank 2, E >= 1, dense last axis.
void check_logits(const Tensor& logits, const std::string& name) {
  core::expect_float(logits, name);
  expect_matrix(logits, name);
  if (logits.shape[1] < 1) fail(ErrorKind::shape, name + ": expected at least one expert (E >= 1), got shape " +
                                                    logits.shape_str());
}

void check_experts_limit(std::int64_t experts, const std::string& op) {
  if (experts > kMoeMaxExperts)
    fail(ErrorKind::unsupported, op + ": at most " + str(kMoeMaxExperts) + " experts are supported, got E = " +
                                     str(experts));
}

void check_top_k(int top_k, std::int64_t limit, const std::string& limit_name, const std::string& op) {
  if (top_k < 1 || top_k > limit)
    fail(ErrorKind::value, op + ": top_k: expected 1 <= top_k <= " + limit_name + " (" + str(limit) + "), got " +
                               str(top_k));
  if (top_k > kMoeMaxTopK)
    fail(ErrorKind::unsupported, op + ": top_k: at most " + str(kMoeMaxTopK) + " is supported, got " + str(top_k));
}

void check_route_outputs(const Tensor& logits, const Tensor& indices, const Tensor& weights, int top_k,
                         const std::string& op) {
  const std::string shape = shape_of(logits.shape[0], top_k);
  check_output(indices, logits, "logits", DType::u32, shape, "[T, top_k]", op + ": expert_indices");
  core::expect_same_device(weights, logits, op + ": weights", "logits");
  expect_like_dtype(weights, logits.dtype, op + ": weights", "logits");
  expect_shape(weights, shape, "[T, top_k]", op + ": weights");
  expect_dense(weights, op + ": weights");
}

void check_scale(float scale, const std::string& op) { core::expect_positive_finite(scale, op + ": scale"); }

// indices [T, k] of any index dtype, k >= 1, matching the tokens of `logits` when given.
void check_indices(const Tensor& indices, const Tensor& ref, const std::string& ref_name, const std::string& name) {
  core::expect_same_device(indices, ref, name, ref_name);
  expect_index_dtype(indices, name);
  expect_matrix(indices, name);
  if (indices.shape[1] < 1) fail(ErrorKind::shape, name + ": expected at least one slot (k >= 1), got shape " +
                                                     indices.shape_str());
}

// A read-only matrix input of a given shape and dtype on ref's device.
void check_input_matrix(const Tensor& t, const Tensor& ref, const std::string& ref_name, DType dtype,
                        const std::string& dtype_ref, const std::string& shape, const std::string& what,
                        const std::string& name) {
  core::expect_same_device(t, ref, name, ref_name);
  expect_like_dtype(t, dtype, name, dtype_ref);
  expect_matrix(t, name);
  expect_shape(t, shape, what, name);
}

std::int64_t row_stride(const Tensor& t) { return t.rank == 2 ? t.strides[0] : 0; }

}  // namespace

std::int64_t read_index(const Tensor& t, std::int64_t offset) {
  switch (t.dtype) {
    case DType::u32: return std::int64_t(t.ptr<std::uint32_t>()[offset]);
    case DType::i32: return std::int64_t(t.ptr<std::int32_t>()[offset]);
    case DType::i64: return t.ptr<std::int64_t>()[offset];
    default: fail(ErrorKind::dtype, "internal: not an index dtype");
  }
}

RouteProblem validate_route(const MoeRouteArgs& a) {
  const std::string op = "moe.route";
  check_logits(a.logits, op + ": logits");
  check_experts_limit(a.logits.shape[1], op);
  check_top_k(a.top_k, a.logits.shape[1], "E", op);
  check_route_outputs(a.logits, a.expert_indices, a.weights, a.top_k, op);
  core::expect_outputs_apart({{a.expert_indices, op + ": expert_indices"}, {a.weights, op + ": weights"}},
                             {{a.logits, op + ": logits"}});
  RouteProblem p;
  p.tokens = a.logits.shape[0];
  p.experts = int(a.logits.shape[1]);
  p.top_k = a.top_k;
  p.logits_stride = row_stride(a.logits);
  p.renormalize = a.renormalize;
  return p;
}

RouteProblem validate_route_sigmoid_grouped(const MoeRouteSigmoidGroupedArgs& a) {
  const std::string op = "moe.route_sigmoid_grouped";
  check_logits(a.logits, op + ": logits");
  const std::int64_t E = a.logits.shape[1];
  check_experts_limit(E, op);
  if (a.bias) {
    core::expect_same_device(*a.bias, a.logits, op + ": bias", "logits");
    core::expect_dtype(*a.bias, DType::f32, op + ": bias");
    if (a.bias->rank != 1 || a.bias->shape[0] != E)
      fail(ErrorKind::shape, op + ": bias: expected shape [" + str(E) + "] (the experts of logits), got " +
                                 a.bias->shape_str());
    core::expect_last_dim_contiguous(*a.bias, op + ": bias");
  }
  if (a.groups < 1 || a.groups > kMoeMaxGroups)
    fail(ErrorKind::value, op + ": groups: expected 1 <= groups <= " + str(kMoeMaxGroups) + ", got " + str(a.groups));
  if (E % a.groups != 0)
    fail(ErrorKind::value, op + ": groups: expected a divisor of the number of experts (" + str(E) + "), got " +
                               str(a.groups));
  if (a.selected_groups < 1 || a.selected_groups > a.groups)
    fail(ErrorKind::value, op + ": selected_groups: expected 1 <= selected_groups <= groups (" + str(a.groups) +
                               "), got " + str(a.selected_groups));
  const std::int64_t per_group = E / a.groups;
  if (a.group_top_two && per_group < 2)
    fail(ErrorKind::value, op + ": group_top_two needs at least 2 experts per group, got " + str(per_group) +
                               " (E = " + str(E) + ", groups = " + str(a.groups) + ")");
  check_top_k(a.top_k, per_group * a.selected_groups, "the experts in the kept groups", op);
  check_scale(a.scale, op);
  check_route_outputs(a.logits, a.expert_indices, a.weights, a.top_k, op);
  core::expect_outputs_apart({{a.expert_indices, op + ": expert_indices"}, {a.weights, op + ": weights"}},
                             {{a.logits, op + ": logits"}, {a.bias, op + ": bias"}});
  RouteProblem p;
  p.tokens = a.logits.shape[0];
  p.experts = int(E);
  p.top_k = a.top_k;
  p.logits_stride = row_stride(a.logits);
  p.groups = a.groups;
  p.selected_groups = a.selected_groups;
  p.group_top_two = a.group_top_two;
  p.renormalize = a.renormalize;
  p.scale = a.scale;
  return p;
}

DispatchPlanProblem validate_dispatch_plan(const MoeDispatchPlanArgs& a) {
  const std::string op = "moe.dispatch";
  const Tensor& idx = a.expert_indices;
  check_indices(idx, idx, "expert_indices", op + ": expert_indices");
  if (a.num_experts < 1)
    fail(ErrorKind::value, op + ": num_experts: expected >= 1, got " + str(a.num_experts));
  check_experts_limit(a.num_experts, op);
  const std::int64_t T = idx.shape[0], k = idx.shape[1];
  if (T * k >= (std::int64_t(1) << 31))
    fail(ErrorKind::unsupported, op + ": at most 2^31 - 1 (token, slot) pairs are supported, got " + str(T * k));
  // Host ids are checked here (SPEC section 4: no token is dropped); device ids are not read on
  // the host, and a slot whose id is out of range gets no row there (token_of_row -1).
  if (!idx.device.is_cuda())
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < k; ++j)
        if (const std::int64_t e = read_index(idx, t * row_stride(idx) + j); e < 0 || e >= a.num_experts)
          fail(ErrorKind::value, op + ": expert_indices[" + str(t) + ", " + str(j) + "]: expected an expert id in [0, " +
                                     str(a.num_experts) + "), got " + str(e));
  check_output(a.offsets, idx, "expert_indices", DType::i32, "[" + str(a.num_experts + 1) + "]", "[E + 1]",
               op + ": offsets");
  check_output(a.token_of_row, idx, "expert_indices", DType::i32, "[" + str(T * k) + "]", "[T * k]",
               op + ": token_of_row");
  check_output(a.row_of_slot, idx, "expert_indices", DType::i32, shape_of(T, k), "[T, k]", op + ": row_of_slot");
  if (a.workspace) {
    core::expect_same_device(*a.workspace, idx, op + ": workspace", "expert_indices");
    core::expect_dtype(*a.workspace, DType::u8, op + ": workspace");
  }
  core::expect_outputs_apart({{a.offsets, op + ": offsets"}, {a.token_of_row, op + ": token_of_row"},
                              {a.row_of_slot, op + ": row_of_slot"}, {a.workspace, op + ": workspace"}},
                             {{idx, op + ": expert_indices"}});
  DispatchPlanProblem p;
  p.tokens = T;
  p.top_k = int(k);
  p.experts = a.num_experts;
  p.index_stride = row_stride(idx);
  return p;
}

GatherProblem validate_gather_rows(const Tensor& x, const Tensor& token_of_row, const Tensor& out) {
  const std::string op = "moe.dispatch";
  core::expect_float(x, op + ": x");
  expect_matrix(x, op + ": x");
  core::expect_same_device(token_of_row, x, op + ": token_of_row", "x");
  core::expect_dtype(token_of_row, DType::i32, op + ": token_of_row");
  if (token_of_row.rank != 1)
    fail(ErrorKind::shape, op + ": token_of_row: expected 1 axis, got shape " + token_of_row.shape_str());
  expect_dense(token_of_row, op + ": token_of_row");
  const std::int64_t N = token_of_row.shape[0], H = x.shape[1];
  core::expect_same_device(out, x, op + ": out", "x");
  expect_like_dtype(out, x.dtype, op + ": out", "x");
  expect_matrix(out, op + ": out");
  expect_shape(out, shape_of(N, H), "[N, H]", op + ": out");
  core::expect_outputs_apart({{out, op + ": out"}}, {{x, op + ": x"}, {token_of_row, op + ": token_of_row"}});
  GatherProblem p;
  p.tokens = x.shape[0];
  p.rows = N;
  p.hidden = H;
  p.x_stride = row_stride(x);
  p.out_stride = row_stride(out);
  return p;
}

namespace {

// The shared part of combine and its backward: y [N, H], row_of_slot [T, k], weights [T, k].
CombineProblem check_combine_common(const Tensor& y, const Tensor& row_of_slot, const Tensor* weights,
                                    const std::string& op) {
  core::expect_float(y, op + ": y");
  expect_matrix(y, op + ": y");
  core::expect_same_device(row_of_slot, y, op + ": row_of_slot", "y");
  core::expect_dtype(row_of_slot, DType::i32, op + ": row_of_slot");
  if (row_of_slot.rank != 2)
    fail(ErrorKind::shape, op + ": row_of_slot: expected 2 axes, got shape " + row_of_slot.shape_str());
  expect_dense(row_of_slot, op + ": row_of_slot");
  if (!row_of_slot.device.is_cuda()) {  // host rows must name rows of y (device ones are not read here)
    const std::int32_t* r = row_of_slot.ptr<std::int32_t>();
    const std::int64_t slots = row_of_slot.shape[0] * row_of_slot.shape[1], k = row_of_slot.shape[1];
    for (std::int64_t i = 0; i < slots; ++i)
      if (r[i] < 0 || r[i] >= y.shape[0])
        fail(ErrorKind::value, op + ": row_of_slot[" + str(i / k) + ", " + str(i % k) + "]: expected a row of y in [0, " +
                                   str(y.shape[0]) + "), got " + str(r[i]));
  }
  CombineProblem p;
  p.tokens = row_of_slot.shape[0];
  p.top_k = int(row_of_slot.shape[1]);
  p.rows = y.shape[0];
  p.hidden = y.shape[1];
  p.y_stride = row_stride(y);
  if (weights) {
    core::expect_same_device(*weights, y, op + ": weights", "y");
    core::expect_float(*weights, op + ": weights");
    expect_matrix(*weights, op + ": weights");
    expect_shape(*weights, shape_of(p.tokens, p.top_k), "[T, k] like row_of_slot", op + ": weights");
    p.weight_stride = row_stride(*weights);
    p.has_weights = true;
  }
  return p;
}

}  // namespace

CombineProblem validate_combine(const MoeCombineArgs& a) {
  const std::string op = a.weights ? "moe.combine" : "moe.dispatch_backward";
  CombineProblem p = check_combine_common(a.y, a.row_of_slot, a.weights, op);
  core::expect_same_device(a.out, a.y, op + ": out", "y");
  expect_like_dtype(a.out, a.y.dtype, op + ": out", "y");
  expect_matrix(a.out, op + ": out");
  expect_shape(a.out, shape_of(p.tokens, p.hidden), "[T, H]", op + ": out");
  core::expect_outputs_apart({{a.out, op + ": out"}},
                             {{a.y, op + ": y"}, {a.row_of_slot, op + ": row_of_slot"}, {a.weights, op + ": weights"}});
  p.out_stride = row_stride(a.out);
  return p;
}

CombineProblem validate_combine_backward(const MoeCombineBackwardArgs& a) {
  const std::string op = "moe.combine_backward";
  CombineProblem p = check_combine_common(a.y, a.row_of_slot, &a.weights, op);
  // dy[r] is written (not accumulated) by the one slot that names row r, so host rows must be
  // distinct, as a dispatch makes them (two slots on one row would need the sum of both
  // gradients). Device rows are not read on the host; there distinct rows are the caller's
  // promise (see DispatchedTokens.combine_backward).
  if (!a.row_of_slot.device.is_cuda()) {
    const std::int32_t* r = a.row_of_slot.ptr<std::int32_t>();
    const std::int64_t k = p.top_k;
    std::vector<std::int64_t> slot_of_row(std::size_t(p.rows), -1);
    for (std::int64_t i = 0; i < p.tokens * k; ++i) {
      std::int64_t& first = slot_of_row[std::size_t(r[i])];
      if (first >= 0)
        fail(ErrorKind::value, op + ": row_of_slot[" + str(i / k) + ", " + str(i % k) + "]: row " + str(r[i]) +
                                   " of y is already named by row_of_slot[" + str(first / k) + ", " +
                                   str(first % k) + "] (the rows of a dispatch are distinct)");
      first = i;
    }
  }
  check_input_matrix(a.dout, a.y, "y", a.y.dtype, "y", shape_of(p.tokens, p.hidden), "[T, H]", op + ": dout");
  core::expect_same_device(a.dy, a.y, op + ": dy", "y");
  expect_like_dtype(a.dy, a.y.dtype, op + ": dy", "y");
  expect_matrix(a.dy, op + ": dy");
  expect_shape(a.dy, shape_of(p.rows, p.hidden), "[N, H] like y", op + ": dy");
  check_output(a.dweights, a.y, "y", DType::f32, shape_of(p.tokens, p.top_k), "[T, k]", op + ": dweights");
  core::expect_outputs_apart({{a.dy, op + ": dy"}, {a.dweights, op + ": dweights"}},
                             {{a.y, op + ": y"}, {a.dout, op + ": dout"}, {a.row_of_slot, op + ": row_of_slot"},
                              {a.weights, op + ": weights"}});
  p.dout_stride = row_stride(a.dout);
  p.dy_stride = row_stride(a.dy);
  return p;
}

namespace {

// Host offsets partition the N rows of x: offsets[0] = 0, non-decreasing, offsets[E] = N.
// (Device offsets are not read on the host; their kernels clamp them, and rows that no
// segment covers are written zero: zero_uncovered_rows_cuda in dispatch_cuda.cu.)
void check_host_offsets(const Tensor& offsets, std::int64_t rows, const std::string& op) {
  const std::int32_t* o = offsets.ptr<std::int32_t>();
  const std::int64_t E = offsets.shape[0] - 1;
  const std::string name = op + ": offsets[";
  if (o[0] != 0) fail(ErrorKind::value, name + "0]: expected 0 (the first row), got " + str(o[0]));
  for (std::int64_t e = 1; e <= E; ++e)
    if (o[e] < o[e - 1])
      fail(ErrorKind::value, name + str(e) + "]: expected >= offsets[" + str(e - 1) + "] = " + str(o[e - 1]) +
                                 " (offsets do not decrease), got " + str(o[e]));
  if (o[E] != rows)
    fail(ErrorKind::value, name + str(E) + "]: expected " + str(rows) + " (every row of x belongs to an expert), got " +
                               str(o[E]));
}

// x [N, H], offsets [E+1], gate/up [E, I, H], down [E, H, I].
ExpertsProblem check_experts_common(const Tensor& x, const Tensor& offsets, const Tensor& gate, const Tensor& up,
                                    const Tensor& down, const std::string& op, bool read_offsets) {
  core::expect_float(x, op + ": x");
  expect_matrix(x, op + ": x");
  core::expect_float(gate, op + ": gate");
  if (gate.rank != 3) fail(ErrorKind::shape, op + ": gate: expected 3 axes [E, I, H], got shape " + gate.shape_str());
  const std::int64_t E = gate.shape[0], I = gate.shape[1], H = gate.shape[2];
  if (E < 1 || I < 1 || H < 1)
    fail(ErrorKind::shape, op + ": gate: expected E, I, H >= 1, got shape " + gate.shape_str());
  for (const auto* w : {&gate, &up, &down}) {
    const std::string name = op + (w == &gate ? ": gate" : w == &up ? ": up" : ": down");
    core::expect_same_device(*w, x, name, "x");
    if (w != &gate) core::expect_float(*w, name);
    expect_like_dtype(*w, x.dtype, name, "x");
    expect_dense(*w, name);
  }
  expect_shape(up, shape_of(E, I, H), "[E, I, H] like gate", op + ": up");
  expect_shape(down, shape_of(E, H, I), "[E, H, I]", op + ": down");
  if (x.shape[1] != H)
    fail(ErrorKind::shape, op + ": x: expected " + str(H) + " columns (H of the experts), got shape " +
                               x.shape_str());
  check_experts_limit(E, op);
  core::expect_same_device(offsets, x, op + ": offsets", "x");
  core::expect_dtype(offsets, DType::i32, op + ": offsets");
  expect_shape(offsets, "[" + str(E + 1) + "]", "[E + 1]", op + ": offsets");
  expect_dense(offsets, op + ": offsets");
  if (read_offsets && !offsets.device.is_cuda()) check_host_offsets(offsets, x.shape[0], op);
  ExpertsProblem p;
  p.rows = x.shape[0];
  p.experts = int(E);
  p.hidden = H;
  p.inter = I;
  p.x_stride = row_stride(x);
  return p;
}

void check_pre(const Tensor& t, const Tensor& x, const ExpertsProblem& p, const std::string& name) {
  check_output(t, x, "x", x.dtype, shape_of(p.rows, p.inter), "[N, I]", name);
}

void check_experts_workspace(const Tensor* w, const Tensor& x, const std::string& op) {
  if (!w) return;
  core::expect_same_device(*w, x, op + ": workspace", "x");
  core::expect_dtype(*w, DType::u8, op + ": workspace");
}

// The interleaved layout is made of whole blocks of kMoeGateUpBlock rows of gate and of up (the
// fused kernel computes h 64 columns per tile from one such pair).
void check_gate_up_blocks(std::int64_t inter, const std::string& name) {
  if (inter % kMoeGateUpBlock != 0)
    fail(ErrorKind::unsupported, name + ": the interleaved gate/up layout needs I to be a multiple of " +
                                     str(kMoeGateUpBlock) + ", got I = " + str(inter));
}

// gate_up [E, 2I, H] on ref's device in ref's dtype, dense.
void check_gate_up(const Tensor& gate_up, const Tensor& ref, const std::string& ref_name, std::int64_t experts,
                   std::int64_t inter, std::int64_t hidden, const std::string& name) {
  core::expect_same_device(gate_up, ref, name, ref_name);
  expect_like_dtype(gate_up, ref.dtype, name, ref_name);
  expect_shape(gate_up, shape_of(experts, 2 * inter, hidden), "[E, 2I, H]", name);
  expect_dense(gate_up, name);
}

}  // namespace

ExpertsProblem validate_experts_forward(const MoeExpertsForwardArgs& a, bool read_offsets) {
  const std::string op = a.gate_pre ? "SwiGluExperts.forward_dispatched_training" : "SwiGluExperts.forward_dispatched";
  ExpertsProblem p = check_experts_common(a.x, a.offsets, a.gate, a.up, a.down, op, read_offsets);
  core::expect_same_device(a.y, a.x, op + ": y", "x");
  expect_like_dtype(a.y, a.x.dtype, op + ": y", "x");
  expect_matrix(a.y, op + ": y");
  expect_shape(a.y, a.x.shape_str(), "[N, H] like x", op + ": y");
  if (bool(a.gate_pre) != bool(a.up_pre)) fail(ErrorKind::value, op + ": gate_pre and up_pre must be given together");
  if (a.gate_pre) check_pre(*a.gate_pre, a.x, p, op + ": gate_pre");
  if (a.up_pre) check_pre(*a.up_pre, a.x, p, op + ": up_pre");
  if (a.gate_up) {
    check_gate_up(*a.gate_up, a.x, "x", p.experts, p.inter, p.hidden, op + ": gate_up");
    check_gate_up_blocks(p.inter, op + ": gate_up");
  }
  check_experts_workspace(a.workspace, a.x, op);
  p.y_stride = row_stride(a.y);
  core::expect_outputs_apart({{a.y, op + ": y"}, {a.gate_pre, op + ": gate_pre"}, {a.up_pre, op + ": up_pre"},
                              {a.workspace, op + ": workspace"}},
                             {{a.x, op + ": x"}, {a.offsets, op + ": offsets"}, {a.gate, op + ": gate"},
                              {a.up, op + ": up"}, {a.down, op + ": down"}, {a.gate_up, op + ": gate_up"}});
  p.strategy = a.strategy;
  return p;
}

ExpertsProblem validate_experts_backward(const MoeExpertsBackwardArgs& a, bool read_offsets) {
  const std::string op = "MoeTrainingCache.backward";
  ExpertsProblem p = check_experts_common(a.x, a.offsets, a.gate, a.up, a.down, op, read_offsets);
  check_input_matrix(a.dy, a.x, "x", a.x.dtype, "x", a.x.shape_str(), "[N, H] like x", op + ": dy");
  check_pre(a.gate_pre, a.x, p, op + ": gate_pre");
  check_pre(a.up_pre, a.x, p, op + ": up_pre");
  core::expect_same_device(a.dx, a.x, op + ": dx", "x");
  expect_like_dtype(a.dx, a.x.dtype, op + ": dx", "x");
  expect_matrix(a.dx, op + ": dx");
  expect_shape(a.dx, a.x.shape_str(), "[N, H] like x", op + ": dx");
  check_output(a.dgate, a.x, "x", DType::f32, a.gate.shape_str(), "[E, I, H] like gate", op + ": dgate");
  check_output(a.dup, a.x, "x", DType::f32, a.gate.shape_str(), "[E, I, H] like up", op + ": dup");
  check_output(a.ddown, a.x, "x", DType::f32, a.down.shape_str(), "[E, H, I] like down", op + ": ddown");
  check_experts_workspace(a.workspace, a.x, op);
  p.y_stride = row_stride(a.dx);
  core::expect_outputs_apart({{a.dx, op + ": dx"}, {a.dgate, op + ": dgate"}, {a.dup, op + ": dup"},
                              {a.ddown, op + ": ddown"}, {a.workspace, op + ": workspace"}},
                             {{a.dy, op + ": dy"}, {a.x, op + ": x"}, {a.offsets, op + ": offsets"},
                              {a.gate, op + ": gate"}, {a.up, op + ": up"}, {a.down, op + ": down"},
                              {a.gate_pre, op + ": gate_pre"}, {a.up_pre, op + ": up_pre"}});
  p.dy_stride = row_stride(a.dy);
  p.strategy = a.strategy;
  return p;
}

LayerProblem validate_layer(const MoeLayerArgs& a) {
  const std::string op = "SwiGluExperts";
  core::expect_float(a.x, op + ": x");
  expect_matrix(a.x, op + ": x");
  check_logits(a.logits, op + ": logits");
  core::expect_same_device(a.logits, a.x, op + ": logits", "x");
  if (a.logits.shape[0] != a.x.shape[0])
    fail(ErrorKind::shape, op + ": logits: expected [T, E] with T = " + str(a.x.shape[0]) + " (the tokens of x), got " +
                               a.logits.shape_str());
  check_experts_limit(a.logits.shape[1], op);
  check_top_k(a.top_k, a.logits.shape[1], "E", op);
  check_output(a.out, a.x, "x", a.x.dtype, a.x.shape_str(), "[T, H] like x", op + ": out");
  if (a.workspace) {
    core::expect_same_device(*a.workspace, a.x, op + ": workspace", "x");
    core::expect_dtype(*a.workspace, DType::u8, op + ": workspace");
  }
  core::expect_outputs_apart({{a.out, op + ": out"}, {a.workspace, op + ": workspace"}},
                             {{a.x, op + ": x"}, {a.logits, op + ": logits"}, {a.gate, op + ": gate"},
                              {a.up, op + ": up"}, {a.down, op + ": down"}, {a.gate_up, op + ": gate_up"},
                              {a.bias, op + ": bias"}});
  LayerProblem p;
  p.tokens = a.x.shape[0];
  p.hidden = a.x.shape[1];
  p.experts = int(a.logits.shape[1]);
  p.top_k = a.top_k;
  return p;
}

InterleaveProblem validate_interleave_gate_up(const Tensor& gate, const Tensor& up, const Tensor& gate_up) {
  const std::string op = "moe.interleave_gate_up";
  core::expect_float(gate, op + ": gate");
  if (gate.rank != 3) fail(ErrorKind::shape, op + ": gate: expected 3 axes [E, I, H], got shape " + gate.shape_str());
  expect_dense(gate, op + ": gate");
  core::expect_same_device(up, gate, op + ": up", "gate");
  expect_like_dtype(up, gate.dtype, op + ": up", "gate");
  expect_shape(up, gate.shape_str(), "[E, I, H] like gate", op + ": up");
  expect_dense(up, op + ": up");
  InterleaveProblem p;
  p.experts = gate.shape[0];
  p.inter = gate.shape[1];
  p.hidden = gate.shape[2];
  check_gate_up_blocks(p.inter, op + ": gate");
  check_gate_up(gate_up, gate, "gate", p.experts, p.inter, p.hidden, op + ": gate_up");
  core::expect_outputs_apart({{gate_up, op + ": gate_up"}}, {{gate, op + ": gate"}, {up, op + ": up"}});
  return p;
}

namespace {

SelectedRouterProblem check_selected_common(const Tensor& logits, const Tensor& indices, float scale,
                                            const std::string& op) {
  check_logits(logits, op + ": logits");
  check_indices(indices, logits, "logits", op + ": indices");
  if (indices.shape[0] != logits.shape[0])
    fail(ErrorKind::shape, op + ": indices: expected " + str(logits.shape[0]) +
                               " rows (the tokens of logits), got shape " + indices.shape_str());
  if (indices.shape[1] > kMoeMaxTopK)
    fail(ErrorKind::unsupported, op + ": indices: at most " + str(kMoeMaxTopK) + " slots per token are supported, got " +
                                     str(indices.shape[1]));
  check_scale(scale, op);
  SelectedRouterProblem p;
  p.tokens = logits.shape[0];
  p.experts = int(std::min<std::int64_t>(logits.shape[1], std::int64_t(1) << 30));
  if (logits.shape[1] >= (std::int64_t(1) << 30))
    fail(ErrorKind::unsupported, op + ": logits: too many experts (" + str(logits.shape[1]) + ")");
  p.top_k = int(indices.shape[1]);
  p.logits_stride = row_stride(logits);
  p.index_stride = row_stride(indices);
  return p;
}

}  // namespace

SelectedRouterProblem validate_selected_router(const MoeSelectedRouterArgs& a) {
  const std::string op = "moe.selected_router_weights";
  SelectedRouterProblem p = check_selected_common(a.logits, a.indices, a.scale, op);
  check_output(a.weights, a.logits, "logits", DType::f32, shape_of(p.tokens, p.top_k), "[T, k] like indices",
               op + ": weights");
  core::expect_outputs_apart({{a.weights, op + ": weights"}},
                             {{a.logits, op + ": logits"}, {a.indices, op + ": indices"}});
  return p;
}

SelectedRouterProblem validate_selected_router_backward(const MoeSelectedRouterBackwardArgs& a) {
  const std::string op = "moe.selected_router_backward";
  SelectedRouterProblem p = check_selected_common(a.logits, a.indices, a.scale, op);
  core::expect_same_device(a.grad_weights, a.logits, op + ": grad_weights", "logits");
  core::expect_float(a.grad_weights, op + ": grad_weights");
  expect_matrix(a.grad_weights, op + ": grad_weights");
  expect_shape(a.grad_weights, shape_of(p.tokens, p.top_k), "[T, k] like indices", op + ": grad_weights");
  core::expect_same_device(a.dlogits, a.logits, op + ": dlogits", "logits");
  expect_like_dtype(a.dlogits, a.logits.dtype, op + ": dlogits", "logits");
  expect_matrix(a.dlogits, op + ": dlogits");
  expect_shape(a.dlogits, a.logits.shape_str(), "[T, E] like logits", op + ": dlogits");
  core::expect_outputs_apart({{a.dlogits, op + ": dlogits"}},
                             {{a.logits, op + ": logits"}, {a.indices, op + ": indices"},
                              {a.grad_weights, op + ": grad_weights"}});
  p.grad_stride = row_stride(a.grad_weights);
  p.dlogits_stride = row_stride(a.dlogits);
  return p;
}

}  // namespace rudnn::moe
