// Chunked gated delta rule forward on tensor cores (sm80 mma.sync through CuTe MMA atoms;
// runs on Ampere, Ada and Hopper). The algorithm of cpu.cpp's chunked_forward_impl: per chunk
// of C = 64 tokens with cumulative log decays G,
//   L = strict_lower(diag(beta) (e^(G_i - G_j)) * K K^T),  T = (I + L)^-1,
//   W = T diag(beta e^G) K,  U' = T diag(beta) V,  P = scale e^(G_i - G_j) [j <= i] * Q K^T,
//   U = U' - W S0,  O = scale diag(e^G) Q S0 + P U,  S = e^(G_last) S0 + K^T diag(e^(G_last - G)) U.
// Two kernels, one per stage:
//  * chunk_prep_kernel, one CTA per (chunk, value head), all chunks in parallel: everything that
//    does not depend on the state (G, P, -W, U') into the caller's workspace;
//  * chunk_state_kernel, one CTA per (sequence, value head, 32 value columns), walking the
//    chunks in order: U, the output and the state update. The float32 state stays in the
//    accumulator registers of the K^T U product for the whole sequence (its bf16/f16 copy in
//    shared memory feeds the S0 products).
// Matrix products take the input dtype with float32 accumulation; decays, the triangular solve
// and the state are float32. Padding rows of the last chunk are zeros (k = q = v = beta = g = 0)
// and are never stored.
//
// Tiles reach shared memory through stage_tile: 16-byte cp.async pieces (src-size 0, i.e. zeros,
// past the sequence end and beyond K or V) where every row of the source is 16-byte aligned, as
// the host decides once per call (staging_for), element loads into 16-byte shared stores
// otherwise. The state kernel keeps one buffer per tile and refills it for chunk c + 1 as soon as
// chunk c's last reader of it has passed a barrier (-W after U, Q, P, G and U' after O, K after
// the state update), so each copy is in flight during one to two of the chunk's three products;
// a second copy of every tile would take 128.5 KB and leave one CTA per SM where this keeps
// three (H100/H200; two on A100). The prep kernel issues K and Q at once and waits for K only
// before K K^T, and streams the value tiles into Q's space (dead after P) during the
// triangular solve.
//
// Every 16-bit tile in shared memory is row-major with its 16-byte pieces XOR-swizzled within
// each row (SmemTile: piece j of row r at piece j ^ (r mod 8) of its 128-byte half, or of
// (r / 2) mod 4 for 64-byte rows), so the 8 rows of one 8 x 8 ldmatrix matrix fall in 8
// different bank groups; stage_tile writes its 16-byte cp.async pieces through that layout (a
// piece is 8 aligned elements, below the bits the swizzle moves, so it stays whole). The MMA
// operands come out of these tiles with ldmatrix.x4 (CuTe SM75 LDSM atoms through
// make_tiled_copy_A/B), one k step of 16 at a time: .x4 without .trans where the operand's
// contracted index runs along the stored rows (K K^T, Q K^T, T X, T V, W S, Q S, P U's A), and
// .x4.trans where it runs down the columns (the stored tiles' transposes: X and V in prep, S0, U
// and U_d as B, and K^T as the A of K^T U_d). The transposes are thereby free: no tile is staged
// twice or transposed in shared memory, which would cost a copy and a barrier per chunk.
#include <cute/arch/copy_sm80.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/cuda_check.hpp"
#include "gated_delta/chunk_mma.cuh"
#include "gated_delta/cuda_common.cuh"

namespace rudnn::gated_delta::cuda {

namespace {

using namespace cute;
using namespace chunk_mma;  // SmemTile, the atoms, mma_from_smem, make_chunk_mma

constexpr int kC = 64;    // chunk length
constexpr int kKt = 128;  // key dimension of the tile (K <= 128, zero padded)
constexpr int kBV = 32;   // value columns per CTA (B = 1, 32 value heads, V = 128: 128 CTAs fill an H200)
constexpr int kB = 16;    // block size of the blocked triangular inverse
constexpr int kNB = kC / kB;
constexpr int kThreads = 128;
// CTAs per SM that shared memory allows on H100/H200 (3 x (72.5 + 1) KB <= 228 KB), given to
// ptxas as the occupancy to keep: up to 170 registers per thread (without it ptxas held the state
// kernel at 128 on sm_90a and spilled).
constexpr int kCtasPerSm = 3;

// Tiles of 32-bit elements (G) are never MMA operands: plain rows.
template <int Rows, int Cols>
struct PlainRows {
  static constexpr int kRows = Rows, kCols = Cols, kPitch = Cols;
  using Layout = cute::Layout<Shape<Int<kRows>, Int<kCols>>, Stride<Int<kCols>, _1>>;
};

// A [Rows][128] 16-bit tile as two blocks of 64 columns, one after the other, each [Rows][64]
// with 128-byte rows and SmemTile<Rows, 64>'s swizzle: wgmma's canonical 128-byte-swizzled
// layout (an SW128 atom is 8 rows of 64 elements), which SmemTile<Rows, 128>'s 256-byte rows are
// not. The state kernel's K, Q and -W tiles, for both of its paths (ldmatrix reads it as well).
template <int Rows>
struct WideTile {
  static constexpr int kRows = Rows, kCols = 128, kPitch = 64;  // kPitch: elements from a row to the next
  using Swz = Swizzle<3, 3, 3>;
  using Layout =
      decltype(composition(Swz{}, cute::Layout<Shape<Int<Rows>, Shape<_64, _2>>, Stride<_64, Stride<_1, Int<Rows * 64>>>>{}));
  template <class E>
  static __device__ __forceinline__ auto view(E* p) {
    return make_tensor(make_smem_ptr(p), Layout{});
  }
  template <class E>
  static __device__ __forceinline__ auto view_t(E* p) {
    return make_tensor(make_smem_ptr(p), composition(Swz{}, cute::Layout<Shape<Shape<_64, _2>, Int<Rows>>,
                                                                        Stride<Stride<_1, Int<Rows * 64>>, _64>>{}));
  }
};

using KTile = SmemTile<kC, kKt>;   // prep: K, Q, diag(beta e^G) K
using WTile = WideTile<kC>;        // state: K, Q, -W
using CTile = SmemTile<kC, kC>;    // P, T
using VTile = SmemTile<kC, kBV>;   // value tiles, U' / U, U_d
using STile = SmemTile<kKt, kBV>;  // S0

// Shared memory of the prep kernel. f32 where the triangular solve needs it, E (half/bf16) for
// MMA operands.
template <class E>
struct PrepSmem {
  E k[kC * kKt];      // K rows of the chunk            [C][Kt]
  E q[kC * kKt];      // Q rows [C][Kt]; after P, up to kKt / kBV value tiles [C][BV] (beta V)
  float l[kC * kC];   // L (f32); reused for diag(beta e^G) K as E after the solve
  float t[kC * kC];   // T = (I + L)^-1 (f32): the triangular workspace, with g below
  float g[kC];        // cumulative log decay G
  float beta[kC];
  E tb[kC * kC];      // T in the operand dtype; before, the blocked inverse's off-diagonal block
                      // products (kNB - 1 blocks of kB x kB floats)
};

// Shared memory of the state kernel. Every 16-bit tile starts at a multiple of 1024 bytes (the
// 128-byte swizzle's period; wgmma's descriptors carry no base offset). kStages copies of the
// K, Q and P tiles (the wgmma schedule streams chunk c + 2's in during chunk c), two of G (one
// per chunk parity; the mma.sync schedule uses the first).
template <class E, int kStages = 1>
struct StateSmem {
  E k[kStages][kC * kKt];  // K rows of the chunk            [C][Kt] (WTile)
  E q[kStages][kC * kKt];  // Q rows                          [C][Kt] (WTile)
  E s[kKt * kBV];          // S0 in the operand dtype         [Kt][BV]
  E w[kC * kKt];           // -W                              (WTile)
  E p[kStages][kC * kC];   // P
  E u[kC * kBV];           // U (the mma.sync schedule stages U' here first)
  E ud[kC * kBV];          // e^(G_last - G_j) U_j
  float g[2][kC];
};
template <int kStages>
constexpr bool state_tiles_aligned() {
  using S = StateSmem<cute::half_t, kStages>;
  return offsetof(S, q) % 1024 == 0 && offsetof(S, s) % 1024 == 0 && offsetof(S, w) % 1024 == 0 &&
         offsetof(S, p) % 1024 == 0 && offsetof(S, u) % 1024 == 0 && offsetof(S, ud) % 1024 == 0 &&
         sizeof(S::k[0]) % 1024 == 0 && sizeof(S::p[0]) % 1024 == 0;
}
static_assert(state_tiles_aligned<1>() && state_tiles_aligned<2>(), "16-bit tiles on 1024-byte boundaries");

// How a call's tiles are copied into shared memory (decided on the host, staging_for): true where
// every row of the source can move as 16-byte cp.async pieces.
struct Staging {
  bool qk = false;  // q and k rows
  bool v = false;   // v rows (prep kernel)
  bool ws = false;  // G, P, -W and U' in the workspace (256-byte aligned regions of its base)
};

inline Staging staging_for(const Params& p, const void* workspace) {
  Staging st;
  st.qk = rows_in_16_bytes(p.q, p.sq, p.B, p.Hk, p.T, p.K) && rows_in_16_bytes(p.k, p.sk, p.B, p.Hk, p.T, p.K);
  st.v = rows_in_16_bytes(p.v, p.sv, p.B, p.Hv, p.T, p.V);
  st.ws = reinterpret_cast<std::uintptr_t>(workspace) % 16 == 0;
  return st;
}

// Issues the copy of a Tile (SmemTile, WideTile or PlainRows: [Rows][Cols]) whose row r is at
// src + r * row_stride; rows >= valid_rows and columns >= valid_cols become zeros (valid_cols a
// multiple of a 16-byte piece when vec16). With vec16 every piece is one cp.async (the caller
// commits and waits), otherwise element loads and one shared store (ordered by a barrier).
// Thread t copies piece t % pieces of rows t / pieces, + kThreads / pieces, ...: the address math
// is one pointer step per piece on both sides (the row step is a multiple of the swizzle's
// 8-row period; a WideTile's rows are kPitch = 64 elements apart within a column block).
template <class Tile, class E>
__device__ __forceinline__ void stage_tile(E* dst, const E* src, i64 row_stride, int valid_rows, int valid_cols,
                                           bool vec16) {
  constexpr int Rows = Tile::kRows, Cols = Tile::kCols;
  constexpr int kPer = 16 / int(sizeof(E));  // elements of a piece
  constexpr int kPieces = Cols / kPer;       // pieces of a row
  constexpr int kRowStep = kThreads / kPieces;
  static_assert(Cols % kPer == 0 && kThreads % kPieces == 0, "a row is whole pieces, threads are whole rows");
  static_assert(Rows <= kRowStep || kRowStep % 8 == 0, "steps of whole swizzle periods");
  const int col = int(threadIdx.x) % kPieces * kPer;
  int r = int(threadIdx.x) / kPieces;
  const E* from = src + r * row_stride + col;
  E* to = dst + typename Tile::Layout{}(r, col);  // this thread's first piece in the tile
  for (; r < Rows; r += kRowStep, from += kRowStep * row_stride, to += kRowStep * Tile::kPitch) {
    auto& piece = *reinterpret_cast<cute::uint128_t*>(to);
    if (vec16) {
      const bool ok = r < valid_rows && col < valid_cols;  // src-size 0: nothing read, 16 zero bytes
      SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(*reinterpret_cast<const cute::uint128_t*>(ok ? from : src),
                                                            piece, ok);
    } else {
      E pack[kPer];
      CUTE_UNROLL
      for (int l = 0; l < kPer; ++l) pack[l] = r < valid_rows && col + l < valid_cols ? from[l] : E(0.0f);
      cute::uint128_t bits;
      memcpy(&bits, pack, 16);
      piece = bits;
    }
  }
}

// Stores f(i) for every element i of a thread's accumulator at dst(i) (dst: the accumulator's
// partition of a 16-bit shared tile), two at a time: elements 2j and 2j + 1 of the m16n8
// accumulator are adjacent columns of one row, and the swizzle keeps them adjacent (one 32-bit
// store instead of two 16-bit ones).
template <class E, class Dst, class F>
__device__ __forceinline__ void store_pairs(Dst&& dst, F&& f) {
  CUTE_UNROLL
  for (int i = 0; i < size(dst); i += 2) {
    const E two[2] = {E(f(i)), E(f(i + 1))};
    std::uint32_t bits;
    memcpy(&bits, two, 4);
    *reinterpret_cast<std::uint32_t*>(&dst(i)) = bits;  // 4-byte aligned: an even column
  }
}

// The workspace of one (chunk slot, value head): G [C] f32, P [C][C], -W [C][Kt], U' [C][Vp].
template <class E>
struct ChunkSlot {
  float* g;
  E* p;
  E* w;
  E* u;
};

template <class E>
__device__ __forceinline__ ChunkSlot<E> chunk_slot(const ChunkWorkspace& ws, i64 slot, i64 h, i64 Hv) {
  const i64 i = slot * Hv + h;
  return {ws.g + i * kC, static_cast<E*>(ws.p) + i * kC * kC, static_cast<E*>(ws.w) + i * kC * kKt,
          static_cast<E*>(ws.u) + i * kC * ws.vp};
}

// Stage 1: one CTA per (chunk slot, value head); slots without a chunk return at once.
template <class E>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) chunk_prep_kernel(Params p, ChunkWorkspace ws, i64 vtiles, Staging st) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<PrepSmem<E>*>(smem_raw);
  auto mma = make_chunk_mma<E>();
  auto thr = mma.get_thread_slice(threadIdx.x);
  const int tid = threadIdx.x;
  using X = StorageOf<E>;

  if (p.N == 0) return;
  const i64 slot = blockIdx.x / p.Hv, h = blockIdx.x % p.Hv, hk = h / p.group;
  const SlotChunk sc = slot_chunk(p, kC, ws.chunks_per_batch, slot);
  const Sequence& s = sc.s;
  const i64 c0 = sc.c0;
  if (c0 >= s.eos) return;  // a slot no chunk uses (varlen slack)
  const int valid = int(min(i64(kC), s.eos - c0));
  const ChunkSlot<E> out = chunk_slot<E>(ws, slot, h, p.Hv);

  // 1. Stage the chunk (zero padded): K and Q as two copy groups, beta by the first 64 threads
  //    and G = cumsum(g) by the first warp meanwhile.
  stage_tile<KTile>(sm.k, static_cast<const E*>(p.k) + s.b * p.sk.b + hk * p.sk.h + c0 * p.sk.t, p.sk.t, valid,
                      int(p.K), st.qk);
  cp_async_fence();
  stage_tile<KTile>(sm.q, static_cast<const E*>(p.q) + s.b * p.sq.b + hk * p.sq.h + c0 * p.sq.t, p.sq.t, valid,
                      int(p.K), st.qk);
  cp_async_fence();
  if (tid < kC) sm.beta[tid] = tid < valid ? load<X>(p.beta, p.sbeta, s.b, h, c0 + tid) : 0.0f;
  if (tid < 32) {
    // Lane l holds tokens 2l and 2l + 1: their sum's inclusive scan over the lanes (5 shuffle
    // steps, no barrier), then the lane's own two from the scan of the lanes below it.
    static_assert(kC == 64, "one warp, two tokens per lane");
    const int i = 2 * tid;
    auto log_decay = [&](int t) {
      return t < valid ? chunked_log_decay(p.g[s.b * p.sg.b + h * p.sg.h + (c0 + t) * p.sg.t]) : 0.0f;
    };
    const float a = log_decay(i), b = log_decay(i + 1);
    float cum = a + b;
    CUTE_UNROLL
    for (int d = 1; d < 32; d *= 2) {
      const float below = __shfl_up_sync(0xffffffffu, cum, d);
      if (tid >= d) cum += below;
    }
    const float before = __shfl_up_sync(0xffffffffu, cum, 1);
    const float g0 = (tid > 0 ? before : 0.0f) + a, g1 = g0 + b;
    sm.g[i] = g0;
    sm.g[i + 1] = g1;
    out.g[i] = g0;
    out.g[i + 1] = g1;
  }
  cp_async_wait<1>();  // K has landed (Q may still be in flight)
  __syncthreads();

  // 2. L = strict_lower(beta_i e^(G_i - G_j) k_i.k_j) to shared memory, P to the workspace.
  {
    auto coord_cc = thr.partition_C(make_identity_tensor(Shape<Int<kC>, Int<kC>>{}));
    auto acc = partition_fragment_C(mma, Shape<Int<kC>, Int<kC>>{});
    clear(acc);
    mma_from_smem<LdsmN, LdsmN>(mma, KTile::view(sm.k), KTile::view(sm.k), acc);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      const int r = get<0>(coord_cc(i)), c = get<1>(coord_cc(i));
      sm.l[r * kC + c] = c < r ? sm.beta[r] * expf(sm.g[r] - sm.g[c]) * acc(i) : 0.0f;
    }
    cp_async_wait<0>();  // Q has landed
    __syncthreads();
    clear(acc);
    mma_from_smem<LdsmN, LdsmN>(mma, KTile::view(sm.q), KTile::view(sm.k), acc);
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      const int r = get<0>(coord_cc(i)), c = get<1>(coord_cc(i));
      out.p[r * kC + c] = E(c <= r ? p.scale * expf(sm.g[r] - sm.g[c]) * acc(i) : 0.0f);
    }
  }
  __syncthreads();  // every warp is done with Q

  // Q's space holds up to kVSlots value tiles [C][BV] (V in rounds of kVSlots tiles); the first
  // round streams in during the triangular solve.
  constexpr int kVSlots = kKt / kBV;
  E* vbuf = sm.q;
  const E* v_rows = static_cast<const E*>(p.v) + s.b * p.sv.b + h * p.sv.h + c0 * p.sv.t;
  auto issue_values = [&](i64 vt0) {
    for (int j = 0; j < kVSlots && vt0 + j < vtiles; ++j) {
      const i64 col0 = (vt0 + j) * kBV;
      stage_tile<VTile>(vbuf + j * kC * kBV, v_rows + col0, p.sv.t, valid, int(min(i64(kBV), p.V - col0)), st.v);
    }
    cp_async_fence();
  };
  issue_values(0);

  // 3. T = (I + L)^-1 in 16 x 16 blocks (the dependency chain is 16 long, not 64): the diagonal
  //    blocks by forward substitution, one column per thread, then the blocks at distance
  //    d = 1, 2, 3 below the diagonal: T_ab = -T_aa sum_{b <= m < a} L_am T_mb, which reads
  //    only blocks nearer the diagonal. Blocks above the diagonal are zero.
  if (tid < kC) {
    const int base = (tid / kB) * kB, jj = tid % kB;
    for (int i = 0; i < kB; ++i) {
      float acc = i == jj ? 1.0f : 0.0f;
      for (int m = jj; m < i; ++m) acc -= sm.l[(base + i) * kC + base + m] * sm.t[(base + m) * kC + base + jj];
      sm.t[(base + i) * kC + base + jj] = i >= jj ? acc : 0.0f;
    }
  }
  for (int e = tid; e < kC * kC; e += kThreads)
    if ((e % kC) / kB > (e / kC) / kB) sm.t[e] = 0.0f;
  __syncthreads();
  float* const y = reinterpret_cast<float*>(sm.tb);
  static_assert((kNB - 1) * kB * kB * sizeof(float) <= sizeof(sm.tb), "the block products fit in tb");
  for (int d = 1; d < kNB; ++d) {
    const int count = (kNB - d) * kB * kB;  // the blocks (a, b = a - d)
    for (int e = tid; e < count; e += kThreads) {
      const int b = e / (kB * kB), r = (e / kB) % kB, c = e % kB, a = b + d;
      float acc = 0.0f;
      for (int m = b * kB; m < a * kB; ++m) acc += sm.l[(a * kB + r) * kC + m] * sm.t[m * kC + b * kB + c];
      y[e] = acc;
    }
    __syncthreads();
    for (int e = tid; e < count; e += kThreads) {
      const int b = e / (kB * kB), r = (e / kB) % kB, c = e % kB, a = b + d;
      float acc = 0.0f;
      for (int m = 0; m < kB; ++m) acc -= sm.t[(a * kB + r) * kC + a * kB + m] * y[b * kB * kB + m * kB + c];
      sm.t[(a * kB + r) * kC + b * kB + c] = acc;
    }
    __syncthreads();
  }
  // Operands of W and U': T, converted 8 elements (one 16-byte piece) at a time, and
  // diag(beta e^G) K into l's space, element e of K's tile to element e of X's (the same layout;
  // e / kKt is its row wherever the swizzle put it).
  E* kx = reinterpret_cast<E*>(sm.l);
  for (int piece = tid; piece < kC * kC / 8; piece += kThreads) {
    const int r = piece / (kC / 8), c = piece % (kC / 8) * 8;
    E pack[8];
    CUTE_UNROLL
    for (int l = 0; l < 8; ++l) pack[l] = E(sm.t[r * kC + c + l]);
    cute::uint128_t bits;
    memcpy(&bits, pack, 16);
    *reinterpret_cast<cute::uint128_t*>(&CTile::view(sm.tb)(r, c)) = bits;  // a whole piece
  }
  for (int e = tid; e < kC * kKt; e += kThreads) {
    const int i = e / kKt;
    kx[e] = E(sm.beta[i] * expf(sm.g[i]) * float(sm.k[e]));
  }
  __syncthreads();

  // 4. -W = -T (diag(beta e^G) K) to the workspace.
  {
    auto coord_ck = thr.partition_C(make_identity_tensor(Shape<Int<kC>, Int<kKt>>{}));
    auto acc_w = partition_fragment_C(mma, Shape<Int<kC>, Int<kKt>>{});
    clear(acc_w);
    mma_from_smem<LdsmN, LdsmT>(mma, CTile::view(sm.tb), KTile::view_t(kx), acc_w);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_w); ++i) out.w[get<0>(coord_ck(i)) * kKt + get<1>(coord_ck(i))] = E(-acc_w(i));
  }

  // 5. U' = T (diag(beta) V), to the workspace, kVSlots value tiles per round.
  auto coord_cv = thr.partition_C(make_identity_tensor(Shape<Int<kC>, Int<kBV>>{}));
  for (i64 vt0 = 0; vt0 < vtiles; vt0 += kVSlots) {
    if (vt0 > 0) issue_values(vt0);
    cp_async_wait<0>();  // this round's value tiles have landed
    __syncthreads();
    const int tiles = int(min(i64(kVSlots), vtiles - vt0));
    // beta on each row in place (e / kBV % kC is element e's row: the swizzle keeps rows)
    for (int e = tid; e < tiles * kC * kBV; e += kThreads) vbuf[e] = E(sm.beta[e / kBV % kC] * float(vbuf[e]));
    __syncthreads();
    for (int j = 0; j < tiles; ++j) {
      const i64 v0 = (vt0 + j) * kBV;
      auto acc_u = partition_fragment_C(mma, Shape<Int<kC>, Int<kBV>>{});
      clear(acc_u);
      mma_from_smem<LdsmN, LdsmT>(mma, CTile::view(sm.tb), VTile::view_t(vbuf + j * kC * kBV), acc_u);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_u); ++i)
        out.u[get<0>(coord_cv(i)) * ws.vp + v0 + get<1>(coord_cv(i))] = E(acc_u(i));
    }
    __syncthreads();  // the next round overwrites the tiles
  }
}

// The state kernel's products on Hopper: wgmma (warpgroup MMA, m64n32k16) with both operands read
// by the tensor cores from shared memory through matrix descriptors, in place of ldmatrix into
// registers and mma.sync. The four warps are one warpgroup; the accumulators hold the same
// (row, column) elements per thread as mma.sync's (one 64 x 32 atom per 64 rows), so the staging
// and the element-wise code are shared (StateChunks, store_pairs). The descriptors see the tiles through CuTe's canonical
// GMMA layouts over the same bytes the staging writes (WideTile, SmemTile<., 64> and
// SmemTile<., 32> are those layouts): -W, Q and P K-major as A; S0, U and U_d MN-major as B (their
// 32 value columns contiguous); K MN-major as A of K^T U_d (keys contiguous, two 64-key atoms).
template <class E>
struct StateGmma {
  using Major = GMMA::Major;
  template <Major A>
  using Atom = std::conditional_t<std::is_same_v<E, cute::half_t>, SM90::GMMA::MMA_64x32x16_F32F16F16_SS<A, Major::MN>,
                                  SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<A, Major::MN>>;
  using RowsA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kC>, Int<kKt>>{}));   // -W, Q
  using ChunkA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kC>, Int<kC>>{}));  // P
  using KeysA = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<E>{}, Shape<Int<kKt>, Int<kC>>{},
                                       Step<_2, _1>{}));  // K^T: [keys][tokens], a 64-key block after the other
  using StateB = decltype(tile_to_shape(GMMA::Layout_MN_SW64_Atom<E>{}, Shape<Int<kBV>, Int<kKt>>{}));  // S0
  using ValueB = decltype(tile_to_shape(GMMA::Layout_MN_SW64_Atom<E>{}, Shape<Int<kBV>, Int<kC>>{}));   // U, U_d
};

// Stage 2: one CTA per (sequence, value head, 32 value columns), the chunks in order. What both
// of its schedules share: the CTA's coordinates, the copies of a chunk's tiles (each issue adds
// pieces to the thread's open cp.async group; the schedules commit), and the state's first and
// last values.
template <class E, int kStages>
struct StateChunks {
  StateSmem<E, kStages>& sm;
  const Params& p;
  const ChunkWorkspace& ws;
  Staging st;
  i64 h, hk, n, v0, slot0;
  Sequence s;
  const E* k_rows;
  const E* q_rows;

  __device__ StateChunks(unsigned char* smem_raw, const Params& p_, const ChunkWorkspace& ws_, i64 vtiles, Staging st_)
      : sm(*reinterpret_cast<StateSmem<E, kStages>*>(smem_raw)), p(p_), ws(ws_), st(st_) {
    i64 id = blockIdx.x;
    const i64 vt = id % vtiles;
    id /= vtiles;
    h = id % p.Hv, n = id / p.Hv, hk = h / p.group;
    v0 = vt * kBV;
    s = sequence(p, n);
    slot0 = chunk_slot0(p, kC, ws.chunks_per_batch, n, s);
    k_rows = static_cast<const E*>(p.k) + s.b * p.sk.b + hk * p.sk.h;
    q_rows = static_cast<const E*>(p.q) + s.b * p.sq.b + hk * p.sq.h;
  }
  __device__ int valid_rows(i64 c0) const { return int(min(i64(kC), s.eos - c0)); }
  __device__ ChunkSlot<E> slot(i64 i) const { return chunk_slot<E>(ws, i, h, p.Hv); }
  // Chunk (c0, slot i)'s tiles; nothing past the sequence's last chunk.
  __device__ void copy_w(i64 c0, i64 i) const {
    if (c0 < s.eos) stage_tile<WTile>(sm.w, slot(i).w, kKt, kC, kKt, st.ws);
  }
  __device__ void copy_g(i64 c0, i64 i, int parity) const {
    if (c0 < s.eos) stage_tile<PlainRows<1, kC>>(sm.g[parity], slot(i).g, 0, 1, kC, st.ws);
  }
  __device__ void copy_u(i64 c0, i64 i) const {  // U' into U's buffer
    if (c0 < s.eos) stage_tile<VTile>(sm.u, slot(i).u + v0, ws.vp, kC, kBV, st.ws);
  }
  __device__ void copy_q_p(i64 c0, i64 i, int stage) const {
    if (c0 < s.eos) {
      stage_tile<WTile>(sm.q[stage], q_rows + c0 * p.sq.t, p.sq.t, valid_rows(c0), int(p.K), st.qk);
      stage_tile<CTile>(sm.p[stage], slot(i).p, kC, kC, kC, st.ws);
    }
  }
  __device__ void copy_k(i64 c0, int stage) const {
    if (c0 < s.eos) stage_tile<WTile>(sm.k[stage], k_rows + c0 * p.sk.t, p.sk.t, valid_rows(c0), int(p.K), st.qk);
  }
  // The state tile's elements (coord: their (key row, value column) in the tile) from the initial
  // state or zero, and back to the final state.
  template <class Acc, class Coord>
  __device__ void load_state(Acc& acc_s, const Coord& coord_s) const {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) {
      const i64 row = get<0>(coord_s(i)), col = v0 + get<1>(coord_s(i));
      acc_s(i) = (p.initial && row < p.K && col < p.V)
                     ? p.initial[n * p.sinit.n + h * p.sinit.h + row * p.sinit.k + col] : 0.0f;
    }
  }
  template <class Acc, class Coord>
  __device__ void store_state(const Acc& acc_s, const Coord& coord_s) const {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) {
      const i64 row = get<0>(coord_s(i)), col = v0 + get<1>(coord_s(i));
      if (row < p.K && col < p.V) p.final_state[n * p.sfinal.n + h * p.sfinal.h + row * p.sfinal.k + col] = acc_s(i);
    }
  }
  // The output rows of the chunk at c0 (valid rows and columns only).
  template <class Acc, class Coord>
  __device__ void store_out(const Acc& acc_o, const Coord& coord_cv, i64 c0) const {
    const int valid = valid_rows(c0);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) {
      const int r = get<0>(coord_cv(i));
      const i64 col = v0 + get<1>(coord_cv(i));
      if (r < valid && col < p.V)
        static_cast<E*>(p.out)[s.b * p.sout.b + h * p.sout.h + (c0 + r) * p.sout.t + col] = E(acc_o(i));
    }
  }
};

// The mma.sync schedule (every architecture): one buffer per tile, refilled for chunk c + 1 as
// soon as chunk c's last reader of it has passed a barrier, as four cp.async groups in the order
// they are read: -W; G and U'; Q and P; K. Every issue commits a group, empty past the last
// chunk, so each thread's groups stay in step with the waits below.
template <class E>
__device__ __forceinline__ void state_chunks_mma(const Params& p, const ChunkWorkspace& ws, i64 vtiles, Staging st,
                                                 unsigned char* smem_raw) {
  const StateChunks<E, 1> x(smem_raw, p, ws, vtiles, st);
  auto& sm = x.sm;
  auto mma = make_chunk_mma<E>();
  auto thr = mma.get_thread_slice(threadIdx.x);

  // The state tile [Kt][BV] in float32 accumulator registers.
  auto acc_s = partition_fragment_C(mma, Shape<Int<kKt>, Int<kBV>>{});
  auto coord_s = thr.partition_C(make_identity_tensor(Shape<Int<kKt>, Int<kBV>>{}));
  x.load_state(acc_s, coord_s);
  auto coord_cv = thr.partition_C(make_identity_tensor(Shape<Int<kC>, Int<kBV>>{}));

  auto issue_w = [&](i64 c0, i64 slot) {
    x.copy_w(c0, slot);
    cp_async_fence();
  };
  auto issue_g_u = [&](i64 c0, i64 slot) {
    x.copy_g(c0, slot, 0);
    x.copy_u(c0, slot);
    cp_async_fence();
  };
  auto issue_q_p = [&](i64 c0, i64 slot) {
    x.copy_q_p(c0, slot, 0);
    cp_async_fence();
  };
  auto issue_k = [&](i64 c0) {
    x.copy_k(c0, 0);
    cp_async_fence();
  };
  const Sequence& s = x.s;
  issue_w(s.bos, x.slot0);
  issue_g_u(s.bos, x.slot0);
  issue_q_p(s.bos, x.slot0);
  issue_k(s.bos);

  for (i64 c0 = s.bos, slot = x.slot0; c0 < s.eos; c0 += kC, ++slot) {
    // 1. The operand copy of S0 (each thread its own accumulator elements).
    store_pairs<E>(thr.partition_C(STile::view(sm.s)), [&](int i) { return acc_s(i); });
    cp_async_wait<2>();  // -W, G and U' of this chunk have landed (Q, P and K may be in flight)
    __syncthreads();

    // 2. U = U' - W S0; keep U and e^(G_last - G_j) U_j as operands. U' is read and U written
    //    at each thread's own accumulator elements.
    auto acc_u = partition_fragment_C(mma, Shape<Int<kC>, Int<kBV>>{});
    auto u_mine = thr.partition_C(VTile::view(sm.u));
    CUTE_UNROLL
    for (int i = 0; i < size(acc_u); ++i) acc_u(i) = float(u_mine(i));
    mma_from_smem<LdsmN, LdsmT>(mma, WTile::view(sm.w), STile::view_t(sm.s), acc_u);
    const float* g = sm.g[0];
    const float g_last = g[kC - 1];
    store_pairs<E>(u_mine, [&](int i) { return acc_u(i); });
    store_pairs<E>(thr.partition_C(VTile::view(sm.ud)),
                   [&](int i) { return expf(g_last - g[get<0>(coord_cv(i))]) * acc_u(i); });
    cp_async_wait<1>();  // Q and P have landed
    __syncthreads();     // U is complete; every warp is done with -W
    issue_w(c0 + kC, slot + 1);

    // 3. O = scale e^G (Q S0) + P U, stored for the valid rows and columns.
    {
      auto acc_o = partition_fragment_C(mma, Shape<Int<kC>, Int<kBV>>{});
      clear(acc_o);
      mma_from_smem<LdsmN, LdsmT>(mma, WTile::view(sm.q[0]), STile::view_t(sm.s), acc_o);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= p.scale * expf(g[get<0>(coord_cv(i))]);
      mma_from_smem<LdsmN, LdsmT>(mma, CTile::view(sm.p[0]), VTile::view_t(sm.u), acc_o);
      x.store_out(acc_o, coord_cv, c0);
    }
    cp_async_wait<1>();  // K has landed (the next chunk's -W may be in flight)
    __syncthreads();     // every warp is done with Q, P, G and U
    issue_g_u(c0 + kC, slot + 1);
    issue_q_p(c0 + kC, slot + 1);

    // 4. S = e^(G_last) S0 + K^T (e^(G_last - G) U), accumulated in float32 registers.
    const float chunk_decay = expf(g_last);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= chunk_decay;
    mma_from_smem<LdsmT, LdsmT>(mma, WTile::view_t(sm.k[0]), VTile::view_t(sm.ud), acc_s);
    __syncthreads();  // every warp is done with K, U_d and S0's copy
    issue_k(c0 + kC);
  }
  cp_async_wait<0>();  // only empty groups remain
  x.store_state(acc_s, coord_s);
}

// The wgmma schedule (sm_90a). The products are warpgroup MMAs (m64n32k16, both operands read by
// the tensor cores from shared memory through descriptors; StateGmma), which run asynchronously
// to the threads until waited for, so a chunk needs only two round trips through the tensor
// cores: U = U' - W S0 (the state's own chain: its result feeds the rest), then O's two products
// and the state update K^T U_d issued as one group and waited for once. The accumulators hold the
// mma.sync accumulators' (row, column) elements, so the element-wise code is the same. What
// feeds it:
//   * K, Q and P in two stages: chunk c + 2's are issued when chunk c's products are done (a
//     whole chunk ahead of their use, where the mma.sync schedule has one product's time);
//   * -W and G (one of two, by chunk parity) issued once U is done, for the next chunk;
//   * U' read into registers with plain loads during the products of the chunk before, added
//     to W S0 after its wait (no shared buffer, no wait for it);
//   so each chunk waits for its cp.async copies once (the group of -W and G, which also
//   completes every older one). Shared memory 112.5 KB: two CTAs per SM on H100/H200.
// Generic-proxy writes (cp.async, the S0 / U / U_d stores) are fenced
// (fence.proxy.async.shared::cta) before the barriers that publish them to wgmma.
template <class E>
__device__ __forceinline__ void state_chunks_wgmma(const Params& p, const ChunkWorkspace& ws, i64 vtiles, Staging st,
                                                   unsigned char* smem_raw) {
  using G = StateGmma<E>;
  const StateChunks<E, 2> x(smem_raw, p, ws, vtiles, st);
  auto& sm = x.sm;
  auto mma = make_tiled_mma(typename G::template Atom<GMMA::Major::K>{});      // -W S0, Q S0, P U
  auto mma_kv = make_tiled_mma(typename G::template Atom<GMMA::Major::MN>{});  // K^T U_d
  auto thr = mma.get_thread_slice(threadIdx.x);
  auto thr_kv = mma_kv.get_thread_slice(threadIdx.x);

  auto acc_s = partition_fragment_C(mma_kv, Shape<Int<kKt>, Int<kBV>>{});
  auto coord_s = thr.partition_C(make_identity_tensor(Shape<Int<kKt>, Int<kBV>>{}));
  x.load_state(acc_s, coord_s);
  auto coord_cv = thr.partition_C(make_identity_tensor(Shape<Int<kC>, Int<kBV>>{}));

  // Descriptors of the operands that stay put, and of each stage's K, Q and P.
  auto dW = thr.make_fragment_A(thr.partition_A(make_tensor(make_smem_ptr(sm.w), typename G::RowsA{})));
  auto dS = thr.make_fragment_B(thr.partition_B(make_tensor(make_smem_ptr(sm.s), typename G::StateB{})));
  auto dU = thr.make_fragment_B(thr.partition_B(make_tensor(make_smem_ptr(sm.u), typename G::ValueB{})));
  auto dUd = thr_kv.make_fragment_B(thr_kv.partition_B(make_tensor(make_smem_ptr(sm.ud), typename G::ValueB{})));
  auto dQ = [&](int stage) {
    return thr.make_fragment_A(thr.partition_A(make_tensor(make_smem_ptr(sm.q[stage]), typename G::RowsA{})));
  };
  auto dP = [&](int stage) {
    return thr.make_fragment_A(thr.partition_A(make_tensor(make_smem_ptr(sm.p[stage]), typename G::ChunkA{})));
  };
  auto dK = [&](int stage) {
    return thr_kv.make_fragment_A(thr_kv.partition_A(make_tensor(make_smem_ptr(sm.k[stage]), typename G::KeysA{})));
  };
  // k steps of one product into the open wgmma group; the first overwrites acc unless accumulate.
  auto issue = [](auto& tiled, const auto& a, const auto& b, auto& acc, bool accumulate) {
    tiled.accumulate_ = accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int kk = 0; kk < size<2>(a); ++kk) {
      cute::gemm(tiled, a(_, _, kk), b(_, _, kk), acc);
      tiled.accumulate_ = GMMA::ScaleOut::One;
    }
  };

  // U' of the chunk at (c0, slot i) at this thread's accumulator elements, two neighbouring
  // columns per 4-byte load (a pair never straddles a row; vp and v0 are multiples of 32).
  constexpr int kPairs = decltype(size(coord_cv))::value / 2;
  std::uint32_t u_next[kPairs];
  auto load_u = [&](i64 c0, i64 i) {
    const E* rows = x.slot(i).u + x.v0;
    CUTE_UNROLL
    for (int j = 0; j < kPairs; ++j)
      u_next[j] = c0 < x.s.eos ? *reinterpret_cast<const std::uint32_t*>(
                                     rows + get<0>(coord_cv(2 * j)) * ws.vp + get<1>(coord_cv(2 * j)))
                               : 0u;
  };
  auto u_prime = [&](int i) {
    E two[2];
    memcpy(two, &u_next[i / 2], 4);
    return float(two[i % 2]);
  };

  const Sequence& s = x.s;
  x.copy_w(s.bos, x.slot0);
  x.copy_g(s.bos, x.slot0, 0);
  cp_async_fence();
  x.copy_q_p(s.bos, x.slot0, 0);
  x.copy_k(s.bos, 0);
  cp_async_fence();
  x.copy_q_p(s.bos + kC, x.slot0 + 1, 1);
  x.copy_k(s.bos + kC, 1);
  cp_async_fence();
  load_u(s.bos, x.slot0);

  int stage = 0;  // chunk parity: the stage of K, Q, P and the copy of G
  for (i64 c0 = s.bos, slot = x.slot0; c0 < s.eos; c0 += kC, ++slot, stage ^= 1) {
    // 1. The operand copy of S0; this chunk's copies have landed (its K, Q and P were issued
    //    before its -W and G; the next chunk's K, Q and P may be in flight).
    store_pairs<E>(thr.partition_C(STile::view(sm.s)), [&](int i) { return acc_s(i); });
    cp_async_wait<1>();
    cutlass::arch::fence_view_async_shared();
    __syncthreads();

    // 2. U = U' + (-W) S0; keep U and e^(G_last - G_j) U_j as operands.
    auto acc_u = partition_fragment_C(mma, Shape<Int<kC>, Int<kBV>>{});
    warpgroup_fence_operand(acc_u);
    warpgroup_arrive();
    issue(mma, dW, dS, acc_u, false);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_u);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_u); ++i) acc_u(i) += u_prime(i);
    const float* g = sm.g[stage];
    const float g_last = g[kC - 1];
    store_pairs<E>(thr.partition_C(VTile::view(sm.u)), [&](int i) { return acc_u(i); });
    store_pairs<E>(thr.partition_C(VTile::view(sm.ud)),
                   [&](int i) { return expf(g_last - g[get<0>(coord_cv(i))]) * acc_u(i); });
    cutlass::arch::fence_view_async_shared();
    __syncthreads();  // U and U_d are complete; every warp is done with -W
    x.copy_w(c0 + kC, slot + 1);
    x.copy_g(c0 + kC, slot + 1, stage ^ 1);
    cp_async_fence();
    load_u(c0 + kC, slot + 1);  // lands during the products below

    // 3. O = scale e^G (Q S0) + P U and S = e^(G_last) S0 + K^T U_d: one group, one wait.
    auto acc_o = partition_fragment_C(mma, Shape<Int<kC>, Int<kBV>>{});
    auto acc_pu = partition_fragment_C(mma, Shape<Int<kC>, Int<kBV>>{});
    const float chunk_decay = expf(g_last);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= chunk_decay;
    warpgroup_fence_operand(acc_s);
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(acc_pu);
    warpgroup_arrive();
    issue(mma, dQ(stage), dS, acc_o, false);
    issue(mma, dP(stage), dU, acc_pu, false);
    issue(mma_kv, dK(stage), dUd, acc_s, true);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(acc_pu);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) = p.scale * expf(g[get<0>(coord_cv(i))]) * acc_o(i) + acc_pu(i);
    x.store_out(acc_o, coord_cv, c0);
    __syncthreads();  // every warp is done with this stage's K, Q, P, with U, U_d and S0's copy
    x.copy_q_p(c0 + 2 * kC, slot + 2, stage);
    x.copy_k(c0 + 2 * kC, stage);
    cp_async_fence();
  }
  cp_async_wait<0>();  // only empty groups remain
  x.store_state(acc_s, coord_s);
}

template <bool kWgmma>
constexpr int state_stages = kWgmma ? 2 : 1;

// kWgmma: the wgmma schedule (compiled for sm_90a only; an empty kernel elsewhere), else mma.sync.
template <class E, bool kWgmma>
__global__ void __launch_bounds__(kThreads, kWgmma ? 2 : kCtasPerSm)
    chunk_state_kernel(Params p, ChunkWorkspace ws, i64 vtiles, Staging st) {
  extern __shared__ __align__(1024) unsigned char state_smem_raw[];  // 1024: the 128-byte swizzle's period
  if constexpr (kWgmma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    state_chunks_wgmma<E>(p, ws, vtiles, st, state_smem_raw);
#endif
  } else {
    state_chunks_mma<E>(p, ws, vtiles, st, state_smem_raw);
  }
}

}  // namespace

ChunkLayout chunked_forward_layout(const Problem& p) {
  ChunkLayout l{};
  l.vtiles = (p.V + kBV - 1) / kBV;
  l.vp = l.vtiles * kBV;
  l.chunks_per_batch = (p.T + kC - 1) / kC;
  l.slots = p.varlen ? p.T / kC + p.N : p.N * l.chunks_per_batch;
  const i64 units = l.slots * p.Hv;
  auto aligned = [](i64 bytes) { return (bytes + 255) / 256 * 256; };
  l.g_bytes = aligned(units * kC * 4);
  l.p_bytes = aligned(units * kC * kC * 2);
  l.w_bytes = aligned(units * kC * kKt * 2);
  l.u_bytes = aligned(units * kC * l.vp * 2);
  return l;
}

bool chunked_forward_supported(const Problem& p, int max_smem) {
  const std::size_t smem = std::max(sizeof(PrepSmem<cute::half_t>), sizeof(StateSmem<cute::half_t>));
  return p.chunk_size == kC && p.K <= kKt && (p.dtype == DType::f16 || p.dtype == DType::bf16) &&
         std::size_t(max_smem) >= smem;
}

void chunked_forward(const Params& params, const Problem& problem, void* workspace, DType dtype, bool wgmma,
                     cudaStream_t stream) {
  const ChunkLayout l = chunked_forward_layout(problem);
  ChunkWorkspace ws;
  char* at = static_cast<char*>(workspace);
  ws.g = reinterpret_cast<float*>(at);
  ws.p = at += l.g_bytes;
  ws.w = at += l.p_bytes;
  ws.u = at + l.w_bytes;
  ws.vp = l.vp;
  ws.chunks_per_batch = l.chunks_per_batch;
  const i64 prep_blocks = l.slots * params.Hv, state_blocks = params.N * params.Hv * l.vtiles;
  const Staging st = staging_for(params, workspace);
  auto run = [&](auto tag) {
    using E = typename decltype(tag)::type;
    if (prep_blocks > 0) {
      const int smem = int(sizeof(PrepSmem<E>));
      RUDNN_CUDA_CHECK(cudaFuncSetAttribute(chunk_prep_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      chunk_prep_kernel<E><<<unsigned(prep_blocks), kThreads, smem, stream>>>(params, ws, l.vtiles, st);
      RUDNN_CUDA_CHECK_LAUNCH(chunk_prep_kernel);
    }
    if (state_blocks > 0) {
      const int smem = int(wgmma ? sizeof(StateSmem<E, state_stages<true>>) : sizeof(StateSmem<E, state_stages<false>>));
      auto launch_state = [&](auto kernel) {
        RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        // The CTAs per SM the schedules count on (3 x 73.5 KB or 2 x 113.5 KB) need the largest
        // shared-memory carveout; a hint the driver otherwise need not follow.
        RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                              int(cudaSharedmemCarveoutMaxShared)));
        kernel<<<unsigned(state_blocks), kThreads, smem, stream>>>(params, ws, l.vtiles, st);
        RUDNN_CUDA_CHECK_LAUNCH(chunk_state_kernel);
      };
      if (wgmma)
        launch_state(chunk_state_kernel<E, true>);
      else
        launch_state(chunk_state_kernel<E, false>);
    }
  };
  if (dtype == DType::bf16)
    run(core::Tag<cute::bfloat16_t>{});
  else
    run(core::Tag<cute::half_t>{});
}

}  // namespace rudnn::gated_delta::cuda
