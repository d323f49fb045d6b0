// Every check of the CTC family, run once before either backend. The host arrays (targets and
// lengths) are read here, value by value, into the problem's table; sizes are checked for
// overflow as they are computed, so that no backend index can wrap.
#include <climits>
#include <string>

#include "core/aliasing.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/checked_math.hpp"
#include "ctc/problem.hpp"

namespace rudnn::ctc {

using core::checked_add;
using core::checked_mul;
using core::fail;

namespace {

// Byte size of `count` elements of `size` bytes, rounded up to 16, appended at `offset`.
std::size_t append(std::size_t& offset, i64 count, std::size_t size, const std::string& what) {
  const i64 bytes = checked_mul(count, i64(size), what);
  const i64 padded = checked_add(bytes, 15, what) / 16 * 16;
  const std::size_t at = offset;
  const i64 end = checked_add(i64(offset), padded, what);
  offset = std::size_t(end);
  return at;
}

void expect_index_dtype(const Tensor& t, const std::string& name) {
  if (t.dtype != DType::i32 && t.dtype != DType::i64)
    fail(ErrorKind::dtype, name + ": expected int32 or int64, got " + dtype_name(t.dtype));
}

void expect_host(const Tensor& t, const std::string& name) {
  if (t.device.is_cuda())
    fail(ErrorKind::device, name + ": expected an array in host memory (its values are read on the host), got " +
                                t.device.str());
}

// Element i (flat, in index order) of a host int32/int64 array of rank 1 or 2.
struct HostInts {
  const Tensor& t;
  i64 at(i64 i0, i64 i1 = 0) const {
    const i64 offset = i0 * t.strides[0] + (t.rank > 1 ? i1 * t.strides[1] : 0);
    return t.dtype == DType::i64 ? t.ptr<const std::int64_t>()[offset] : i64(t.ptr<const std::int32_t>()[offset]);
  }
};

void expect_lengths(const Tensor& t, i64 N, const std::string& name, const std::string& op) {
  expect_index_dtype(t, op + ": " + name);
  expect_host(t, op + ": " + name);
  core::expect_shape(t, {N}, op + ": " + name, "(one per sequence, N from log_probs)");
  core::expect_data(t, op + ": " + name);
}

struct Inputs {
  const CtcOptions& options;
  const Tensor& log_probs;
  const Tensor& targets;
  const Tensor& input_lengths;
  const Tensor& target_lengths;
};

// The checks and the table common to the forward and the backward.
Problem read_problem(const Inputs& in, bool backward, const std::string& op) {
  const Tensor& lp = in.log_probs;
  core::expect_float(lp, op + ": log_probs");
  if (lp.rank != 3)
    fail(ErrorKind::shape, op + ": log_probs: expected 3 axes [T, N, C] (or 2, [T, C], without a batch), got shape " +
                               lp.shape_str());
  if (lp.numel() == 0)  // torch rejects an empty log_probs too
    fail(ErrorKind::shape, op + ": log_probs: expected T, N and C >= 1, got shape " + lp.shape_str());
  if (lp.shape[2] > INT32_MAX)
    fail(ErrorKind::unsupported, op + ": log_probs: at most " + std::to_string(INT32_MAX) + " classes, got " +
                                     std::to_string(lp.shape[2]));
  core::expect_last_dim_contiguous(lp, op + ": log_probs");
  if (lp.device.is_cuda() && lp.shape[1] > INT32_MAX)  // one block per sequence
    fail(ErrorKind::unsupported, op + ": log_probs: at most " + std::to_string(INT32_MAX) +
                                     " sequences on CUDA, got " + std::to_string(lp.shape[1]));
  core::expect_data(lp, op + ": log_probs");

  Problem p;
  p.T = lp.shape[0];
  p.N = lp.shape[1];
  p.C = lp.shape[2];
  p.lp_t = lp.strides[0];
  p.lp_n = lp.strides[1];
  p.backward = backward;
  p.zero_infinity = in.options.zero_infinity;
  p.reduction = in.options.reduction;
  p.blank = in.options.blank;
  if (p.blank < 0 || p.blank >= p.C)
    fail(ErrorKind::value, op + ": blank: expected a class in [0, " + std::to_string(p.C) + ") (C from log_probs), got " +
                               std::to_string(p.blank));

  expect_lengths(in.input_lengths, p.N, "input_lengths", op);
  expect_lengths(in.target_lengths, p.N, "target_lengths", op);
  const Tensor& tg = in.targets;
  expect_index_dtype(tg, op + ": targets");
  expect_host(tg, op + ": targets");
  if (tg.rank != 1 && tg.rank != 2)
    fail(ErrorKind::shape, op + ": targets: expected 2 axes [N, S] (padded) or 1 [sum(target_lengths)] "
                                "(concatenated), got shape " + tg.shape_str());
  const bool padded = tg.rank == 2;
  if (padded && tg.shape[0] != p.N)
    fail(ErrorKind::shape, op + ": targets: expected " + std::to_string(p.N) +
                               " rows (N from log_probs) in padded targets [N, S], got shape " + tg.shape_str());
  core::expect_data(tg, op + ": targets");

  const HostInts input_lengths{in.input_lengths}, target_lengths{in.target_lengths}, targets{tg};
  p.sequences.resize(std::size_t(p.N));
  i64 total = 0, max_target = 0;
  for (i64 n = 0; n < p.N; ++n) {
    Sequence& s = p.sequences[std::size_t(n)];
    s.input_length = input_lengths.at(n);
    s.target_length = target_lengths.at(n);
    if (s.input_length < 0 || s.input_length > p.T)
      fail(ErrorKind::value, op + ": input_lengths: expected values in [0, " + std::to_string(p.T) +
                                 "] (T from log_probs), got " + std::to_string(s.input_length) + " for sequence " +
                                 std::to_string(n));
    if (s.target_length < 0)
      fail(ErrorKind::value, op + ": target_lengths: expected values >= 0, got " + std::to_string(s.target_length) +
                                 " for sequence " + std::to_string(n));
    if (padded && s.target_length > tg.shape[1])
      fail(ErrorKind::value, op + ": target_lengths: " + std::to_string(s.target_length) + " for sequence " +
                                 std::to_string(n) + " is longer than the padded targets (S = " +
                                 std::to_string(tg.shape[1]) + ")");
    s.label_offset = total;
    total = checked_add(total, s.target_length, op + ": sum(target_lengths)");
    if (s.target_length > max_target) max_target = s.target_length;
  }
  p.max_states = checked_add(checked_mul(max_target, 2, op + ": 2 * max(target_lengths) + 1"), 1,
                             op + ": 2 * max(target_lengths) + 1");

  if (!padded && total != tg.shape[0])
    fail(ErrorKind::value, op + ": target_lengths: expected their sum (" + std::to_string(total) +
                               ") to be the length of the concatenated targets, got " + std::to_string(tg.shape[0]) +
                               " labels");

  // Sized before the labels are copied, so that a size that overflows fails before any allocation.
  const std::string what = op + ": the workspace size";
  std::size_t at = 0;
  p.ws.sequences = append(at, p.N, sizeof(Sequence), what);
  p.ws.labels = append(at, total, sizeof(std::int32_t), what);
  p.ws.links = append(at, backward ? total : 0, sizeof(std::int32_t), what);
  p.ws.losses = append(at, p.N, sizeof(float), what);
  const i64 alpha_rows = backward ? p.T : 2;
  p.ws.alpha = append(at, checked_mul(checked_mul(p.N, alpha_rows, what), p.max_states, what), sizeof(float), what);
  p.ws.beta = append(at, backward ? checked_mul(checked_mul(p.N, 2, what), p.max_states, what) : 0, sizeof(float),
                     what);
  p.ws.total = at;

  p.labels.resize(std::size_t(total));
  i64 concat_at = 0;
  for (i64 n = 0; n < p.N; ++n) {
    const Sequence& s = p.sequences[std::size_t(n)];
    for (i64 k = 0; k < s.target_length; ++k) {
      const i64 label = padded ? targets.at(n, k) : targets.at(concat_at + k);
      if (label < 0 || label >= p.C || label == p.blank)
        fail(ErrorKind::value, op + ": targets: expected labels in [0, " + std::to_string(p.C) +
                                   ") other than blank (" + std::to_string(p.blank) + "), got " + std::to_string(label) +
                                   " at position " + std::to_string(k) + " of sequence " + std::to_string(n));
      p.labels[std::size_t(s.label_offset + k)] = std::int32_t(label);
    }
    concat_at += s.target_length;
  }

  return p;
}

// (N,) for reduction none, else rank 0.
void expect_loss_shape(const Tensor& t, const Problem& p, const std::string& name) {
  if (p.reduction == CtcReduction::none) core::expect_shape(t, {p.N}, name, "(reduction none: one per sequence)");
  else if (t.rank != 0)
    fail(ErrorKind::shape, name + ": expected shape [] (a scalar for reduction mean or sum), got " + t.shape_str());
}

}  // namespace

// The outputs and the workspace are checked only by the calls that run (not by the size queries).
Problem validate_forward(const CtcLossArgs& args, bool check_outputs) {
  const std::string op = "ctc_loss";
  Problem p = read_problem({args.options, args.log_probs, args.targets, args.input_lengths, args.target_lengths},
                           false, op);
  if (!check_outputs) return p;
  core::expect_dtype_of(args.loss, args.log_probs, op + ": loss", "log_probs");
  core::expect_same_device(args.loss, args.log_probs, op + ": loss", "log_probs");
  expect_loss_shape(args.loss, p, op + ": loss");
  core::expect_data(args.loss, op + ": loss");
  p.loss_n = args.loss.rank ? args.loss.strides[0] : 0;
  core::expect_workspace(args.workspace, args.log_probs, "log_probs", p.ws.total, op, alignof(Sequence),
                         "8-byte sequence records");
  core::expect_outputs_apart({{args.loss, op + ": loss"}, {args.workspace, op + ": workspace"}},
                             {{args.log_probs, op + ": log_probs"}, {args.targets, op + ": targets"},
                              {args.input_lengths, op + ": input_lengths"},
                              {args.target_lengths, op + ": target_lengths"}});
  return p;
}

Problem validate_backward(const CtcLossBackwardArgs& args, bool check_outputs) {
  const std::string op = "ctc_loss_backward";
  Problem p = read_problem({args.options, args.log_probs, args.targets, args.input_lengths, args.target_lengths},
                           true, op);
  if (!check_outputs) return p;
  core::expect_float(args.dloss, op + ": dloss");
  core::expect_same_device(args.dloss, args.log_probs, op + ": dloss", "log_probs");
  expect_loss_shape(args.dloss, p, op + ": dloss");
  core::expect_data(args.dloss, op + ": dloss");
  p.loss_n = args.dloss.rank ? args.dloss.strides[0] : 0;
  const Tensor& g = args.dlog_probs;
  core::expect_dtype_of(g, args.log_probs, op + ": dlog_probs", "log_probs");
  core::expect_same_device(g, args.log_probs, op + ": dlog_probs", "log_probs");
  core::expect_same_shape(g, args.log_probs, op + ": dlog_probs", "log_probs");
  core::expect_last_dim_contiguous(g, op + ": dlog_probs");
  core::expect_data(g, op + ": dlog_probs");
  p.grad_t = g.strides[0];
  p.grad_n = g.strides[1];
  core::expect_workspace(args.workspace, args.log_probs, "log_probs", p.ws.total, op, alignof(Sequence),
                         "8-byte sequence records");
  core::expect_outputs_apart({{g, op + ": dlog_probs"}, {args.workspace, op + ": workspace"}},
                             {{args.dloss, op + ": dloss"}, {args.log_probs, op + ": log_probs"},
                              {args.targets, op + ": targets"}, {args.input_lengths, op + ": input_lengths"},
                              {args.target_lengths, op + ": target_lengths"}});
  return p;
}

}  // namespace rudnn::ctc
