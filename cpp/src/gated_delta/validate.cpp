// Every check of the gated delta rule family, run once before either backend.
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "gated_delta/problem.hpp"
#if RUDNN_WITH_CUDA
#include "core/device.hpp"
#endif

namespace rudnn::gated_delta {

using core::expect_dtype_of;
using core::expect_shape;
using core::fail;
using core::has_shape;
using core::shape_str;

namespace {

SeqStrides seq_strides(const Tensor& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }
StateStrides state_strides(const Tensor& t) { return {t.strides[0], t.strides[1], t.strides[2]}; }

// A float32 [N, Hv, K, V] state with a dense last axis.
void check_state(const Tensor& t, const Tensor& q, const Problem& p, const std::string& name) {
  core::expect_same_device(t, q, name, "q");
  core::expect_dtype(t, DType::f32, name);
  expect_shape(t, {p.N, p.Hv, p.K, p.V}, name,
               p.varlen ? "[N, Hv, K, V] (one state per sequence of cu_seqlens)" : "[B, Hv, K, V]");
  core::expect_last_dim_contiguous(t, name);
  core::expect_data(t, name);
}

// A [B, H, T, X] tensor like `ref` in dtype, with the given shape and a dense last axis.
void check_seq4(const Tensor& t, const Tensor& q, std::initializer_list<std::int64_t> dims, const std::string& name,
                const std::string& what) {
  core::expect_same_device(t, q, name, "q");
  expect_dtype_of(t, q, name, "q");
  expect_shape(t, dims, name, what);
  core::expect_last_dim_contiguous(t, name);
  core::expect_data(t, name);
}

// The inputs shared by the forward and the backward; fills the sizes and input strides of p.
Problem check_inputs(const std::string& op, GatedDeltaAlgo algo, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& beta, const Tensor& g, const Tensor* initial, const Tensor* cu_seqlens,
                     float scale, int chunk_size, bool read_offsets) {
  Problem p;
  core::expect_float(q, op + ": q");
  if (q.rank != 4) fail(ErrorKind::shape, op + ": q: expected 4 axes [B, H, T, K], got shape " + q.shape_str());
  p.B = q.shape[0];
  p.Hk = q.shape[1];
  p.T = q.shape[2];
  p.K = q.shape[3];
  if (p.Hk < 1 || p.K < 1)
    fail(ErrorKind::shape, op + ": q: expected at least one head and K >= 1, got shape " + q.shape_str());
  core::expect_last_dim_contiguous(q, op + ": q");
  core::expect_data(q, op + ": q");
  if (q.device.is_cuda() && p.K > kMaxCudaK)
    fail(ErrorKind::unsupported, op + ": K = " + std::to_string(p.K) + " is not supported by the CUDA kernels (K <= " +
                                     std::to_string(kMaxCudaK) + ")");
  check_seq4(k, q, {p.B, p.Hk, p.T, p.K}, op + ": k", "[B, H, T, K] (the shape of q)");

  core::expect_same_device(v, q, op + ": v", "q");
  expect_dtype_of(v, q, op + ": v", "q");
  if (v.rank != 4 || v.shape[0] != p.B || v.shape[2] != p.T || v.shape[1] < 1 || v.shape[3] < 1)
    fail(ErrorKind::shape, op + ": v: expected shape [B, Hv, T, V] with B = " + std::to_string(p.B) +
                               " and T = " + std::to_string(p.T) + " (from q) and Hv, V >= 1, got " + v.shape_str());
  p.Hv = v.shape[1];
  p.V = v.shape[3];
  if (p.Hv % p.Hk != 0)
    fail(ErrorKind::shape, op + ": v: the number of value heads (" + std::to_string(p.Hv) +
                               ") must be a multiple of the number of q/k heads (" + std::to_string(p.Hk) + ")");
  p.group = p.Hv / p.Hk;
  core::expect_last_dim_contiguous(v, op + ": v");
  core::expect_data(v, op + ": v");

  core::expect_same_device(beta, q, op + ": beta", "q");
  expect_dtype_of(beta, q, op + ": beta", "q");
  expect_shape(beta, {p.B, p.Hv, p.T}, op + ": beta", "[B, Hv, T]");
  core::expect_data(beta, op + ": beta");
  core::expect_same_device(g, q, op + ": log_decay", "q");
  core::expect_dtype(g, DType::f32, op + ": log_decay");
  expect_shape(g, {p.B, p.Hv, p.T}, op + ": log_decay", "[B, Hv, T]");
  core::expect_data(g, op + ": log_decay");

  p.N = p.B;
  if (cu_seqlens) {
    const Tensor& cu = *cu_seqlens;
    const std::string name = op + ": cu_seqlens";
    core::expect_same_device(cu, q, name, "q");
    if (cu.dtype != DType::i32 && cu.dtype != DType::i64)
      fail(ErrorKind::dtype, name + ": expected int32 or int64, got " + dtype_name(cu.dtype));
    if (cu.rank != 1 || cu.shape[0] < 1)
      fail(ErrorKind::shape, name + ": expected shape [N + 1] with N >= 0 sequences, got " + cu.shape_str());
    if (p.B != 1)
      fail(ErrorKind::shape, name + ": varlen packing needs B == 1 (sequences packed along T), got B = " +
                                 std::to_string(p.B));
    core::expect_data(cu, name);
    p.varlen = true;
    p.cu_dtype = cu.dtype;
    p.N = cu.shape[0] - 1;
    // The offsets of device arrays are not read on the host (that would synchronize); the
    // CUDA kernels clamp them into [0, T] instead, so bad offsets cannot reach out of bounds.
    if (read_offsets && !cu.device.is_cuda()) {
      std::int64_t prev = 0;
      for (std::int64_t i = 0; i <= p.N; ++i) {
        const std::int64_t c = cu.dtype == DType::i32 ? std::int64_t(cu.ptr<std::int32_t>()[i * cu.strides[0]])
                                                      : cu.ptr<std::int64_t>()[i * cu.strides[0]];
        if (i == 0 && c != 0)
          fail(ErrorKind::value, name + ": expected cu_seqlens[0] == 0, got " + std::to_string(c));
        if (c < prev)
          fail(ErrorKind::value, name + ": expected non-decreasing offsets, got cu_seqlens[" + std::to_string(i) +
                                     "] = " + std::to_string(c) + " < " + std::to_string(prev));
        prev = c;
      }
      if (prev != p.T)
        fail(ErrorKind::value, name + ": expected cu_seqlens[-1] == T = " + std::to_string(p.T) + ", got " +
                                   std::to_string(prev));
    }
  }
  if (initial) {
    check_state(*initial, q, p, op + ": initial_state");
    p.has_initial = true;
    p.initial = state_strides(*initial);
  }
  if (!std::isfinite(scale))
    fail(ErrorKind::value, op + ": scale: expected a finite value, got " + std::to_string(scale));
  if (algo == GatedDeltaAlgo::chunked) {
    if (chunk_size <= 0)
      fail(ErrorKind::value, op + ": chunk_size: expected a value > 0, got " + std::to_string(chunk_size));
    std::int64_t limit = kCpuSharedMemoryLimit;
#if RUDNN_WITH_CUDA
    if (q.device.is_cuda()) limit = core::device_props(q.device.index).max_smem_per_block_optin;
#endif
    // 4 * (c^2 + c) fits int64 below c = 2^30; a larger c needs more than any shared memory.
    const bool fits = chunk_size < (std::int64_t(1) << 30);
    const std::int64_t need = fits ? chunk_workspace_bytes(chunk_size) : INT64_MAX;
    if (need > limit)
      fail(ErrorKind::value, op + ": chunk_size: " + std::to_string(chunk_size) + " needs " +
                                 (fits ? std::to_string(need) : std::string("more than 2^62")) +
                                 " bytes of triangular workspace (4 * (c^2 + c)), more than the " +
                                 std::to_string(limit) + " bytes of shared memory per block of " + q.device.str());
  }
  p.dtype = q.dtype;
  p.scale = scale;
  p.chunk_size = chunk_size;
  p.q = seq_strides(q);
  p.k = seq_strides(k);
  p.v = seq_strides(v);
  p.beta = seq_strides(beta);
  p.g = seq_strides(g);
  return p;
}

std::string op_name(GatedDeltaAlgo algo, bool backward) {
  return std::string(algo == GatedDeltaAlgo::chunked ? "chunk_gated_delta_rule" : "gated_delta_rule") +
         (backward ? "_backward" : "");
}

}  // namespace

Problem validate_forward(const GatedDeltaForwardArgs& a, bool read_offsets) {
  const std::string op = op_name(a.algo, false);
  Problem p = check_inputs(op, a.algo, a.q, a.k, a.v, a.beta, a.log_decay, a.initial_state, a.cu_seqlens, a.scale,
                           a.chunk_size, read_offsets);
  if (a.algo == GatedDeltaAlgo::recurrent && a.kernel == GatedDeltaKernel::chunked)
    fail(ErrorKind::value, op + ": the chunked kernel serves chunk_gated_delta_rule only");
  p.kernel = a.kernel;
  check_seq4(a.out, a.q, {p.B, p.Hv, p.T, p.V}, op + ": out", "[B, Hv, T, V]");
  check_state(a.final_state, a.q, p, op + ": final_state");
  if (a.workspace) {
    core::expect_same_device(*a.workspace, a.q, op + ": workspace", "q");
    core::expect_dtype(*a.workspace, DType::u8, op + ": workspace");
  }
  core::expect_outputs_apart({{a.out, op + ": out"}, {a.final_state, op + ": final_state"},
                              {a.workspace, op + ": workspace"}},
                             {{a.q, op + ": q"}, {a.k, op + ": k"}, {a.v, op + ": v"}, {a.beta, op + ": beta"},
                              {a.log_decay, op + ": log_decay"}, {a.initial_state, op + ": initial_state"},
                              {a.cu_seqlens, op + ": cu_seqlens"}});
  p.out = seq_strides(a.out);
  p.final_state = state_strides(a.final_state);
  return p;
}

Problem validate_backward(const GatedDeltaBackwardArgs& a, bool read_offsets) {
  const std::string op = op_name(a.algo, true);
  Problem p = check_inputs(op, a.algo, a.q, a.k, a.v, a.beta, a.log_decay, a.initial_state, a.cu_seqlens, a.scale,
                           a.chunk_size, read_offsets);
  p.kernel = a.kernel;
  check_seq4(a.dout, a.q, {p.B, p.Hv, p.T, p.V}, op + ": dout", "[B, Hv, T, V] (the shape of out)");
  if (a.dfinal_state) {
    check_state(*a.dfinal_state, a.q, p, op + ": dfinal_state");
    p.has_dfinal = true;
    p.dfinal = state_strides(*a.dfinal_state);
  }
  check_seq4(a.dq, a.q, {p.B, p.Hk, p.T, p.K}, op + ": dq", "(the shape of q)");
  check_seq4(a.dk, a.q, {p.B, p.Hk, p.T, p.K}, op + ": dk", "(the shape of k)");
  check_seq4(a.dv, a.q, {p.B, p.Hv, p.T, p.V}, op + ": dv", "(the shape of v)");
  core::expect_same_device(a.dbeta, a.q, op + ": dbeta", "q");
  expect_dtype_of(a.dbeta, a.q, op + ": dbeta", "q");
  expect_shape(a.dbeta, {p.B, p.Hv, p.T}, op + ": dbeta", "(the shape of beta)");
  core::expect_data(a.dbeta, op + ": dbeta");
  core::expect_same_device(a.dlog_decay, a.q, op + ": dlog_decay", "q");
  core::expect_dtype(a.dlog_decay, DType::f32, op + ": dlog_decay");
  expect_shape(a.dlog_decay, {p.B, p.Hv, p.T}, op + ": dlog_decay", "(the shape of log_decay)");
  core::expect_data(a.dlog_decay, op + ": dlog_decay");
  if (a.dinitial_state) {
    check_state(*a.dinitial_state, a.q, p, op + ": dinitial_state");
    p.has_dinitial = true;
    p.dinitial = state_strides(*a.dinitial_state);
  }
  if (a.workspace) {
    core::expect_same_device(*a.workspace, a.q, op + ": workspace", "q");
    core::expect_dtype(*a.workspace, DType::u8, op + ": workspace");
  }
  core::expect_outputs_apart({{a.dq, op + ": dq"}, {a.dk, op + ": dk"}, {a.dv, op + ": dv"}, {a.dbeta, op + ": dbeta"},
                              {a.dlog_decay, op + ": dlog_decay"}, {a.dinitial_state, op + ": dinitial_state"},
                              {a.workspace, op + ": workspace"}},
                             {{a.q, op + ": q"}, {a.k, op + ": k"}, {a.v, op + ": v"}, {a.beta, op + ": beta"},
                              {a.log_decay, op + ": log_decay"}, {a.initial_state, op + ": initial_state"},
                              {a.cu_seqlens, op + ": cu_seqlens"}, {a.dout, op + ": dout"},
                              {a.dfinal_state, op + ": dfinal_state"}});
  p.out = p.dout = seq_strides(a.dout);
  p.dq = seq_strides(a.dq);
  p.dk = seq_strides(a.dk);
  p.dv = seq_strides(a.dv);
  p.dbeta = seq_strides(a.dbeta);
  p.dg = seq_strides(a.dlog_decay);
  return p;
}

}  // namespace rudnn::gated_delta
