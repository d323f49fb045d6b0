// The "flash" backward for sm80+ (CuTe, mma.sync), head dims (D, Dv) in {(64, 64), (96, 96),
// (128, 128), (192, 128), (256, 256)}. Probabilities are recomputed from lse; no Sq x Sk matrix
// exists and no atomics are used, so the result is bitwise deterministic. Three kernels on the
// stream:
//   delta   delta_i = dout_i . out_i per query row (into the workspace)
//   dq      one CTA per 64 query rows: for each visible 64-key block, S = Q K^T, dP = dO V^T,
//           dS = P (dP - delta) (softcap') scale, dQ += dS K
//   dkdv    one CTA per 64 keys: for each query head of the group and each query block that
//           sees these keys, the same S, dP, P and dS (written to shared memory), then
//           dV += P^T dO and dK += dS^T Q (transposed operands read with ldmatrix.trans)
// dq recomputes S and dP that dkdv also computes: the price of needing no atomics.
//
// Warps: 8, 4 along the 64 rows of every product x 2 splitting its columns, so that the dK and dV
// (or dQ) accumulators, D or Dv floats per row, are spread over 256 threads (with 4 warps the
// dk/dv kernel spilled from D = 64 on). A warp holds only part of a row of dS, so dq reads dS
// back from shared memory like dkdv.
//
// Loads overlap the products without a second buffer: V (dq) or dO (dk/dv) of the next block
// streams in once the current one has been read for the last time, K or Q after that.
#pragma once

#include "attention/flash_sm80.cuh"
#include "attention/kernels.hpp"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim, int kHeadDimV>
struct Sm80BwdConfig : Sm80Config<Element, kHeadDim, kHeadDimV, 2> {
  using Base = Sm80Config<Element, kHeadDim, kHeadDimV, 2>;
  static constexpr int BM = Base::kBlockM, BN = Base::kBlockN;
  using SmemLayoutdO = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<BM>, Int<kHeadDimV>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(typename Base::SmemAtom{}, Shape<Int<BM>, Int<BN>>{}));
  // Transposed views (no data movement): K^T [D, BN]; P^T, dS^T [BN, BM]; Q^T [D, BM]; dO^T [Dv, BM].
  using SmemLayoutKt =
      decltype(composition(typename Base::SmemLayoutK{}, make_layout(Shape<Int<kHeadDim>, Int<BN>>{}, GenRowMajor{})));
  using SmemLayoutPdSt = decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<BN>, Int<BM>>{}, GenRowMajor{})));
  using SmemLayoutQt =
      decltype(composition(typename Base::SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<BM>>{}, GenRowMajor{})));
  using SmemLayoutdOt =
      decltype(composition(SmemLayoutdO{}, make_layout(Shape<Int<kHeadDimV>, Int<BM>>{}, GenRowMajor{})));
  static constexpr int kOperandBytes = (BM + BN) * (kHeadDim + kHeadDimV) * int(sizeof(Element));  // Q, dO, K, V
  static constexpr int kTileBytes = BM * BN * int(sizeof(Element));                                // P or dS
  static constexpr int kDqSmemBytes = kOperandBytes + kTileBytes;  // and dS
  static constexpr int kDkdvSmemBytes = kOperandBytes + 2 * kTileBytes;
  static_assert(kDkdvSmemBytes == flash_backward_smem_bytes(kHeadDim, kHeadDimV) && kDkdvSmemBytes >= kDqSmemBytes,
                "flash_backward_smem_bytes (kernels.hpp) must state what the kernels take");
};

// The score of every element of one (query block, key block) tile from the raw S = Q K^T
// accumulator: each(r, c, i, s, t) for the element at (r, c) of acc_s's rowcol view, with s its
// score in cuda::log2_factor's units (-inf where hidden, outside the sequences or where the
// query's lse is -inf: else the raw dot in the plain kernels, the transformed logit otherwise)
// and t the transform's tanh (softcap). coords gives each element's (row, col) in the tile: (query,
// key), or (key, query) when kKeysByRow (the sm90a dk/dv kernels compute the transposed
// products); the tile holds tile_queries x tile_keys scores. i indexes the thread's queries for
// lse_of(i) (and the caller's delta_of): its rows in rowcol order, or its columns when kKeysByRow.
// The sm90a dk/dv kernels' plain instantiations set hidden scores to -inf in acc_s itself.
// kSoftcap (keys by row only: the sm90ws dk/dv kernel's softcap instantiation,
// Problem::softcap_scores: softcap, no mask or bias): acc_s becomes the capped logits in place,
// by the warp-specialized forward's inline transform (cuda::SoftcapTransform: no call per score),
// then hidden scores -inf as in the plain kernels (after the transform, which would turn -inf into
// -cap), and t = s / cap.
template <bool kPlain, bool kKeysByRow = false, bool kSoftcap = false, class AccS, class Coords, class LseOf,
          class Each>
__device__ __forceinline__ void for_each_score(const Problem& p, AccS& acc_s, Coords const& coords, int tile_queries,
                                               int tile_keys, std::int64_t b, std::int64_t h, std::int64_t m0,
                                               std::int64_t n0, std::int64_t len_q, std::int64_t len_k,
                                               LseOf&& lse_of, Each&& each) {
  static_assert(!kSoftcap || (!kPlain && kKeysByRow), "the softcap instantiation: dk/dv kernels, softcap scores");
  cute::Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  cute::Tensor c_rc = make_tensor(coords.data(), rowcol(coords.layout()));
  auto query_of = [&](int r, int c) { return kKeysByRow ? get<1>(c_rc(r, c)) : get<0>(c_rc(r, c)); };  // in the tile
  auto key_of = [&](int r, int c) { return kKeysByRow ? get<0>(c_rc(r, c)) : get<1>(c_rc(r, c)); };
  const cuda::TileBand band = cuda::tile_band(p, m0, n0, len_q, len_k);
  // Plain kernels: where the band does not cover the tile, hidden scores become -inf. The sm90a
  // dk/dv kernels (kKeysByRow), at the register limit, do it in a pass of their own first (with
  // the test inside the loop below, the D = 128 one spilled); the dq kernels and sm80's dk/dv
  // test in the loop (the separate pass cost the sm90 dq kernel at D = 96 six registers, three
  // CTAs per SM to two, and the sm80 one at D = 64 55).
  constexpr bool kMaskingPass = (kPlain || kSoftcap) && kKeysByRow;
  const bool all_visible = (kPlain || kSoftcap) && band.covers(tile_queries, tile_keys);  // uniform over the CTA
  if constexpr (kSoftcap) {
    const cuda::SoftcapTransform transform(p);
    CUTE_UNROLL
    for (int j = 0; j < size(acc_s); ++j) acc_s(j) = transform(acc_s(j));
  }
  if constexpr (kMaskingPass) {
    if (!all_visible) {
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c)
          if (!band.visible(query_of(r, c), key_of(r, c))) s_rc(r, c) = -INFINITY;
      }
    }
  }
  const float inverse_cap = kSoftcap ? 1.0f / p.softcap : 0.0f;
  CUTE_UNROLL
  for (int r = 0; r < size<0>(s_rc); ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c) {
      const int i = kKeysByRow ? c : r;
      float s = -INFINITY, t = 0.0f;
      if (lse_of(i) != -INFINITY) {
        if constexpr (kMaskingPass) {
          s = s_rc(r, c);  // -inf where hidden
          if constexpr (kSoftcap) t = s * inverse_cap;
        } else if constexpr (kPlain) {
          if (all_visible || band.visible(query_of(r, c), key_of(r, c))) s = s_rc(r, c);
        } else {
          const int query = query_of(r, c), key = key_of(r, c);
          if (query < band.rows_in && key < band.cols_in)
            s = cuda::general_logit(p, s_rc(r, c), b, h, m0 + query, n0 + key, len_q, len_k, &t);
        }
      }
      each(r, c, i, s, t);
    }
  }
}

// dS and P of one tile in place: acc_s becomes P, acc_dp (the raw dP = dO V^T) becomes dS.
// lse_of(i) and delta_of(i) as for_each_score's i.
template <bool kPlain, bool kKeysByRow = false, bool kSoftcap = false, class AccS, class AccDp, class Coords,
          class LseOf, class DeltaOf>
__device__ __forceinline__ void probabilities_and_dscores(const Problem& p, AccS& acc_s, AccDp& acc_dp,
                                                         Coords const& coords, int tile_queries, int tile_keys,
                                                         std::int64_t b, std::int64_t h, std::int64_t m0,
                                                         std::int64_t n0, std::int64_t len_q, std::int64_t len_k,
                                                         LseOf&& lse_of, DeltaOf&& delta_of) {
  cute::Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  cute::Tensor dp_rc = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
  const float to_log2 = cuda::log2_factor<kPlain>(p);
  for_each_score<kPlain, kKeysByRow, kSoftcap>(p, acc_s, coords, tile_queries, tile_keys, b, h, m0, n0, len_q, len_k,
                                               lse_of, [&](int r, int c, int i, float s, float t) {
                                                 cuda::probability_and_dscore(p, s, to_log2, t, lse_of(i), dp_rc(r, c),
                                                                              delta_of(i), s_rc(r, c), dp_rc(r, c));
                                               });
}

// The (query head, query block) pairs a dk/dv CTA of key block [n0, n0 + BN) of KV head hk
// visits, in order: every query head of the group, and of each the query blocks that see these
// keys (both backward generations). Visit i's head and block by a 32-bit division (a 64-bit one
// is a call of ~70 instructions, once per visit in every dk/dv loop): exact, since steps < 2^32
// for any problem that fits in memory (dq, an output that never overlaps itself (core/aliasing),
// holds steps x 64 rows x D elements at least; 2^32 steps would be 32 TiB at D = 64 in 16 bits).
struct QueryVisits {
  std::int64_t first_head, first_block;
  std::uint32_t blocks_per_head;
  std::int64_t steps;
  __device__ std::int64_t head(std::int64_t i) const { return first_head + std::uint32_t(i) / blocks_per_head; }
  __device__ std::int64_t block(std::int64_t i) const { return first_block + std::uint32_t(i) % blocks_per_head; }
};

__device__ __forceinline__ QueryVisits query_visits(const Problem& p, std::int64_t hk, std::int64_t n0,
                                                    std::int64_t len_q, std::int64_t len_k, int block_m,
                                                    int block_n) {
  const std::int64_t cols_here = len_k - n0 < block_n ? len_k - n0 : block_n;
  std::int64_t m_first, m_last;
  cuda::query_block_range(p, n0, cols_here, len_q, len_k, block_m, m_first, m_last);
  const std::int64_t blocks_per_head = m_last > m_first ? m_last - m_first : 0;
  return QueryVisits{hk * p.group, m_first, std::uint32_t(blocks_per_head), p.group * blocks_per_head};
}

// lse and delta of the thread's queries m0 + query_of(i), i < kN, of head (b, h); -inf and 0 past
// the sequence.
template <int kN, class QueryOf>
__device__ __forceinline__ void load_lse_delta(const Problem& p, const float* lse, const float* delta, std::int64_t b,
                                               std::int64_t h, std::int64_t q0, std::int64_t m0, std::int64_t len_q,
                                               QueryOf&& query_of, float (&lse_q)[kN], float (&delta_q)[kN]) {
  CUTE_UNROLL
  for (int i = 0; i < kN; ++i) {
    const std::int64_t row = m0 + query_of(i);
    lse_q[i] = row < len_q ? lse[p.lse.at(b, h, q0 + row)] : -INFINITY;
    delta_q[i] = row < len_q ? delta[cuda::delta_index(p, b, h, q0 + row)] : 0.0f;
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
  if (threadIdx.x % 32 == 0) delta[cuda::delta_index(p, b, h, q0 + i)] = bp.row_delta(s, b, h, q0 + i);
}

// acc += A B over the k axis of the fragments, both operands loaded from shared memory by their
// tiled copies k step by k step (so only one step's fragments need to be live).
template <class Mma, class CopyA, class SA, class RA, class RAView, class CopyB, class SB, class RB, class RBView,
          class Acc>
__device__ __forceinline__ void smem_gemm(Mma const& mma, CopyA const& copy_a, SA const& sa, RA& ra, RAView& ra_view,
                                          CopyB const& copy_b, SB const& sb, RB& rb, RBView& rb_view, Acc& acc) {
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(ra); ++kk) {
    cute::copy(copy_a, sa(_, _, kk), ra_view(_, _, kk));
    cute::copy(copy_b, sb(_, _, kk), rb_view(_, _, kk));
    cute::gemm(mma, ra(_, _, kk), rb(_, _, kk), acc);
  }
}

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(Sm80BwdConfig<Element, kHeadDim, kHeadDimV>::kThreads)
    dq_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout, const Element* __restrict__ q,
              const Element* __restrict__ k, const Element* __restrict__ v, const float* __restrict__ lse,
              const float* __restrict__ delta, Element* __restrict__ dq) {
  using Cfg = Sm80BwdConfig<Element, kHeadDim, kHeadDimV>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const Problem& p = bp.fwd;
  const int m_block = cuda::query_block_heaviest_first();
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t m0 = std::int64_t(m_block) * BM;
  if (m0 >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x;

  const HeadRows<Element> rows_q = head_rows(q, p.q, b, h, q0, len_q);
  const HeadRows<Element> rows_do = head_rows(dout, bp.dout, b, h, q0, len_q);
  const HeadRows<Element> rows_k = head_rows(k, p.k, b, hk, k0, len_k);
  const HeadRows<Element> rows_v = head_rows(v, p.v, b, hk, k0, len_k);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutdO{});
  cute::Tensor sK = make_tensor(sdO.data() + size(sdO), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sKt = make_tensor(sK.data(), typename Cfg::SmemLayoutKt{});
  // dS for dQ += dS K.
  cute::Tensor sdS = make_tensor(sV.data() + size(sV), typename Cfg::SmemLayoutPdS{});

  const typename Cfg::template Loader<typename Cfg::SmemLayoutQ> q_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutdO> do_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutK> k_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutV> v_loader(tid);

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  cute::Tensor tSrdO = thr_mma.partition_fragment_A(sdO);
  cute::Tensor tSrK = thr_mma.partition_fragment_B(sK);
  cute::Tensor tSrV = thr_mma.partition_fragment_B(sV);
  cute::Tensor tQrKt = thr_mma.partition_fragment_B(sKt);
  cute::Tensor tQrdS = thr_mma.partition_fragment_A(sdS);
  cute::Tensor acc_dq = partition_fragment_C(mma, Shape<Int<BM>, Int<kHeadDim>>{});
  clear(acc_dq);

  auto copy_a = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_a = copy_a.get_thread_slice(tid);
  cute::Tensor tSsQ = thr_copy_a.partition_S(sQ);
  cute::Tensor tSrQ_view = thr_copy_a.retile_D(tSrQ);
  cute::Tensor tSsdO = thr_copy_a.partition_S(sdO);
  cute::Tensor tSrdO_view = thr_copy_a.retile_D(tSrdO);
  cute::Tensor tQsdS = thr_copy_a.partition_S(sdS);
  cute::Tensor tQrdS_view = thr_copy_a.retile_D(tQrdS);
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
  load_lse_delta(p, lse, delta, b, h, q0, m0, len_q, [&](int r) { return get<0>(tScS_rc(r, 0)); }, lse_r, delta_r);

  std::int64_t n_first, n_last;
  const std::int64_t rows_here = len_q - m0 < BM ? len_q - m0 : BM;
  cuda::key_block_range(p, m0, rows_here, len_q, len_k, BN, n_first, n_last);

  // Loads overlap the products as in the forward: V of block n + 1 streams in during the
  // softmax-gradient math and dQ += dS K of block n (V is done with once dP exists); K of block
  // n + 1 follows once dQ has read K of block n.
  q_loader.load(rows_q, m0, raw_pointer_cast(sQ.data()));
  do_loader.load(rows_do, m0, raw_pointer_cast(sdO.data()));
  if (n_first < n_last) {
    k_loader.load(rows_k, n_first * BN, raw_pointer_cast(sK.data()));
    v_loader.load(rows_v, n_first * BN, raw_pointer_cast(sV.data()));
  }
  cp_async_fence();

  for (std::int64_t n = n_first; n < n_last; ++n) {
    const std::int64_t n0 = n * BN;
    const bool more = n + 1 < n_last;
    cp_async_wait<0>();  // K and V of block n (and Q, dO the first time) have landed
    __syncthreads();

    cute::Tensor acc_s = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    cute::Tensor acc_dp = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    clear(acc_s);
    clear(acc_dp);
    smem_gemm(mma, copy_a, tSsQ, tSrQ, tSrQ_view, copy_b, tSsK, tSrK, tSrK_view, acc_s);
    smem_gemm(mma, copy_a, tSsdO, tSrdO, tSrdO_view, copy_b, tSsV, tSrV, tSrV_view, acc_dp);
    __syncthreads();  // every warp is done reading sV
    if (more) {
      v_loader.load(rows_v, n0 + BN, raw_pointer_cast(sV.data()));
      cp_async_fence();
    }
    probabilities_and_dscores<kPlain>(p, acc_s, acc_dp, tScS, BM, BN, b, h, m0, n0, len_q, len_k,
                                      [&](int r) { return lse_r[r]; }, [&](int r) { return delta_r[r]; });

    // dQ += dS K, dS through shared memory (a row of it is spread over two warps), K^T through
    // ldmatrix.trans.
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dp); ++i) sdS(get<0>(tScS(i)), get<1>(tScS(i))) = static_cast<Element>(acc_dp(i));
    __syncthreads();
    smem_gemm(mma, copy_a, tQsdS, tQrdS, tQrdS_view, copy_bt, tQsKt, tQrKt, tQrKt_view, acc_dq);
    __syncthreads();  // every warp is done reading sK and sdS
    if (more) {
      k_loader.load(rows_k, n0 + BN, raw_pointer_cast(sK.data()));
      cp_async_fence();
    }
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

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(Sm80BwdConfig<Element, kHeadDim, kHeadDimV>::kThreads)
    dkdv_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout, const Element* __restrict__ q,
                const Element* __restrict__ k, const Element* __restrict__ v, const float* __restrict__ lse,
                const float* __restrict__ delta, Element* __restrict__ dk, Element* __restrict__ dv) {
  using Cfg = Sm80BwdConfig<Element, kHeadDim, kHeadDimV>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * BN;
  if (n0 >= len_k) return;
  const int tid = threadIdx.x;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutdO{});
  cute::Tensor sK = make_tensor(sdO.data() + size(sdO), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sP = make_tensor(sV.data() + size(sV), typename Cfg::SmemLayoutPdS{});
  cute::Tensor sdS = make_tensor(sP.data() + size(sP), typename Cfg::SmemLayoutPdS{});
  cute::Tensor sPt = make_tensor(sP.data(), typename Cfg::SmemLayoutPdSt{});
  cute::Tensor sdSt = make_tensor(sdS.data(), typename Cfg::SmemLayoutPdSt{});
  cute::Tensor sQt = make_tensor(sQ.data(), typename Cfg::SmemLayoutQt{});
  cute::Tensor sdOt = make_tensor(sdO.data(), typename Cfg::SmemLayoutdOt{});

  const typename Cfg::template Loader<typename Cfg::SmemLayoutQ> q_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutdO> do_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutK> k_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutV> v_loader(tid);

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  // (queries x keys) products S and dP, as in the dq kernel.
  cute::Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  cute::Tensor tSrdO = thr_mma.partition_fragment_A(sdO);
  cute::Tensor tSrK = thr_mma.partition_fragment_B(sK);
  cute::Tensor tSrV = thr_mma.partition_fragment_B(sV);
  // (keys x Dv) dV += P^T dO and (keys x D) dK += dS^T Q.
  cute::Tensor tVrPt = thr_mma.partition_fragment_A(sPt);
  cute::Tensor tVrdOt = thr_mma.partition_fragment_B(sdOt);
  cute::Tensor tKrdSt = thr_mma.partition_fragment_A(sdSt);
  cute::Tensor tKrQt = thr_mma.partition_fragment_B(sQt);
  cute::Tensor acc_dv = partition_fragment_C(mma, Shape<Int<BN>, Int<kHeadDimV>>{});
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

  // The (query head, query block) pairs this CTA visits (query_visits). dO of the next pair
  // streams in during dK += dS^T Q of this one (dO is done with once dV is updated); its Q follows
  // once dK has read this Q.
  const QueryVisits visits = query_visits(p, hk, n0, len_q, len_k, BM, BN);
  const std::int64_t steps = visits.steps;
  auto load_q = [&](std::int64_t i) {
    q_loader.load(head_rows(q, p.q, b, visits.head(i), q0, len_q), visits.block(i) * BM, raw_pointer_cast(sQ.data()));
  };
  auto load_dout = [&](std::int64_t i) {
    do_loader.load(head_rows(dout, bp.dout, b, visits.head(i), q0, len_q), visits.block(i) * BM,
                 raw_pointer_cast(sdO.data()));
  };

  k_loader.load(head_rows(k, p.k, b, hk, k0, len_k), n0, raw_pointer_cast(sK.data()));
  v_loader.load(head_rows(v, p.v, b, hk, k0, len_k), n0, raw_pointer_cast(sV.data()));
  if (steps > 0) {
    load_q(0);
    load_dout(0);
  }
  cp_async_fence();

  for (std::int64_t i = 0; i < steps; ++i) {
    const std::int64_t h = visits.head(i), m0 = visits.block(i) * BM;
    const bool more = i + 1 < steps;
    float lse_r[kRows], delta_r[kRows];
    load_lse_delta(p, lse, delta, b, h, q0, m0, len_q, [&](int r) { return get<0>(tScS_rc(r, 0)); }, lse_r,
                   delta_r);
    cp_async_wait<0>();  // Q and dO of this step (and K, V the first time) have landed
    __syncthreads();

    cute::Tensor acc_s = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    cute::Tensor acc_dp = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    clear(acc_s);
    clear(acc_dp);
    smem_gemm(mma, copy_a, tSsQ, tSrQ, tSrQ_view, copy_b, tSsK, tSrK, tSrK_view, acc_s);
    smem_gemm(mma, copy_a, tSsdO, tSrdO, tSrdO_view, copy_b, tSsV, tSrV, tSrV_view, acc_dp);
    probabilities_and_dscores<kPlain>(p, acc_s, acc_dp, tScS, BM, BN, b, h, m0, n0, len_q, len_k,
                                      [&](int r) { return lse_r[r]; }, [&](int r) { return delta_r[r]; });

    // P and dS to shared memory (by coordinates) so that their transposes can be read back.
    CUTE_UNROLL
    for (int j = 0; j < size(acc_s); ++j) {
      const int r = get<0>(tScS(j)), c = get<1>(tScS(j));
      sP(r, c) = static_cast<Element>(acc_s(j));
      sdS(r, c) = static_cast<Element>(acc_dp(j));
    }
    __syncthreads();

    smem_gemm(mma, copy_at, tVsPt, tVrPt, tVrPt_view, copy_bt, tVsdOt, tVrdOt, tVrdOt_view, acc_dv);
    __syncthreads();  // every warp is done reading sdO
    if (more) {
      load_dout(i + 1);
      cp_async_fence();
    }
    smem_gemm(mma, copy_at, tKsdSt, tKrdSt, tKrdSt_view, copy_bt, tKsQt, tKrQt, tKrQt_view, acc_dk);
    __syncthreads();  // every warp is done reading sQ, sP and sdS
    if (more) {
      load_q(i + 1);
      cp_async_fence();
    }
  }
  cp_async_wait<0>();

  cute::Tensor tKcK = thr_mma.partition_C(make_identity_tensor(Shape<Int<BN>, Int<kHeadDim>>{}));
  cute::Tensor tVcV = thr_mma.partition_C(make_identity_tensor(Shape<Int<BN>, Int<kHeadDimV>>{}));
  Element* dk_base = dk + bp.dk.at(b, hk, k0);
  Element* dv_base = dv + bp.dv.at(b, hk, k0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) {
    const std::int64_t row = n0 + get<0>(tKcK(i));
    if (row < len_k) dk_base[row * bp.dk.s + get<1>(tKcK(i))] = static_cast<Element>(acc_dk(i));
  }
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dv); ++i) {
    const std::int64_t row = n0 + get<0>(tVcV(i));
    if (row < len_k) dv_base[row * bp.dv.s + get<1>(tVcV(i))] = static_cast<Element>(acc_dv(i));
  }
}

// The dq and dk/dv kernels of one generation (plain and general instantiations), their dynamic
// shared memory and block sizes.
template <class Element>
struct BackwardKernels {
  using Dq = void (*)(BackwardProblem, const Element*, const Element*, const Element*, const Element*, const float*,
                      const float*, Element*);
  using Dkdv = void (*)(BackwardProblem, const Element*, const Element*, const Element*, const Element*,
                        const float*, const float*, Element*, Element*);
  Dq dq_plain, dq_general;
  int dq_smem, dq_threads;
  Dkdv dkdv_plain, dkdv_general;
  int dkdv_smem, dkdv_threads;
};

// The backward's launches: delta, then dq (a CTA per 64 query rows of each head) and dk/dv (a CTA
// per 64 keys of each K/V head). A null dq (or dk/dv) kernel: the caller forms that gradient itself.
template <class Element>
void launch_backward_kernels(const BackwardProblem& bp, const BackwardKernels<Element>& kernels, const void* dout,
                             const void* q, const void* k, const void* v, const void* out, const float* lse,
                             void* dq, void* dk, void* dv, float* delta, Stream stream) {
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
    auto kernel = p.plain_scores() ? kernels.dq_plain : kernels.dq_general;
    if (kernel != nullptr) {
      if (kernels.dq_smem > 48 * 1024)
        RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kernels.dq_smem));
      kernel<<<dim3(unsigned((p.sq + 63) / 64), unsigned(p.hq), unsigned(p.batch)), kernels.dq_threads,
               kernels.dq_smem, s>>>(bp, dO, Q, K, V, lse, delta, static_cast<Element*>(dq));
      RUDNN_CUDA_CHECK_LAUNCH("attention flash dq kernel");
    }
  }
  if (p.sk > 0 && kernels.dkdv_plain != nullptr) {  // none: the caller launches its own dk/dv kernel
    auto kernel = p.plain_scores() ? kernels.dkdv_plain : kernels.dkdv_general;
    if (kernels.dkdv_smem > 48 * 1024)
      RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kernels.dkdv_smem));
    kernel<<<dim3(unsigned((p.sk + 63) / 64), unsigned(p.hkv), unsigned(p.batch)), kernels.dkdv_threads,
             kernels.dkdv_smem, s>>>(bp, dO, Q, K, V, lse, delta, static_cast<Element*>(dk),
                                     static_cast<Element*>(dv));
    RUDNN_CUDA_CHECK_LAUNCH("attention flash dk/dv kernel");
  }
}

template <class Element, int kHeadDim, int kHeadDimV>
void launch_backward_sm80(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                          const void* out, const float* lse, void* dq, void* dk, void* dv, float* delta,
                          Stream stream) {
  using Cfg = Sm80BwdConfig<Element, kHeadDim, kHeadDimV>;
  static_assert(Cfg::BM == 64 && Cfg::BN == 64, "launch_backward_kernels launches 64-row tiles");
  launch_backward_kernels<Element>(
      bp, BackwardKernels<Element>{dq_kernel<Element, kHeadDim, kHeadDimV, true>,
                                   dq_kernel<Element, kHeadDim, kHeadDimV, false>, Cfg::kDqSmemBytes, Cfg::kThreads,
                                   dkdv_kernel<Element, kHeadDim, kHeadDimV, true>,
                                   dkdv_kernel<Element, kHeadDim, kHeadDimV, false>, Cfg::kDkdvSmemBytes,
                                   Cfg::kThreads},
      dout, q, k, v, out, lse, dq, dk, dv, delta, stream);
}

}  // namespace rudnn::attention::flash
