// Chunked backward of the gated delta rule on CUDA (issue 26 item 2): states checkpointed at
// chunk boundaries, the state gradient carried backwards across chunk boundaries, and the
// gradients of each chunk's tokens from its checkpoints alone, all chunks in parallel. It computes
// in float32. For f16/bf16 inputs the products run on tensor cores (which products may lose
// float32 operands was settled by bench/gated_delta_bwd_precision.py): the local kernel's K K^T
// and its seven products that feed only dq and dk on 16-bit mma.sync with ldmatrix operands
// (chunk_mma.cuh: 16-bit operands, float32 sums); every other product on TF32 mma.sync, a 16-bit
// input operand exact, a float32 operand split hi + lo (3xTF32 when both are float32) so that the
// sums keep float32's accuracy. Left on FMAs: the triangular inverse, the [C][C] elementwise
// terms, the row shares of dbeta / dlog_decay. float32 inputs: FMAs throughout. Its speed has not
// been measured (no GPU was available).
//
// The math. Per value head, a chunk of C tokens (the last one padded with k = q = v = beta =
// g = 0, which changes nothing), start state S0 [K, V], log decays g raised to -80
// (chunked_log_decay), G = cumsum(g), gamma = e^G, w = e^(G_last - G),
// Gam_ij = e^(G_i - G_j) for j <= i (0 above). The forward (cpu.cpp's chunked form):
//   L = strict_lower(diag(beta) (Gam * K K^T)),  T = (I + L)^-1,
//   W = T diag(beta gamma) K,  U' = T diag(beta) V,  U = U' - W S0   [(I + L) U = X,
//   X = diag(beta) (V - diag(gamma) K S0)],  P = scale Gam * Q K^T,
//   O = scale diag(gamma) Q S0 + P U,  S_C = e^(G_last) S0 + K^T diag(w) U.
// U feeds only O and S_C, so with dS_C = dL/dS_C (the chunk's end state) its full gradient is
//   dU = P^T dO + diag(w) K dS_C,
// and the gradient of the chunk's start state (= the previous chunk's dS_C) is
//   dS0 = e^(G_last) dS_C + scale (diag(gamma) Q)^T dO - W^T dU        (W^T dU: through X).
// That is the reverse pass over chunks; it needs P, W, K, Q, G and dO, not the states. Given S0,
// dS_C, U and dU every chunk's local gradients follow without any other chunk:
//   dX = T^T dU (from (I + L) U = X),  dv = diag(beta) dX,  dL = -strict_lower(dX U^T),
//   dP = lower(dO U^T),  dA = scale Gam * dP  (A = Q K^T),  D = diag(beta) Gam * dL,
//   dq = scale diag(gamma) dO S0^T + dA K,
//   dk = dA^T Q + diag(w) U dS_C^T - diag(beta gamma) dX S0^T + (D + D^T) K,
//   dbeta_i = dX_i . (v_i - gamma_i (S0^T k_i)) + sum_j dL_ij Gam_ij k_i.k_j,
//   dG_i = scale gamma_i dO_i . (S0^T q_i) - beta_i gamma_i dX_i . (S0^T k_i) - dw_i
//          + sum_j (dP_ij P_ij + dL_ij L_ij) - sum_j (dP_ji P_ji + dL_ji L_ji),
//   dw_i = w_i (K dS_C)_i . U_i,  dG_last += e^(G_last) <dS_C, S0> + sum_i dw_i,
//   dg = the reverse cumulative sum of dG over the chunk (padding rows included: their G is G_last).
// Summed as written, dg_t adds +E_ij and -E_ij (E = dP * P + dL * L) for every pair i, j >= t,
// which cancel in exact arithmetic but not in float32 (errors growing with C); the kernel sums
// only what survives:
//   dg_t = sum_{i >= t} r_i + sum_{j < t} dw_j + e^(G_last) <dS_C, S0> + sum_{i >= t > j} E_ij,
//   r_i = scale gamma_i dO_i . (S0^T q_i) - beta_i gamma_i dX_i . (S0^T k_i).
// G is kept in float64 (workspace and shared memory) and only the differences G_i - G_j, G_last - G_i
// and G_i itself are rounded to float32 before their exp: with float32 cumulative sums a chunk
// after a -inf (-80) decay loses ~1e-5 relative accuracy in every decay factor.
// tests/test_gated_delta_chunked_backward.py checks exactly these stages in float64 against torch
// autograd through the token-by-token recurrence (several C, partial chunks, -inf decays, varlen).
//
// Kernels (128 threads each; f32 in shared memory but for the state passes' staged inputs;
// storage T = float, half or bfloat16):
//  1. bwd_prep_kernel,    one CTA per (chunk slot, value head): G, T, P, W and U' to the workspace.
//  2. bwd_forward_kernel, one CTA per (sequence, value head, 32 value columns), chunks in order:
//     S0 of every chunk to the workspace (checkpoints), U = U' - W S0 in place of U'.
//  3. bwd_reverse_kernel, same grid, chunks backwards: dS_C of every chunk and dU to the
//     workspace, dinitial_state at the end.
//     Both state passes stage a chunk's tiles by cp.async, the next chunk's during this one's
//     products where two stages pay (bwd_launch_plan).
//  4. bwd_local_kernel,   one CTA per (chunk slot, q/k head): for each value head of the group in
//     order the local gradients above; dq and dk accumulate in a float32 workspace tile each of
//     whose elements only one thread touches (no atomics, fixed order), then go out in q's dtype.
// Nothing here synchronizes or allocates; the workspace is carved from the caller's buffer
// (chunked_backward_layout sizes it).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <cute/arch/copy_sm80.hpp>

#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "gated_delta/chunk_mma.cuh"
#include "gated_delta/cuda_common.cuh"

namespace rudnn::gated_delta::cuda {

namespace {

using cute::cp_async_fence;  // (named unqualified, as the host emulator's stand-ins replace them)
using cute::cp_async_wait;
using cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL;

constexpr int kBwdThreads = 128;
constexpr int kBwdMaxC = 64;    // chunk_size <= 64
constexpr int kBwdMaxK = 128;   // K <= 128
constexpr int kBwdCols = 32;    // value columns per slice (a warp's lanes)
// Row stride (floats) of the local kernel's float32 slice tiles (U, dU, dX, dO): 4 past 32, so the
// TF32 fragment reads (row g or g + 8, column t or t + 4 of a quad's lanes) fall in 32 different
// banks (at 32 they were 8-way conflicts: every row starts in bank 0).
constexpr int kSliceLd = kBwdCols + 4;
constexpr unsigned kBwdFullMask = 0xffffffffu;

// The local kernel's tensor-core operands (f16/bf16 inputs; float32 inputs keep FMAs and float32
// copies of K and Q): swizzled 16-bit tiles of the static shapes, zero padded past C, K and the
// slice's columns (zero rows and columns add nothing to a product).
using KqTile = chunk_mma::SmemTile<kBwdMaxC, kBwdMaxK>;          // K, Q: [64][128]
using RowSliceTile = chunk_mma::SmemTile<kBwdMaxC, kBwdCols>;    // [64][32]: a slice's A operands
using StateSliceTile = chunk_mma::SmemTile<kBwdMaxK, kBwdCols>;  // [128][32]: S0, dS_C slices
using PairTile = chunk_mma::SmemTile<kBwdMaxC, kBwdMaxC>;        // [64][64]: dA, D + D^T
constexpr int kKqElems = kBwdMaxC * kBwdMaxK, kRowSliceElems = kBwdMaxC * kBwdCols,
              kStateSliceElems = kBwdMaxK * kBwdCols, kPairElems = kBwdMaxC * kBwdMaxC;
// K and Q, then a region holding a slice's five operands, later dA and D + D^T (bytes; 61440, a
// multiple of 128 so the float32 tiles after it start aligned).
constexpr int kBwdTcBytes =
    2 * (2 * kKqElems + std::max(3 * kRowSliceElems + 2 * kStateSliceElems, 2 * kPairElems));
template <class T>
constexpr bool kBwdTensorCores = !std::is_void_v<typename chunk_mma::CuteOf<T>::type>;

__device__ __forceinline__ float bwd_warp_sum(float x) {
#pragma unroll
  for (int step = 16; step >= 1; step /= 2) x += __shfl_xor_sync(kBwdFullMask, x, step);
  return x;
}

// Workspace tiles of one (slot, value head).
struct BwdUnit {
  double* g;
  float *t, *pm, *w, *u, *du, *s0, *dsc;
};
__device__ __forceinline__ BwdUnit bwd_unit(const Params& p, const ChunkedBackwardWorkspace& ws, i64 slot, i64 h) {
  const i64 i = slot * p.Hv + h, C = ws.C;
  return {ws.g + i * C, ws.t + i * C * C, ws.p + i * C * C, ws.w + i * C * p.K, ws.u + i * C * p.V,
          ws.du + i * C * p.V, ws.s0 + i * p.K * p.V, ws.dsc + i * p.K * p.V};
}

// Columns [col0, col0 + cols) of rows [c0, c0 + C) of a [B, H, T, X] tensor into an f32 [C][cols]
// tile of row stride ld (cols: dense), zeros past `valid` and X.
template <class T>
__device__ __forceinline__ void bwd_stage_rows(float* dst, const void* src, const SeqStrides& st, i64 b, i64 h, i64 c0,
                                               int C, int valid, i64 col0, int cols, i64 X, int ld = 0) {
  if (ld == 0) ld = cols;
  for (int e = threadIdx.x; e < C * cols; e += kBwdThreads) {
    const int r = e / cols, c = e % cols;
    dst[r * ld + c] = (r < valid && col0 + c < X) ? load<T>(src, st, b, h, c0 + r, col0 + c) : 0.0f;
  }
}

// A swizzled 16-bit Tile (chunk_mma::SmemTile) filled with f(row, column) for each of its
// elements, 8 at a time: one 16-byte shared store per piece (the swizzle moves whole pieces).
template <class Tile, class E, class F>
__device__ __forceinline__ void bwd_fill_tile16(E* tile, F&& f) {
  constexpr int kPieces = Tile::kCols / 8;  // pieces of a row
  for (int piece = threadIdx.x; piece < Tile::kRows * kPieces; piece += kBwdThreads) {
    const int r = piece / kPieces, c = piece % kPieces * 8;
    E pack[8];
#pragma unroll
    for (int l = 0; l < 8; ++l) pack[l] = E(f(r, c + l));
    cute::uint128_t bits;
    memcpy(&bits, pack, 16);
    *reinterpret_cast<cute::uint128_t*>(&Tile::view(tile)(r, c)) = bits;
  }
}

// The local kernel's products for dq and dk on tensor cores: a cleared [64][128] float32
// accumulator in the registers of the 2 x 2 warps' mma.sync partition (64 a thread), and its
// addition into a [C][K] float32 tile of the workspace at the thread's own elements (the tile's
// only reader and writer from the first addition on).
template <class E>
__device__ __forceinline__ auto bwd_dqdk_accumulator() {
  using namespace cute;
  auto acc = partition_fragment_C(chunk_mma::make_chunk_mma<E>(), Shape<Int<kBwdMaxC>, Int<kBwdMaxK>>{});
  clear(acc);
  return acc;
}
template <class E, class Acc>
__device__ __forceinline__ void bwd_add_own(const Acc& acc, float* tile, int C, int K) {
  using namespace cute;
  auto coord = chunk_mma::make_chunk_mma<E>().get_thread_slice(threadIdx.x).partition_C(
      make_identity_tensor(Shape<Int<kBwdMaxC>, Int<kBwdMaxK>>{}));
#pragma unroll
  for (int e = 0; e < size(acc); ++e) {
    const int i = get<0>(coord(e)), x = get<1>(coord(e));
    if (i < C && x < K) tile[i * K + x] += acc(e);
  }
}

// K S0, Q S0 and K dS_C over a slice's 32 columns on TF32 tensor cores (16-bit inputs only: K and
// Q are exact in TF32, S0 and dS_C enter as hi + lo TF32 pairs, two MMAs each, so the sums keep
// about float32's accuracy, which dbeta and dlog_decay need: bench/gated_delta_bwd_precision.py).
// Warp w takes rows [16 w, 16 w + 16) and all 32 columns (four 8-column atoms); the thread's
// element e of atom j is row 16 w + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2
// (chunk_mma::mma_tf32). S0 and dS_C fragments come straight from the workspace (each element
// read once per warp), K and Q fragments from their staged tiles.
struct BwdRowTerms {
  float ks[4][4], qs[4][4], kd[4][4];  // [atom][element]: K S0, Q S0, K dS_C
};
template <class E>
__device__ __forceinline__ void bwd_row_terms_tf32(BwdRowTerms& r, const E* kb, const E* qb, const float* s0,
                                                   const float* dsc, i64 V, i64 f0, int cols, int K) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, row = 16 * int(threadIdx.x / 32) + g;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) r.ks[j][e] = r.qs[j][e] = r.kd[j][e] = 0.0f;
#pragma unroll 1
  for (int x0 = 0; x0 < K; x0 += 8) {
    std::uint32_t ka[4], qa[4];  // A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4): exact, no rounding
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row + 8 * (e % 2), x = x0 + t + 4 * (e / 2);
      const float kv = float(KqTile::view(kb)(i, x)), qv = float(KqTile::view(qb)(i, x));
      memcpy(&ka[e], &kv, 4);
      memcpy(&qa[e], &qv, 4);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int f = 8 * j + g;  // B(t, g) and B(t + 4, g) of atom j
      std::uint32_t s_hi[2], s_lo[2], d_hi[2], d_lo[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int x = x0 + t + 4 * h;
        const bool in = x < K && f < cols;
        chunk_mma::tf32_split(in ? s0[x * V + f0 + f] : 0.0f, s_hi[h], s_lo[h]);
        chunk_mma::tf32_split(in ? dsc[x * V + f0 + f] : 0.0f, d_hi[h], d_lo[h]);
      }
      chunk_mma::mma_tf32(r.ks[j], ka, s_hi[0], s_hi[1]);
      chunk_mma::mma_tf32(r.ks[j], ka, s_lo[0], s_lo[1]);
      chunk_mma::mma_tf32(r.qs[j], qa, s_hi[0], s_hi[1]);
      chunk_mma::mma_tf32(r.qs[j], qa, s_lo[0], s_lo[1]);
      chunk_mma::mma_tf32(r.kd[j], ka, d_hi[0], d_hi[1]);
      chunk_mma::mma_tf32(r.kd[j], ka, d_lo[0], d_lo[1]);
    }
  }
}

// dX = T^T dU of a slice on TF32 tensor cores (16-bit inputs): T (the lower triangle of tm, row
// stride C; its strict upper triangle holds K K^T, read here as zeros) and dU are float32, so
// 3xTF32 (hi hi + hi lo + lo hi), the accuracy dv, dbeta and dlog_decay need. T^T is upper
// triangular: 16-row block r of dX sums over tokens j >= 16 r, 8 - 2 r k steps of 8. Warps 0 and
// 1 take row blocks {0, 3}, warps 2 and 3 {1, 2}, each warp two of the four 8-column atoms (atoms
// 2 (w % 2) and 2 (w % 2) + 1): 20 atom k-steps per warp. Each element of dX goes to dxs (rows at
// or past C are not stored) and to out(i, column) (dv = beta dX, by the caller's store).
template <class Out>
__device__ __forceinline__ void bwd_dx_tf32(const float* tm, const float* dus, float* dxs, int C, Out&& out) {
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  const int atom0 = 2 * (warp % 2);
  // One row block at a time, stored before the next starts (both blocks' accumulators live at once
  // spilled on sm_80).
#pragma unroll 1
  for (int rb = 0; rb < 2; ++rb) {
    const int r = rb == 0 ? warp / 2 : 3 - warp / 2;
    float acc[2][4] = {};  // [atom][element]
#pragma unroll 1
    for (int j0 = 16 * r; j0 < C; j0 += 8) {
      std::uint32_t a_hi[4], a_lo[4];  // T^T(i, j) = T(j, i) for j >= i: rows g, g + 8, tokens t, t + 4
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * r + g + 8 * (e % 2), j = j0 + t + 4 * (e / 2);
        chunk_mma::tf32_split(j >= i && j < C && i < C ? tm[j * C + i] : 0.0f, a_hi[e], a_lo[e]);
      }
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        std::uint32_t b_hi[2], b_lo[2];  // dU(j0 + t (+ 4), 8 (atom0 + a) + g)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = j0 + t + 4 * h;
          chunk_mma::tf32_split(j < C ? dus[j * kSliceLd + 8 * (atom0 + a) + g] : 0.0f, b_hi[h], b_lo[h]);
        }
        chunk_mma::mma_tf32(acc[a], a_hi, b_hi[0], b_hi[1]);
        chunk_mma::mma_tf32(acc[a], a_hi, b_lo[0], b_lo[1]);
        chunk_mma::mma_tf32(acc[a], a_lo, b_hi[0], b_hi[1]);
      }
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * r + g + 8 * (e / 2), c = 8 * (atom0 + a) + 2 * t + e % 2;
        if (i < C) {
          dxs[i * kSliceLd + c] = acc[a][e];
          out(i, c, acc[a][e]);
        }
      }
  }
}

// One 16-row block r of dO U^T or dX U^T (A = dos or dxs) on TF32 tensor cores, added into out
// (da or dd, [C][C] float32) for the 8-column atoms that reach the block's diagonal (2 r + 2 of
// them, at most kAtoms). dO is a 16-bit input, exact in TF32, so U enters as hi + lo (2 MMAs);
// dX and U are both float32 sums, so dX U^T is hi hi + hi lo + lo hi (3xTF32 when three; lo lo is
// below float32's rounding). Fragments as in bwd_row_terms_tf32 (A: rows g, g + 8, columns t,
// t + 4; B: U's rows 8 j + g, columns t, t + 4); rows at or past C read as zeros.
template <int kAtoms>
__device__ __forceinline__ void bwd_pair_block_tf32(const float* a_rows, const float* us, float* out, int r, bool three,
                                                    int C) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4, atoms = 2 * r + 2;
  float acc[kAtoms][4];
#pragma unroll
  for (int j = 0; j < kAtoms; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  auto at = [&](const float* tile, int i, int f) { return i < C ? tile[i * kSliceLd + f] : 0.0f; };
#pragma unroll
  for (int f0 = 0; f0 < kBwdCols; f0 += 8) {
    std::uint32_t a_hi[4], a_lo[4];  // A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      chunk_mma::tf32_split(at(a_rows, 16 * r + g + 8 * (e % 2), f0 + t + 4 * (e / 2)), a_hi[e], a_lo[e]);
#pragma unroll
    for (int j = 0; j < kAtoms; ++j) {
      if (j >= atoms) break;  // warp-uniform
      std::uint32_t b_hi[2], b_lo[2];  // B(t, g), B(t + 4, g) of atom j: U(8 j + g, f0 + t (+ 4))
#pragma unroll
      for (int h = 0; h < 2; ++h) chunk_mma::tf32_split(at(us, 8 * j + g, f0 + t + 4 * h), b_hi[h], b_lo[h]);
      chunk_mma::mma_tf32(acc[j], a_hi, b_hi[0], b_hi[1]);
      chunk_mma::mma_tf32(acc[j], a_hi, b_lo[0], b_lo[1]);
      if (three) chunk_mma::mma_tf32(acc[j], a_lo, b_hi[0], b_hi[1]);
    }
  }
  // D(g, 2t), D(g, 2t + 1), D(g + 8, 2t), D(g + 8, 2t + 1) of atom j: row 16 r + g + 8 (e / 2),
  // column 8 j + 2 t + e % 2. Each entry belongs to one lane of one warp.
#pragma unroll
  for (int j = 0; j < kAtoms; ++j) {
    if (j >= atoms) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * r + g + 8 * (e / 2), c = 8 * j + 2 * t + e % 2;
      if (i < C && c < C) out[i * C + c] += acc[j][e];
    }
  }
}

// dO U^T and dX U^T of a slice (16-bit inputs), added into da and dd on and below the diagonal,
// the entries the [C][C] terms read (dP = lower(dO U^T), dL = -strict_lower(dX U^T)), at the
// float32 accuracy dbeta and dlog_decay need (bench/gated_delta_bwd_precision.py). Warps 0 and 1
// form dO U^T, warps 2 and 3 dX U^T; each takes two 16-row blocks, {0, 3} (even warps) or {1, 2}
// (odd): 10 atoms per warp. One block at a time, so at most 8 atoms of accumulators are live (both
// at once spilled on sm_80).
__device__ __forceinline__ void bwd_pair_terms_tf32(const float* dos, const float* dxs, const float* us, float* da,
                                                    float* dd, int C) {
  const int warp = int(threadIdx.x / 32);
  const bool three = warp >= 2;  // dX U^T: dX's lo part too
  const float* a_rows = three ? dxs : dos;
  float* out = three ? dd : da;
  bwd_pair_block_tf32<4>(a_rows, us, out, warp % 2, three, C);      // block 0 or 1: 2 or 4 atoms
  bwd_pair_block_tf32<8>(a_rows, us, out, 3 - warp % 2, three, C);  // block 3 or 2: 8 or 6 atoms
}

// A warp's rows of a [rows][32] slice product on TF32 tensor cores (the state passes, 16-bit
// inputs): acc[rb][j] += sum over k in [k_begin, kdim) of a(row, k) b(k, column) for the 16-row
// blocks starting at row0[rb] (blocks at or past `rows` skipped, warp-uniform) and the slice's 32
// columns (four 8-column atoms), mma.sync m16n8k8 .tf32 (chunk_mma::mma_tf32). a and b return
// float32 values, zero outside their operand (k past kdim included: k steps are 8 wide).
// kSplitA / kSplitB: that operand is a float32 sum and enters as hi + lo (tf32_split); an operand
// that is a 16-bit input is exact in TF32 and is passed unrounded. So 1, 2 or 3 MMAs per atom and
// k step (3xTF32 when both are split: about float32's accuracy, which the state recurrences need,
// bench/gated_delta_bwd_precision.py). Element e of atom j of block rb is row
// row0[rb] + g + 8 (e / 2), column 8 j + 2 t + e % 2 (g = lane / 4, t = lane % 4).
template <int kBlocks, bool kSplitA, bool kSplitB, class FA, class FB>
__device__ __forceinline__ void bwd_slice_mma_tf32(float (&acc)[kBlocks][4][4], const int (&row0)[kBlocks], int rows,
                                                   int k_begin, int kdim, FA&& a, FB&& b) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  auto operand = [](float v, std::uint32_t& hi, std::uint32_t& lo, auto split) {
    if constexpr (decltype(split)::value) {
      chunk_mma::tf32_split(v, hi, lo);
    } else {
      memcpy(&hi, &v, 4);  // exact in TF32
      lo = 0;
    }
  };
#pragma unroll 1
  for (int k0 = k_begin; k0 < kdim; k0 += 8) {
    std::uint32_t b_hi[4][2], b_lo[4][2];  // B(t, g), B(t + 4, g) of atom j
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        operand(b(k0 + t + 4 * h, 8 * j + g), b_hi[j][h], b_lo[j][h], std::bool_constant<kSplitB>{});
#pragma unroll
    for (int rb = 0; rb < kBlocks; ++rb) {
      if (row0[rb] >= rows) continue;  // warp-uniform
      std::uint32_t a_hi[4], a_lo[4];  // A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        operand(a(row0[rb] + g + 8 * (e % 2), k0 + t + 4 * (e / 2)), a_hi[e], a_lo[e], std::bool_constant<kSplitA>{});
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        chunk_mma::mma_tf32(acc[rb][j], a_hi, b_hi[j][0], b_hi[j][1]);
        if constexpr (kSplitB) chunk_mma::mma_tf32(acc[rb][j], a_hi, b_lo[j][0], b_lo[j][1]);
        if constexpr (kSplitA) chunk_mma::mma_tf32(acc[rb][j], a_lo, b_hi[j][0], b_hi[j][1]);
      }
    }
  }
}

// Visits the elements of bwd_slice_mma_tf32's accumulators (one or more, same blocks):
// f(row, column, value of each accumulator).
template <int kBlocks, class F, class... Acc>
__device__ __forceinline__ void bwd_slice_mma_each(const int (&row0)[kBlocks], F&& f, const Acc&... acc) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
#pragma unroll
  for (int rb = 0; rb < kBlocks; ++rb)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(row0[rb] + g + 8 * (e / 2), 8 * j + 2 * t + e % 2, acc[rb][j][e]...);
}

// T = (I + L)^-1 for a strictly lower triangular [C][C] L (row stride ld, C <= 64) into tm (same
// stride; the upper triangle zero), blocked by 16 rows: the diagonal blocks by forward substitution,
// one column per thread (chains of at most 15 steps instead of C - 1), then block row a = 1, 2, 3
// from those above it, T_ab = -T_aa (sum over b <= m < a of L_am T_mb) for every b < a at once
// (X = the sum, in registers, then into L's block row a, which nothing reads after; then T_aa X).
// Ends with a barrier; lm is scratch afterwards.
__device__ __forceinline__ void bwd_unit_lower_inverse(float* lm, float* tm, int C, int ld) {
  constexpr int kTb = 16, kMaxPerThread = kTb * (kBwdMaxC - kTb) / kBwdThreads;  // 6
  const int tid = threadIdx.x;
  for (int e = tid; e < C * C; e += kBwdThreads) {
    const int i = e / C, j = e % C;
    if (i / kTb != j / kTb || j >= i) tm[i * ld + j] = i == j ? 1.0f : 0.0f;  // (lower blocks below the diagonal: step 2)
  }
  if (tid < C) {  // column j of its diagonal block
    const int j = tid, end = min(C, (j / kTb + 1) * kTb);
    for (int i = j + 1; i < end; ++i) {
      float acc = 0.0f;
      for (int m = j; m < i; ++m) acc -= lm[i * ld + m] * (m == j ? 1.0f : tm[m * ld + j]);
      tm[i * ld + j] = acc;
    }
  }
  for (int a0 = kTb; a0 < C; a0 += kTb) {  // block row a: rows [a0, a1), columns [0, a0)
    const int a1 = min(C, a0 + kTb), count = (a1 - a0) * a0;
    __syncthreads();  // the blocks above are complete
    float x[kMaxPerThread];
#pragma unroll
    for (int n = 0; n < kMaxPerThread; ++n) {
      const int e = tid + n * kBwdThreads, i = a0 + e / a0, j = e % a0;
      x[n] = 0.0f;
      if (e < count)
        for (int k = j / kTb * kTb; k < a0; ++k) x[n] += lm[i * ld + k] * tm[k * ld + j];
    }
    __syncthreads();  // every thread is done reading L's block row a
#pragma unroll
    for (int n = 0; n < kMaxPerThread; ++n) {
      const int e = tid + n * kBwdThreads;
      if (e < count) lm[(a0 + e / a0) * ld + e % a0] = x[n];
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kMaxPerThread; ++n) {
      const int e = tid + n * kBwdThreads, i = a0 + e / a0, j = e % a0;
      if (e < count) {
        float acc = 0.0f;
        for (int l = a0; l <= i; ++l) acc -= tm[i * ld + l] * lm[l * ld + j];
        tm[i * ld + j] = acc;
      }
    }
  }
  __syncthreads();
}

// ---- 1. prep: per (chunk slot, value head) ----
// Row strides: the [C][K] tiles K + 4 floats, the [C][C] tiles C + 4, the value slices kSliceLd
// (TF32 fragment reads on 32 banks). f16/bf16 inputs: K K^T and Q K^T on TF32 (16-bit inputs are
// exact in TF32: one MMA, float32 sums), W = (T diag(beta gamma)) K and U' = (T diag(beta)) V with
// the float32 left factor split hi + lo (the right one exact: two MMAs); the triangular inverse
// stays a forward substitution. float32 inputs: FMAs.
template <class T>
__global__ void __launch_bounds__(kBwdThreads) bwd_prep_kernel(Params p, ChunkedBackwardWorkspace ws) {
  constexpr bool kTc = kBwdTensorCores<T>;
  extern __shared__ __align__(16) unsigned char bwd_smem_raw[];
  const int C = int(ws.C), K = int(p.K), tid = threadIdx.x, warp = tid / 32, ldk = K + 4, ldc = C + 4;
  double* gs = reinterpret_cast<double*>(bwd_smem_raw);  // [C] G
  float* sm = reinterpret_cast<float*>(gs + C);
  float* ks = sm;                                // [C][K] (row stride ldk)
  float* qs = ks + C * ldk;                      // [C][K] (ldk); later value slices [C][32] (kSliceLd)
  float* lm = qs + C * max(ldk, kSliceLd);       // [C][C] L (row stride ldc)
  float* tm = lm + C * ldc;                      // [C][C] T (ldc)
  float* bs = tm + C * ldc;                      // [C] beta
  float* bg = bs + C;                            // [C] beta e^G

  if (p.N == 0) return;
  const i64 slot = blockIdx.x / p.Hv, h = blockIdx.x % p.Hv, hk = h / p.group;
  const SlotChunk sc = slot_chunk(p, ws.C, ws.chunks_per_batch, slot);
  if (sc.c0 >= sc.s.eos) return;
  const int valid = int(min(i64(C), sc.s.eos - sc.c0));
  const i64 b = sc.s.b;
  const BwdUnit out = bwd_unit(p, ws, slot, h);

  bwd_stage_rows<T>(ks, p.k, p.sk, b, hk, sc.c0, C, valid, 0, K, p.K, ldk);
  bwd_stage_rows<T>(qs, p.q, p.sq, b, hk, sc.c0, C, valid, 0, K, p.K, ldk);
  if (tid < C) {
    bs[tid] = tid < valid ? load<T>(p.beta, p.sbeta, b, h, sc.c0 + tid) : 0.0f;
    gs[tid] = tid < valid ? chunked_log_decay(p.g[b * p.sg.b + h * p.sg.h + (sc.c0 + tid) * p.sg.t]) : 0.0f;
  }
  __syncthreads();
  if (tid < 32) {
    // G = cumsum(g) in float64 by a warp scan: lane l holds tokens 2l and 2l + 1 (C <= 64), their
    // sum's inclusive scan over the lanes (5 shuffle steps), then the lane's own two.
    const int i = 2 * tid;
    const double a = i < C ? gs[i] : 0.0, c = i + 1 < C ? gs[i + 1] : 0.0;
    double cum = a + c;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const double below = __shfl_up_sync(kBwdFullMask, cum, d);
      if (tid >= d) cum += below;
    }
    const double before = __shfl_up_sync(kBwdFullMask, cum, 1);
    const double g0 = (tid > 0 ? before : 0.0) + a;
    if (i < C) gs[i] = g0;
    if (i + 1 < C) gs[i + 1] = g0 + c;
  }
  __syncthreads();
  if (tid < C) {
    out.g[tid] = gs[tid];
    bg[tid] = bs[tid] * expf(float(gs[tid]));
  }
  // L (strictly lower) and P (lower, scale included) from K K^T and Q K^T at (i, j).
  auto store_lp = [&](int i, int j, float kk, float qk) {
    const float decay = j <= i ? expf(float(gs[i] - gs[j])) : 0.0f;
    lm[i * ldc + j] = j < i ? bs[i] * decay * kk : 0.0f;
    out.pm[i * C + j] = p.scale * decay * qk;
  };
  if constexpr (kTc) {
    const int row0[1] = {16 * warp};
    for (int n0 = 0; n0 < C; n0 += kBwdCols) {  // 32 columns (keys j) at a time
      float kk[1][4][4] = {}, qk[1][4][4] = {};
      auto kt = [&](int x, int j) { return x < K && n0 + j < C ? ks[(n0 + j) * ldk + x] : 0.0f; };  // K^T
      bwd_slice_mma_tf32<1, false, false>(
          kk, row0, C, 0, K, [&](int i, int x) { return i < C && x < K ? ks[i * ldk + x] : 0.0f; }, kt);
      bwd_slice_mma_tf32<1, false, false>(
          qk, row0, C, 0, K, [&](int i, int x) { return i < C && x < K ? qs[i * ldk + x] : 0.0f; }, kt);
      bwd_slice_mma_each(row0, [&](int i, int c, float kkv, float qkv) {
        if (i < C && n0 + c < C) store_lp(i, n0 + c, kkv, qkv);
      }, kk, qk);
    }
  } else {
    for (int e = tid; e < C * C; e += kBwdThreads) {
      const int i = e / C, j = e % C;
      float kk = 0.0f, qk = 0.0f;
      if (j <= i)
        for (int x = 0; x < K; ++x) {
          kk += ks[i * ldk + x] * ks[j * ldk + x];
          qk += qs[i * ldk + x] * ks[j * ldk + x];
        }
      store_lp(i, j, kk, qk);
    }
  }
  __syncthreads();
  bwd_unit_lower_inverse(lm, tm, C, ldc);  // T = (I + L)^-1; L's space is scratch after it
  for (int e = tid; e < C * C; e += kBwdThreads) out.t[e] = tm[(e / C) * ldc + e % C];
  // W = T diag(beta gamma) K. T is lower triangular: rows [16 w, 16 w + 16) sum over j < 16 w + 16.
  [[maybe_unused]] const int row0[1] = {16 * warp};  // the tensor-core path's rows
  [[maybe_unused]] const int kdim = min(C, 16 * warp + 16);
  if constexpr (kTc) {
    for (int n0 = 0; n0 < K; n0 += kBwdCols) {  // 32 key dims at a time
      float acc[1][4][4] = {};
      bwd_slice_mma_tf32<1, true, false>(
          acc, row0, C, 0, kdim, [&](int i, int j) { return i < C && j < C ? tm[i * ldc + j] * bg[j] : 0.0f; },
          [&](int j, int x) { return j < C && n0 + x < K ? ks[j * ldk + n0 + x] : 0.0f; });
      bwd_slice_mma_each(row0, [&](int i, int x, float w) {
        if (i < C && n0 + x < K) out.w[i * K + n0 + x] = w;
      }, acc);
    }
  } else {
    for (int e = tid; e < C * K; e += kBwdThreads) {
      const int i = e / K, x = e % K;
      float acc = 0.0f;
      for (int j = 0; j <= i; ++j) acc += tm[i * ldc + j] * bs[j] * expf(float(gs[j])) * ks[j * ldk + x];
      out.w[e] = acc;
    }
  }
  // U' = T diag(beta) V, 32 value columns at a time through qs's space.
  for (i64 f0 = 0; f0 < p.V; f0 += kBwdCols) {
    __syncthreads();  // qs / the previous slice is no longer read
    bwd_stage_rows<T>(qs, p.v, p.sv, b, h, sc.c0, C, valid, f0, kBwdCols, p.V, kSliceLd);
    __syncthreads();
    if constexpr (kTc) {
      float acc[1][4][4] = {};
      bwd_slice_mma_tf32<1, true, false>(
          acc, row0, C, 0, kdim, [&](int i, int j) { return i < C && j < C ? tm[i * ldc + j] * bs[j] : 0.0f; },
          [&](int j, int f) { return j < C ? qs[j * kSliceLd + f] : 0.0f; });
      bwd_slice_mma_each(row0, [&](int i, int f, float u) {
        if (i < C && f0 + f < p.V) out.u[i * p.V + f0 + f] = u;
      }, acc);
    } else {
      for (int e = tid; e < C * kBwdCols; e += kBwdThreads) {
        const int i = e / kBwdCols, f = e % kBwdCols;
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) acc += tm[i * ldc + j] * bs[j] * qs[j * kSliceLd + f];
        if (f0 + f < p.V) out.u[i * p.V + f0 + f] = acc;
      }
    }
  }
}

// ---- The state passes' shared memory and staging ----
// Each chunk's tiles (forward pass: G, W, K, U'; reverse pass: G, P, dO, K, Q, W) are staged in
// their source dtype (K, Q and dO 16-bit for f16/bf16 inputs: exact, and half the bytes of the
// float32 copies they replace) and read as float32 by the products. They move as 16-byte cp.async
// pieces where every source row is 16-byte aligned and whole pieces (bwd_copies decides on the
// host; src-size 0, i.e. zeros, past the sequence end and past K or the slice's columns), element
// copies otherwise. With two stages (bwd_launch_plan decides where) chunk c + 1's copies are
// issued as chunk c starts, into the stage chunk c - 1 used, and land during chunk c's two
// products; with one stage a chunk's copies are issued at its start and waited for at once (one
// wait for global memory per chunk, as before). bwd_issue_ring holds that order for both passes.
struct BwdStaging {
  int stages = 1;                                    // 1 or 2 (ring of chunk tiles)
  bool k = false, q = false, dout = false;           // input rows as 16-byte pieces
  bool g = false, w = false, u = false, p = false;   // workspace tiles as 16-byte pieces
};

__host__ __device__ constexpr int bwd_round16(int bytes) { return (bytes + 15) / 16 * 16; }
// Row stride (elements) of a staged tile with rows of n elements of esize bytes: n rounded up to
// whole 16-byte pieces plus one piece. Rows start on 16 bytes (cp.async pieces), and consecutive
// rows are 4 banks apart where n is a multiple of 32 words, so the TF32 fragment reads (a quad
// pattern of 8 rows x 4 columns, either orientation) hit distinct banks.
__host__ __device__ constexpr int bwd_tile_ld(int n, int esize) {
  const int per = 16 / esize;
  return (n + per - 1) / per * per + per;
}

// Byte offsets of the forward pass's shared memory: `stages` copies of a chunk's tiles (offsets
// within a stage: g, w, k, u), then the state slice ss [K][32] and w = e^(G_last - G) [C].
struct BwdForwardSmem {
  int ldw, ldk;        // row strides (elements) of W (float) and K (input dtype)
  int g, w, k, u, stage;
  int ss, wv, bytes;
};
__host__ __device__ constexpr BwdForwardSmem bwd_forward_smem(int C, int K, int esize, int stages) {
  BwdForwardSmem l{};
  l.ldw = bwd_tile_ld(K, 4);
  l.ldk = bwd_tile_ld(K, esize);
  l.g = 0;
  l.w = bwd_round16(8 * C);
  l.k = l.w + C * l.ldw * 4;
  l.u = l.k + bwd_round16(C * l.ldk * esize);
  l.stage = l.u + C * kSliceLd * 4;
  l.ss = stages * l.stage;
  l.wv = l.ss + K * kSliceLd * 4;
  l.bytes = l.wv + bwd_round16(4 * C);
  return l;
}

// The reverse pass's: `stages` copies of (g, P, dO slice, K, Q, W), then the state gradient slice
// ds [K][32], dU [C][32] and scale e^G [C].
struct BwdReverseSmem {
  int ldc, ldo, ldk, ldw;  // row strides (elements) of P (float), dO and K/Q (input dtype), W (float)
  int g, p, dout, k, q, w, stage;
  int ds, dus, gam, bytes;
};
__host__ __device__ constexpr BwdReverseSmem bwd_reverse_smem(int C, int K, int esize, int stages) {
  BwdReverseSmem l{};
  l.ldc = bwd_tile_ld(C, 4);
  l.ldo = bwd_tile_ld(kBwdCols, esize);
  l.ldk = bwd_tile_ld(K, esize);
  l.ldw = bwd_tile_ld(K, 4);
  l.g = 0;
  l.p = bwd_round16(8 * C);
  l.dout = l.p + C * l.ldc * 4;
  l.k = l.dout + bwd_round16(C * l.ldo * esize);
  l.q = l.k + bwd_round16(C * l.ldk * esize);
  l.w = l.q + bwd_round16(C * l.ldk * esize);
  l.stage = l.w + C * l.ldw * 4;
  l.ds = stages * l.stage;
  l.dus = l.ds + K * kSliceLd * 4;
  l.gam = l.dus + C * kSliceLd * 4;
  l.bytes = l.gam + bwd_round16(4 * C);
  return l;
}

// Issues the copy of rows [0, rows) of n elements (source row r at src + r * src_stride) into dst
// at row stride ld; rows >= valid_rows and elements >= valid_n become zeros. With vec16 (rows
// 16-byte aligned, valid_n whole pieces) each 16-byte piece is one cp.async, which the caller
// commits and waits for; otherwise element copies (ordered by the caller's barrier).
template <class E>
__device__ __forceinline__ void bwd_copy_rows(E* dst, int ld, const E* src, i64 src_stride, int rows, int n,
                                              int valid_rows, int valid_n, bool vec16) {
  constexpr int kPer = 16 / int(sizeof(E));
  const int pieces = (n + kPer - 1) / kPer;
  for (int e = threadIdx.x; e < rows * pieces; e += kBwdThreads) {
    const int r = e / pieces, c = e % pieces * kPer;
    const E* from = src + r * src_stride + c;
    E* to = dst + r * ld + c;
    if (vec16) {
      const bool ok = r < valid_rows && c < valid_n;  // src-size 0: nothing read, 16 zero bytes
      SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
          *reinterpret_cast<const cute::uint128_t*>(ok ? from : src), *reinterpret_cast<cute::uint128_t*>(to), ok);
    } else {
      for (int l = 0; l < kPer && c + l < n; ++l) to[l] = r < valid_rows && c + l < valid_n ? from[l] : E(0.0f);
    }
  }
}

// The ring's copies at the start of chunk `ch` of a state pass (after the barrier that ends the
// previous chunk's reads), `first`: the pass's first chunk, `next`: the chunk it takes after ch,
// or -1. One stage: ch's own copies, waited for at once. Two: the first chunk's, then always the
// next one's, into the stage chunk ch - 1 used. Every thread commits two groups either way, empty
// or not, so the pass's cp_async_wait<1> leaves exactly the next chunk's copies in flight.
template <class Issue>
__device__ __forceinline__ void bwd_issue_ring(const BwdStaging& st, i64 ch, i64 first, i64 next, Issue&& issue) {
  if (st.stages == 1 || ch == first) issue(ch);
  cp_async_fence();
  if (st.stages == 2 && next >= 0) issue(next);
  cp_async_fence();
}

// An element of a staged tile. (The host emulator's tests wrap this to record the read for their
// shared-memory ordering check against the copies.)
template <class E>
__device__ __forceinline__ E bwd_staged(const E* at) { return *at; }

// Asks L2 for rows [0, rows) of row_bytes bytes each at base + r * stride_bytes, one
// prefetch.global.L2 per 128-byte line a row touches (its first byte, then each later line's start
// inside it; no register written, nothing waited for): the local kernel issues the next slice's
// rows while it computes this one, so that its synchronous staging of them finds them in L2 instead
// of HBM (one CTA per SM: no other block hides that wait).
__device__ __forceinline__ void bwd_prefetch_rows(const void* base, i64 stride_bytes, int rows, int row_bytes) {
  const int lines = (row_bytes + 126) / 128 + 1;  // the most lines a row of row_bytes can touch
#pragma unroll 1
  for (int e = threadIdx.x; e < rows * lines; e += kBwdThreads) {
    const char* row = static_cast<const char*>(base) + (e / lines) * stride_bytes;
    const int l = e % lines;
    const char* at = l == 0 ? row : row + (128 * l - int(reinterpret_cast<std::uintptr_t>(row) % 128));
    if (at < row + row_bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
  }
}

// The (sequence, value head, value slice) of a state-pass CTA.
struct StateBlock {
  i64 n, h, hk, f0;
  Sequence s;
  i64 slot0;
};
__device__ __forceinline__ StateBlock bwd_state_block(const Params& p, const ChunkedBackwardWorkspace& ws) {
  const i64 vtiles = (p.V + kBwdCols - 1) / kBwdCols;
  i64 id = blockIdx.x;
  StateBlock sb;
  sb.f0 = (id % vtiles) * kBwdCols;
  id /= vtiles;
  sb.h = id % p.Hv;
  sb.n = id / p.Hv;
  sb.hk = sb.h / p.group;
  sb.s = sequence(p, sb.n);
  sb.slot0 = chunk_slot0(p, ws.C, ws.chunks_per_batch, sb.n, sb.s);
  return sb;
}

// ---- 2. forward over chunks: checkpoints S0 and U = U' - W S0 ----
// f16/bf16 inputs: U = U' - W S0 on 3xTF32 (W and S0 float32 sums) and K^T diag(w) U on TF32
// with w U split (K exact); float32 inputs: FMAs. (Occupancy 1 told to ptxas: left to itself it held the
// float32 instantiation at 64 registers and spilled 8 bytes.)
template <class T>
__global__ void __launch_bounds__(kBwdThreads, 1) bwd_forward_kernel(Params p, ChunkedBackwardWorkspace ws, BwdStaging st) {
  constexpr bool kTc = kBwdTensorCores<T>;
  extern __shared__ __align__(16) unsigned char bwd_smem_raw[];
  const int C = int(ws.C), K = int(p.K), tid = threadIdx.x, warp = tid / 32;
  const BwdForwardSmem lay = bwd_forward_smem(C, K, int(sizeof(T)), st.stages);
  const int ldw = lay.ldw, ldk = lay.ldk;
  float* ss = reinterpret_cast<float*>(bwd_smem_raw + lay.ss);  // [K][32] the state slice (row stride kSliceLd)
  float* wv = reinterpret_cast<float*>(bwd_smem_raw + lay.wv);  // [C] w = e^(G_last - G)
  const StateBlock sb = bwd_state_block(p, ws);
  const int cols = int(min(i64(kBwdCols), p.V - sb.f0));
  const i64 chunks = (sb.s.eos - sb.s.bos + C - 1) / C;
  const T* k_rows = static_cast<const T*>(p.k) + sb.s.b * p.sk.b + sb.hk * p.sk.h;

  struct Tiles {
    double* g;  // [C] G
    float* w;   // [C][K] W (row stride ldw)
    T* k;       // [C][K] K (row stride ldk)
    float* u;   // [C][32] U', then U in place (row stride kSliceLd)
  };
  auto tiles = [&](i64 ch) {
    unsigned char* at = bwd_smem_raw + int(ch % st.stages) * lay.stage;
    return Tiles{reinterpret_cast<double*>(at + lay.g), reinterpret_cast<float*>(at + lay.w),
                 reinterpret_cast<T*>(at + lay.k), reinterpret_cast<float*>(at + lay.u)};
  };
  auto issue = [&](i64 ch) {
    const BwdUnit un = bwd_unit(p, ws, sb.slot0 + ch, sb.h);
    const i64 c0 = sb.s.bos + ch * C;
    const Tiles tl = tiles(ch);
    bwd_copy_rows(tl.g, C, un.g, C, 1, C, 1, C, st.g);
    bwd_copy_rows(tl.w, ldw, un.w, K, C, K, C, K, st.w);
    bwd_copy_rows(tl.k, ldk, k_rows + c0 * p.sk.t, p.sk.t, C, K, int(min(i64(C), sb.s.eos - c0)), K, st.k);
    bwd_copy_rows(tl.u, kSliceLd, un.u + sb.f0, p.V, C, kBwdCols, C, cols, st.u);
  };

  for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
    const int x = e / kBwdCols, f = e % kBwdCols;
    ss[x * kSliceLd + f] =
        (p.initial && f < cols) ? p.initial[sb.n * p.sinit.n + sb.h * p.sinit.h + x * p.sinit.k + sb.f0 + f] : 0.0f;
  }
  for (i64 ch = 0; ch < chunks; ++ch) {
    const BwdUnit un = bwd_unit(p, ws, sb.slot0 + ch, sb.h);
    __syncthreads();  // ss is complete; chunk ch - 1's stage (chunk ch + 1's with two) and wv are no longer read
    bwd_issue_ring(st, ch, 0, ch + 1 < chunks ? ch + 1 : -1, issue);
    for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
      const int x = e / kBwdCols, f = e % kBwdCols;
      if (f < cols) un.s0[x * p.V + sb.f0 + f] = ss[x * kSliceLd + f];
    }
    cp_async_wait<1>();  // chunk ch's tiles have landed (chunk ch + 1's may be in flight)
    __syncthreads();
    const Tiles tl = tiles(ch);
    if (tid < C) wv[tid] = expf(float(bwd_staged(tl.g + C - 1) - bwd_staged(tl.g + tid)));
    // U = U' - W S0 in place of U' (in the stage and in the workspace).
    if constexpr (kTc) {
      const int row0[1] = {16 * warp};  // rows of U
      float acc[1][4][4] = {};
      bwd_slice_mma_tf32<1, true, true>(
          acc, row0, C, 0, K, [&](int i, int x) { return i < C && x < K ? bwd_staged(tl.w + i * ldw + x) : 0.0f; },
          [&](int x, int f) { return x < K ? ss[x * kSliceLd + f] : 0.0f; });
      bwd_slice_mma_each(row0, [&](int i, int f, float ws0) {
        if (i >= C) return;
        const float u = bwd_staged(tl.u + i * kSliceLd + f) - ws0;  // 0 past cols (U' and S0 are zeros there)
        tl.u[i * kSliceLd + f] = u;
        if (f < cols) un.u[i * p.V + sb.f0 + f] = u;
      }, acc);
    } else {
      for (int e = tid; e < C * kBwdCols; e += kBwdThreads) {
        const int i = e / kBwdCols, f = e % kBwdCols;
        float acc = bwd_staged(tl.u + i * kSliceLd + f);  // U' (this thread's own element)
        if (f < cols) {
          for (int x = 0; x < K; ++x) acc -= bwd_staged(tl.w + i * ldw + x) * ss[x * kSliceLd + f];
          un.u[i * p.V + sb.f0 + f] = acc;
        }
        tl.u[i * kSliceLd + f] = acc;
      }
    }
    __syncthreads();  // U and wv are complete; every thread is done with reading S0
    // S = e^(G_last) S0 + K^T diag(w) U; element (x, f) is only ever touched by one thread.
    const float decay = expf(float(bwd_staged(tl.g + C - 1)));
    if constexpr (kTc) {
      const int row0[2] = {16 * warp, 16 * warp + 64};  // rows (key dims) of S
      float acc[2][4][4] = {};
      bwd_slice_mma_tf32<2, false, true>(
          acc, row0, K, 0, C,
          [&](int x, int i) { return x < K && i < C ? to_float(bwd_staged(tl.k + i * ldk + x)) : 0.0f; },
          [&](int i, int f) { return i < C ? wv[i] * bwd_staged(tl.u + i * kSliceLd + f) : 0.0f; });
      bwd_slice_mma_each(row0, [&](int x, int f, float kwu) {
        if (x < K) ss[x * kSliceLd + f] = decay * ss[x * kSliceLd + f] + kwu;
      }, acc);
    } else {
      for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
        const int x = e / kBwdCols, f = e % kBwdCols;
        float acc = decay * ss[x * kSliceLd + f];
        for (int i = 0; i < C; ++i)
          acc += to_float(bwd_staged(tl.k + i * ldk + x)) * wv[i] * bwd_staged(tl.u + i * kSliceLd + f);
        ss[x * kSliceLd + f] = acc;
      }
    }
  }
  cp_async_wait<0>();  // (only empty groups remain)
}

// ---- 3. reverse over chunks: dS_C of every chunk, dU, dinitial_state ----
// f16/bf16 inputs: P^T dO with P split (dO exact), K dS_C with dS_C split (K exact), Q^T (scale
// gamma dO) with the scaled dO split and W^T dU on 3xTF32; float32 inputs: FMAs.
template <class T>
__global__ void __launch_bounds__(kBwdThreads) bwd_reverse_kernel(Params p, ChunkedBackwardWorkspace ws, BwdStaging st) {
  constexpr bool kTc = kBwdTensorCores<T>;
  extern __shared__ __align__(16) unsigned char bwd_smem_raw[];
  const int C = int(ws.C), K = int(p.K), tid = threadIdx.x, warp = tid / 32;
  const BwdReverseSmem lay = bwd_reverse_smem(C, K, int(sizeof(T)), st.stages);
  const int ldc = lay.ldc, ldo = lay.ldo, ldk = lay.ldk, ldw = lay.ldw;
  float* ds = reinterpret_cast<float*>(bwd_smem_raw + lay.ds);    // [K][32] dS slice (row stride kSliceLd)
  float* dus = reinterpret_cast<float*>(bwd_smem_raw + lay.dus);  // [C][32] dU (row stride kSliceLd)
  float* gam = reinterpret_cast<float*>(bwd_smem_raw + lay.gam);  // [C] scale e^G (the tensor-core path)
  const StateBlock sb = bwd_state_block(p, ws);
  const int cols = int(min(i64(kBwdCols), p.V - sb.f0));
  const i64 chunks = (sb.s.eos - sb.s.bos + C - 1) / C;
  const T* k_rows = static_cast<const T*>(p.k) + sb.s.b * p.sk.b + sb.hk * p.sk.h;
  const T* q_rows = static_cast<const T*>(p.q) + sb.s.b * p.sq.b + sb.hk * p.sq.h;
  const T* do_rows = static_cast<const T*>(p.dout) + sb.s.b * p.sdout.b + sb.h * p.sdout.h + sb.f0;

  struct Tiles {
    double* g;  // [C] G
    float* pm;  // [C][C] P (row stride ldc)
    T* dout;    // [C][32] dO's slice (row stride ldo)
    T* k;       // [C][K] K (row stride ldk)
    T* q;       // [C][K] Q (row stride ldk)
    float* w;   // [C][K] W (row stride ldw)
  };
  auto tiles = [&](i64 ch) {
    unsigned char* at = bwd_smem_raw + int(ch % st.stages) * lay.stage;
    return Tiles{reinterpret_cast<double*>(at + lay.g), reinterpret_cast<float*>(at + lay.p),
                 reinterpret_cast<T*>(at + lay.dout), reinterpret_cast<T*>(at + lay.k),
                 reinterpret_cast<T*>(at + lay.q), reinterpret_cast<float*>(at + lay.w)};
  };
  auto issue = [&](i64 ch) {
    const BwdUnit un = bwd_unit(p, ws, sb.slot0 + ch, sb.h);
    const i64 c0 = sb.s.bos + ch * C;
    const int valid = int(min(i64(C), sb.s.eos - c0));
    const Tiles tl = tiles(ch);
    bwd_copy_rows(tl.g, C, un.g, C, 1, C, 1, C, st.g);
    bwd_copy_rows(tl.pm, ldc, un.pm, C, C, C, C, C, st.p);
    bwd_copy_rows(tl.dout, ldo, do_rows + c0 * p.sdout.t, p.sdout.t, C, kBwdCols, valid, cols, st.dout);
    bwd_copy_rows(tl.k, ldk, k_rows + c0 * p.sk.t, p.sk.t, C, K, valid, K, st.k);
    bwd_copy_rows(tl.q, ldk, q_rows + c0 * p.sq.t, p.sq.t, C, K, valid, K, st.q);
    bwd_copy_rows(tl.w, ldw, un.w, K, C, K, C, K, st.w);
  };

  for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
    const int x = e / kBwdCols, f = e % kBwdCols;
    ds[x * kSliceLd + f] =
        (p.dfinal && f < cols) ? p.dfinal[sb.n * p.sdfinal.n + sb.h * p.sdfinal.h + x * p.sdfinal.k + sb.f0 + f] : 0.0f;
  }
  for (i64 ch = chunks - 1; ch >= 0; --ch) {
    const BwdUnit un = bwd_unit(p, ws, sb.slot0 + ch, sb.h);
    __syncthreads();  // ds is complete; chunk ch + 1's stage (chunk ch - 1's with two) and gam are no longer read
    bwd_issue_ring(st, ch, chunks - 1, ch - 1, issue);
    for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
      const int x = e / kBwdCols, f = e % kBwdCols;
      if (f < cols) un.dsc[x * p.V + sb.f0 + f] = ds[x * kSliceLd + f];
    }
    cp_async_wait<1>();  // chunk ch's tiles have landed (chunk ch - 1's may be in flight)
    __syncthreads();
    const Tiles tl = tiles(ch);
    const double g_last = bwd_staged(tl.g + C - 1);
    if (kTc && tid < C) gam[tid] = p.scale * expf(float(bwd_staged(tl.g + tid)));
    // dU = P^T dO + diag(w) K dS_C, w = e^(G_last - G).
    auto store_du = [&](int i, int f, float pdo, float kds) {
      const float du = pdo + expf(float(g_last - bwd_staged(tl.g + i))) * kds;
      dus[i * kSliceLd + f] = du;
      if (f < cols) un.du[i * p.V + sb.f0 + f] = du;
    };
    auto dout_at = [&](int j, int f) { return to_float(bwd_staged(tl.dout + j * ldo + f)); };
    if constexpr (kTc) {
      const int row0[1] = {16 * warp};  // rows (tokens) of dU
      float pd[1][4][4] = {}, kd[1][4][4] = {};
      // P^T is upper triangular (prep stores P's upper triangle as zeros): rows [16 w, 16 w + 16)
      // sum over tokens j >= 16 w.
      bwd_slice_mma_tf32<1, true, false>(
          pd, row0, C, 16 * warp, C, [&](int i, int j) { return i < C && j < C ? bwd_staged(tl.pm + j * ldc + i) : 0.0f; },
          [&](int j, int f) { return j < C ? dout_at(j, f) : 0.0f; });
      bwd_slice_mma_tf32<1, false, true>(
          kd, row0, C, 0, K,
          [&](int i, int x) { return i < C && x < K ? to_float(bwd_staged(tl.k + i * ldk + x)) : 0.0f; },
          [&](int x, int f) { return x < K ? ds[x * kSliceLd + f] : 0.0f; });
      bwd_slice_mma_each(row0, [&](int i, int f, float pdo, float kds) {
        if (i < C) store_du(i, f, pdo, kds);
      }, pd, kd);
    } else {
      for (int e = tid; e < C * kBwdCols; e += kBwdThreads) {
        const int i = e / kBwdCols, f = e % kBwdCols;
        float a = 0.0f, b = 0.0f;
        for (int j = i; j < C; ++j) a += bwd_staged(tl.pm + j * ldc + i) * dout_at(j, f);
        for (int x = 0; x < K; ++x) b += to_float(bwd_staged(tl.k + i * ldk + x)) * ds[x * kSliceLd + f];
        store_du(i, f, a, b);
      }
    }
    __syncthreads();  // dU and gam are complete; every thread is done with reading dS_C
    // dS0 = e^(G_last) dS_C + scale (diag(gamma) Q)^T dO - W^T dU; element (x, f) only touched by one thread.
    const float decay = expf(float(g_last));
    if constexpr (kTc) {
      const int row0[2] = {16 * warp, 16 * warp + 64};  // rows (key dims) of dS0
      float acc[2][4][4] = {};
      bwd_slice_mma_tf32<2, false, true>(
          acc, row0, K, 0, C,
          [&](int x, int i) { return x < K && i < C ? to_float(bwd_staged(tl.q + i * ldk + x)) : 0.0f; },
          [&](int i, int f) { return i < C ? gam[i] * dout_at(i, f) : 0.0f; });
      bwd_slice_mma_tf32<2, true, true>(
          acc, row0, K, 0, C, [&](int x, int i) { return x < K && i < C ? bwd_staged(tl.w + i * ldw + x) : 0.0f; },
          [&](int i, int f) { return i < C ? -dus[i * kSliceLd + f] : 0.0f; });
      bwd_slice_mma_each(row0, [&](int x, int f, float sum) {
        if (x < K) ds[x * kSliceLd + f] = decay * ds[x * kSliceLd + f] + sum;
      }, acc);
    } else {  // (a shared scale e^G array in this loop made ptxas spill 16 B on sm_80)
      for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
        const int x = e / kBwdCols, f = e % kBwdCols;
        float acc = decay * ds[x * kSliceLd + f];
        for (int i = 0; i < C; ++i)
          acc += p.scale * expf(float(bwd_staged(tl.g + i))) * to_float(bwd_staged(tl.q + i * ldk + x)) * dout_at(i, f) -
                 bwd_staged(tl.w + i * ldw + x) * dus[i * kSliceLd + f];
        ds[x * kSliceLd + f] = acc;
      }
    }
  }
  cp_async_wait<0>();   // (only empty groups remain)
  __syncthreads();  // dS is complete (the tensor-core path writes it in the MMA's element mapping)
  if (p.final_state)  // dinitial_state
    for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
      const int x = e / kBwdCols, f = e % kBwdCols;
      if (f < cols) p.final_state[sb.n * p.sfinal.n + sb.h * p.sfinal.h + x * p.sfinal.k + sb.f0 + f] = ds[x * kSliceLd + f];
    }
}

// ---- 4. local gradients: per (chunk slot, q/k head), the value heads of the group in order ----
// One CTA per SM is all its shared memory allows anyway (up to 163 KB); told to ptxas so that the
// tensor-core path's accumulators (64 floats a thread per dq/dk product group, 32 for K K^T) may
// take registers past 128 instead of spilling.
// f16/bf16 inputs (kBwdTensorCores): K K^T and the seven products that feed only dq and dk run on
// mma.sync with 16-bit operands (bench/gated_delta_bwd_precision.py: one bf16 MMA fits their
// budgets; the row scales gamma, w, beta are folded into the A operands before rounding), each
// product group's accumulator added into the float32 dq/dk workspace (bwd_add_own); the rows
// K S0, Q S0 and K dS_C, which feed dbeta and dlog_decay, run on TF32 mma.sync with S0 and dS_C
// split hi + lo (bwd_row_terms_tf32: float32's accuracy), and so do dX = T^T dU, dO U^T and
// dX U^T (bwd_dx_tf32, bwd_pair_terms_tf32: 3xTF32 where both operands are float32 sums); the
// [C][C] terms and the slice's row shares stay float32 FMAs. float32 inputs: every product is
// float32 FMAs. Either way each workspace element is touched by one thread only.
template <class T>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_local_kernel(Params p, ChunkedBackwardWorkspace ws, T* dq, SeqStrides sdq, T* dk, SeqStrides sdk, T* dbeta,
                     SeqStrides sdbeta, float* dg, SeqStrides sdg) {
  extern __shared__ __align__(16) unsigned char bwd_smem_raw[];
  constexpr bool kTc = kBwdTensorCores<T>;
  using E = std::conditional_t<kTc, typename chunk_mma::CuteOf<T>::type, float>;  // 16-bit operands
  const int C = int(ws.C), K = int(p.K), tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Tensor-core path only: the 16-bit tiles first (kBwdTcBytes).
  E* kb = reinterpret_cast<E*>(bwd_smem_raw);  // [64][128] K
  E* qb = kb + kKqElems;                        // [64][128] Q
  E* a_do = qb + kKqElems;                      // [64][32] scale gamma dO of a slice
  E* a_u = a_do + kRowSliceElems;               // [64][32] w U
  E* a_dx = a_u + kRowSliceElems;               // [64][32] -beta gamma dX
  E* b_s0 = a_dx + kRowSliceElems;              // [128][32] S0 columns of the slice
  E* b_dsc = b_s0 + kStateSliceElems;           // [128][32] dS_C columns of the slice
  E* p_da = a_do;                               // [64][64] dA, once the slices are done
  E* p_dd = p_da + kPairElems;                  // [64][64] D + D^T
  double* gs = reinterpret_cast<double*>(bwd_smem_raw + (kTc ? kBwdTcBytes : 0));  // [C] G
  float* sm = reinterpret_cast<float*>(gs + C);
  const int kq_floats = kTc ? 0 : C * K;  // the float32 path's copies of Q and K
  float* qs = sm;                  // [C][K]
  float* ks = qs + kq_floats;      // [C][K]
  float* tm = ks + kq_floats;      // [C][C] lower: T, then E = dP * P + dL * L; strict upper: K K^T
  float* da = tm + C * C;          // [C][C] dO U^T accumulated, then dA
  float* dd = da + C * C;          // [C][C] dX U^T accumulated, then D
  float* ff = dd + C * C;          // [C][C] F = dL * Gam * K K^T
  float* us = ff + C * C;          // [C][32] U slice (row stride kSliceLd, as the next three)
  float* dus = us + C * kSliceLd;  // [C][32] dU slice
  float* dxs = dus + C * kSliceLd; // [C][32] dX slice
  float* dos = dxs + C * kSliceLd; // [C][32] dO slice
  float* bs = dos + C * kSliceLd;  // [C] beta
  float* gam = bs + C;             // [C] e^G
  float* wv = gam + C;             // [C] e^(G_last - G)
  float* dga = wv + C;             // [C] dG
  float* dba = dga + C;            // [C] dbeta
  float* dwa = dba + C;            // [C] dw
  float* red = dwa + C;            // [4] per-warp partials, [4] <dS_C, S0>
  float* xg = red + 8;             // [C] sum over i >= t > j of E_ij

  if (p.N == 0) return;
  const i64 slot = blockIdx.x / p.Hk, hk = blockIdx.x % p.Hk;
  const SlotChunk sc = slot_chunk(p, ws.C, ws.chunks_per_batch, slot);
  if (sc.c0 >= sc.s.eos) return;
  const int valid = int(min(i64(C), sc.s.eos - sc.c0));
  const i64 b = sc.s.b;
  // dq and dk accumulate here, each element read and written by one thread only: element e by
  // thread e mod 128 (float32 path), or by the thread holding it in bwd_add_own's partition.
  float* dqa = ws.dq_acc + (slot * p.Hk + hk) * C * K;
  float* dka = ws.dk_acc + (slot * p.Hk + hk) * C * K;
  for (int e = tid; e < C * K; e += kBwdThreads) dqa[e] = dka[e] = 0.0f;  // before the barrier below
  // L2 prefetches (bwd_prefetch_rows) of slice [f, f + 32) of value head hh: U, dU, S0, dS_C
  // (workspace), dO and v; of a head: its T, G, beta and first slice.
  auto prefetch_slice = [&](const BwdUnit& u, i64 hh, i64 f) {
    const int bytes = int(min(i64(kBwdCols), p.V - f)) * 4, in_bytes = bytes / 4 * int(sizeof(T));
    bwd_prefetch_rows(u.u + f, p.V * 4, C, bytes);
    bwd_prefetch_rows(u.du + f, p.V * 4, C, bytes);
    bwd_prefetch_rows(u.s0 + f, p.V * 4, K, bytes);
    bwd_prefetch_rows(u.dsc + f, p.V * 4, K, bytes);
    bwd_prefetch_rows(static_cast<const T*>(p.dout) + b * p.sdout.b + hh * p.sdout.h + sc.c0 * p.sdout.t + f,
                      p.sdout.t * i64(sizeof(T)), valid, in_bytes);
    bwd_prefetch_rows(static_cast<const T*>(p.v) + b * p.sv.b + hh * p.sv.h + sc.c0 * p.sv.t + f,
                      p.sv.t * i64(sizeof(T)), valid, in_bytes);
  };
  auto prefetch_head = [&](i64 hh) {
    const BwdUnit u = bwd_unit(p, ws, slot, hh);
    bwd_prefetch_rows(u.t, 0, 1, C * C * 4);
    bwd_prefetch_rows(u.g, 0, 1, C * 8);
    const bool dense = p.sbeta.t == 1;  // the chunk's betas in one row, else one element per token
    bwd_prefetch_rows(static_cast<const T*>(p.beta) + b * p.sbeta.b + hh * p.sbeta.h + sc.c0 * p.sbeta.t,
                      p.sbeta.t * i64(sizeof(T)), dense ? 1 : valid, dense ? valid * int(sizeof(T)) : 1);
    prefetch_slice(u, hh, 0);
  };
  prefetch_head(hk * p.group);  // (in flight while K and Q are staged and K K^T is formed)


  if constexpr (kTc) {
    bwd_fill_tile16<KqTile>(qb, [&](int i, int x) {
      return i < valid && x < K ? load<T>(p.q, p.sq, b, hk, sc.c0 + i, x) : 0.0f;
    });
    bwd_fill_tile16<KqTile>(kb, [&](int i, int x) {
      return i < valid && x < K ? load<T>(p.k, p.sk, b, hk, sc.c0 + i, x) : 0.0f;
    });
  } else {
    bwd_stage_rows<T>(qs, p.q, p.sq, b, hk, sc.c0, C, valid, 0, K, p.K);
    bwd_stage_rows<T>(ks, p.k, p.sk, b, hk, sc.c0, C, valid, 0, K, p.K);
  }
  // K K^T, the same for every value head of the group, into tm's strict upper triangle (the
  // lower one holds each head's T, then E; K K^T is symmetric and read as (j, i) for j < i).
  __syncthreads();  // K is staged
  if constexpr (kTc) {
    // mma.sync, both operands without .trans: the contracted index runs along K's rows.
    using namespace cute;
    auto mma = chunk_mma::make_chunk_mma<E>();
    auto acc = partition_fragment_C(mma, Shape<Int<kBwdMaxC>, Int<kBwdMaxC>>{});
    clear(acc);
    chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmN>(mma, KqTile::view(kb), KqTile::view(kb), acc);
    auto coord = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<kBwdMaxC>, Int<kBwdMaxC>>{}));
#pragma unroll
    for (int e = 0; e < size(acc); ++e) {
      const int i = get<0>(coord(e)), j = get<1>(coord(e));
      if (i < j && j < C) tm[i * C + j] = acc(e);
    }
  } else {
    for (int e = tid; e < C * C; e += kBwdThreads) {
      const int i = e / C, j = e % C;
      if (i < j) {
        float kk = 0.0f;
        for (int x = 0; x < K; ++x) kk += ks[i * K + x] * ks[j * K + x];
        tm[e] = kk;
      }
    }
  }

  for (i64 h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const BwdUnit un = bwd_unit(p, ws, slot, h);
    __syncthreads();  // the previous head is done with every tile
    for (int e = tid; e < C * C; e += kBwdThreads) {
      if (e % C <= e / C) tm[e] = un.t[e];  // T is lower triangular (unit diagonal)
      da[e] = dd[e] = 0.0f;
    }
    if (tid < C) {
      gs[tid] = un.g[tid];
      bs[tid] = tid < valid ? load<T>(p.beta, p.sbeta, b, h, sc.c0 + tid) : 0.0f;
      dga[tid] = dba[tid] = dwa[tid] = 0.0f;
    }
    if (tid == 0) red[4] = 0.0f;
    __syncthreads();
    if (tid < C) {
      gam[tid] = expf(float(gs[tid]));
      wv[tid] = expf(float(gs[C - 1] - gs[tid]));
    }
    for (i64 f0 = 0; f0 < p.V; f0 += kBwdCols) {
      const int cols = int(min(i64(kBwdCols), p.V - f0));
      __syncthreads();  // gam / wv are complete; the previous slice's tiles are no longer read
      for (int e = tid; e < C * kBwdCols; e += kBwdThreads) {
        const int i = e / kBwdCols, f = e % kBwdCols;
        us[i * kSliceLd + f] = f < cols ? un.u[i * p.V + f0 + f] : 0.0f;
        dus[i * kSliceLd + f] = f < cols ? un.du[i * p.V + f0 + f] : 0.0f;
      }
      bwd_stage_rows<T>(dos, p.dout, p.sdout, b, h, sc.c0, C, valid, f0, kBwdCols, p.V, kSliceLd);
      if constexpr (kTc) {
        bwd_fill_tile16<StateSliceTile>(b_s0, [&](int x, int f) { return x < K && f < cols ? un.s0[x * p.V + f0 + f] : 0.0f; });
        bwd_fill_tile16<StateSliceTile>(b_dsc, [&](int x, int f) { return x < K && f < cols ? un.dsc[x * p.V + f0 + f] : 0.0f; });
      }
      __syncthreads();
      // The next slice's rows (of this head, or the next head's first slice with its T, G and
      // beta) into L2 while this slice computes.
      if (f0 + kBwdCols < p.V) {
        prefetch_slice(un, h, f0 + kBwdCols);
      } else if (h + 1 < (hk + 1) * p.group) {
        prefetch_head(h + 1);
      }
      // dX = T^T dU, and dv = diag(beta) dX out.
      const bool col_ok = lane < cols;
      auto store_dv = [&](int i, int f, float dx) {
        if (i < valid && f < cols)
          static_cast<T*>(p.out)[b * p.sout.b + h * p.sout.h + (sc.c0 + i) * p.sout.t + f0 + f] = from_float<T>(bs[i] * dx);
      };
      if constexpr (kTc) {
        bwd_dx_tf32(tm, dus, dxs, C, store_dv);
      } else {
        for (int i = warp; i < C; i += 4) {  // row i of this warp, column lane
          float acc = 0.0f;
          for (int j = i; j < C; ++j) acc += tm[j * C + i] * dus[j * kSliceLd + lane];
          dxs[i * kSliceLd + lane] = acc;
          store_dv(i, lane, acc);
        }
      }
      float s_part = 0.0f;  // <dS_C, S0> over this thread's (x, column) pairs
      for (int e = tid; e < K * kBwdCols; e += kBwdThreads) {
        const int x = e / kBwdCols;
        if (col_ok) s_part += un.dsc[x * p.V + f0 + lane] * un.s0[x * p.V + f0 + lane];
      }
      // Row i's shares of dbeta, dw and dG from K S0, Q S0 and K dS_C at its columns f:
      //   dX . (v - gamma K S0),  w (K dS_C) . U,  scale gamma dO . (Q S0) - beta gamma dX . (K S0).
      auto row_shares = [&](int i, int f, float ksv, float qsv, float kds, float& pb, float& pw, float& pg) {
        const bool in = i < valid && f < cols;
        const float v = in ? load<T>(p.v, p.sv, b, h, sc.c0 + i, f0 + f) : 0.0f;
        const float dxv = dxs[i * kSliceLd + f], u = us[i * kSliceLd + f], dov = dos[i * kSliceLd + f];
        pb += dxv * (v - gam[i] * ksv);
        pw += wv[i] * kds * u;
        pg += p.scale * gam[i] * dov * qsv - bs[i] * gam[i] * dxv * ksv;
      };
      if constexpr (kTc) {
        __syncthreads();  // dX is complete (a thread's rows and columns below are other threads')
        BwdRowTerms rt;
        bwd_row_terms_tf32(rt, kb, qb, un.s0, un.dsc, p.V, f0, cols, K);
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // rows 16 warp + lane / 4 (+ 8)
          const int i = 16 * warp + lane / 4 + 8 * half;
          float pb = 0.0f, pw = 0.0f, pg = 0.0f;
          if (i < C)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int e = 2 * half + c;
                row_shares(i, 8 * j + 2 * (lane % 4) + c, rt.ks[j][e], rt.qs[j][e], rt.kd[j][e], pb, pw, pg);
              }
          // The row's 32 columns lie in the 4 lanes of its quad.
#pragma unroll
          for (int step = 1; step <= 2; step *= 2) {
            pb += __shfl_xor_sync(kBwdFullMask, pb, step);
            pw += __shfl_xor_sync(kBwdFullMask, pw, step);
            pg += __shfl_xor_sync(kBwdFullMask, pg, step);
          }
          if (lane % 4 == 0 && i < C) {
            dba[i] += pb;
            dwa[i] += pw;
            dga[i] += pg;
          }
        }
      } else {
        for (int i = warp; i < C; i += 4) {  // rows of this warp (warp-uniform), column lane
          float ksv = 0.0f, qsv = 0.0f, kds = 0.0f;
          if (col_ok)
            for (int x = 0; x < K; ++x) {
              const float s0 = un.s0[x * p.V + f0 + lane], dsc = un.dsc[x * p.V + f0 + lane];
              ksv += ks[i * K + x] * s0;
              qsv += qs[i * K + x] * s0;
              kds += ks[i * K + x] * dsc;
            }
          float pb = 0.0f, pw = 0.0f, pg = 0.0f;
          row_shares(i, lane, ksv, qsv, kds, pb, pw, pg);
          pb = bwd_warp_sum(pb);
          pw = bwd_warp_sum(pw);
          pg = bwd_warp_sum(pg);
          if (lane == 0) {
            dba[i] += pb;
            dwa[i] += pw;
            dga[i] += pg;
          }
        }
      }
      s_part = bwd_warp_sum(s_part);
      if (lane == 0) red[warp] = s_part;
      __syncthreads();  // dX and the partials are complete
      if (tid == 0) red[4] += red[0] + red[1] + red[2] + red[3];
      // dO U^T and dX U^T, accumulated over the slices.
      if constexpr (kTc) {
        bwd_pair_terms_tf32(dos, dxs, us, da, dd, C);
      } else {
        for (int e = tid; e < C * C; e += kBwdThreads) {
          const int i = e / C, j = e % C;
          float a = 0.0f, c = 0.0f;
          for (int f = 0; f < kBwdCols; ++f) {
            a += dos[i * kSliceLd + f] * us[j * kSliceLd + f];
            c += dxs[i * kSliceLd + f] * us[j * kSliceLd + f];
          }
          da[e] += a;
          dd[e] += c;
        }
      }
      // dq += scale diag(gamma) dO S0^T;  dk += diag(w) U dS_C^T - diag(beta gamma) dX S0^T.
      if constexpr (kTc) {
        bwd_fill_tile16<RowSliceTile>(a_do, [&](int i, int f) { return i < C ? p.scale * gam[i] * dos[i * kSliceLd + f] : 0.0f; });
        bwd_fill_tile16<RowSliceTile>(a_u, [&](int i, int f) { return i < C ? wv[i] * us[i * kSliceLd + f] : 0.0f; });
        bwd_fill_tile16<RowSliceTile>(a_dx, [&](int i, int f) { return i < C ? -bs[i] * gam[i] * dxs[i * kSliceLd + f] : 0.0f; });
        __syncthreads();
        // A (64 rows, 32 slice columns) times B^T with B (128 key columns, 32 slice columns): both
        // contract along their tile's rows (ldmatrix without .trans).
        auto mma = chunk_mma::make_chunk_mma<E>();
        auto acc = bwd_dqdk_accumulator<E>();
        chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmN>(mma, RowSliceTile::view(a_do), StateSliceTile::view(b_s0), acc);
        bwd_add_own<E>(acc, dqa, C, K);
        clear(acc);
        chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmN>(mma, RowSliceTile::view(a_u), StateSliceTile::view(b_dsc), acc);
        chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmN>(mma, RowSliceTile::view(a_dx), StateSliceTile::view(b_s0), acc);
        bwd_add_own<E>(acc, dka, C, K);
      } else {
        for (int e = tid; e < C * K; e += kBwdThreads) {
          const int i = e / K, x = e % K;
          float a = 0.0f, u = 0.0f, c = 0.0f;
          for (int f = 0; f < cols; ++f) {
            const float s0 = un.s0[x * p.V + f0 + f];
            a += dos[i * kSliceLd + f] * s0;
            u += us[i * kSliceLd + f] * un.dsc[x * p.V + f0 + f];
            c += dxs[i * kSliceLd + f] * s0;
          }
          dqa[e] += p.scale * gam[i] * a;
          dka[e] += wv[i] * u - bs[i] * gam[i] * c;
        }
      }
    }
    __syncthreads();  // the accumulations over the slices are complete; T is no longer read
    // The [C][C] terms: dA = scale Gam * lower(dO U^T), dL = -strict_lower(dX U^T), D = beta Gam dL.
    for (int e = tid; e < C * C; e += kBwdThreads) {
      const int i = e / C, j = e % C;
      const float decay = j <= i ? expf(float(gs[i] - gs[j])) : 0.0f;
      const float kk = j < i ? tm[j * C + i] : 0.0f;  // K K^T (upper triangle, not written here)
      const float dp = j <= i ? da[e] : 0.0f;
      const float dl = j < i ? -dd[e] : 0.0f;
      if (j <= i) tm[e] = dp * un.pm[e] + dl * bs[i] * decay * kk;  // dP * P + dL * L
      ff[e] = dl * decay * kk;
      da[e] = p.scale * decay * dp;
      dd[e] = bs[i] * decay * dl;
    }
    __syncthreads();
    if (tid < C) {  // the pairs that survive the reverse cumulative sum: E_ij with i >= t > j
      const int t = tid;
      float cross = 0.0f, fb = 0.0f;
      for (int i = t; i < C; ++i)
        for (int j = 0; j < t; ++j) cross += tm[i * C + j];
      for (int j = 0; j < C; ++j) fb += ff[t * C + j];
      xg[t] = cross;
      dba[t] += fb;
    }
    if constexpr (kTc) {  // dA and D + D^T as 16-bit operands (the slices' tiles are dead)
      bwd_fill_tile16<PairTile>(p_da, [&](int i, int j) { return i < C && j < C ? da[i * C + j] : 0.0f; });
      bwd_fill_tile16<PairTile>(p_dd, [&](int i, int j) { return i < C && j < C ? dd[i * C + j] + dd[j * C + i] : 0.0f; });
    }
    __syncthreads();
    if (tid == 0) {  // dg_t = sum_{i >= t} dG_i without the pairs that cancel; dbeta
      const float state_term = expf(float(gs[C - 1])) * red[4];
      float before = 0.0f;  // sum_{j < t} dw_j
      for (int t = 0; t < C; ++t) {
        const float here = dwa[t];
        dwa[t] = before;
        before += here;
      }
      float after = 0.0f;   // sum_{i >= t} of the per-row terms
      for (int t = C - 1; t >= 0; --t) {
        after += dga[t];
        if (t < valid) {
          dg[b * sdg.b + h * sdg.h + (sc.c0 + t) * sdg.t] = after + dwa[t] + xg[t] + state_term;
          dbeta[b * sdbeta.b + h * sdbeta.h + (sc.c0 + t) * sdbeta.t] = from_float<T>(dba[t]);
        }
      }
    }
    // dq += dA K;  dk += dA^T Q + (D + D^T) K.
    if constexpr (kTc) {
      // The contracted index (a token) runs down the columns of K, Q and (for dA^T) dA: .trans.
      auto mma = chunk_mma::make_chunk_mma<E>();
      auto acc = bwd_dqdk_accumulator<E>();
      chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmT>(mma, PairTile::view(p_da), KqTile::view_t(kb), acc);
      bwd_add_own<E>(acc, dqa, C, K);
      clear(acc);
      chunk_mma::mma_from_smem<chunk_mma::LdsmT, chunk_mma::LdsmT>(mma, PairTile::view_t(p_da), KqTile::view_t(qb), acc);
      chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmT>(mma, PairTile::view(p_dd), KqTile::view_t(kb), acc);
      bwd_add_own<E>(acc, dka, C, K);
    } else {
      for (int e = tid; e < C * K; e += kBwdThreads) {
        const int i = e / K, x = e % K;
        float a = 0.0f, c = 0.0f;
        for (int j = 0; j < C; ++j) {
          a += da[i * C + j] * ks[j * K + x];
          c += da[j * C + i] * qs[j * K + x] + (dd[i * C + j] + dd[j * C + i]) * ks[j * K + x];
        }
        dqa[e] += a;
        dka[e] += c;
      }
    }
  }
  if constexpr (kTc) __syncthreads();  // the additions are complete (another thread mapping than below)
  for (int e = tid; e < C * K; e += kBwdThreads) {
    const int i = e / K, x = e % K;
    if (i < valid) {
      dq[b * sdq.b + hk * sdq.h + (sc.c0 + i) * sdq.t + x] = from_float<T>(dqa[e]);
      dk[b * sdk.b + hk * sdk.h + (sc.c0 + i) * sdk.t + x] = from_float<T>(dka[e]);
    }
  }
}

// Shared-memory bytes of each kernel for chunk size C, key dimension K and esize-byte inputs, and the
// state passes' stages (at most forward_stages / reverse_stages): two where they fit in the bytes a
// block may opt in to, unless they leave fewer CTAs per SM (shared memory per SM, with the 1 KB
// the runtime reserves per CTA) while the state_blocks CTAs of the grid need more than one wave of
// them: there one stage and twice the CTAs hides the copies as well, and the waves halve. A device
// of unknown SM count or per-SM shared memory (0) takes two stages wherever they fit.
struct BwdDevice {
  i64 max_smem_block = 0, smem_per_sm = 0, sm_count = 0;
};
struct BwdPlan {
  std::size_t prep, forward, reverse, local;
  int forward_stages, reverse_stages;
};
// tensor_cores: the local kernel's 16-bit path (kBwdTensorCores of the storage type).
inline BwdPlan bwd_plan(i64 C, i64 K, int esize, bool tensor_cores, const BwdDevice& dev, i64 state_blocks = 0,
                        int forward_stages = 2, int reverse_stages = 2) {
  BwdPlan pl;
  // G is double (first, or right after the local kernel's 16-bit tiles: 8-byte aligned); the rest float
  pl.prep = std::size_t(C * (K + 4) + C * std::max<i64>(K + 4, kSliceLd) + 2 * C * (C + 4) + 4 * C) * 4;
  pl.local = (tensor_cores ? kBwdTcBytes : 0) +
             std::size_t((tensor_cores ? 0 : 2 * C * K) + 4 * C * C + 4 * kSliceLd * C + 9 * C + 8) * 4;
  const auto stages = [&](int most, auto bytes_of) {
    const i64 one = bytes_of(1), two = bytes_of(2);
    if (most < 2 || two > dev.max_smem_block) return 1;
    if (dev.smem_per_sm <= 0 || dev.sm_count <= 0 || state_blocks <= 0) return 2;
    const i64 ctas_one = dev.smem_per_sm / (one + 1024), ctas_two = dev.smem_per_sm / (two + 1024);
    return ctas_two >= ctas_one || state_blocks <= ctas_two * dev.sm_count ? 2 : 1;
  };
  pl.forward_stages = stages(forward_stages, [&](int n) { return i64(bwd_forward_smem(int(C), int(K), esize, n).bytes); });
  pl.reverse_stages = stages(reverse_stages, [&](int n) { return i64(bwd_reverse_smem(int(C), int(K), esize, n).bytes); });
  pl.forward = std::size_t(bwd_forward_smem(int(C), int(K), esize, pl.forward_stages).bytes);
  pl.reverse = std::size_t(bwd_reverse_smem(int(C), int(K), esize, pl.reverse_stages).bytes);
  return pl;
}

// Which of the state passes' tiles move as 16-byte cp.async pieces: the input rows where
// rows_in_16_bytes holds, the workspace tiles where the region is 16-byte aligned and a row is
// whole pieces (W: K floats, U: V floats, the slices starting at multiples of 32; P: C floats; G:
// C doubles).
inline BwdStaging bwd_copies(const Params& p, const ChunkedBackwardWorkspace& ws, int esize) {
  const auto aligned = [](const void* at) { return reinterpret_cast<std::uintptr_t>(at) % 16 == 0; };
  BwdStaging st;
  st.k = rows_in_16_bytes(p.k, p.sk, p.B, p.Hk, p.T, p.K, esize);
  st.q = rows_in_16_bytes(p.q, p.sq, p.B, p.Hk, p.T, p.K, esize);
  st.dout = rows_in_16_bytes(p.dout, p.sdout, p.B, p.Hv, p.T, p.V, esize);
  st.g = aligned(ws.g) && ws.C % 2 == 0;
  st.w = aligned(ws.w) && p.K % 4 == 0;
  st.u = aligned(ws.u) && p.V % 4 == 0;
  st.p = aligned(ws.p) && ws.C % 4 == 0;
  return st;
}

// Everything the launcher decides for the state passes, in one place (the host emulator runs it
// too): which tiles move by cp.async, and the stages: two only where every tile of the pass does
// (an element copy of the next chunk would stall the current one at its start, which is what one
// stage costs anyway) and bwd_plan allows; one_stage: RUDNN_GATED_DELTA_BWD_STAGES=1.
struct BwdLaunchPlan {
  BwdPlan smem;
  BwdStaging forward, reverse;
};
inline BwdLaunchPlan bwd_launch_plan(const Params& p, const ChunkedBackwardWorkspace& ws, int esize, bool tensor_cores,
                                     const BwdDevice& dev, i64 state_blocks, bool one_stage) {
  BwdLaunchPlan lp;
  lp.forward = lp.reverse = bwd_copies(p, ws, esize);
  const BwdStaging& c = lp.forward;
  const int forward_most = !one_stage && c.g && c.w && c.k && c.u ? 2 : 1;
  const int reverse_most = !one_stage && c.g && c.p && c.dout && c.k && c.q && c.w ? 2 : 1;
  lp.smem = bwd_plan(ws.C, p.K, esize, tensor_cores, dev, state_blocks, forward_most, reverse_most);
  lp.forward.stages = lp.smem.forward_stages;
  lp.reverse.stages = lp.smem.reverse_stages;
  return lp;
}

}  // namespace

ChunkedBackwardLayout chunked_backward_layout(const Problem& p) {
  ChunkedBackwardLayout l{};
  const i64 C = p.chunk_size;
  l.chunks_per_batch = (p.T + C - 1) / C;
  l.slots = p.varlen ? p.T / C + p.N : p.N * l.chunks_per_batch;
  const i64 units = l.slots * p.Hv;
  l.g = units * C * 2;  // float64
  l.t = l.p = units * C * C;
  l.w = units * C * p.K;
  l.u = l.du = units * C * p.V;
  l.s0 = l.dsc = units * p.K * p.V;
  l.dq_acc = l.dk_acc = l.slots * p.Hk * C * p.K;
  return l;
}

bool chunked_backward_supported(const Problem& p, int max_smem) {
  if (p.chunk_size > kBwdMaxC || p.K > kBwdMaxK) return false;
  bool fits = false;
  dispatch(p.dtype, [&](auto tag) {  // the launcher's own choice of path (kBwdTensorCores)
    using T = typename decltype(tag)::type;
    BwdDevice dev;
    dev.max_smem_block = max_smem;
    const BwdPlan s = bwd_plan(p.chunk_size, p.K, int(sizeof(T)), kBwdTensorCores<T>, dev);  // (one stage if two do not fit)
    fits = std::max({s.prep, s.forward, s.reverse, s.local}) <= std::size_t(max_smem);
  });
  return fits;
}

void chunked_backward(const Params& params, const ChunkedBackwardWorkspace& ws, DType dtype, void* dq, SeqStrides sdq,
                      void* dk, SeqStrides sdk, void* dbeta, SeqStrides sdbeta, float* dg, SeqStrides sdg,
                      i64 slots, const core::DeviceProps& device, cudaStream_t stream) {
  const i64 vtiles = (params.V + kBwdCols - 1) / kBwdCols;
  const i64 unit_blocks = slots * params.Hv, local_blocks = slots * params.Hk, state_blocks = params.N * params.Hv * vtiles;
  BwdDevice dev;
  dev.max_smem_block = device.max_smem_per_block_optin;
  dev.smem_per_sm = device.max_smem_per_sm;
  dev.sm_count = device.sm_count;
  // RUDNN_GATED_DELTA_BWD_STAGES=1 holds the state passes to one stage (read on every call, so
  // that one benchmark run times both; the results are the same bits).
  const char* stages_env = std::getenv("RUDNN_GATED_DELTA_BWD_STAGES");
  const bool one_stage = stages_env != nullptr && stages_env[0] == '1';
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const BwdLaunchPlan plan = bwd_launch_plan(params, ws, int(sizeof(T)), kBwdTensorCores<T>, dev, state_blocks, one_stage);
    auto launch = [&](auto kernel, i64 blocks, std::size_t bytes, auto... args) {
      if (blocks <= 0) return;
      // The opt-in limit, not `bytes`: the same value on every call, so two host threads launching
      // with different plans never lower it under each other.
      RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dev.max_smem_block)));
      kernel<<<unsigned(blocks), kBwdThreads, bytes, stream>>>(params, ws, args...);
      RUDNN_CUDA_CHECK_LAUNCH(gated_delta_chunked_backward);
    };
    launch(bwd_prep_kernel<T>, unit_blocks, plan.smem.prep);
    launch(bwd_forward_kernel<T>, state_blocks, plan.smem.forward, plan.forward);
    launch(bwd_reverse_kernel<T>, state_blocks, plan.smem.reverse, plan.reverse);
    launch(bwd_local_kernel<T>, local_blocks, plan.smem.local, static_cast<T*>(dq), sdq, static_cast<T*>(dk), sdk,
           static_cast<T*>(dbeta), sdbeta, dg, sdg);
  });
}

}  // namespace rudnn::gated_delta::cuda
