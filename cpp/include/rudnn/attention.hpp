// Dense scaled-dot-product attention, forward and backward (SPEC section 2).
//
//   score[i, j] = scale * q_i . k_j
//   score       = softcap * tanh(score / softcap)           (when softcap > 0)
//   score      += bias[b, h, i, j] + mask[b, h, i, j]       (additive float bias / mask)
//   score       = -inf where a boolean mask is false, where causal hides key j
//                 (j > i + Sk - Sq: bottom-right aligned) or the sliding window does
//   out_i       = sum_j softmax_j(score[i, :]) v_j,  lse_i = log sum_j exp(score[i, j])
// A row that sees no key gives out 0 and lse -inf (never NaN).
//
// Layouts: dense q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], any strides with
// the last axis contiguous (so [B, S, H, D] memory is a transposed view). Query head h
// reads key/value head h / (Hq / Hkv) (GQA/MQA; K/V are never repeated in memory).
// Varlen: q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] packed, with int32 cu_seqlens_q/k
// [B + 1]; sequence b owns rows cu[b] .. cu[b+1]-1; out [Tq, Hq, Dv]; lse [Hq, Tq] (as in
// FlashAttention's varlen API).
//
// libruDNN never allocates device memory: outputs and workspaces come from the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class AttentionStrategy {
  automatic,  // flash where it supports the case, else fallback
  flash,      // fused tensor-core kernel (CUDA only; error if the case is unsupported)
  fallback,   // simple CUDA kernels: any float dtype, any head dim, any mask
  autotune,   // time the CUDA candidates once per (shape class, dtype, device), cache the winner
};

// The options shared by forward and backward.
struct AttentionOptions {
  const Tensor* mask = nullptr;   // bool (true = keep) or float (additive); broadcastable to [B, Hq, Sq, Sk]
  const Tensor* bias = nullptr;   // float, additive; broadcastable to [B, Hq, Sq, Sk]
  std::optional<double> scale;    // finite, > 0; default 1/sqrt(D)
  bool causal = false;            // bottom-right aligned
  std::int64_t window_left = -1;  // sliding window: key j visible iff i' - left <= j <= i' + right,
  std::int64_t window_right = -1; // with i' = i + Sk - Sq; -1 = unbounded on that side
  double softcap = 0.0;           // 0 = off; otherwise finite > 0
  const Tensor* cu_seqlens_q = nullptr;  // int32 [B + 1] (varlen; with cu_seqlens_k)
  const Tensor* cu_seqlens_k = nullptr;
  AttentionStrategy strategy = AttentionStrategy::automatic;
};

struct AttentionForwardArgs {
  Tensor q, k, v;
  AttentionOptions options;
  Tensor out;                     // [B, Hq, Sq, Dv] (varlen [Tq, Hq, Dv]), q's dtype
  const Tensor* lse = nullptr;    // float32 [B, Hq, Sq] (varlen [Hq, Tq]); optional output
};

// Bytes of scratch memory attention_forward needs on args' device (0 on the CPU).
std::size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args);
void attention_forward(const AttentionForwardArgs& args, const Tensor* workspace = nullptr, Stream stream = nullptr);

struct AttentionBackwardArgs {
  Tensor dout, q, k, v, out, lse;  // lse: float32, as written by attention_forward
  AttentionOptions options;
  bool deterministic = false;     // bitwise run-to-run reproducible dq/dk/dv
  Tensor dq, dk, dv;              // like q, k, v (outputs)
  // Optional: the gradient of the loss with respect to lse (float32, lse's shape; any strides).
  // The gradients then include the path through lse (d lse_i / d s_ij = P_ij), as needed when
  // partial attentions are merged by their lse (split-KV, ring attention).
  const Tensor* dlse = nullptr;
};

std::size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args);
void attention_backward(const AttentionBackwardArgs& args, const Tensor* workspace = nullptr,
                        Stream stream = nullptr);

// The CUDA kernel the last call on this thread ran ("cpu", "fallback", "flash_sm80", ...).
const char* attention_last_algorithm();

}  // namespace rudnn
