// The validated form of an attention call, shared by the CPU and CUDA backends.
// validate.cpp builds it after every check has passed; backends assume it is valid.
// It is plain data (copied to kernels by value) and its helpers run on host and device.
#pragma once

#include <cstdint>

#include "core/rows.hpp"  // RUDNN_HD
#include "rudnn/attention.hpp"

namespace rudnn::attention {

// Element strides of a [batch, head, seq, ...] operand; for varlen operands the batch
// stride is 0 and rows start at cu_seqlens[b].
struct Strides {
  std::int64_t b = 0, h = 0, s = 0;
  RUDNN_HD std::int64_t at(std::int64_t bi, std::int64_t hi, std::int64_t si) const {
    return bi * b + hi * h + si * s;
  }
};

// A mask or bias broadcast to [B, Hq, Sq, Sk] (stride 0 on broadcast axes).
struct Broadcast {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t b = 0, h = 0, i = 0, j = 0;
  RUDNN_HD std::int64_t at(std::int64_t bi, std::int64_t hi, std::int64_t qi, std::int64_t kj) const {
    return bi * b + hi * h + qi * i + kj * j;
  }
};

struct Problem {
  bool varlen = false;
  std::int64_t batch = 0;
  std::int64_t hq = 0, hkv = 0, group = 1;  // group = hq / hkv
  std::int64_t sq = 0, sk = 0;              // dense: sequence lengths; varlen: Tq, Tk (upper bounds)
  std::int64_t d = 0, dv = 0;
  DType dtype = DType::f32;                 // of q, k, v, out (and dout, dq, dk, dv)
  float scale = 1.0f;
  float softcap = 0.0f;                     // 0 = off
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  const std::int32_t* cu_q = nullptr;       // varlen only ([batch + 1], on the tensors' device)
  const std::int32_t* cu_k = nullptr;
  Strides q, k, v, out, lse;                // lse.b/h/s index the float32 lse (if any)
  Broadcast mask, bias;                     // data == nullptr when absent
  bool mask_is_bool = false;

  // Rows [q0, q0 + len_q) of q/out/lse and [k0, k0 + len_k) of k/v belong to batch b.
  // Device code clamps cu_seqlens to [0, total] so that bad values never read out of bounds
  // (they are validated on the CPU; on CUDA they are not read by the host).
  RUDNN_HD void sequence(std::int64_t b, std::int64_t& q0, std::int64_t& len_q, std::int64_t& k0,
                         std::int64_t& len_k) const {
    if (!varlen) {
      q0 = 0, len_q = sq, k0 = 0, len_k = sk;
      return;
    }
    q0 = clamp(cu_q[b], sq), k0 = clamp(cu_k[b], sk);
    const std::int64_t q1 = clamp(cu_q[b + 1], sq), k1 = clamp(cu_k[b + 1], sk);
    len_q = q1 > q0 ? q1 - q0 : 0;
    len_k = k1 > k0 ? k1 - k0 : 0;
  }

  // Causal and sliding-window visibility of key j to query i (both local to the sequence),
  // aligned to the bottom-right corner: query i sits at key position i + len_k - len_q.
  RUDNN_HD bool visible(std::int64_t i, std::int64_t j, std::int64_t len_q, std::int64_t len_k) const {
    const std::int64_t pos = i + len_k - len_q;
    if (causal && j > pos) return false;
    if (window_left >= 0 && j < pos - window_left) return false;
    if (window_right >= 0 && j > pos + window_right) return false;
    return true;
  }

  // No mask, bias or softcap (causal and window allowed): the flash kernels then keep the raw
  // dots (the scale folded into the exp2, cuda_common.cuh log2_factor) and test causal and window
  // visibility by position in tile coordinates (TileBand) instead of calling the whole transform
  // (general_logit) for each score. (Softcap inline, even as a uniform branch never taken, grew
  // the plain kernels by up to 32 registers, and made the sm90a dk/dv kernel at D = 128 spill:
  // bench/NOTES.md, 2026-12-01.)
  bool plain_scores() const { return mask.data == nullptr && bias.data == nullptr && !(softcap > 0.0f); }
  // Softcap without a mask or bias (causal and window allowed): the warp-specialized forward and
  // dk/dv kernel have an instantiation for it with the transform inline (Gemma-style models cap
  // every call). Its formula, cap - 2 cap / (1 + e^(2 dot / cap)), carries an absolute error of a
  // few 1e-7 cap whatever the logit (cuda_common.cuh SoftcapTransform): at most ~1e-4 for caps up
  // to kInlineSoftcapMax (Gemma 2: 50, Grok: 30), but 0 for every logit once cap is huge (1e35);
  // larger caps take the general instantiation (tanhf).
  static constexpr float kInlineSoftcapMax = 256.0f;
  bool softcap_scores() const {
    return mask.data == nullptr && bias.data == nullptr && softcap > 0.0f && softcap <= kInlineSoftcapMax;
  }

  bool has_mask() const { return mask.data != nullptr; }
  bool has_bias() const { return bias.data != nullptr; }

 private:
  RUDNN_HD static std::int64_t clamp(std::int64_t v, std::int64_t total) { return v < 0 ? 0 : v > total ? total : v; }
};

// Backward adds the gradient operands (same layouts as their forward twins).
struct BackwardProblem {
  Problem fwd;
  Strides dout, dq, dk, dv;
  bool deterministic = false;
  const float* dlse = nullptr;  // the gradient through lse (optional), indexed like lse by dlse_at
  Strides dlse_at;

  // The row term of dS_ij = P_ij (dP_ij - delta_i): delta_i = dout_i . out_i - dlse_i, the
  // second part because d lse_i / d s_ij = P_ij. `dot` is dout_i . out_i.
  RUDNN_HD float row_delta(float dot, std::int64_t b, std::int64_t h, std::int64_t row) const {
    return dlse == nullptr ? dot : dot - dlse[dlse_at.at(b, h, row)];
  }
};

Problem validate_forward(const AttentionForwardArgs& args);
BackwardProblem validate_backward(const AttentionBackwardArgs& args);

// CPU reference backend (cpu.cpp).
void forward_cpu(const AttentionForwardArgs& args, const Problem& p);
void backward_cpu(const AttentionBackwardArgs& args, const BackwardProblem& p);

// CUDA backend (*.cu). The caller has made the tensors' device current.
std::size_t forward_workspace_bytes_cuda(const Problem& p, AttentionStrategy strategy);
std::size_t backward_workspace_bytes_cuda(const BackwardProblem& p, AttentionStrategy strategy);
const char* forward_cuda(const AttentionForwardArgs& args, const Problem& p, const Tensor* workspace, Stream stream);
const char* backward_cuda(const AttentionBackwardArgs& args, const BackwardProblem& p, const Tensor* workspace,
                          Stream stream);

}  // namespace rudnn::attention
