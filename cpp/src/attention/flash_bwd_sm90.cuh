// The "flash" backward for Hopper (sm90a), head dims D = Dv in {64, 128}: the two kernels of the
// sm80 backward (flash_bwd_sm80.cuh, which also provides the delta kernel) with every product a
// warpgroup MMA (wgmma). One warpgroup (128 threads) per CTA; 64 x 64 tiles.
//   dq     64 query rows per CTA; for each visible 64-key block
//            S  = Q K^T       wgmma SS
//            dP = dO V^T      wgmma SS
//            dS from S, dP, lse and delta in registers (the sm80 code, on the mma.sync-order view)
//            dQ += dS K       wgmma RS: dS from those registers, K through its transposed view
//   dkdv   64 keys per CTA; for each query head of the group and each query block that sees
//          them, the transposed products, so that P^T and dS^T come out in registers as the A
//          operands of the two updates (no shared-memory round trip, unlike the sm80 kernel):
//            S^T  = K Q^T     wgmma SS
//            dP^T = V dO^T    wgmma SS
//            P^T, dS^T        elementwise, keys by row
//            dV += P^T dO     wgmma RS, dO through its transposed view
//            dK += dS^T Q     wgmma RS, Q through its transposed view
// Q, dO, K and V tiles are stored once each, [64, D] K-major with the 128-byte GMMA swizzle; the
// MN-major B operands are the same bytes seen as [D, 64]. Loads are cp.async into two stages: the
// next block's tiles stream in during this block's products. Deterministic: no atomics.
#pragma once

#include "attention/flash_bwd_sm80.cuh"
#include "attention/flash_sm90.cuh"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim>
struct Sm90BwdConfig : Sm90Config<Element, kHeadDim> {
  using Base = Sm90Config<Element, kHeadDim>;
  static constexpr int BM = Base::kBlockM, BN = Base::kBlockN;
  static_assert(BM == BN, "every tile is [64, D]");
  // A [64, D] tile of Q, dO, K or V, and the same bytes as [D, 64] (MN-major for wgmma).
  using SmemLayoutRows = typename Base::SmemLayoutQ;
  using SmemLayoutRowsT =
      decltype(composition(SmemLayoutRows{}, make_layout(Shape<Int<kHeadDim>, Int<BM>>{}, GenRowMajor{})));
  static constexpr int kTileElements = BM * kHeadDim;
  // Six tiles: the two a CTA keeps (Q, dO in dq; K, V in dk/dv) and two stages of the two it
  // streams; then, in dk/dv, lse and delta of each stage's 64 queries.
  static constexpr int kStatsOffset = 6 * kTileElements * int(sizeof(Element));
  static constexpr int kBwdSmemBytes = kStatsOffset + 2 * 2 * BM * int(sizeof(float));
};

// Two products as one wgmma group, waited for: acc1 = A1 B1 and acc2 = A2 B2 (kOverwrite), or
// acc1 += A1 B1 and acc2 += A2 B2.
template <bool kOverwrite, class Mma, class A1, class B1, class Acc1, class A2, class B2, class Acc2>
__device__ __forceinline__ void wgmma_pair(Mma& mma, A1 const& a1, B1 const& b1, Acc1& acc1, A2 const& a2,
                                           B2 const& b2, Acc2& acc2) {
  warpgroup_fence_operand(acc1);
  warpgroup_fence_operand(acc2);
  warpgroup_arrive();
  if constexpr (kOverwrite) {
    wgmma_overwrite(mma, a1, b1, acc1);
    wgmma_overwrite(mma, a2, b2, acc2);
  } else {
    wgmma_accumulate(mma, a1, b1, acc1);
    wgmma_accumulate(mma, a2, b2, acc2);
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc1);
  warpgroup_fence_operand(acc2);
}

template <class Element, int kHeadDim, bool kPlain>
__global__ void __launch_bounds__(128)
    dq_sm90_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout,
                   const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                   const float* __restrict__ lse, const float* __restrict__ delta, Element* __restrict__ dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90BwdConfig<Element, kHeadDim>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const Problem& p = bp.fwd;
  const int m_block = blockIdx.x;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t m0 = std::int64_t(m_block) * BM;
  if (m0 >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x;
  using Tile = Shape<Int<BM>, Int<kHeadDim>>;

  cute::Tensor gQ = local_tile(head_rows<kHeadDim>(q, p.q, b, h, q0, len_q), Tile{}, make_coord(m_block, 0));
  cute::Tensor gdO = local_tile(head_rows<kHeadDim>(dout, bp.dout, b, h, q0, len_q), Tile{}, make_coord(m_block, 0));
  cute::Tensor gK = local_tile(head_rows<kHeadDim>(k, p.k, b, hk, k0, len_k), Tile{}, make_coord(_, 0));
  cute::Tensor gV = local_tile(head_rows<kHeadDim>(v, p.v, b, hk, k0, len_k), Tile{}, make_coord(_, 0));

  // Q, dO, then K and V of two stages: the next key block streams in during this one's products.
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  auto tile = [&](int i, auto layout) { return make_tensor(make_smem_ptr(smem + i * Cfg::kTileElements), layout); };
  using Rows = typename Cfg::SmemLayoutRows;
  cute::Tensor sQ = tile(0, Rows{});
  cute::Tensor sdO = tile(1, Rows{});
  auto sK = [&](int stage) { return tile(2 + 2 * stage, Rows{}); };
  auto sV = [&](int stage) { return tile(3 + 2 * stage, Rows{}); };
  auto sKt = [&](int stage) { return tile(2 + 2 * stage, typename Cfg::SmemLayoutRowsT{}); };

  typename Cfg::GmemCopy gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tid);
  cute::Tensor tKg = gthr.partition_S(gK);
  cute::Tensor tVg = gthr.partition_S(gV);
  cute::Tensor tRowsC = gthr.partition_S(make_identity_tensor(Tile{}));
  auto load_kv = [&](std::int64_t n, int stage) {
    cute::Tensor tKs = gthr.partition_D(sK(stage));
    cute::Tensor tVs = gthr.partition_D(sV(stage));
    copy_rows(gmem_copy, tKg(_, _, _, n), tKs, tRowsC, len_k - n * BN);
    copy_rows(gmem_copy, tVg(_, _, _, n), tVs, tRowsC, len_k - n * BN);
  };

  // S = Q K^T and dP = dO V^T: shared-memory descriptors for both operands.
  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));
  cute::Tensor tPrdO = thr_s.make_fragment_A(thr_s.partition_A(sdO));
  // dQ += dS K: dS from registers, K^T [D, BN] by descriptors.
  typename Cfg::TiledMmaO mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  cute::Tensor acc_dq90 = partition_fragment_C(mma_dq, Tile{});
  clear(acc_dq90);

  // The accumulators in mma.sync order (flash_sm90.cuh) with each element's (row, col).
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  using AccLayoutS = decltype(partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{}).layout());
  using AccLayoutQ = decltype(partition_fragment_C(mma, Tile{}).layout());
  cute::Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
  cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  float lse_r[kRows], delta_r[kRows];
  load_lse_delta(p, lse, delta, b, h, q0, m0, len_q, [&](int r) { return get<0>(tScS_rc(r, 0)); }, lse_r, delta_r);

  std::int64_t n_first, n_last;
  const std::int64_t rows_here = len_q - m0 < BM ? len_q - m0 : BM;
  cuda::key_block_range(p, m0, rows_here, len_q, len_k, BN, n_first, n_last);

  cute::Tensor tQs = gthr.partition_D(sQ);
  cute::Tensor tdOs = gthr.partition_D(sdO);
  copy_rows(gmem_copy, gthr.partition_S(gQ), tQs, tRowsC, len_q - m0);
  copy_rows(gmem_copy, gthr.partition_S(gdO), tdOs, tRowsC, len_q - m0);
  if (n_first < n_last) load_kv(n_first, 0);
  cp_async_fence();

  for (std::int64_t n = n_first; n < n_last; ++n) {
    const std::int64_t n0 = n * BN;
    const int stage = int((n - n_first) & 1);
    if (n + 1 < n_last) load_kv(n + 1, stage ^ 1);  // its stage was last read two blocks ago
    cp_async_fence();
    cp_async_wait<1>();                        // all but that copy: Q, dO, K and V of block n have landed
    cutlass::arch::fence_view_async_shared();  // make these generic-proxy writes visible to wgmma
    __syncthreads();                           // ... for every warp

    cute::Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK(stage)));
    cute::Tensor tPrV = thr_s.make_fragment_B(thr_s.partition_B(sV(stage)));
    cute::Tensor acc_s90 = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
    cute::Tensor acc_dp90 = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
    wgmma_pair<true>(mma_s, tSrQ, tSrK, acc_s90, tPrdO, tPrV, acc_dp90);
    cute::Tensor acc_s = make_tensor(acc_s90.data(), AccLayoutS{});
    cute::Tensor acc_dp = make_tensor(acc_dp90.data(), AccLayoutS{});
    probabilities_and_dscores<kPlain>(p, acc_s, acc_dp, tScS, b, h, m0, n0, len_q, len_k,
                                      [&](int r) { return lse_r[r]; }, [&](int r) { return delta_r[r]; });

    cute::Tensor rdS = make_tensor_like<Element>(acc_dp);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dp); ++i) rdS(i) = static_cast<Element>(acc_dp(i));
    cute::Tensor tQrdS = make_tensor(rdS.data(), acc_as_a(rdS.layout()));
    cute::Tensor tQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt(stage)));
    warpgroup_fence_operand(acc_dq90);
    warpgroup_arrive();
    wgmma_accumulate(mma_dq, tQrdS, tQrKt, acc_dq90);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dq90);
    __syncthreads();  // every warp is done reading this stage before it is refilled
  }
  cp_async_wait<0>();

  cute::Tensor acc_dq = make_tensor(acc_dq90.data(), AccLayoutQ{});
  cute::Tensor tQcQ = thr_mma.partition_C(make_identity_tensor(Tile{}));
  Element* dq_base = dq + bp.dq.at(b, h, q0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) {
    const std::int64_t row = m0 + get<0>(tQcQ(i));
    if (row < len_q) dq_base[row * bp.dq.s + get<1>(tQcQ(i))] = static_cast<Element>(acc_dq(i));
  }
#else
  (void)bp, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dq;  // compiled for sm_90a only
#endif
}

template <class Element, int kHeadDim, bool kPlain>
__global__ void __launch_bounds__(128)
    dkdv_sm90_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout,
                     const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                     const float* __restrict__ lse, const float* __restrict__ delta, Element* __restrict__ dk,
                     Element* __restrict__ dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90BwdConfig<Element, kHeadDim>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * BN;
  if (n0 >= len_k) return;
  const int tid = threadIdx.x;
  using Tile = Shape<Int<BN>, Int<kHeadDim>>;

  cute::Tensor gK = local_tile(head_rows<kHeadDim>(k, p.k, b, hk, k0, len_k), Tile{}, make_coord(n_block, 0));
  cute::Tensor gV = local_tile(head_rows<kHeadDim>(v, p.v, b, hk, k0, len_k), Tile{}, make_coord(n_block, 0));

  // K, V, then Q and dO of two stages (the next query block streams in during this one's
  // products), then lse and delta of each stage's queries: read per element from shared memory,
  // not held in registers (the four accumulators leave no room for them).
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  auto tile = [&](int i, auto layout) { return make_tensor(make_smem_ptr(smem + i * Cfg::kTileElements), layout); };
  using Rows = typename Cfg::SmemLayoutRows;
  cute::Tensor sK = tile(0, Rows{});
  cute::Tensor sV = tile(1, Rows{});
  auto sQ = [&](int stage) { return tile(2 + 2 * stage, Rows{}); };
  auto sdO = [&](int stage) { return tile(3 + 2 * stage, Rows{}); };
  auto sQt = [&](int stage) { return tile(2 + 2 * stage, typename Cfg::SmemLayoutRowsT{}); };
  auto sdOt = [&](int stage) { return tile(3 + 2 * stage, typename Cfg::SmemLayoutRowsT{}); };
  float* s_stats = reinterpret_cast<float*>(smem_raw + Cfg::kStatsOffset);  // [stage][lse, delta][BM]

  typename Cfg::GmemCopy gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tid);
  cute::Tensor tRowsC = gthr.partition_S(make_identity_tensor(Tile{}));

  // The (query head, query block) pairs this CTA visits (query_visits).
  const QueryVisits visits = query_visits(p, hk, n0, len_q, len_k, BM, BN);
  const std::int64_t steps = visits.steps;
  auto load_qdo = [&](std::int64_t i, int stage) {
    const std::int64_t h = visits.head(i), m = visits.block(i), m0 = m * BM;
    cute::Tensor gQ = local_tile(head_rows<kHeadDim>(q, p.q, b, h, q0, len_q), Tile{}, make_coord(m, 0));
    cute::Tensor gdO = local_tile(head_rows<kHeadDim>(dout, bp.dout, b, h, q0, len_q), Tile{}, make_coord(m, 0));
    cute::Tensor tQs = gthr.partition_D(sQ(stage));
    cute::Tensor tdOs = gthr.partition_D(sdO(stage));
    copy_rows(gmem_copy, gthr.partition_S(gQ), tQs, tRowsC, len_q - m0);
    copy_rows(gmem_copy, gthr.partition_S(gdO), tdOs, tRowsC, len_q - m0);
    if (tid < 2 * BM) {  // thread t: lse (t < 64) or delta of query t % 64
      const std::int64_t row = m0 + tid % BM;
      float value = tid < BM ? -INFINITY : 0.0f;
      if (row < len_q) value = tid < BM ? lse[p.lse.at(b, h, q0 + row)] : delta[cuda::delta_index(p, b, h, q0 + row)];
      s_stats[stage * 2 * BM + tid] = value;
    }
  };

  // S^T = K Q^T and dP^T = V dO^T: keys are the rows (M), queries the columns (N).
  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  cute::Tensor tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK));
  cute::Tensor tPrV = thr_s.make_fragment_A(thr_s.partition_A(sV));
  // dV += P^T dO and dK += dS^T Q: P^T, dS^T from registers; dO^T, Q^T [D, BM] by descriptors.
  typename Cfg::TiledMmaO mma_kv;
  auto thr_kv = mma_kv.get_thread_slice(tid);
  cute::Tensor acc_dv90 = partition_fragment_C(mma_kv, Tile{});
  cute::Tensor acc_dk90 = partition_fragment_C(mma_kv, Tile{});
  clear(acc_dv90);
  clear(acc_dk90);

  // The accumulators in mma.sync order with each element's (key, query) or (key, d).
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  using AccLayoutS = decltype(partition_fragment_C(mma, Shape<Int<BN>, Int<BM>>{}).layout());
  using AccLayoutKV = decltype(partition_fragment_C(mma, Tile{}).layout());
  cute::Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<BN>, Int<BM>>{}));
  cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));

  cute::Tensor tKs = gthr.partition_D(sK);
  cute::Tensor tVs = gthr.partition_D(sV);
  copy_rows(gmem_copy, gthr.partition_S(gK), tKs, tRowsC, len_k - n0);
  copy_rows(gmem_copy, gthr.partition_S(gV), tVs, tRowsC, len_k - n0);
  if (steps > 0) load_qdo(0, 0);
  cp_async_fence();

  for (std::int64_t i = 0; i < steps; ++i) {
    const std::int64_t h = visits.head(i), m0 = visits.block(i) * BM;
    const int stage = int(i & 1);
    if (i + 1 < steps) load_qdo(i + 1, stage ^ 1);  // its stage was last read two steps ago
    cp_async_fence();
    cp_async_wait<1>();                        // all but that copy: K, V, Q and dO of step i have landed
    cutlass::arch::fence_view_async_shared();  // ... visible to wgmma
    __syncthreads();                           // ... for every warp, with lse and delta

    cute::Tensor tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ(stage)));
    cute::Tensor tPrdO = thr_s.make_fragment_B(thr_s.partition_B(sdO(stage)));
    cute::Tensor acc_st90 = partition_fragment_C(mma_s, Shape<Int<BN>, Int<BM>>{});
    cute::Tensor acc_dpt90 = partition_fragment_C(mma_s, Shape<Int<BN>, Int<BM>>{});
    wgmma_pair<true>(mma_s, tSrK, tSrQ, acc_st90, tPrV, tPrdO, acc_dpt90);
    cute::Tensor acc_st = make_tensor(acc_st90.data(), AccLayoutS{});
    cute::Tensor acc_dpt = make_tensor(acc_dpt90.data(), AccLayoutS{});
    const float* s_lse = s_stats + stage * 2 * BM;
    probabilities_and_dscores<kPlain, true>(
        p, acc_st, acc_dpt, tScS, b, h, m0, n0, len_q, len_k, [&](int c) { return s_lse[get<1>(tScS_rc(0, c))]; },
        [&](int c) { return s_lse[BM + get<1>(tScS_rc(0, c))]; });

    cute::Tensor rPt = make_tensor_like<Element>(acc_st);
    cute::Tensor rdSt = make_tensor_like<Element>(acc_dpt);
    CUTE_UNROLL
    for (int j = 0; j < size(acc_st); ++j) {
      rPt(j) = static_cast<Element>(acc_st(j));
      rdSt(j) = static_cast<Element>(acc_dpt(j));
    }
    cute::Tensor tVrPt = make_tensor(rPt.data(), acc_as_a(rPt.layout()));
    cute::Tensor tKrdSt = make_tensor(rdSt.data(), acc_as_a(rdSt.layout()));
    cute::Tensor tVrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt(stage)));
    cute::Tensor tKrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt(stage)));
    wgmma_pair<false>(mma_kv, tVrPt, tVrdOt, acc_dv90, tKrdSt, tKrQt, acc_dk90);
    __syncthreads();  // every warp is done reading this stage (and its lse, delta) before it is refilled
  }
  cp_async_wait<0>();

  cute::Tensor acc_dk = make_tensor(acc_dk90.data(), AccLayoutKV{});
  cute::Tensor acc_dv = make_tensor(acc_dv90.data(), AccLayoutKV{});
  cute::Tensor tKcK = thr_mma.partition_C(make_identity_tensor(Tile{}));
  Element* dk_base = dk + bp.dk.at(b, hk, k0);
  Element* dv_base = dv + bp.dv.at(b, hk, k0);
  CUTE_UNROLL
  for (int j = 0; j < size(acc_dk); ++j) {
    const std::int64_t row = n0 + get<0>(tKcK(j));
    const int col = get<1>(tKcK(j));
    if (row < len_k) {
      dk_base[row * bp.dk.s + col] = static_cast<Element>(acc_dk(j));
      dv_base[row * bp.dv.s + col] = static_cast<Element>(acc_dv(j));
    }
  }
#else
  (void)bp, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dk, (void)dv;  // sm_90a only
#endif
}

template <class Element, int kHeadDim>
void launch_backward_sm90(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                          const void* out, const float* lse, void* dq, void* dk, void* dv, float* delta,
                          Stream stream) {
  using Cfg = Sm90BwdConfig<Element, kHeadDim>;
  launch_backward_kernels<Element>(
      bp, BackwardKernels<Element>{dq_sm90_kernel<Element, kHeadDim, true>, dq_sm90_kernel<Element, kHeadDim, false>,
                                   Cfg::kBwdSmemBytes, dkdv_sm90_kernel<Element, kHeadDim, true>,
                                   dkdv_sm90_kernel<Element, kHeadDim, false>, Cfg::kBwdSmemBytes, 128},
      dout, q, k, v, out, lse, dq, dk, dv, delta, stream);
}

}  // namespace rudnn::attention::flash
