// The "flash" backward for sm80+ (CuTe, mma.sync), head dims D == Dv (64, 96, 128). Probabilities
// are recomputed from lse; no Sq x Sk matrix exists and no atomics are used, so the result is
// bitwise deterministic. Three kernels on the stream:
//   delta   delta_i = dout_i . out_i per query row (into the workspace)
//   dq      one CTA per 64 query rows: for each visible 64-key block, S = Q K^T, dP = dO V^T,
//           dS = P (dP - delta) (softcap') scale, dQ += dS K
//   dkdv    one CTA per 64 keys: for each query head of the group and each query block that
//           sees these keys, the same S, dP, P and dS (written to shared memory), then
//           dV += P^T dO and dK += dS^T Q (transposed operands read with ldmatrix.trans)
// dq recomputes S and dP that dkdv also computes: the price of needing no atomics.
#pragma once

#include "attention/flash_sm80.cuh"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim>
struct Sm80BwdConfig : Sm80Config<Element, kHeadDim> {
  using Base = Sm80Config<Element, kHeadDim>;
  using SmemLayoutPdS = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<Base::kBlockM>, Int<Base::kBlockN>>{}));
  // Transposed views (no data movement): K^T [D, BN]; P^T, dS^T [BN, BM]; Q^T, dO^T [D, BM].
  using SmemLayoutKt = typename Base::SmemLayoutVt;
  using SmemLayoutPdSt = decltype(composition(SmemLayoutPdS{},
                                              make_layout(Shape<Int<Base::kBlockN>, Int<Base::kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutQt = decltype(composition(typename Base::SmemLayoutQ{},
                                            make_layout(Shape<Int<kHeadDim>, Int<Base::kBlockM>>{}, GenRowMajor{})));
  static constexpr int kDqSmemBytes = (2 * Base::kBlockM + 2 * Base::kBlockN) * kHeadDim * int(sizeof(Element));
  static constexpr int kDkdvSmemBytes = kDqSmemBytes + 2 * Base::kBlockM * Base::kBlockN * int(sizeof(Element));
};

// dS and P of one (query block, key block) tile from the raw S = Q K^T and dP = dO V^T
// accumulators, in place: acc_s becomes P, acc_dp becomes dS. lse_r / delta_r are the
// thread's rows (rowcol order); rows and keys outside the sequences or hidden get 0.
template <bool kPlain, class AccS, class AccDp, class Coords, int kRows>
__device__ __forceinline__ void probabilities_and_dscores(const Problem& p, AccS& acc_s, AccDp& acc_dp,
                                                         Coords const& coords, std::int64_t b, std::int64_t h,
                                                         std::int64_t m0, std::int64_t n0, std::int64_t len_q,
                                                         std::int64_t len_k, const float (&lse_r)[kRows],
                                                         const float (&delta_r)[kRows]) {
  cute::Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  cute::Tensor dp_rc = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
  cute::Tensor c_rc = make_tensor(coords.data(), rowcol(coords.layout()));
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c) {
      const std::int64_t row = m0 + get<0>(c_rc(r, c)), col = n0 + get<1>(c_rc(r, c));
      float prob = 0.0f, ds = 0.0f;
      if (row < len_q && col < len_k && lse_r[r] != -INFINITY) {
        float t;
        const float s = cuda::score<kPlain>(p, s_rc(r, c), b, h, row, col, len_q, len_k, &t);
        cuda::probability_and_dscore(p, s, t, lse_r[r], dp_rc(r, c), delta_r[r], prob, ds);
      }
      s_rc(r, c) = prob;
      dp_rc(r, c) = ds;
    }
  }
}

template <class Element>
__global__ void __launch_bounds__(128)
    delta_kernel(const BackwardProblem bp, const Element* __restrict__ dout, const Element* __restrict__ out,
                 float* __restrict__ delta) {
  const Problem& p = bp.fwd;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t i = std::int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // one warp per row
  if (i >= len_q) return;
  const Element* o = out + p.out.at(b, h, q0 + i);
  const Element* g = dout + bp.dout.at(b, h, q0 + i);
  float s = 0.0f;
  for (std::int64_t d = threadIdx.x % 32; d < p.dv; d += 32) s = fmaf(float(g[d]), float(o[d]), s);
  for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
  if (threadIdx.x % 32 == 0) delta[cuda::delta_index(p, b, h, q0 + i)] = s;
}

template <class Element, int kHeadDim, bool kPlain>
__global__ void __launch_bounds__(128)
    dq_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout, const Element* __restrict__ q,
              const Element* __restrict__ k, const Element* __restrict__ v, const float* __restrict__ lse,
              const float* __restrict__ delta, Element* __restrict__ dq) {
  using Cfg = Sm80BwdConfig<Element, kHeadDim>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const Problem& p = bp.fwd;
  const int m_block = blockIdx.x;
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t m0 = std::int64_t(m_block) * BM;
  if (m0 >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x;

  cute::Tensor gQ = local_tile(head_rows<kHeadDim>(q, p.q, b, h, q0, len_q), Shape<Int<BM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
  cute::Tensor gdO = local_tile(head_rows<kHeadDim>(dout, bp.dout, b, h, q0, len_q), Shape<Int<BM>, Int<kHeadDim>>{},
                                make_coord(m_block, 0));
  cute::Tensor gK = local_tile(head_rows<kHeadDim>(k, p.k, b, hk, k0, len_k), Shape<Int<BN>, Int<kHeadDim>>{}, make_coord(_, 0));
  cute::Tensor gV = local_tile(head_rows<kHeadDim>(v, p.v, b, hk, k0, len_k), Shape<Int<BN>, Int<kHeadDim>>{}, make_coord(_, 0));

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutQ{});
  cute::Tensor sK = make_tensor(sdO.data() + size(sdO), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sKt = make_tensor(sK.data(), typename Cfg::SmemLayoutKt{});

  typename Cfg::GmemCopy gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tid);
  cute::Tensor tQg = gthr.partition_S(gQ);
  cute::Tensor tQs = gthr.partition_D(sQ);
  cute::Tensor tdOg = gthr.partition_S(gdO);
  cute::Tensor tdOs = gthr.partition_D(sdO);
  cute::Tensor tKg = gthr.partition_S(gK);
  cute::Tensor tKs = gthr.partition_D(sK);
  cute::Tensor tVg = gthr.partition_S(gV);
  cute::Tensor tVs = gthr.partition_D(sV);
  cute::Tensor tQc = gthr.partition_S(make_identity_tensor(Shape<Int<BM>, Int<kHeadDim>>{}));
  cute::Tensor tKVc = gthr.partition_S(make_identity_tensor(Shape<Int<BN>, Int<kHeadDim>>{}));

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  cute::Tensor tSrdO = thr_mma.partition_fragment_A(sdO);
  cute::Tensor tSrK = thr_mma.partition_fragment_B(sK);
  cute::Tensor tSrV = thr_mma.partition_fragment_B(sV);
  cute::Tensor tQrKt = thr_mma.partition_fragment_B(sKt);
  cute::Tensor acc_dq = partition_fragment_C(mma, Shape<Int<BM>, Int<kHeadDim>>{});
  clear(acc_dq);

  auto copy_a = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_a = copy_a.get_thread_slice(tid);
  cute::Tensor tSsQ = thr_copy_a.partition_S(sQ);
  cute::Tensor tSrQ_view = thr_copy_a.retile_D(tSrQ);
  cute::Tensor tSsdO = thr_copy_a.partition_S(sdO);
  cute::Tensor tSrdO_view = thr_copy_a.retile_D(tSrdO);
  auto copy_b = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_b = copy_b.get_thread_slice(tid);
  cute::Tensor tSsK = thr_copy_b.partition_S(sK);
  cute::Tensor tSrK_view = thr_copy_b.retile_D(tSrK);
  cute::Tensor tSsV = thr_copy_b.partition_S(sV);
  cute::Tensor tSrV_view = thr_copy_b.retile_D(tSrV);
  auto copy_bt = make_tiled_copy_B(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  auto thr_copy_bt = copy_bt.get_thread_slice(tid);
  cute::Tensor tQsKt = thr_copy_bt.partition_S(sKt);
  cute::Tensor tQrKt_view = thr_copy_bt.retile_D(tQrKt);

  cute::Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
  cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  float lse_r[kRows], delta_r[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t row = m0 + get<0>(tScS_rc(r, 0));
    lse_r[r] = row < len_q ? lse[p.lse.at(b, h, q0 + row)] : -INFINITY;
    delta_r[r] = row < len_q ? delta[cuda::delta_index(p, b, h, q0 + row)] : 0.0f;
  }

  std::int64_t n_first, n_last;
  const std::int64_t rows_here = len_q - m0 < BM ? len_q - m0 : BM;
  cuda::key_block_range(p, m0, rows_here, len_q, len_k, BN, n_first, n_last);

  copy_rows(gmem_copy, tQg, tQs, tQc, len_q - m0);
  copy_rows(gmem_copy, tdOg, tdOs, tQc, len_q - m0);
  cp_async_fence();

  for (std::int64_t n = n_first; n < n_last; ++n) {
    const std::int64_t n0 = n * BN;
    copy_rows(gmem_copy, tKg(_, _, _, n), tKs, tKVc, len_k - n0);
    copy_rows(gmem_copy, tVg(_, _, _, n), tVs, tKVc, len_k - n0);
    cp_async_fence();
    cp_async_wait<0>();
    __syncthreads();

    cute::Tensor acc_s = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    cute::Tensor acc_dp = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    clear(acc_s);
    clear(acc_dp);
    CUTE_UNROLL
    for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
      cute::copy(copy_a, tSsQ(_, _, kk), tSrQ_view(_, _, kk));
      cute::copy(copy_b, tSsK(_, _, kk), tSrK_view(_, _, kk));
      cute::gemm(mma, tSrQ(_, _, kk), tSrK(_, _, kk), acc_s);
      cute::copy(copy_a, tSsdO(_, _, kk), tSrdO_view(_, _, kk));
      cute::copy(copy_b, tSsV(_, _, kk), tSrV_view(_, _, kk));
      cute::gemm(mma, tSrdO(_, _, kk), tSrV(_, _, kk), acc_dp);
    }
    probabilities_and_dscores<kPlain>(p, acc_s, acc_dp, tScS, b, h, m0, n0, len_q, len_k, lse_r, delta_r);

    // dQ += dS K: dS straight from registers as the A operand, K^T through ldmatrix.trans.
    cute::Tensor rdS = make_tensor_like<Element>(acc_dp);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dp); ++i) rdS(i) = static_cast<Element>(acc_dp(i));
    cute::Tensor tQrdS = make_tensor(rdS.data(), acc_as_a(rdS.layout()));
    CUTE_UNROLL
    for (int kk = 0; kk < size<2>(tQrdS); ++kk) {
      cute::copy(copy_bt, tQsKt(_, _, kk), tQrKt_view(_, _, kk));
      cute::gemm(mma, tQrdS(_, _, kk), tQrKt(_, _, kk), acc_dq);
    }
    __syncthreads();  // sK / sV are overwritten next
  }
  cp_async_wait<0>();

  cute::Tensor tQcQ = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<kHeadDim>>{}));
  Element* dq_base = dq + bp.dq.at(b, h, q0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) {
    const std::int64_t row = m0 + get<0>(tQcQ(i));
    if (row < len_q) dq_base[row * bp.dq.s + get<1>(tQcQ(i))] = static_cast<Element>(acc_dq(i));
  }
}

template <class Element, int kHeadDim, bool kPlain>
__global__ void __launch_bounds__(128)
    dkdv_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout, const Element* __restrict__ q,
                const Element* __restrict__ k, const Element* __restrict__ v, const float* __restrict__ lse,
                const float* __restrict__ delta, Element* __restrict__ dk, Element* __restrict__ dv) {
  using Cfg = Sm80BwdConfig<Element, kHeadDim>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * BN;
  if (n0 >= len_k) return;
  const int tid = threadIdx.x;

  cute::Tensor gK = local_tile(head_rows<kHeadDim>(k, p.k, b, hk, k0, len_k), Shape<Int<BN>, Int<kHeadDim>>{},
                               make_coord(n_block, 0));
  cute::Tensor gV = local_tile(head_rows<kHeadDim>(v, p.v, b, hk, k0, len_k), Shape<Int<BN>, Int<kHeadDim>>{},
                               make_coord(n_block, 0));

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutQ{});
  cute::Tensor sK = make_tensor(sdO.data() + size(sdO), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sP = make_tensor(sV.data() + size(sV), typename Cfg::SmemLayoutPdS{});
  cute::Tensor sdS = make_tensor(sP.data() + size(sP), typename Cfg::SmemLayoutPdS{});
  cute::Tensor sPt = make_tensor(sP.data(), typename Cfg::SmemLayoutPdSt{});
  cute::Tensor sdSt = make_tensor(sdS.data(), typename Cfg::SmemLayoutPdSt{});
  cute::Tensor sQt = make_tensor(sQ.data(), typename Cfg::SmemLayoutQt{});
  cute::Tensor sdOt = make_tensor(sdO.data(), typename Cfg::SmemLayoutQt{});

  typename Cfg::GmemCopy gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tid);
  cute::Tensor tKg = gthr.partition_S(gK);
  cute::Tensor tKs = gthr.partition_D(sK);
  cute::Tensor tVg = gthr.partition_S(gV);
  cute::Tensor tVs = gthr.partition_D(sV);
  cute::Tensor tQs = gthr.partition_D(sQ);
  cute::Tensor tdOs = gthr.partition_D(sdO);
  cute::Tensor tQc = gthr.partition_S(make_identity_tensor(Shape<Int<BM>, Int<kHeadDim>>{}));
  cute::Tensor tKVc = gthr.partition_S(make_identity_tensor(Shape<Int<BN>, Int<kHeadDim>>{}));

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  // (queries x keys) products S and dP, as in the dq kernel.
  cute::Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  cute::Tensor tSrdO = thr_mma.partition_fragment_A(sdO);
  cute::Tensor tSrK = thr_mma.partition_fragment_B(sK);
  cute::Tensor tSrV = thr_mma.partition_fragment_B(sV);
  // (keys x D) products dV += P^T dO and dK += dS^T Q.
  cute::Tensor tVrPt = thr_mma.partition_fragment_A(sPt);
  cute::Tensor tVrdOt = thr_mma.partition_fragment_B(sdOt);
  cute::Tensor tKrdSt = thr_mma.partition_fragment_A(sdSt);
  cute::Tensor tKrQt = thr_mma.partition_fragment_B(sQt);
  cute::Tensor acc_dv = partition_fragment_C(mma, Shape<Int<BN>, Int<kHeadDim>>{});
  cute::Tensor acc_dk = partition_fragment_C(mma, Shape<Int<BN>, Int<kHeadDim>>{});
  clear(acc_dv);
  clear(acc_dk);

  auto copy_a = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_a = copy_a.get_thread_slice(tid);
  cute::Tensor tSsQ = thr_copy_a.partition_S(sQ);
  cute::Tensor tSrQ_view = thr_copy_a.retile_D(tSrQ);
  cute::Tensor tSsdO = thr_copy_a.partition_S(sdO);
  cute::Tensor tSrdO_view = thr_copy_a.retile_D(tSrdO);
  auto copy_b = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_b = copy_b.get_thread_slice(tid);
  cute::Tensor tSsK = thr_copy_b.partition_S(sK);
  cute::Tensor tSrK_view = thr_copy_b.retile_D(tSrK);
  cute::Tensor tSsV = thr_copy_b.partition_S(sV);
  cute::Tensor tSrV_view = thr_copy_b.retile_D(tSrV);
  auto copy_at = make_tiled_copy_A(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  auto thr_copy_at = copy_at.get_thread_slice(tid);
  cute::Tensor tVsPt = thr_copy_at.partition_S(sPt);
  cute::Tensor tVrPt_view = thr_copy_at.retile_D(tVrPt);
  cute::Tensor tKsdSt = thr_copy_at.partition_S(sdSt);
  cute::Tensor tKrdSt_view = thr_copy_at.retile_D(tKrdSt);
  auto copy_bt = make_tiled_copy_B(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  auto thr_copy_bt = copy_bt.get_thread_slice(tid);
  cute::Tensor tVsdOt = thr_copy_bt.partition_S(sdOt);
  cute::Tensor tVrdOt_view = thr_copy_bt.retile_D(tVrdOt);
  cute::Tensor tKsQt = thr_copy_bt.partition_S(sQt);
  cute::Tensor tKrQt_view = thr_copy_bt.retile_D(tKrQt);

  cute::Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
  cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;

  copy_rows(gmem_copy, tKg, tKs, tKVc, len_k - n0);
  copy_rows(gmem_copy, tVg, tVs, tKVc, len_k - n0);
  cp_async_fence();

  const std::int64_t cols_here = len_k - n0 < BN ? len_k - n0 : BN;
  std::int64_t m_first, m_last;
  cuda::query_block_range(p, n0, cols_here, len_q, len_k, BM, m_first, m_last);

  for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    cute::Tensor gQ = local_tile(head_rows<kHeadDim>(q, p.q, b, h, q0, len_q), Shape<Int<BM>, Int<kHeadDim>>{}, make_coord(_, 0));
    cute::Tensor gdO = local_tile(head_rows<kHeadDim>(dout, bp.dout, b, h, q0, len_q), Shape<Int<BM>, Int<kHeadDim>>{},
                                  make_coord(_, 0));
    cute::Tensor tQg = gthr.partition_S(gQ);
    cute::Tensor tdOg = gthr.partition_S(gdO);
    for (std::int64_t m = m_first; m < m_last; ++m) {
      const std::int64_t m0 = m * BM;
      copy_rows(gmem_copy, tQg(_, _, _, m), tQs, tQc, len_q - m0);
      copy_rows(gmem_copy, tdOg(_, _, _, m), tdOs, tQc, len_q - m0);
      cp_async_fence();
      float lse_r[kRows], delta_r[kRows];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const std::int64_t row = m0 + get<0>(tScS_rc(r, 0));
        lse_r[r] = row < len_q ? lse[p.lse.at(b, h, q0 + row)] : -INFINITY;
        delta_r[r] = row < len_q ? delta[cuda::delta_index(p, b, h, q0 + row)] : 0.0f;
      }
      cp_async_wait<0>();  // K/V (first time) and Q/dO have landed
      __syncthreads();

      cute::Tensor acc_s = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
      cute::Tensor acc_dp = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
      clear(acc_s);
      clear(acc_dp);
      CUTE_UNROLL
      for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
        cute::copy(copy_a, tSsQ(_, _, kk), tSrQ_view(_, _, kk));
        cute::copy(copy_b, tSsK(_, _, kk), tSrK_view(_, _, kk));
        cute::gemm(mma, tSrQ(_, _, kk), tSrK(_, _, kk), acc_s);
        cute::copy(copy_a, tSsdO(_, _, kk), tSrdO_view(_, _, kk));
        cute::copy(copy_b, tSsV(_, _, kk), tSrV_view(_, _, kk));
        cute::gemm(mma, tSrdO(_, _, kk), tSrV(_, _, kk), acc_dp);
      }
      probabilities_and_dscores<kPlain>(p, acc_s, acc_dp, tScS, b, h, m0, n0, len_q, len_k, lse_r, delta_r);

      // P and dS to shared memory (by coordinates) so that their transposes can be read back.
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int r = get<0>(tScS(i)), c = get<1>(tScS(i));
        sP(r, c) = static_cast<Element>(acc_s(i));
        sdS(r, c) = static_cast<Element>(acc_dp(i));
      }
      __syncthreads();

      CUTE_UNROLL
      for (int kk = 0; kk < size<2>(tVrPt); ++kk) {
        cute::copy(copy_at, tVsPt(_, _, kk), tVrPt_view(_, _, kk));
        cute::copy(copy_bt, tVsdOt(_, _, kk), tVrdOt_view(_, _, kk));
        cute::gemm(mma, tVrPt(_, _, kk), tVrdOt(_, _, kk), acc_dv);
        cute::copy(copy_at, tKsdSt(_, _, kk), tKrdSt_view(_, _, kk));
        cute::copy(copy_bt, tKsQt(_, _, kk), tKrQt_view(_, _, kk));
        cute::gemm(mma, tKrdSt(_, _, kk), tKrQt(_, _, kk), acc_dk);
      }
      __syncthreads();  // sQ, sdO, sP, sdS are overwritten next
    }
  }
  cp_async_wait<0>();

  cute::Tensor tKcK = thr_mma.partition_C(make_identity_tensor(Shape<Int<BN>, Int<kHeadDim>>{}));
  Element* dk_base = dk + bp.dk.at(b, hk, k0);
  Element* dv_base = dv + bp.dv.at(b, hk, k0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) {
    const std::int64_t row = n0 + get<0>(tKcK(i));
    const int col = get<1>(tKcK(i));
    if (row < len_k) {
      dk_base[row * bp.dk.s + col] = static_cast<Element>(acc_dk(i));
      dv_base[row * bp.dv.s + col] = static_cast<Element>(acc_dv(i));
    }
  }
}

template <class Element, int kHeadDim>
void launch_backward_sm80(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                          const void* out, const float* lse, void* dq, void* dk, void* dv, float* delta,
                          Stream stream) {
  using Cfg = Sm80BwdConfig<Element, kHeadDim>;
  const Problem& p = bp.fwd;
  if (p.hq == 0 || p.batch == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const auto* dO = static_cast<const Element*>(dout);
  const auto* Q = static_cast<const Element*>(q);
  const auto* K = static_cast<const Element*>(k);
  const auto* V = static_cast<const Element*>(v);
  if (p.sq > 0) {
    delta_kernel<Element><<<dim3(unsigned((p.sq + 3) / 4), unsigned(p.hq), unsigned(p.batch)), 128, 0, s>>>(
        bp, dO, static_cast<const Element*>(out), delta);
    RUDNN_CUDA_CHECK_LAUNCH("attention flash delta_kernel");
    auto kernel = p.plain_scores() ? dq_kernel<Element, kHeadDim, true> : dq_kernel<Element, kHeadDim, false>;
    if (Cfg::kDqSmemBytes > 48 * 1024)
      RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kDqSmemBytes));
    kernel<<<dim3(unsigned((p.sq + Cfg::kBlockM - 1) / Cfg::kBlockM), unsigned(p.hq), unsigned(p.batch)), 128,
             Cfg::kDqSmemBytes, s>>>(bp, dO, Q, K, V, lse, delta, static_cast<Element*>(dq));
    RUDNN_CUDA_CHECK_LAUNCH("attention flash dq_kernel");
  }
  if (p.sk > 0) {
    auto kernel = p.plain_scores() ? dkdv_kernel<Element, kHeadDim, true> : dkdv_kernel<Element, kHeadDim, false>;
    if (Cfg::kDkdvSmemBytes > 48 * 1024)
      RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kDkdvSmemBytes));
    kernel<<<dim3(unsigned((p.sk + Cfg::kBlockN - 1) / Cfg::kBlockN), unsigned(p.hkv), unsigned(p.batch)), 128,
             Cfg::kDkdvSmemBytes, s>>>(bp, dO, Q, K, V, lse, delta, static_cast<Element*>(dk),
                                       static_cast<Element*>(dv));
    RUDNN_CUDA_CHECK_LAUNCH("attention flash dkdv_kernel");
  }
}

}  // namespace rudnn::attention::flash
