// The warp-specialized flash backward for Hopper (sm90a, the "sm90ws" generation): its delta and
// dq kernels are the sm90 ones (flash_bwd_sm90.cuh); its dk/dv kernel runs the consumers of
// flash_bwd_sm90.cuh's schedules fed by a producer warpgroup instead of their own cp.async copies,
// without their block-wide barriers:
//   producer    warpgroup 0 (registers given back with setmaxnreg), its first warp only: one
//               thread issues TMA copies (tma.hpp: 64 x 64 boxes, one per 128-byte slab) of K and
//               V once, then of Q and dO of each visited (query head, query block) into a ring of
//               stages; the 32 lanes load that block's lse and delta into the stage. A stage's
//               "full" mbarrier completes with the copies' bytes and the lanes' arrivals; the
//               consumers hand it back on its "empty" mbarrier. In a packed variable-length batch
//               (one descriptor over all its rows) a tail stage's Q and dO rows past the sequence
//               are the next sequence's: the lanes clear them before arriving;
//   consumers   where dK and dV fit one warpgroup's registers together (D + Dv <= 256: D = 64,
//               128), 128 keys per CTA: warpgroup 1 + w runs every product of DkdvWarpgroup on
//               keys n0 + 64 w, both halves reading each Q and dO stage (half the stage loads
//               per key of a 64-key CTA, and the two warpgroups' products and elementwise work
//               interleave on the SM, meeting only where dQ by columns needs both dS^T tiles:
//               FlashAttention-3's split of keys between consumers); wider heads ((192, 128),
//               (256, 256)), 64 keys per CTA: warpgroup 1 the P side, warpgroup 2 the dS side of
//               DkdvRole (S^T, P^T and the dS weights w, dV += P^T dO; dP^T, dS^T = w (dP^T -
//               delta), dK += dS^T Q), which meet only at the weights: two named barriers
//               (written, read) guard the one buffer, so the P side runs ahead into the next
//               block's S^T while the dS side finishes dK.
// dQ, two ways (BackwardProblem::deterministic):
//   true    the sm90 dq kernel, a CTA per 64 queries, recomputes S and dP and forms dQ = dS K in
//           registers: 7 products in all, a fixed summation order;
//   false   (5 products) the warpgroup that forms dS^T (each key half; the dS side) also writes
//           it to shared memory (one of its two [key, query] tiles, by visit parity: a visit's
//           writes never meet the previous visit's reads), and after dK += dS^T Q issues
//           dQ_part = dS K (SS wgmma: dS through the tile's transposed view, K through its
//           K tile's, 64 columns of D at a time) and adds it to a float32
//           accumulator in global memory with red.global.add.v2.f32 (rows of the sequence only);
//           the accumulator is zeroed before the dk/dv kernel (zero_dq_accumulator_kernel) and
//           converted to dq's dtype after it (convert_dq_accumulator_kernel; the scale is in dS
//           already, as in the dq kernel). In a packed batch the K rows past a sequence are the
//           next sequence's: dS is 0 there, but 0 x NaN is not, so the producer clears them.
// TMA needs strides in 16-byte multiples, so zero-stride (broadcast) operands run the sm90
// backward (tma_backward_supports), as do head dims that are not 64-column multiples (96).
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "attention/flash_bwd_sm90.cuh"
#include "attention/kernels.hpp"  // dq_accumulator_offset
#include "attention/tma.hpp"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim, int kHeadDimV = kHeadDim>
struct Sm90WsBwdConfig : Sm90BwdConfig<Element, kHeadDim, kHeadDimV> {
  using Base = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "TMA boxes of 64 columns (128-byte swizzle)");
  static_assert(kHeadDim >= kHeadDimV, "dV's accumulator is a view of dK's");
  static constexpr int kThreads = 3 * 128;
  // The consumers' schedule: where dK and dV fit one warpgroup's registers together (D + Dv <=
  // 256), each consumer warpgroup runs every product on its own 64 keys (DkdvWarpgroup), 128 keys
  // per CTA sharing each Q and dO stage; wider heads split the roles over 64 keys (DkdvRole).
  static constexpr bool kKeyHalves = !Base::kSplitDkdv;
  static constexpr int kKeysPerCta = kKeyHalves ? 2 * Base::BN : Base::BN;
  // After setmaxnreg (3 x 128 threads share 64K registers): the consumers hold dK and dV (key
  // halves) or one of them (roles), D / 2 floats per thread each, besides the 64 x 64 products.
  static constexpr int kProducerRegisters = kKeyHalves || kHeadDim == 256 ? 24 : 40;
  static constexpr int kConsumerRegisters = kKeyHalves || kHeadDim == 256 ? 240 : 232;
  static constexpr int kBoxBytes = 64 * 64 * int(sizeof(Element));
  // dQ_part = dS K (deterministic = false): dS [BM queries, BN keys] from a [key, query] tile
  // (MN-major A), K^T [64, BN] from K's tile (MN-major B), in chunks of 64 columns of D: the
  // accumulator of a chunk (32 floats per thread) fits beside dK and dV.
  static constexpr int kDsBytes = Base::BN * Base::BM * int(sizeof(Element));
  // In the key halves at D = 128 the two warpgroups split dQ's columns instead of its keys:
  // warpgroup 1 + w forms columns [64 w, 64 w + 64) over all 128 keys (both dS^T tiles, both K
  // tiles; one wgmma group), so that each dQ element gets one reduction per CTA, not two (half the
  // atomic traffic). The price: both warpgroups meet once a visit (each reads the other's dS^T).
  // (At D = 64 a split would need 64 x 32 tiles; each half keeps its own keys, all 64 columns.)
  static constexpr bool kDqByColumns = kKeyHalves && kHeadDim == 128;
  static constexpr int kDqChunk = 64;
  using TiledMmaDq = decltype(make_tiled_mma(
      ByElement<Element, SM90::GMMA::MMA_64x64x16_F32F16F16_SS<GMMA::Major::MN, GMMA::Major::MN>,
                SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<GMMA::Major::MN, GMMA::Major::MN>>{}));
  // K and V (per key half: half w's pair at w * kPairBytes); then the stages (Q, dO); two dS^T
  // tiles per warpgroup that writes them (by visit parity); the roles' weights (64 x 64 floats);
  // lse and delta per stage; the mbarriers (full K/V; full and empty per stage; a tail tile
  // landed). Three stages where they fit, else two.
  static constexpr int kKvBytes = (kKeyHalves ? 2 : 1) * Base::kPairBytes;
  static constexpr int kDsTiles = kKeyHalves ? 4 : 2;
  static constexpr int kWeightsBytes = kKeyHalves ? 0 : Base::BM * Base::BN * int(sizeof(float));
  static constexpr int kFixedBytes = kKvBytes + kDsTiles * kDsBytes + kWeightsBytes;
  static constexpr int kStageStatsBytes = 2 * Base::BM * int(sizeof(float));
  static constexpr int kStages =
      kFixedBytes + 3 * (Base::kPairBytes + kStageStatsBytes) + 64 <= 227 * 1024 ? 3 : 2;
  static constexpr int kStageOffset = kKvBytes;  // stage s at kStageOffset + s * kPairBytes
  static constexpr int kDsOffset = kStageOffset + kStages * Base::kPairBytes;  // tile t at + t * kDsBytes
  static_assert(kDsOffset % 1024 == 0 && kDsBytes % 1024 == 0, "dS tiles on the swizzle's 1024-byte period");
  static constexpr int kWeightsOffset = kDsOffset + kDsTiles * kDsBytes;
  static constexpr int kStatsOffset = kWeightsOffset + kWeightsBytes;
  static constexpr int kBarrierOffset = kStatsOffset + kStages * kStageStatsBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 + 2 * kStages) * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on Hopper");
};

// Where `add`: adds (a, b) to the two floats at `address` (8-byte aligned, global memory) as one
// vector reduction, red.global.add.v2.f32 (sm_90, PTX ISA 8.1); no value comes back, nothing
// waits. The condition is the instruction's predicate (under a C++ branch, each reduction was a
// branch of its own), and there is no "memory" clobber: nothing in the kernel reads what it adds
// to, and with one the compiler reloaded the problem's fields after every reduction.
__device__ __forceinline__ void red_add_f32x2(bool add, float* address, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %3, 0; @p red.global.add.v2.f32 [%0], {%1, %2}; }" ::"l"(address),
               "f"(a), "f"(b), "r"(int(add)));
#else
  (void)add, (void)address, (void)a, (void)b;
#endif
}

// Where dQ_part = dS K of one visit reads its operands (deterministic = false): dS from kParts
// [key, query] tiles of 64 keys each (part j at ds_bytes + j * ds_stride), K from those keys' K
// tiles (part j at k_bytes + j * k_stride); and the columns of D it forms, [col0, col0 + kCols).
struct DqOperands {
  int ds_bytes, ds_stride, k_bytes, k_stride, col0;
};

// dQ_part = dS K of one visit (deterministic = false), the parts' products summed in the wgmma
// accumulator; each chunk of kDqChunk columns waited for, then added to the float32 accumulator's
// rows m0 + r (below len_q) of query head (b, h). The wgmma accumulator's element v0 + 2 v1 + 4 j
// of thread (warp w, lane l) is row 16 w + l / 4 + 8 v1, column 8 j + 2 (l % 4) + v0 (PTX ISA, the
// m64nNk16 D fragment): a thread adds to two rows, two adjacent columns per reduction, each at a
// constant offset from one of two row pointers.
template <class Element, int kHeadDim, int kHeadDimV, int kParts, int kCols>
__device__ __forceinline__ void accumulate_dq(const Problem& p, unsigned char* smem, DqOperands at, int tid,
                                              float* dq_accum, std::int64_t b, std::int64_t h, std::int64_t q0,
                                              std::int64_t m0, std::int64_t len_q) {
  using Cfg = Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>;
  constexpr int BM = Cfg::BM, kChunk = Cfg::kDqChunk;
  static_assert(kCols % kChunk == 0, "whole chunks");
  typename Cfg::TiledMmaDq mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto ds_of = [&](int part) {
    return thr_dq.make_fragment_A(thr_dq.partition_A(
        smem_tile<Element>(smem, at.ds_bytes + part * at.ds_stride, typename Cfg::template RowsT<BM>{})));
  };
  auto kt_of = [&](int part, int col) {  // K^T [kChunk, 64 keys] from column col: whole 64-column slabs
    return thr_dq.make_fragment_B(thr_dq.partition_B(smem_tile<Element>(
        smem, at.k_bytes + part * at.k_stride + (col / 64) * Cfg::kBoxBytes, typename Cfg::template RowsT<kChunk>{})));
  };
  // the thread's rows r and r + 8 of (b, h) from m0 (delta_index is consecutive in the row)
  const int r = 16 * (tid / 32) + (tid % 32) / 4;
  float* const row_r = dq_accum + (cuda::delta_index(p, b, h, q0) + m0 + r) * kHeadDim + at.col0 + 2 * (tid % 4);
  float* const row_r8 = row_r + 8 * kHeadDim;
  const bool in_r = m0 + r < len_q, in_r8 = m0 + r + 8 < len_q;
  static_assert(kParts == 1 || kParts == 2, "one or both key halves");
  CUTE_UNROLL
  for (int c = 0; c < kCols / kChunk; ++c) {
    cute::Tensor acc = partition_fragment_C(mma_dq, Shape<Int<BM>, Int<kChunk>>{});
    static_assert(decltype(size(acc))::value == kChunk / 2, "the m64nNk16 fragment: N / 2 floats per thread");
    if constexpr (kParts == 1) {
      wgmma_one<true>(mma_dq, ds_of(0), kt_of(0, at.col0 + c * kChunk), acc);
    } else {  // acc = dS_0 K_0 + dS_1 K_1, one group; the operands' descriptors made before it opens
      cute::Tensor ds0 = ds_of(0), kt0 = kt_of(0, at.col0 + c * kChunk);
      cute::Tensor ds1 = ds_of(1), kt1 = kt_of(1, at.col0 + c * kChunk);
      wgmma_pair<true, false>(mma_dq, ds0, kt0, acc, mma_dq, ds1, kt1, acc);
    }
    CUTE_UNROLL
    for (int j = 0; j < kChunk / 8; ++j) {
      red_add_f32x2(in_r, row_r + c * kChunk + 8 * j, acc(4 * j), acc(4 * j + 1));
      red_add_f32x2(in_r8, row_r8 + c * kChunk + 8 * j, acc(4 * j + 2), acc(4 * j + 3));
    }
  }
}

// dS^T of a visit (Element registers, the accumulator's layout; coords: each element's (key, query))
// to the [key, query] tile at ds_bytes, laid out as Rows<BM> by hand: row r at 128 r bytes (8-row
// atoms of 128-byte rows, 1024 apart), its 16-byte chunks XORed with r % 8; the tile is
// 1024-aligned, so this is the address swizzle wgmma undoes. (Through CuTe's swizzled pointer the
// stores lose the shared state space: 16-bit generic stores.) Columns j, j + 1 (j even) share a
// 4-byte word. The caller orders the stores before the wgmma that reads the tile.
template <class DsT, class Coords>
__device__ __forceinline__ void store_ds_tile(unsigned char* smem, int ds_bytes, DsT const& ds_t,
                                              Coords const& coords) {
  CUTE_UNROLL
  for (int j = 0; j < size(ds_t); j += 2) {
    std::uint32_t offset = std::uint32_t(get<0>(coords(j))) * 128 + std::uint32_t(get<1>(coords(j))) * 2;
    offset ^= ((offset >> 7) & 7u) << 4;
    *reinterpret_cast<std::uint32_t*>(smem + ds_bytes + offset) =
        std::uint32_t(ds_t(j).raw()) | std::uint32_t(ds_t(j + 1).raw()) << 16;
  }
}

// Three instantiations per head dim, as the warp-specialized forward's: kPlain
// (Problem::plain_scores), kSoftcap (Problem::softcap_scores: the transform inline, no call per
// score) and neither (masks and bias: cuda::general_logit per score).
template <class Element, int kHeadDim, int kHeadDimV, bool kPlain, bool kSoftcap = false>
__global__ void __launch_bounds__(Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>::kThreads, 1)
    dkdv_sm90ws_kernel(const __grid_constant__ BackwardProblem bp, const float* __restrict__ lse,
                       const float* __restrict__ delta, Element* __restrict__ dk, Element* __restrict__ dv,
                       float* __restrict__ dq_accum, const __grid_constant__ TmaBackwardLoads tma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(!(kPlain && kSoftcap), "plain scores have no softcap");
  using Cfg = Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, kStages = Cfg::kStages, kHalves = Cfg::kKvBytes / Cfg::kPairBytes;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * Cfg::kKeysPerCta;
  if (n0 >= len_k) return;
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;

  // K and V of the key halves from 0 (half w: K at w * kPairBytes, V kBytesD after it), the
  // stages' Q and dO from kStageOffset.
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  auto stage_bytes = [](int stage) { return Cfg::kStageOffset + stage * Cfg::kPairBytes; };  // Q, then dO
  float* s_weights = reinterpret_cast<float*>(smem_raw + Cfg::kWeightsOffset);  // [element j][thread]
  float* s_stats = reinterpret_cast<float*>(smem_raw + Cfg::kStatsOffset);      // [stage][lse, delta][BM]
  std::uint64_t* full_kv = reinterpret_cast<std::uint64_t*>(smem_raw + Cfg::kBarrierOffset);
  std::uint64_t* full = full_kv + 1;
  std::uint64_t* empty = full + kStages;
  std::uint64_t* tail_landed = empty + kStages;  // a packed batch's tail K/V or Q/dO tiles, before their clearing

  const QueryVisits visits = query_visits(p, hk, n0, len_q, len_k, BM, Cfg::kKeysPerCta);
  const std::int64_t steps = visits.steps;

  if (threadIdx.x == 0) {
    Barrier::init(full_kv, 1);  // the producer's arming arrival, then the bytes of the copies
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&full[s], 1 + 32);  // the arming arrival and the lanes that wrote lse, delta
      Barrier::init(&empty[s], 2 * 128);  // every consumer thread is done with the stage
    }
    Barrier::init(tail_landed, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer: the first warp; lane 0 issues every copy ----
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegisters>();
    if (tid >= 32) return;
    using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
    constexpr std::uint64_t kCacheHint = std::uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
    // The 64-column slabs of a [64, W] tile: kBoxBytes apart (the layout tool checks Rows<W>).
    // Rows of a packed batch count from its sequence's first (tma_operand).
    const int batch = tma_batch(p, b);
    auto load_rows = [&](const CUtensorMap* map, std::uint64_t* bar, unsigned char* dst, int slabs,
                         std::int64_t row, std::int64_t head) {
      for (int slab = 0; slab < slabs; ++slab)
        SM90_TMA_LOAD_4D::copy(map, bar, kCacheHint, dst + slab * Cfg::kBoxBytes, slab * 64, int(row), int(head),
                               batch);
    };
    auto load_stage = [&](std::uint64_t* bar, unsigned char* stage_smem, std::int64_t m0, std::int64_t h) {
      TxBarrier::arrive_and_expect_tx(bar, Cfg::kPairBytes);
      load_rows(&tma.q, bar, stage_smem, kHeadDim / 64, q0 + m0, h);
      load_rows(&tma.dout, bar, stage_smem + Cfg::kBytesD, kHeadDimV / 64, q0 + m0, h);
    };
    // The key halves that hold keys of the sequence (a half wholly past it is not loaded: its
    // products only make rows of dK and dV that are not stored, and no TMA box of this kernel lies
    // wholly outside its tensor).
    const int halves_in = len_k - n0 > BN ? kHalves : 1;
    auto load_kv = [&](std::uint64_t* bar) {
      TxBarrier::arrive_and_expect_tx(bar, halves_in * Cfg::kPairBytes);
      for (int half = 0; half < halves_in; ++half) {
        unsigned char* pair = smem_raw + half * Cfg::kPairBytes;
        load_rows(&tma.k, bar, pair, kHeadDim / 64, k0 + n0 + half * BN, hk);
        load_rows(&tma.v, bar, pair + Cfg::kBytesD, kHeadDimV / 64, k0 + n0 + half * BN, hk);
      }
    };
    std::uint32_t tails = 0;  // tail tiles cleared so far (tail_landed's phases)
    if (dq_accum != nullptr && ((p.varlen && n0 + Cfg::kKeysPerCta > len_k) || halves_in < kHalves)) {
      // dQ_part = dS K multiplies K's rows past the sequence (the next sequence's, or a half not
      // loaded) by dS = 0: cleared once landed, before the consumers are told (as a tail Q/dO
      // stage below).
      if (tid == 0) load_kv(tail_landed);
      Barrier::wait(tail_landed, tails++ & 1u);
      for (int half = 0; half < kHalves; ++half)
        clear_tile_rows(smem_raw + half * Cfg::kPairBytes, Cfg::kBoxBytes, kHeadDim / 64, BN,
                        int(len_k - n0) - half * BN, tid, 32);
      cutlass::arch::fence_view_async_shared();  // the stores, before wgmma's (async-proxy) reads
      __syncwarp();
      if (tid == 0) Barrier::arrive(full_kv);  // the arming arrival, no bytes
    } else if (tid == 0) {
      load_kv(full_kv);
    }
    for (std::int64_t i = 0; i < steps; ++i) {
      const int stage = int(i % kStages);
      Barrier::wait(&empty[stage], std::uint32_t((i / kStages) & 1) ^ 1u);  // the first round passes
      const std::int64_t h = visits.head(i), m0 = visits.block(i) * BM;
      unsigned char* stage_smem = smem_raw + stage_bytes(stage);
      // K and V rows past the sequence only make rows of dK and dV that are not stored. Q and dO
      // rows past it have P = dS = 0 but are multiplied (dV += P^T dO, dK += dS^T Q): in a packed
      // batch they are the next sequence's, cleared once landed, before the consumers are told.
      if (p.varlen && m0 + BM > len_q) {
        if (tid == 0) load_stage(tail_landed, stage_smem, m0, h);
        Barrier::wait(tail_landed, tails++ & 1u);
        const int first_row = int(len_q - m0);
        clear_tile_rows(stage_smem, Cfg::kBoxBytes, kHeadDim / 64, BM, first_row, tid, 32);
        clear_tile_rows(stage_smem + Cfg::kBytesD, Cfg::kBoxBytes, kHeadDimV / 64, BM, first_row, tid, 32);
        cutlass::arch::fence_view_async_shared();  // the stores, before wgmma's (async-proxy) reads
        // Every lane past this phase's wait before lane 0 can start the next: a lane left two
        // phases behind would wait for a parity that has come round again.
        __syncwarp();
        if (tid == 0) Barrier::arrive(&full[stage]);  // the arming arrival, no bytes
      } else if (tid == 0) {
        load_stage(&full[stage], stage_smem, m0, h);
      }
      for (int t = tid; t < 2 * BM; t += 32)
        load_query_stats(p, lse, delta, s_stats + stage * 2 * BM, b, h, q0, m0, len_q, t);
      Barrier::arrive(&full[stage]);  // each lane, after its stores
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegisters>();
  // Named barriers (0 is __syncthreads'). The roles' weights buffer: written by the P side (then
  // kWeightsWritten), read by the dS side (then kWeightsRead, which the P side waits for before
  // writing the next block's). kDsWritten + w: warpgroup 1 + w's threads have all written this
  // visit's dS^T tile; kDsWritten alone, with dQ by columns: both warpgroups' threads have.
  enum : std::uint32_t { kWeightsWritten = 1, kWeightsRead = 2, kDsWritten = 3 };
  constexpr std::uint32_t kConsumerThreads = 2 * 128;
  auto write_ds = [&](int ds_bytes, auto const& ds_t, auto const& coords) {
    store_ds_tile(smem_raw, ds_bytes, ds_t, coords);
    cutlass::arch::fence_view_async_shared();  // the stores, before wgmma's (async-proxy) reads
    if constexpr (Cfg::kDqByColumns)  // each warpgroup reads both tiles
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, kDsWritten);
    else
      cutlass::arch::NamedBarrier::sync(128, kDsWritten + warpgroup - 1);
  };
  Barrier::wait(full_kv, 0);
  if constexpr (Cfg::kKeyHalves) {
    // ---- consumers: warpgroup 1 + w every product on keys n0 + 64 w (DkdvWarpgroup) ----
    const int half = warpgroup - 1;
    const int kv_bytes = half * Cfg::kPairBytes;
    const std::int64_t n0_half = n0 + half * BN;
    DkdvWarpgroup<Element, kHeadDim, kHeadDimV, kPlain, kSoftcap> keys(tid, smem_raw, kv_bytes);
    for (std::int64_t i = 0; i < steps; ++i) {
      const int stage = int(i % kStages);
      const std::int64_t h = visits.head(i), m0 = visits.block(i) * BM;
      const int ds_bytes = Cfg::kDsOffset + (2 * half + int(i & 1)) * Cfg::kDsBytes;  // this visit's dS^T tile
      Barrier::wait(&full[stage], std::uint32_t((i / kStages) & 1));
      keys.visit(p, b, h, m0, n0_half, len_q, len_k, stage_bytes(stage), s_stats + stage * 2 * BM,
                 [&](auto const& ds_t, auto const& coords) {
                   if (dq_accum != nullptr) write_ds(ds_bytes, ds_t, coords);
                 });
      Barrier::arrive(&empty[stage]);  // this warpgroup no longer reads the stage
      if (dq_accum == nullptr) continue;
      if constexpr (Cfg::kDqByColumns)  // both halves' dS^T and K: part j at (2 j + i % 2) and j kPairBytes
        accumulate_dq<Element, kHeadDim, kHeadDimV, 2, kHeadDim / 2>(
            p, smem_raw, DqOperands{Cfg::kDsOffset + int(i & 1) * Cfg::kDsBytes, 2 * Cfg::kDsBytes, 0, Cfg::kPairBytes,
                                    half * (kHeadDim / 2)},
            tid, dq_accum, b, h, q0, m0, len_q);
      else
        accumulate_dq<Element, kHeadDim, kHeadDimV, 1, kHeadDim>(p, smem_raw, DqOperands{ds_bytes, 0, kv_bytes, 0, 0},
                                                                 tid, dq_accum, b, h, q0, m0, len_q);
    }
    keys.store(bp, dk, dv, b, hk, k0, n0_half, len_k);
  } else {
    // ---- consumers: the P side (warpgroup 1) and the dS side (warpgroup 2) of DkdvRole ----
    DkdvRole<Element, kHeadDim, kHeadDimV, kPlain, kSoftcap> role(warpgroup == 1, tid, smem_raw, s_weights);
    for (std::int64_t i = 0; i < steps; ++i) {
      const int stage = int(i % kStages);
      const std::int64_t h = visits.head(i), m0 = visits.block(i) * BM;
      const int ds_bytes = Cfg::kDsOffset + int(i & 1) * Cfg::kDsBytes;  // this visit's dS^T tile
      Barrier::wait(&full[stage], std::uint32_t((i / kStages) & 1));
      role.visit(
          p, b, h, m0, n0, len_q, len_k, stage_bytes(stage), s_stats + stage * 2 * BM,
          [&] {
            if (i > 0) cutlass::arch::NamedBarrier::sync(kConsumerThreads, kWeightsRead);
          },
          [&] { cutlass::arch::NamedBarrier::arrive(kConsumerThreads, kWeightsWritten); },
          [&] { cutlass::arch::NamedBarrier::sync(kConsumerThreads, kWeightsWritten); },
          [&] {
            if (i + 1 < steps) cutlass::arch::NamedBarrier::arrive(kConsumerThreads, kWeightsRead);
          },
          [&](auto const& ds_t, auto const& coords) {  // the dS side: dS^T to its tile, [key, query]
            if (dq_accum != nullptr) write_ds(ds_bytes, ds_t, coords);
          });
      Barrier::arrive(&empty[stage]);  // this warpgroup no longer reads the stage
      if (dq_accum != nullptr && warpgroup == 2)
        accumulate_dq<Element, kHeadDim, kHeadDimV, 1, kHeadDim>(p, smem_raw, DqOperands{ds_bytes, 0, 0, 0, 0}, tid,
                                                                 dq_accum, b, h, q0, m0, len_q);
    }
    role.store(bp, dk, dv, b, hk, k0, n0, len_k);
  }
#else
  (void)bp, (void)lse, (void)delta, (void)dk, (void)dv, (void)dq_accum;  // compiled for sm_90a only
#endif
}

// The float32 dQ accumulator (deterministic = false): row r of query head (b, h) at
// delta_index(p, b, h, r) * kHeadDim, so the rows of one head's sequence are contiguous. A CTA of
// 128 threads per 64 of those rows (grid: query blocks, heads, sequences): zeroed before the dk/dv
// kernel, converted to dq's dtype after it. Rows outside every sequence are neither.
struct DqAccumulatorBlock {
  std::int64_t b, h, row;  // sequence, query head, first row (packed row index, q0 + m0)
  std::int64_t offset;     // of that row's first float in the accumulator
  int rows;                // rows of the sequence in this block (<= 64)
};

// The block of accumulator rows this CTA of the zero/convert kernels owns; false when the
// sequence has no rows there (shorter sequences of a padded grid).
template <int kHeadDim>
__device__ inline bool dq_accumulator_block(const Problem& p, DqAccumulatorBlock& blk) {
  blk.h = blockIdx.y, blk.b = blockIdx.z;
  const std::int64_t m0 = std::int64_t(blockIdx.x) * 64;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(blk.b, q0, len_q, k0, len_k);
  if (m0 >= len_q) return false;
  blk.rows = len_q - m0 < 64 ? int(len_q - m0) : 64;
  blk.row = q0 + m0;
  blk.offset = cuda::delta_index(p, blk.b, blk.h, blk.row) * kHeadDim;
  return true;
}

template <int kHeadDim>
__global__ void __launch_bounds__(128)
    zero_dq_accumulator_kernel(const __grid_constant__ BackwardProblem bp, float* __restrict__ dq_accum) {
  DqAccumulatorBlock blk;
  if (!dq_accumulator_block<kHeadDim>(bp.fwd, blk)) return;
  float* base = dq_accum + blk.offset;
  for (int i = threadIdx.x; i < blk.rows * kHeadDim; i += 128) base[i] = 0.0f;
}

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(128)
    convert_dq_accumulator_kernel(const __grid_constant__ BackwardProblem bp, const float* __restrict__ dq_accum,
                                  Element* __restrict__ dq) {
  DqAccumulatorBlock blk;
  if (!dq_accumulator_block<kHeadDim>(bp.fwd, blk)) return;
  const float* base = dq_accum + blk.offset;
  Element* out = dq + bp.dq.at(blk.b, blk.h, blk.row);
  for (int i = threadIdx.x; i < blk.rows * kHeadDim; i += 128)
    out[std::int64_t(i / kHeadDim) * bp.dq.s + i % kHeadDim] = static_cast<Element>(base[i]);
}

}  // namespace rudnn::attention::flash

#include "core/cuda_check.hpp"

namespace rudnn::attention::flash {

// delta; deterministic: the sm90 dq kernel, then the warp-specialized dk/dv kernel; else the
// accumulator zeroed, the dk/dv kernel accumulating dQ, the accumulator converted to dq. The
// workspace holds delta, then (deterministic = false) the accumulator at dq_accumulator_offset
// (kernels.hpp, which sizes it).
template <class Element, int kHeadDim, int kHeadDimV>
void launch_backward_sm90ws(const BackwardProblem& bp, const void* dout, const void* q, const void* k,
                            const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv,
                            float* delta, Stream stream) {
  using Cfg = Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>;
  using Dq = typename BackwardKernels<Element>::Dq;
  const Problem& p = bp.fwd;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  float* dq_accum = bp.deterministic ? nullptr
                                     : reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(delta) +
                                                                dq_accumulator_offset(p));
  const bool has_queries = p.sq > 0 && p.hq > 0 && p.batch > 0;
  const dim3 query_grid(unsigned((p.sq + 63) / 64), unsigned(p.hq), unsigned(p.batch));
  if (dq_accum != nullptr && has_queries) {
    zero_dq_accumulator_kernel<kHeadDim><<<query_grid, 128, 0, s>>>(bp, dq_accum);
    RUDNN_CUDA_CHECK_LAUNCH("attention flash sm90ws dQ accumulator zeroing");
  }
  launch_backward_kernels<Element>(
      bp, BackwardKernels<Element>{dq_accum ? Dq(nullptr) : dq_sm90_kernel<Element, kHeadDim, kHeadDimV, true>,
                                   dq_accum ? Dq(nullptr) : dq_sm90_kernel<Element, kHeadDim, kHeadDimV, false>,
                                   Cfg::kDqSmemBytes, 128, nullptr, nullptr, 0, 0},
      dout, q, k, v, out, lse, dq, dk, dv, delta, stream);
  if (p.sk > 0 && p.hkv > 0 && p.batch > 0) {
    const TmaBackwardLoads tma =
        tma_backward_loads(bp, q, k, v, dout, [&](const TmaTensor4d& t) { return encode_tma(t, p.dtype); });
    auto kernel = p.plain_scores()     ? dkdv_sm90ws_kernel<Element, kHeadDim, kHeadDimV, true>
                  : p.softcap_scores() ? dkdv_sm90ws_kernel<Element, kHeadDim, kHeadDimV, false, true>
                                       : dkdv_sm90ws_kernel<Element, kHeadDim, kHeadDimV, false>;
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    kernel<<<dim3(unsigned((p.sk + Cfg::kKeysPerCta - 1) / Cfg::kKeysPerCta), unsigned(p.hkv), unsigned(p.batch)),
             Cfg::kThreads, Cfg::kSmemBytes,
             s>>>(bp, lse, delta, static_cast<Element*>(dk), static_cast<Element*>(dv), dq_accum, tma);
    RUDNN_CUDA_CHECK_LAUNCH("attention flash sm90ws dk/dv kernel");
  }
  if (dq_accum != nullptr && has_queries) {
    convert_dq_accumulator_kernel<Element, kHeadDim><<<query_grid, 128, 0, s>>>(bp, dq_accum,
                                                                                static_cast<Element*>(dq));
    RUDNN_CUDA_CHECK_LAUNCH("attention flash sm90ws dQ accumulator conversion");
  }
}

}  // namespace rudnn::attention::flash
