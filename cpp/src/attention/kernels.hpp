// Launchers of the attention CUDA kernels (host side), one group per strategy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/problem.hpp"

namespace rudnn::attention {

// fallback_cuda.cu: simple kernels, any float dtype, any head dims, any mask; no
// Sq x Sk matrix in memory. Backward is deterministic by construction (no atomics).
void fallback_forward(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                      Stream stream);
std::size_t fallback_backward_workspace_bytes(const Problem& p);

// The flash backward's workspace: delta (fallback_backward_workspace_bytes), then, where the
// sm90ws backward runs with deterministic = false, its float32 dQ accumulator (D floats per delta
// row) from the next 256-byte boundary.
inline std::size_t dq_accumulator_offset(const Problem& p) {
  return (fallback_backward_workspace_bytes(p) + 255) / 256 * 256;
}
inline std::size_t dq_accumulator_bytes(const Problem& p) {
  return fallback_backward_workspace_bytes(p) * std::size_t(p.d);
}
void fallback_backward(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                       const void* out, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                       Stream stream);

// The flash kernels (f16/bf16; the caller has checked the rest of what they need, see
// attention_cuda.cu), one file per head-dim pair and generation, all of one signature.
using FlashForward = void (*)(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                              Stream stream);
using FlashBackward = void (*)(const BackwardProblem& bp, const void* dout, const void* q, const void* k,
                               const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv,
                               void* workspace, Stream stream);

// flash_fwd_sm80_*.cu: the CuTe sm80 forward (mma.sync), on Ampere, Ada and Hopper.
void flash_forward_sm80_d64(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm80_d96(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm80_d128(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm80_d192_dv128(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm80_d256(const Problem&, const void*, const void*, const void*, void*, float*, Stream);

// flash_fwd_sm90_*.cu: the sm90a forward (wgmma for both GEMMs), Hopper only; every head-dim pair.
void flash_forward_sm90_d64(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90_d96(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90_d128(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90_d192_dv128(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90_d256(const Problem&, const void*, const void*, const void*, void*, float*, Stream);

// flash_fwd_sm90ws_*.cu: the warp-specialized sm90a forward (TMA producer warpgroup, two
// wgmma consumer warpgroups), Hopper only; chosen by RUDNN_ATTENTION_FLASH=sm90ws until measured,
// where tma_forward_supports (tma.hpp) allows it.
void flash_forward_sm90ws_d64(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90ws_d128(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90ws_d192_dv128(const Problem&, const void*, const void*, const void*, void*, float*, Stream);
void flash_forward_sm90ws_d256(const Problem&, const void*, const void*, const void*, void*, float*, Stream);

// flash_bwd_sm80_*.cu: the CuTe sm80 backward, no atomics (deterministic). The workspace holds
// delta_i = dout_i . out_i: fallback_backward_workspace_bytes.
void flash_backward_sm80_d64(const BackwardProblem&, const void*, const void*, const void*, const void*,
                             const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm80_d96(const BackwardProblem&, const void*, const void*, const void*, const void*,
                             const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm80_d128(const BackwardProblem&, const void*, const void*, const void*, const void*,
                              const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm80_d192_dv128(const BackwardProblem&, const void*, const void*, const void*, const void*,
                                    const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm80_d256(const BackwardProblem&, const void*, const void*, const void*, const void*,
                              const void*, const float*, void*, void*, void*, void*, Stream);
// flash_bwd_sm90_*.cu: the sm90a backward (wgmma for all five products), Hopper only; every pair.
void flash_backward_sm90_d64(const BackwardProblem&, const void*, const void*, const void*, const void*,
                             const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90_d96(const BackwardProblem&, const void*, const void*, const void*, const void*,
                             const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90_d128(const BackwardProblem&, const void*, const void*, const void*, const void*,
                              const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90_d192_dv128(const BackwardProblem&, const void*, const void*, const void*, const void*,
                                    const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90_d256(const BackwardProblem&, const void*, const void*, const void*, const void*,
                              const void*, const float*, void*, void*, void*, void*, Stream);
// flash_bwd_sm90ws_*.cu: the warp-specialized sm90a backward (a TMA-fed dk/dv kernel; dq by sm90's
// dq kernel where deterministic, else accumulated by the dk/dv kernel in float32 with atomics),
// Hopper only; head dims in 64-column multiples.
void flash_backward_sm90ws_d64(const BackwardProblem&, const void*, const void*, const void*, const void*,
                               const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90ws_d128(const BackwardProblem&, const void*, const void*, const void*, const void*,
                                const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90ws_d192_dv128(const BackwardProblem&, const void*, const void*, const void*, const void*,
                                      const void*, const float*, void*, void*, void*, void*, Stream);
void flash_backward_sm90ws_d256(const BackwardProblem&, const void*, const void*, const void*, const void*,
                                const void*, const float*, void*, void*, void*, void*, Stream);
// The sm80 backward's shared memory, stated here so that the host can check a device before
// launching (flash_bwd_sm80.cuh asserts that its kernels take what this says): the dk/dv kernel,
// the larger, holds 64-row tiles of Q, dO, K and V and 64 x 64 tiles of P and dS, 16-bit elements.
constexpr std::size_t flash_backward_smem_bytes(std::int64_t d, std::int64_t dv) {
  return std::size_t((64 + 64) * (d + dv) + 2 * 64 * 64) * 2;
}

}  // namespace rudnn::attention
