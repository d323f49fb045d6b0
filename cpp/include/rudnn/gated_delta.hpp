// Gated delta rule (Gated DeltaNet linear attention, Qwen3-Next / Qwen3.5), SPEC section 5.
//
// Per value head, with state S [K, V] (float32):
//   S_t = exp(g_t) * S_{t-1};  S_t += k_t (x) (beta_t * (v_t - S_t^T k_t));  o_t = S_t^T (scale * q_t)
//
// Shapes (any strides; q, k, v, out, states have a dense last axis):
//   q, k       [B, Hk, T, K]   f32 / f16 / bf16
//   v          [B, Hv, T, V]   q's dtype; Hv a multiple of Hk, value head j reads q/k head j / (Hv / Hk)
//   beta       [B, Hv, T]      q's dtype
//   log_decay  [B, Hv, T]      float32 (g_t, usually log-sigmoid outputs, <= 0)
//   states     [N, Hv, K, V]   float32; N = B, or the number of sequences with cu_seqlens
//   cu_seqlens [N + 1]         int32 / int64, B == 1: sequence n is tokens [cu[n], cu[n+1]) of the
//                              packed T axis and has its own state.
//   out        [B, Hv, T, V]   q's dtype
// The [B, T, H, K] memory layout of FLA / vLLM is accepted as a strided [B, H, T, K] view.
#pragma once

#include <cstddef>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class GatedDeltaAlgo {
  chunked,    // chunk_gated_delta_rule: chunked prefill (chunk_size used by the CUDA chunked kernel)
  recurrent,  // gated_delta_rule: token by token (decode)
};

// The kernel of a forward call (Python's strategy=). Every kernel computes the same function;
// only rounding differs.
enum class GatedDeltaKernel {
  automatic,  // chunk_gated_delta_rule: the chunked kernel where it applies, else the recurrent one
  chunked,    // the chunked WY/UT form (CUDA: tensor cores, chunk_size 64, K <= 128, f16/bf16 only;
              // UnsupportedError elsewhere); chunk_gated_delta_rule only
  recurrent,  // token by token
};

struct GatedDeltaForwardArgs {
  GatedDeltaAlgo algo = GatedDeltaAlgo::chunked;
  GatedDeltaKernel kernel = GatedDeltaKernel::automatic;
  Tensor q, k, v, beta, log_decay;
  const Tensor* initial_state = nullptr;  // optional (zeros); read only, never written
  const Tensor* cu_seqlens = nullptr;     // optional varlen packing
  float scale = 1.0f;                     // finite
  int chunk_size = 64;                    // > 0 and 4 * (c^2 + c) bytes fit the device's shared memory per block
  Tensor out;                             // output [B, Hv, T, V]
  Tensor final_state;                     // output [N, Hv, K, V] float32
  const Tensor* workspace = nullptr;      // u8, >= gated_delta_forward_workspace_bytes(args)
};

// Bytes of scratch memory gated_delta_forward needs on args' device (the CUDA chunked kernel's
// per-chunk G, P, W and U'; 0 on the CPU and for the recurrent kernel).
std::size_t gated_delta_forward_workspace_bytes(const GatedDeltaForwardArgs& args);
void gated_delta_forward(const GatedDeltaForwardArgs& args, Stream stream = nullptr);

// Gradients of gated_delta_forward given d(out) and, optionally, d(final_state).
// dq, dk, dv, dbeta take the dtype of their input; dlog_decay and dinitial_state are float32.
struct GatedDeltaBackwardArgs {
  GatedDeltaAlgo algo = GatedDeltaAlgo::chunked;
  // automatic: the CUDA chunked backward from T >= 256 where it applies (chunk_size <= 64, K <= 128,
  // its shared memory fits), else the token-by-token one; chunked: the chunked one
  // (UnsupportedError where it does not apply); recurrent: token by token. The CPU backend
  // computes the same function either way.
  GatedDeltaKernel kernel = GatedDeltaKernel::automatic;
  Tensor q, k, v, beta, log_decay;
  const Tensor* initial_state = nullptr;
  const Tensor* cu_seqlens = nullptr;
  float scale = 1.0f;
  int chunk_size = 64;
  Tensor dout;                              // like out
  const Tensor* dfinal_state = nullptr;     // like final_state; optional (zeros)
  Tensor dq, dk, dv, dbeta, dlog_decay;     // outputs shaped like their inputs
  const Tensor* dinitial_state = nullptr;   // optional output like final_state
  const Tensor* workspace = nullptr;        // u8, >= gated_delta_backward_workspace_bytes(args)
};

// Bytes of scratch memory gated_delta_backward needs on args' device (0 on the CPU).
std::size_t gated_delta_backward_workspace_bytes(const GatedDeltaBackwardArgs& args);
void gated_delta_backward(const GatedDeltaBackwardArgs& args, Stream stream = nullptr);

// What the last forward or backward on this thread ran: "cpu", "chunked", "chunked_wgmma" (the
// chunked forward with its state kernel on wgmma: a compute capability 9.0 device and
// RUDNN_GATED_DELTA_WGMMA=1), "recurrent", "recurrent_backward" or "chunked_backward" ("none"
// before any).
const char* gated_delta_last_algorithm();

}  // namespace rudnn
