// Launchers of the attention CUDA kernels (host side), one group per strategy.
#pragma once

#include <cstddef>

#include "attention/problem.hpp"

namespace rudnn::attention {

// fallback_cuda.cu: simple kernels, any float dtype, any head dims, any mask; no
// Sq x Sk matrix in memory. Backward is deterministic by construction (no atomics).
void fallback_forward(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                      Stream stream);
std::size_t fallback_backward_workspace_bytes(const Problem& p);
void fallback_backward(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                       const void* out, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                       Stream stream);

// flash_fwd_sm80_d*.cu: the CuTe sm80 flash forward (f16/bf16, D == Dv), one file per head
// dim. The caller has checked supports (see attention_cuda.cu).
void flash_forward_sm80_d64(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                            Stream stream);
void flash_forward_sm80_d128(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                             Stream stream);

// flash_fwd_sm90_d*.cu: the sm90a flash forward (wgmma for Q K^T), same cases as sm80.
void flash_forward_sm90_d64(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                            Stream stream);
void flash_forward_sm90_d128(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                             Stream stream);

// flash_bwd_sm80_d64.cu: the CuTe sm80 flash backward (f16/bf16, D == Dv == 64), no atomics
// (deterministic). The workspace holds delta_i = dout_i . out_i: fallback_backward_workspace_bytes.
void flash_backward_sm80_d64(const BackwardProblem& bp, const void* dout, const void* q, const void* k,
                             const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv,
                             void* workspace, Stream stream);

}  // namespace rudnn::attention
