// The warp-specialized flash backward for Hopper (sm90a, the "sm90ws" generation): its delta and
// dq kernels are the sm90 ones (flash_bwd_sm90.cuh); its dk/dv kernel runs the two roles of
// dkdv_sm90_split_kernel on 64 keys, fed by a producer warpgroup instead of their own cp.async
// copies, and without its block-wide barriers:
//   producer    warpgroup 0 (registers given back with setmaxnreg), its first warp only: one
//               thread issues TMA copies (tma.hpp: 64 x 64 boxes, one per 128-byte slab) of K and
//               V once, then of Q and dO of each visited (query head, query block) into a ring of
//               stages; the 32 lanes load that block's lse and delta into the stage. A stage's
//               "full" mbarrier completes with the copies' bytes and the lanes' arrivals; the
//               consumers hand it back on its "empty" mbarrier. In a packed variable-length batch
//               (one descriptor over all its rows) a tail stage's Q and dO rows past the sequence
//               are the next sequence's: the lanes clear them before arriving;
//   consumers   warpgroup 1 the P side, warpgroup 2 the dS side of DkdvRole (flash_bwd_sm90.cuh):
//               S^T, P^T and the dS weights w, dV += P^T dO; dP^T, dS^T = w (dP^T - delta),
//               dK += dS^T Q.
// The consumers meet only at the weights: two named barriers (written, read) guard the one
// buffer, so the P side runs ahead into the next block's S^T while the dS side finishes dK.
// TMA needs strides in 16-byte multiples, so zero-stride (broadcast) operands run the sm90
// backward (tma_backward_supports), as do head dims that are not 64-column multiples (96).
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "attention/flash_bwd_sm90.cuh"
#include "attention/tma.hpp"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim, int kHeadDimV = kHeadDim>
struct Sm90WsBwdConfig : Sm90BwdConfig<Element, kHeadDim, kHeadDimV> {
  using Base = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "TMA boxes of 64 columns (128-byte swizzle)");
  static_assert(kHeadDim >= kHeadDimV, "dV's accumulator is a view of dK's");
  static constexpr int kThreads = 3 * 128;
  // After setmaxnreg (3 x 128 threads share 64K registers): the consumers hold dK or dV (D / 2
  // floats per thread) besides the 64 x 64 product.
  static constexpr int kProducerRegisters = kHeadDim == 256 ? 24 : 40;
  static constexpr int kConsumerRegisters = kHeadDim == 256 ? 240 : 232;
  static constexpr int kBoxBytes = 64 * 64 * int(sizeof(Element));
  // K, V; then the stages (Q, dO); the weights (64 x 64 floats); lse and delta per stage; the
  // mbarriers (full K/V; full and empty per stage; a tail stage landed). Three stages where they
  // fit, else two.
  static constexpr int kFixedBytes = Base::kPairBytes + Base::BM * Base::BN * int(sizeof(float));
  static constexpr int kStageStatsBytes = 2 * Base::BM * int(sizeof(float));
  static constexpr int kStages =
      kFixedBytes + 3 * (Base::kPairBytes + kStageStatsBytes) + 64 <= 227 * 1024 ? 3 : 2;
  static constexpr int kStageOffset = Base::kPairBytes;  // stage s at kStageOffset + s * kPairBytes
  static constexpr int kWeightsOffset = kStageOffset + kStages * Base::kPairBytes;
  static constexpr int kStatsOffset = kWeightsOffset + Base::BM * Base::BN * int(sizeof(float));
  static constexpr int kBarrierOffset = kStatsOffset + kStages * kStageStatsBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 + 2 * kStages) * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on Hopper");
};

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>::kThreads, 1)
    dkdv_sm90ws_kernel(const __grid_constant__ BackwardProblem bp, const float* __restrict__ lse,
                       const float* __restrict__ delta, Element* __restrict__ dk, Element* __restrict__ dv,
                       const __grid_constant__ TmaBackwardLoads tma) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, kStages = Cfg::kStages;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * BN;
  if (n0 >= len_k) return;
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;

  // K at 0, V at kBytesD, the stages' Q and dO from kStageOffset (DkdvRole's layout).
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  auto stage_bytes = [](int stage) { return Cfg::kStageOffset + stage * Cfg::kPairBytes; };  // Q, then dO
  float* s_weights = reinterpret_cast<float*>(smem_raw + Cfg::kWeightsOffset);  // [element j][thread]
  float* s_stats = reinterpret_cast<float*>(smem_raw + Cfg::kStatsOffset);      // [stage][lse, delta][BM]
  std::uint64_t* full_kv = reinterpret_cast<std::uint64_t*>(smem_raw + Cfg::kBarrierOffset);
  std::uint64_t* full = full_kv + 1;
  std::uint64_t* empty = full + kStages;
  std::uint64_t* tail_landed = empty + kStages;  // a packed batch's tail Q/dO stage, before its clearing

  const QueryVisits visits = query_visits(p, hk, n0, len_q, len_k, BM, BN);
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
    if (tid == 0) {
      TxBarrier::arrive_and_expect_tx(full_kv, Cfg::kPairBytes);
      load_rows(&tma.k, full_kv, smem_raw, kHeadDim / 64, k0 + n0, hk);
      load_rows(&tma.v, full_kv, smem_raw + Cfg::kBytesD, kHeadDimV / 64, k0 + n0, hk);
    }
    std::uint32_t tails = 0;  // tail stages cleared so far (tail_landed's phases)
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

  // ---- consumers: the P side (warpgroup 1) and the dS side (warpgroup 2) of DkdvRole ----
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegisters>();
  // The weights buffer: written by the P side (then kWeightsWritten), read by the dS side (then
  // kWeightsRead, which the P side waits for before writing the next block's).
  enum : std::uint32_t { kWeightsWritten = 1, kWeightsRead = 2 };  // named barriers (0: __syncthreads)
  constexpr std::uint32_t kConsumerThreads = 2 * 128;
  DkdvRole<Element, kHeadDim, kHeadDimV, kPlain> role(warpgroup == 1, tid, smem_raw, s_weights);
  Barrier::wait(full_kv, 0);
  for (std::int64_t i = 0; i < steps; ++i) {
    const int stage = int(i % kStages);
    Barrier::wait(&full[stage], std::uint32_t((i / kStages) & 1));
    role.visit(
        p, b, visits.head(i), visits.block(i) * BM, n0, len_q, len_k, stage_bytes(stage), s_stats + stage * 2 * BM,
        [&] {
          if (i > 0) cutlass::arch::NamedBarrier::sync(kConsumerThreads, kWeightsRead);
        },
        [&] { cutlass::arch::NamedBarrier::arrive(kConsumerThreads, kWeightsWritten); },
        [&] { cutlass::arch::NamedBarrier::sync(kConsumerThreads, kWeightsWritten); },
        [&] {
          if (i + 1 < steps) cutlass::arch::NamedBarrier::arrive(kConsumerThreads, kWeightsRead);
        });
    Barrier::arrive(&empty[stage]);  // this warpgroup no longer reads the stage
  }
  role.store(bp, dk, dv, b, hk, k0, n0, len_k);
#else
  (void)bp, (void)lse, (void)delta, (void)dk, (void)dv;  // compiled for sm_90a only
#endif
}

}  // namespace rudnn::attention::flash

#include "core/cuda_check.hpp"

namespace rudnn::attention::flash {

// delta and dq (the sm90 kernels), then the warp-specialized dk/dv kernel.
template <class Element, int kHeadDim, int kHeadDimV>
void launch_backward_sm90ws(const BackwardProblem& bp, const void* dout, const void* q, const void* k,
                            const void* v, const void* out, const float* lse, void* dq, void* dk, void* dv,
                            float* delta, Stream stream) {
  using Cfg = Sm90WsBwdConfig<Element, kHeadDim, kHeadDimV>;
  const Problem& p = bp.fwd;
  launch_backward_kernels<Element>(
      bp, BackwardKernels<Element>{dq_sm90_kernel<Element, kHeadDim, kHeadDimV, true>,
                                   dq_sm90_kernel<Element, kHeadDim, kHeadDimV, false>, Cfg::kDqSmemBytes, 128,
                                   nullptr, nullptr, 0, 0},
      dout, q, k, v, out, lse, dq, dk, dv, delta, stream);
  if (p.sk == 0 || p.hkv == 0 || p.batch == 0) return;
  const TmaBackwardLoads tma =
      tma_backward_loads(bp, q, k, v, dout, [&](const TmaTensor4d& t) { return encode_tma(t, p.dtype); });
  auto kernel = p.plain_scores() ? dkdv_sm90ws_kernel<Element, kHeadDim, kHeadDimV, true>
                                 : dkdv_sm90ws_kernel<Element, kHeadDim, kHeadDimV, false>;
  RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  kernel<<<dim3(unsigned((p.sk + 63) / 64), unsigned(p.hkv), unsigned(p.batch)), Cfg::kThreads, Cfg::kSmemBytes,
           static_cast<cudaStream_t>(stream)>>>(bp, lse, delta, static_cast<Element*>(dk),
                                                static_cast<Element*>(dv), tma);
  RUDNN_CUDA_CHECK_LAUNCH("attention flash sm90ws dk/dv kernel");
}

}  // namespace rudnn::attention::flash
