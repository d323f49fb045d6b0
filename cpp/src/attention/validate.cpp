// Every check of the attention family, run once before either backend.
#include <cmath>
#include <initializer_list>
#include <string>

#include "attention/problem.hpp"
#include "core/aliasing.hpp"
#include "core/check.hpp"

namespace rudnn::attention {

using core::expect_dtype_of;
using core::expect_shape;
using core::fail;
using core::has_shape;
using core::shape_str;

namespace {

// cu_seqlens: int32 [B + 1], dense; on the CPU its values are checked too (on CUDA the
// host never reads device memory; kernels clamp the values to the packed length instead).
void check_cu_seqlens(const Tensor& cu, const Tensor& q, const std::string& name, std::int64_t total,
                      const std::string& packed) {
  core::expect_same_device(cu, q, name, "q");
  core::expect_dtype(cu, DType::i32, name);
  if (cu.rank != 1 || cu.shape[0] < 1)
    fail(ErrorKind::shape, name + ": expected shape [B + 1] (one offset per sequence plus the end), got " +
                               cu.shape_str());
  core::expect_last_dim_contiguous(cu, name);
  if (cu.device.is_cuda()) return;
  const std::int32_t* c = cu.ptr<std::int32_t>();
  if (c[0] != 0) fail(ErrorKind::value, name + ": expected " + name.substr(name.rfind(' ') + 1) + "[0] == 0, got " +
                                             std::to_string(c[0]));
  for (std::int64_t b = 1; b < cu.shape[0]; ++b)
    if (c[b] < c[b - 1])
      fail(ErrorKind::value, name + ": expected non-decreasing offsets, got " + std::to_string(c[b]) + " after " +
                                 std::to_string(c[b - 1]) + " at index " + std::to_string(b));
  if (c[cu.shape[0] - 1] != total)
    fail(ErrorKind::value, name + ": expected the last offset to equal the packed length of " + packed + " (" +
                               std::to_string(total) + "), got " + std::to_string(c[cu.shape[0] - 1]));
}

// A mask or bias broadcastable (right-aligned, size-1 axes stretch) to [B, Hq, Sq, Sk].
Broadcast broadcast_view(const Tensor& t, const Tensor& q, const std::string& name, std::int64_t B,
                         std::int64_t Hq, std::int64_t Sq, std::int64_t Sk) {
  core::expect_same_device(t, q, name, "q");
  const std::int64_t full[4] = {B, Hq, Sq, Sk};
  bool ok = t.rank <= 4;
  std::int64_t strides[4] = {0, 0, 0, 0};
  for (int d = 0; ok && d < t.rank; ++d) {
    const int axis = 4 - t.rank + d;
    if (t.shape[d] == full[axis])
      strides[axis] = full[axis] == 1 ? 0 : t.strides[d];
    else if (t.shape[d] != 1)
      ok = false;
  }
  if (!ok)
    fail(ErrorKind::shape, name + ": expected a shape broadcastable to [B, Hq, Sq, Sk] = " +
                               shape_str({B, Hq, Sq, Sk}) + ", got " + t.shape_str());
  Broadcast v;
  v.data = t.data;
  v.dtype = t.dtype;
  v.b = strides[0], v.h = strides[1], v.i = strides[2], v.j = strides[3];
  return v;
}

// Checks q/k/v and the options; fills everything of the Problem but the output strides.
Problem check_inputs(const std::string& op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionOptions& o) {
  core::expect_float(q, op + ": q");
  core::expect_same_device(k, q, op + ": k", "q");
  core::expect_same_device(v, q, op + ": v", "q");
  expect_dtype_of(k, q, op + ": k", "q");
  expect_dtype_of(v, q, op + ": v", "q");

  if (bool(o.cu_seqlens_q) != bool(o.cu_seqlens_k))
    fail(ErrorKind::value, op + ": cu_seqlens_q and cu_seqlens_k must be given together, got " +
                               (o.cu_seqlens_q ? "cu_seqlens_q without cu_seqlens_k"
                                               : "cu_seqlens_k without cu_seqlens_q"));
  Problem p;
  p.varlen = o.cu_seqlens_q != nullptr;
  const int rank = p.varlen ? 3 : 4;
  const char* layout = p.varlen ? " [total, H, D] (packed, with cu_seqlens)" : " [B, H, S, D]";
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}, {v, "v"}})
    if (t.rank != rank)
      fail(ErrorKind::shape, op + ": " + name + ": expected rank " + std::to_string(rank) + layout + ", got shape " +
                                 t.shape_str());
  // Axis numbers of head and sequence in each layout ([B, H, S, D] or packed [total, H, D]).
  const int h_ax = 1, s_ax = p.varlen ? 0 : 2;
  p.d = q.shape[rank - 1];
  p.dv = v.shape[rank - 1];
  p.hq = q.shape[h_ax];
  p.hkv = k.shape[h_ax];
  p.sq = q.shape[s_ax];
  p.sk = k.shape[s_ax];
  if (!p.varlen) {
    p.batch = q.shape[0];
    if (k.shape[0] != p.batch || v.shape[0] != p.batch)
      fail(ErrorKind::shape, op + ": " + (k.shape[0] != p.batch ? "k" : "v") + ": expected batch size B = " +
                                 std::to_string(p.batch) + " (q.shape[0]), got " +
                                 std::to_string(k.shape[0] != p.batch ? k.shape[0] : v.shape[0]));
  }
  if (p.d < 1) fail(ErrorKind::shape, op + ": q: the head dim D (last axis) must be >= 1, got shape " + q.shape_str());
  if (p.dv < 1) fail(ErrorKind::shape, op + ": v: the head dim Dv (last axis) must be >= 1, got shape " + v.shape_str());
  if (k.shape[rank - 1] != p.d)
    fail(ErrorKind::shape, op + ": k: expected head dim D = " + std::to_string(p.d) + " (the last axis of q), got " +
                               std::to_string(k.shape[rank - 1]));
  if (v.shape[h_ax] != p.hkv)
    fail(ErrorKind::shape, op + ": v: expected Hkv = " + std::to_string(p.hkv) + " heads (like k), got " +
                               std::to_string(v.shape[h_ax]));
  if (v.shape[s_ax] != p.sk)
    fail(ErrorKind::shape, op + ": v: expected " + std::to_string(p.sk) + " keys (like k), got " +
                               std::to_string(v.shape[s_ax]));
  if (p.hkv < 1) fail(ErrorKind::shape, op + ": k: expected at least one key/value head, got shape " + k.shape_str());
  if (p.hq % p.hkv != 0)
    fail(ErrorKind::shape, op + ": the number of query heads Hq = " + std::to_string(p.hq) +
                               " must be a multiple of the number of key/value heads Hkv = " + std::to_string(p.hkv));
  p.group = p.hq / p.hkv;
  core::expect_last_dim_contiguous(q, op + ": q");
  core::expect_last_dim_contiguous(k, op + ": k");
  core::expect_last_dim_contiguous(v, op + ": v");
  core::expect_data(q, op + ": q");
  core::expect_data(k, op + ": k");
  core::expect_data(v, op + ": v");
  p.dtype = q.dtype;

  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(p.d));
  core::expect_positive_finite(scale, op + ": scale");
  p.scale = float(scale);
  if (!(std::isfinite(o.softcap) && o.softcap >= 0))
    fail(ErrorKind::value, op + ": softcap: expected a finite value > 0 (or None), got " + std::to_string(o.softcap));
  p.softcap = float(o.softcap);
  if (o.window_left < -1 || o.window_right < -1)
    fail(ErrorKind::value, op + ": window: expected (left, right) with each >= 0, or -1 / None for unbounded, got (" +
                               std::to_string(o.window_left) + ", " + std::to_string(o.window_right) + ")");
  p.causal = o.causal;
  p.window_left = o.window_left;
  p.window_right = o.window_right;

  if (p.varlen) {
    if (o.mask || o.bias)
      fail(ErrorKind::unsupported, op + ": mask and bias are not supported with cu_seqlens (packed sequences)");
    check_cu_seqlens(*o.cu_seqlens_q, q, op + ": cu_seqlens_q", p.sq, "q");
    check_cu_seqlens(*o.cu_seqlens_k, q, op + ": cu_seqlens_k", p.sk, "k");
    if (o.cu_seqlens_k->shape[0] != o.cu_seqlens_q->shape[0])
      fail(ErrorKind::shape, op + ": cu_seqlens_k: expected the shape of cu_seqlens_q " +
                                 o.cu_seqlens_q->shape_str() + ", got " + o.cu_seqlens_k->shape_str());
    p.batch = o.cu_seqlens_q->shape[0] - 1;
    p.cu_q = o.cu_seqlens_q->ptr<std::int32_t>();
    p.cu_k = o.cu_seqlens_k->ptr<std::int32_t>();
    p.q = Strides{0, q.strides[1], q.strides[0]};
    p.k = Strides{0, k.strides[1], k.strides[0]};
    p.v = Strides{0, v.strides[1], v.strides[0]};
  } else {
    p.q = Strides{q.strides[0], q.strides[1], q.strides[2]};
    p.k = Strides{k.strides[0], k.strides[1], k.strides[2]};
    p.v = Strides{v.strides[0], v.strides[1], v.strides[2]};
  }

  if (o.mask) {
    if (o.mask->dtype != DType::boolean && !is_float(o.mask->dtype))
      fail(ErrorKind::dtype, op + ": mask: expected bool (true = keep) or a float dtype (additive), got " +
                                 dtype_name(o.mask->dtype));
    p.mask = broadcast_view(*o.mask, q, op + ": mask", p.batch, p.hq, p.sq, p.sk);
    p.mask_is_bool = o.mask->dtype == DType::boolean;
  }
  if (o.bias) {
    if (!is_float(o.bias->dtype))
      fail(ErrorKind::dtype, op + ": bias: expected float32, float16 or bfloat16, got " + dtype_name(o.bias->dtype));
    p.bias = broadcast_view(*o.bias, q, op + ": bias", p.batch, p.hq, p.sq, p.sk);
  }
  return p;
}

// An output or input shaped like `shape` in the dense or packed layout.
void check_like(const Tensor& t, const Tensor& q, DType dtype, std::initializer_list<std::int64_t> dims,
                const std::string& name, const std::string& what) {
  core::expect_same_device(t, q, name, "q");
  if (t.dtype != dtype)
    fail(ErrorKind::dtype, name + ": expected " + dtype_name(dtype) + " (" + what + "), got " + dtype_name(t.dtype));
  expect_shape(t, dims, name, "");
  core::expect_last_dim_contiguous(t, name);
  core::expect_data(t, name);
}

Strides row_strides(const Tensor& t, bool varlen) {
  return varlen ? Strides{0, t.strides[1], t.strides[0]} : Strides{t.strides[0], t.strides[1], t.strides[2]};
}

// lse: float32 [B, Hq, Sq] (varlen [Hq, Tq]); any strides.
Strides check_lse(const Tensor& lse, const Tensor& q, const Problem& p, const std::string& name) {
  core::expect_same_device(lse, q, name, "q");
  core::expect_dtype(lse, DType::f32, name);
  if (p.varlen)
    expect_shape(lse, {p.hq, p.sq}, name, "([Hq, total_q])");
  else
    expect_shape(lse, {p.batch, p.hq, p.sq}, name, "([B, Hq, Sq])");
  core::expect_data(lse, name);
  return p.varlen ? Strides{0, lse.strides[0], lse.strides[1]}
                  : Strides{lse.strides[0], lse.strides[1], lse.strides[2]};
}

}  // namespace

Problem validate_forward(const AttentionForwardArgs& a) {
  const std::string op = "attention";
  Problem p = check_inputs(op, a.q, a.k, a.v, a.options);
  if (p.varlen)
    check_like(a.out, a.q, p.dtype, {p.sq, p.hq, p.dv}, op + ": out", "q's dtype");
  else
    check_like(a.out, a.q, p.dtype, {p.batch, p.hq, p.sq, p.dv}, op + ": out", "q's dtype");
  if (a.lse) p.lse = check_lse(*a.lse, a.q, p, op + ": lse");
  const AttentionOptions& o = a.options;
  core::expect_outputs_apart({{a.out, op + ": out"}, {a.lse, op + ": lse"}},
                             {{a.q, op + ": q"}, {a.k, op + ": k"}, {a.v, op + ": v"}, {o.mask, op + ": mask"},
                              {o.bias, op + ": bias"}, {o.cu_seqlens_q, op + ": cu_seqlens_q"},
                              {o.cu_seqlens_k, op + ": cu_seqlens_k"}});
  p.out = row_strides(a.out, p.varlen);
  return p;
}

BackwardProblem validate_backward(const AttentionBackwardArgs& a) {
  const std::string op = "attention_backward";
  BackwardProblem bp;
  Problem& p = bp.fwd;
  p = check_inputs(op, a.q, a.k, a.v, a.options);
  const bool vl = p.varlen;
  auto like = [&](const Tensor& t, const Tensor& ref, const char* name) {
    if (vl)
      check_like(t, a.q, p.dtype, {ref.shape[0], ref.shape[1], ref.shape[2]}, op + ": " + name, "the dtype of q");
    else
      check_like(t, a.q, p.dtype, {ref.shape[0], ref.shape[1], ref.shape[2], ref.shape[3]}, op + ": " + name,
                 "the dtype of q");
  };
  if (vl)
    check_like(a.out, a.q, p.dtype, {p.sq, p.hq, p.dv}, op + ": out", "the dtype of q");
  else
    check_like(a.out, a.q, p.dtype, {p.batch, p.hq, p.sq, p.dv}, op + ": out", "the dtype of q");
  like(a.dout, a.out, "dout");
  p.lse = check_lse(a.lse, a.q, p, op + ": lse");
  like(a.dq, a.q, "dq");
  like(a.dk, a.k, "dk");
  like(a.dv, a.v, "dv");
  const AttentionOptions& o = a.options;
  core::expect_outputs_apart({{a.dq, op + ": dq"}, {a.dk, op + ": dk"}, {a.dv, op + ": dv"}},
                             {{a.dout, op + ": dout"}, {a.q, op + ": q"}, {a.k, op + ": k"}, {a.v, op + ": v"},
                              {a.out, op + ": out"}, {a.lse, op + ": lse"}, {a.dlse, op + ": dlse"},
                              {o.mask, op + ": mask"}, {o.bias, op + ": bias"},
                              {o.cu_seqlens_q, op + ": cu_seqlens_q"}, {o.cu_seqlens_k, op + ": cu_seqlens_k"}});
  p.out = row_strides(a.out, vl);
  bp.dout = row_strides(a.dout, vl);
  bp.dq = row_strides(a.dq, vl);
  bp.dk = row_strides(a.dk, vl);
  bp.dv = row_strides(a.dv, vl);
  bp.deterministic = a.deterministic;
  if (a.dlse) {
    bp.dlse_at = check_lse(*a.dlse, a.q, p, op + ": dlse");
    bp.dlse = a.dlse->numel() > 0 ? static_cast<const float*>(a.dlse->data) : nullptr;
  }
  return bp;
}

}  // namespace rudnn::attention
