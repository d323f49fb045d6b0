// Host side of the gated delta CUDA backend: kernel parameters from the validated problem,
// workspace carving, and the choice of kernel.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/check.hpp"
#include "core/device.hpp"
#include "gated_delta/cuda_common.cuh"

namespace rudnn::gated_delta {

namespace cuda {

Params make_params(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                   const Tensor& g, const Tensor* initial, const Tensor* cu_seqlens) {
  Params a;
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.beta = beta.data;
  a.g = g.ptr<float>();
  a.initial = initial ? initial->ptr<float>() : nullptr;
  if (cu_seqlens) {
    a.cu_seqlens = cu_seqlens->data;
    a.cu_int64 = cu_seqlens->dtype == DType::i64;
    a.cu_stride = cu_seqlens->strides[0];
  }
  a.B = p.B, a.T = p.T, a.Hk = p.Hk, a.Hv = p.Hv, a.K = p.K, a.V = p.V, a.N = p.N, a.group = p.group;
  a.scale = p.scale;
  a.sq = p.q, a.sk = p.k, a.sv = p.v, a.sbeta = p.beta, a.sg = p.g;
  a.sinit = p.initial;
  return a;
}

namespace {

void check_grid(const Problem& p, const char* op) {
  const i64 blocks = p.N * p.Hv * value_tiles(p.V);
  if (blocks > INT_MAX)
    core::fail(ErrorKind::unsupported, std::string(op) + ": " + std::to_string(blocks) +
                                           " thread blocks (N * Hv * ceil(V / 32)) exceed the CUDA grid limit");
}

// 256-byte aligned float regions of the backward workspace.
i64 aligned(i64 floats) { return (floats + 63) / 64 * 64; }

}  // namespace

}  // namespace cuda

namespace {

// Whether the forward runs the chunked kernel (after the strategy check).
bool use_chunked(const GatedDeltaForwardArgs& a, const Problem& p) {
  const int max_smem = core::device_props(a.q.device.index).max_smem_per_block_optin;
  const bool chunked_fits = cuda::chunked_forward_supported(p, max_smem);
  if (p.kernel == GatedDeltaKernel::chunked && !chunked_fits)
    core::fail(ErrorKind::unsupported,
               "chunk_gated_delta_rule: the CUDA chunked kernel needs chunk_size 64, K <= 128 and float16 or "
               "bfloat16 inputs, got chunk_size " + std::to_string(p.chunk_size) + ", K " + std::to_string(p.K) +
                   ", " + dtype_name(p.dtype));
  return a.algo == GatedDeltaAlgo::chunked && p.kernel != GatedDeltaKernel::recurrent && chunked_fits;
}

// Whether the chunked forward's state kernel takes its wgmma products: on a compute capability
// 9.0 device (the sm_90a code) with RUDNN_GATED_DELTA_WGMMA=1, read on every call so one
// benchmark run times both. Opt-in until a GPU run has checked it and timed it against mma.sync.
bool chunked_forward_on_wgmma(const GatedDeltaForwardArgs& a) {
  const core::DeviceProps& props = core::device_props(a.q.device.index);
  const char* env = std::getenv("RUDNN_GATED_DELTA_WGMMA");
  return props.cc_major == 9 && props.cc_minor == 0 && env != nullptr && env[0] == '1';
}

}  // namespace

std::size_t forward_workspace_bytes_cuda(const GatedDeltaForwardArgs& a, const Problem& p) {
  if (!use_chunked(a, p)) return 0;
  const cuda::ChunkLayout l = cuda::chunked_forward_layout(p);
  return std::size_t(l.g_bytes + l.p_bytes + l.w_bytes + l.u_bytes);
}

const char* forward_cuda(const GatedDeltaForwardArgs& a, const Problem& p, Stream stream) {
  cuda::check_grid(p, "gated_delta_forward");
  cuda::Params params = cuda::make_params(p, a.q, a.k, a.v, a.beta, a.log_decay, a.initial_state, a.cu_seqlens);
  params.out = a.out.data;
  params.sout = p.out;
  params.final_state = a.final_state.ptr<float>();
  params.sfinal = p.final_state;
  // Chunked prefill on tensor cores where the chunked kernel covers the case; otherwise (decode,
  // float32, other chunk sizes, K > 128) the recurrent kernel, which computes the same function.
  if (use_chunked(a, p)) {
    const bool wgmma = chunked_forward_on_wgmma(a);
    cuda::chunked_forward(params, p, a.workspace ? a.workspace->data : nullptr, p.dtype, wgmma,
                          static_cast<cudaStream_t>(stream));
    return wgmma ? "chunked_wgmma" : "chunked";
  }
  cuda::recurrent_forward(params, p.dtype, static_cast<cudaStream_t>(stream));
  return "recurrent";
}

namespace {

// Whether the backward runs the chunked kernels (after the strategy check).
bool use_chunked_backward(const GatedDeltaBackwardArgs& a, const Problem& p) {
  const int max_smem = core::device_props(a.q.device.index).max_smem_per_block_optin;
  const bool fits = cuda::chunked_backward_supported(p, max_smem);
  if (p.kernel == GatedDeltaKernel::chunked && !fits)
    core::fail(ErrorKind::unsupported,
               "chunk_gated_delta_rule_backward: the CUDA chunked backward needs chunk_size <= 64 and K <= 128 (and "
               "its shared memory within the device's limit), got chunk_size " + std::to_string(p.chunk_size) +
                   ", K " + std::to_string(p.K) + ", " + dtype_name(p.dtype));
  if (p.kernel == GatedDeltaKernel::recurrent || !fits) return false;
  return p.kernel == GatedDeltaKernel::chunked || p.T >= cuda::kChunkedBackwardMinT;
}

cuda::i64 chunked_backward_floats(const cuda::ChunkedBackwardLayout& l) {
  using cuda::aligned;
  return aligned(l.g) + aligned(l.t) + aligned(l.p) + aligned(l.w) + aligned(l.u) + aligned(l.du) + aligned(l.s0) +
         aligned(l.dsc) + aligned(l.dq_acc) + aligned(l.dk_acc);
}

}  // namespace

std::size_t backward_workspace_bytes_cuda(const GatedDeltaBackwardArgs& a, const Problem& p) {
  if (use_chunked_backward(a, p))
    return std::size_t(chunked_backward_floats(cuda::chunked_backward_layout(p))) * sizeof(float);
  const cuda::BackwardLayout l = cuda::backward_layout(p);
  const cuda::i64 floats = cuda::aligned(l.checkpoints) + cuda::aligned(l.chunk_states) + cuda::aligned(l.dq_part) +
                           cuda::aligned(l.dk_part) + cuda::aligned(l.dbeta_part) + cuda::aligned(l.dg_part);
  return std::size_t(floats) * sizeof(float);
}

const char* backward_cuda(const GatedDeltaBackwardArgs& a, const Problem& p, Stream stream) {
  cuda::check_grid(p, "gated_delta_backward");
  cuda::Params params = cuda::make_params(p, a.q, a.k, a.v, a.beta, a.log_decay, a.initial_state, a.cu_seqlens);
  params.dout = a.dout.data;
  params.sdout = p.dout;
  params.dfinal = a.dfinal_state ? a.dfinal_state->ptr<float>() : nullptr;
  params.sdfinal = p.dfinal;
  params.out = a.dv.data;  // the backward kernels write dv where the forward writes out
  params.sout = p.dv;
  params.final_state = a.dinitial_state ? a.dinitial_state->ptr<float>() : nullptr;
  params.sfinal = p.dinitial;

  float* at = a.workspace ? a.workspace->ptr<float>() : nullptr;
  auto take = [&](cuda::i64 floats) {
    float* region = at;
    at += cuda::aligned(floats);
    return region;
  };
  if (use_chunked_backward(a, p)) {
    const cuda::ChunkedBackwardLayout l = cuda::chunked_backward_layout(p);
    if (l.slots * std::max(p.Hv, p.Hk) > INT_MAX)
      core::fail(ErrorKind::unsupported, "gated_delta_backward: " + std::to_string(l.slots * p.Hv) +
                                             " thread blocks (chunks * Hv) exceed the CUDA grid limit");
    cuda::ChunkedBackwardWorkspace ws;
    ws.g = reinterpret_cast<double*>(take(l.g));
    ws.t = take(l.t);
    ws.p = take(l.p);
    ws.w = take(l.w);
    ws.u = take(l.u);
    ws.du = take(l.du);
    ws.s0 = take(l.s0);
    ws.dsc = take(l.dsc);
    ws.dq_acc = take(l.dq_acc);
    ws.dk_acc = take(l.dk_acc);
    ws.C = p.chunk_size;
    ws.chunks_per_batch = l.chunks_per_batch;
    cuda::chunked_backward(params, ws, p.dtype, a.dq.data, p.dq, a.dk.data, p.dk, a.dbeta.data, p.dbeta,
                           a.dlog_decay.ptr<float>(), p.dg, l.slots,
                           core::device_props(a.q.device.index),
                           static_cast<cudaStream_t>(stream));
    return "chunked_backward";
  }

  const cuda::BackwardLayout l = cuda::backward_layout(p);
  cuda::BackwardWorkspace ws;
  ws.checkpoints = take(l.checkpoints);
  ws.chunk_states = take(l.chunk_states);
  ws.dq_part = take(l.dq_part);
  ws.dk_part = take(l.dk_part);
  ws.dbeta_part = take(l.dbeta_part);
  ws.dg_part = take(l.dg_part);
  ws.slots = l.slots;
  ws.chunks_per_batch = l.chunks_per_batch;
  cuda::recurrent_backward(params, ws, p.dtype, a.dq.data, p.dq, a.dk.data, p.dk, a.dbeta.data, p.dbeta,
                           a.dlog_decay.ptr<float>(), p.dg, static_cast<cudaStream_t>(stream));
  return "recurrent_backward";
}

}  // namespace rudnn::gated_delta
