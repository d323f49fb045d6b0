// What the gated delta CUDA kernels share: the kernel parameters, element conversions and
// the per-sequence token range.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/convert.cuh"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "gated_delta/problem.hpp"

namespace rudnn::gated_delta::cuda {

using i64 = std::int64_t;

// Everything a kernel reads about the call, passed by value.
struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* beta = nullptr;
  const float* g = nullptr;
  const float* initial = nullptr;  // may be null (zeros)
  const void* cu_seqlens = nullptr;
  bool cu_int64 = false;
  i64 cu_stride = 1;
  void* out = nullptr;             // forward output / backward dv
  float* final_state = nullptr;    // forward final state / backward dinitial_state (may be null)
  const void* dout = nullptr;      // backward
  const float* dfinal = nullptr;   // backward, may be null
  i64 B = 0, T = 0, Hk = 0, Hv = 0, K = 0, V = 0, N = 0, group = 1;
  float scale = 1.0f;
  SeqStrides sq, sk, sv, sbeta, sg, sout, sdout;
  StateStrides sinit, sfinal, sdfinal;
};

Params make_params(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta,
                   const Tensor& g, const Tensor* initial, const Tensor* cu_seqlens);

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

using core::from_float;
using core::to_float;

template <class T>
__device__ __forceinline__ float load(const void* base, const SeqStrides& s, i64 b, i64 h, i64 t, i64 i = 0) {
  return to_float(static_cast<const T*>(base)[b * s.b + h * s.h + t * s.t + i]);
}

// Token range [bos, eos) and batch row of sequence n. Device-side cu_seqlens are not checked
// on the host (that would synchronize), so they are clamped here into 0 <= bos <= eos <= T.
struct Sequence {
  i64 b, bos, eos;
};

__device__ __forceinline__ Sequence sequence(const Params& p, i64 n) {
  if (!p.cu_seqlens) return {n, 0, p.T};
  auto at = [&](i64 i) -> i64 {
    return p.cu_int64 ? static_cast<const std::int64_t*>(p.cu_seqlens)[i * p.cu_stride]
                      : i64(static_cast<const std::int32_t*>(p.cu_seqlens)[i * p.cu_stride]);
  };
  const i64 lo = min(max(at(n), i64(0)), p.T);
  const i64 hi = min(max(at(n + 1), lo), p.T);
  return {0, lo, hi};
}

// Rows of `cols` elements of esize bytes at base + b * s.b + h * s.h + t * s.t start on 16-byte
// boundaries and hold whole 16-byte pieces (a dimension of extent 1 never steps): the chunked
// kernels may then move them as 16-byte cp.async pieces.
inline bool rows_in_16_bytes(const void* base, const SeqStrides& s, i64 B, i64 H, i64 T, i64 cols, i64 esize = 2) {
  const auto whole = [esize](i64 elems) { return elems * esize % 16 == 0; };
  return reinterpret_cast<std::uintptr_t>(base) % 16 == 0 && whole(cols) && (B == 1 || whole(s.b)) &&
         (H == 1 || whole(s.h)) && (T == 1 || whole(s.t));
}

// Workspace slots of the chunked kernels (forward and backward): the slot of sequence n's chunk ch
// is chunk_slot0 + ch, with ceil(T / C) slots per batch row, or bos / C + n with varlen, which
// never overlaps the previous sequence's slots.
__device__ __forceinline__ i64 chunk_slot0(const Params& p, i64 C, i64 chunks_per_batch, i64 n, const Sequence& s) {
  return p.cu_seqlens ? s.bos / C + n : n * chunks_per_batch;
}

// The sequence of a workspace slot and its chunk's first token c0 (c0 >= eos for a slot no chunk
// uses: varlen slack). chunk_slot0 is increasing in n, so varlen finds n by a binary search.
struct SlotChunk {
  i64 n, c0;
  Sequence s;
};
__device__ __forceinline__ SlotChunk slot_chunk(const Params& p, i64 C, i64 chunks_per_batch, i64 slot) {
  i64 n = 0;
  if (p.cu_seqlens) {
    i64 lo = 0, hi = p.N - 1;
    while (lo < hi) {
      const i64 mid = (lo + hi + 1) / 2;
      if (chunk_slot0(p, C, chunks_per_batch, mid, sequence(p, mid)) <= slot) lo = mid; else hi = mid - 1;
    }
    n = lo;
  } else {
    n = slot / chunks_per_batch;
  }
  const Sequence s = sequence(p, n);
  return {n, s.bos + (slot - chunk_slot0(p, C, chunks_per_batch, n, s)) * C, s};
}

}  // namespace rudnn::gated_delta::cuda

namespace rudnn::gated_delta::cuda {

// The recurrent kernels: a block owns a [K, 32] column slice of one state (one value head of
// one sequence). Lane x of warp y holds column x, rows y*32 .. y*32+31, so every state load and
// store is a coalesced 128-byte row and the reductions over K are a sum over the warps.
constexpr int kRowsPerThread = 32;
constexpr int kColsPerBlock = 32;
constexpr int kMaxRowGroups = 8;  // K <= 256
constexpr int kMaxK = kRowsPerThread * kMaxRowGroups;
static_assert(kMaxK == kMaxCudaK, "validate.cpp checks K against kMaxCudaK");

inline i64 value_tiles(i64 V) { return (V + kColsPerBlock - 1) / kColsPerBlock; }
inline int row_groups(i64 K) { return int((K + kRowsPerThread - 1) / kRowsPerThread); }

// Column j of state (n, h), rows row0 .. row0+31, into S (zeros when absent or out of range).
__device__ __forceinline__ void load_state_slice(float (&S)[kRowsPerThread], const float* base, const StateStrides& s,
                                                 i64 n, i64 h, int row0, i64 j, i64 K, i64 V) {
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const i64 i = row0 + r;
    S[r] = (base && i < K && j < V) ? base[n * s.n + h * s.h + i * s.k + j] : 0.0f;
  }
}

__device__ __forceinline__ void store_state_slice(const float (&S)[kRowsPerThread], float* base, const StateStrides& s,
                                                  i64 n, i64 h, int row0, i64 j, i64 K, i64 V) {
  if (!base || j >= V) return;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const i64 i = row0 + r;
    if (i < K) base[n * s.n + h * s.h + i * s.k + j] = S[r];
  }
}

}  // namespace rudnn::gated_delta::cuda

namespace rudnn::gated_delta::cuda {

// Scratch of the recurrent backward (float32, carved out of the caller's workspace).
struct BackwardWorkspace {
  float* checkpoints = nullptr;  // state before every chunk: [Hv, vtiles, slots, Kp, 32]
  float* chunk_states = nullptr; // states inside the chunk being differentiated: [blocks, C + 1, Kp, 32]
  float* dq_part = nullptr;      // per value head and column tile: [vtiles, B, Hv, T, K]
  float* dk_part = nullptr;      // [vtiles, B, Hv, T, K]
  float* dbeta_part = nullptr;   // [vtiles, B, Hv, T]
  float* dg_part = nullptr;      // [vtiles, B, Hv, T]
  i64 slots = 0;                 // checkpoint slots per (head, column tile)
  i64 chunks_per_batch = 0;      // ceil(T / C) without varlen
};

constexpr int kBackwardChunk = 64;  // tokens between state checkpoints in the recurrent backward

// Sizes in floats of the regions above, in order.
struct BackwardLayout {
  i64 checkpoints, chunk_states, dq_part, dk_part, dbeta_part, dg_part, slots, chunks_per_batch;
};
BackwardLayout backward_layout(const Problem& p);

void recurrent_forward(const Params& params, DType dtype, cudaStream_t stream);
// The tensor-core chunked forward (chunked_forward.cu): chunk_size 64, K <= 128, f16/bf16.
// Its workspace holds, per (chunk slot, value head), G (f32), P, -W and U' (operand dtype).
struct ChunkWorkspace {
  float* g = nullptr;
  void* p = nullptr;
  void* w = nullptr;
  void* u = nullptr;
  i64 vp = 0;                // U' row length: V rounded up to the 32-column tiles
  i64 chunks_per_batch = 0;  // ceil(T / 64) without varlen
};
struct ChunkLayout {
  i64 vtiles, vp, chunks_per_batch, slots;  // slots: ceil(T / 64) per batch row, or T / 64 + N with varlen
  i64 g_bytes, p_bytes, w_bytes, u_bytes;   // each a multiple of 256
};
ChunkLayout chunked_forward_layout(const Problem& p);
bool chunked_forward_supported(const Problem& p, int max_smem_per_block);
// wgmma: the state kernel's products on wgmma (sm_90a; only on a compute capability 9.0 device).
void chunked_forward(const Params& params, const Problem& problem, void* workspace, DType dtype, bool wgmma,
                     cudaStream_t stream);
// The chunked backward (chunked_backward.cu): chunk_size <= 64, K <= 128, every dtype, float32
// FMAs (the local kernel's K K^T on mma.sync for f16/bf16). Its workspace (float32, carved from the caller's buffer), per (chunk slot, value head):
// G [C] (float64: e^(G_i - G_j) stays accurate where the cumulative sums are large), T and P [C][C], W [C][K], U and dU [C][V], the chunk's start state S0 and the gradient of
// its end state dS_C [K][V]; per (chunk slot, q/k head): dq and dk accumulators [C][K].
struct ChunkedBackwardWorkspace {
  double* g = nullptr;
  float *t = nullptr, *p = nullptr, *w = nullptr, *u = nullptr, *du = nullptr, *s0 = nullptr,
        *dsc = nullptr, *dq_acc = nullptr, *dk_acc = nullptr;
  i64 C = 64;                // chunk size
  i64 chunks_per_batch = 0;  // ceil(T / C) without varlen
};
// Sizes in floats (G: two per value) of the regions above, in order; slots: ceil(T / C) per batch row, or T / C + N
// with varlen.
struct ChunkedBackwardLayout {
  i64 g, t, p, w, u, du, s0, dsc, dq_acc, dk_acc, slots, chunks_per_batch;
};
ChunkedBackwardLayout chunked_backward_layout(const Problem& p);
bool chunked_backward_supported(const Problem& p, int max_smem_per_block);
void chunked_backward(const Params& params, const ChunkedBackwardWorkspace& ws, DType dtype, void* dq, SeqStrides sdq,
                      void* dk, SeqStrides sdk, void* dbeta, SeqStrides sdbeta, float* dg, SeqStrides sdg,
                      i64 slots, const core::DeviceProps& device, cudaStream_t stream);
// The backward runs the chunked kernels from this many tokens on (strategy "auto"; a guess, not
// measured: below it the token-by-token kernel's 64-token chain is short anyway).
constexpr i64 kChunkedBackwardMinT = 256;
void recurrent_backward(const Params& params, const BackwardWorkspace& ws, DType dtype, void* dq, SeqStrides sdq,
                        void* dk, SeqStrides sdk, void* dbeta, SeqStrides sdbeta, float* dg, SeqStrides sdg,
                        cudaStream_t stream);

}  // namespace rudnn::gated_delta::cuda
