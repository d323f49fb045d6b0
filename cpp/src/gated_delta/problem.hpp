// The validated form of a gated delta rule call, shared by the CPU and CUDA backends.
// validate.cpp builds it after every check has passed; backends assume it is valid.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rudnn/gated_delta.hpp"

namespace rudnn::gated_delta {

// Element strides of a [B, H, T] or [B, H, T, X] tensor (X, when present, is dense).
struct SeqStrides {
  std::int64_t b = 0, h = 0, t = 0;
};

// Element strides of a [N, H, K, V] state (V is dense).
struct StateStrides {
  std::int64_t n = 0, h = 0, k = 0;
};

struct Problem {
  std::int64_t B = 0, T = 0, Hk = 0, Hv = 0, K = 0, V = 0;
  std::int64_t N = 0;      // number of sequences (= states): B, or cu_seqlens.size - 1
  std::int64_t group = 1;  // Hv / Hk: value head h reads q/k head h / group
  bool varlen = false;     // sequences come from cu_seqlens (then B == 1)
  DType dtype = DType::f32;      // q, k, v, beta, out
  DType cu_dtype = DType::i32;   // cu_seqlens
  float scale = 1.0f;
  int chunk_size = 64;
  GatedDeltaKernel kernel = GatedDeltaKernel::automatic;
  SeqStrides q, k, v, beta, g, out;
  bool has_initial = false;
  StateStrides initial, final_state;
  // Backward only.
  SeqStrides dout, dq, dk, dv, dbeta, dg;
  bool has_dfinal = false, has_dinitial = false;
  StateStrides dfinal, dinitial;
};

// Shared-memory limit the chunk_size check applies to CPU tensors: the opt-in maximum per
// block of sm90 (H100/H200), so a chunk size the CPU accepts is one the largest GPU accepts.
constexpr std::int64_t kCpuSharedMemoryLimit = 232448;
// The CUDA kernels keep a [K, 32] state slice in the registers of K / 32 warps.
constexpr std::int64_t kMaxCudaK = 256;

inline std::int64_t chunk_workspace_bytes(std::int64_t c) { return 4 * (c * c + c); }

// The chunked form takes e^(G_i - G_j) of cumulative log decays, where -inf - (-inf) is NaN; log
// decays below this floor (-inf included) are raised to it there. e^-80 ~ 1.8e-35 resets the
// state to float32 precision, as the recurrent form's e^-inf = 0 does exactly; NaN stays NaN.
constexpr float kChunkedLogDecayFloor = -80.0f;
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float chunked_log_decay(float g) { return g < kChunkedLogDecayFloor ? kChunkedLogDecayFloor : g; }

// read_offsets = false skips the checks of cu_seqlens' values (JAX trace-time validation,
// where arrays have no data yet); device arrays are never read on the host anyway.
Problem validate_forward(const GatedDeltaForwardArgs& args, bool read_offsets = true);
Problem validate_backward(const GatedDeltaBackwardArgs& args, bool read_offsets = true);

// CPU reference backend (cpu.cpp).
void forward_cpu(const GatedDeltaForwardArgs& args, const Problem& p);
void backward_cpu(const GatedDeltaBackwardArgs& args, const Problem& p);

// CUDA backend (gated_delta_*.cu). The caller has made the tensors' device current.
std::size_t forward_workspace_bytes_cuda(const GatedDeltaForwardArgs& args, const Problem& p);
std::size_t backward_workspace_bytes_cuda(const GatedDeltaBackwardArgs& args, const Problem& p);
// Returns the kernel it ran: "chunked" or "recurrent".
const char* forward_cuda(const GatedDeltaForwardArgs& args, const Problem& p, Stream stream);
// Returns the kernel it ran: "chunked_backward" or "recurrent_backward".
const char* backward_cuda(const GatedDeltaBackwardArgs& args, const Problem& p, Stream stream);

}  // namespace rudnn::gated_delta
