// The "flash" forward kernel for sm80+ (Ampere, Ada, Hopper), written with CuTe:
// one CTA of 4 warps owns 64 query rows of one (batch, head); it streams 64-key blocks of
// K and V through shared memory with cp.async, computes S = Q K^T and O += P V with
// mma.sync tensor-core atoms fed by ldmatrix, and keeps the online softmax (running row
// max and sum) in registers, so no Sq x Sk matrix ever exists. Every option of the CPU
// reference applies element-wise to the score tile through its (row, col) coordinates.
//
// Schedule per key block: issue K and V loads (two cp.async groups), wait for K, S = Q K^T,
// scores + softmax update, wait for V, O += P V. Key blocks no row of the CTA can see
// (causal / sliding window) are skipped.
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "attention/cuda_common.cuh"

namespace rudnn::attention::flash {

using namespace cute;

// kWarpsAlongN: 1 for the forward (4 warps stacked along the 64 rows); the backward of wide heads
// takes 2 (8 warps, each pair splitting the columns of every product).
template <class Element, int kHeadDim, int kHeadDimV = kHeadDim, int kWarpsAlongN = 1>
struct Sm80Config {
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = 4 * kWarpsAlongN;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kHeadDim % 32 == 0 && kHeadDimV % 32 == 0, "head dims must be multiples of 32 (64-byte smem rows)");

  using MmaAtom = std::conditional_t<std::is_same_v<Element, cute::half_t>, SM80_16x8x16_F32F16F16F32_TN,
                                     SM80_16x8x16_F32BF16BF16F32_TN>;
  // 4 warps along M (16 rows each), kWarpsAlongN along N; an N tile of 16 per warp lets
  // ldmatrix.x4 feed B.
  using TiledMma = TiledMMA<MMA_Atom<MmaAtom>, Layout<Shape<_4, Int<kWarpsAlongN>, _1>>,
                            Tile<_64, Int<16 * kWarpsAlongN>, _16>>;

  // 8 rows x 64 elements (128 bytes) per atom, XOR-swizzled so that the 16-byte chunks of one
  // column block land in different banks for both cp.async stores and ldmatrix loads; 8 x 32
  // (64 bytes, 4 chunks per row) when a head dim is an odd multiple of 32 (96).
  static constexpr int kAtomCols = kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 ? 64 : 32;
  using SmemAtom = decltype(composition(Swizzle<kAtomCols == 64 ? 3 : 2, 3, 3>{},
                                        Layout<Shape<_8, Int<kAtomCols>>, Stride<Int<kAtomCols>, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
  // V seen as [Dv, BN] (its transpose) for the B operand of O += P V, without moving data.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, GenRowMajor{})));

  // The 128 threads as rows of kAtomCols / 8 threads, each moving 8 elements (16 bytes) per
  // cp.async: one atom width of (128 / (kAtomCols / 8)) rows per step.
  static constexpr int kCopyThreadsPerRow = kAtomCols / 8;
  using GmemCopy = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      Layout<Shape<Int<kThreads / kCopyThreadsPerRow>, Int<kCopyThreadsPerRow>>, Stride<Int<kCopyThreadsPerRow>, _1>>{},
      Layout<Shape<_1, _8>>{}));

  static constexpr int kSmemBytes = (kBlockM * kHeadDim + kBlockN * (kHeadDim + kHeadDimV)) * int(sizeof(Element));
};

// Accumulator layout ((2,2), M, N) of the m16n8 atom seen as (rows, cols) = ((2,M), (2,N)):
// each thread holds 2 adjacent columns of rows r and r + 8 per atom.
template <class Layout>
__device__ __forceinline__ constexpr auto rowcol(Layout const& acc) {
  auto d = logical_divide(acc, Shape<_2>{});
  return make_layout(make_layout(get<0, 1>(d), get<1>(d)), make_layout(get<0, 0>(d), get<2>(d)));
}

// The same registers as the A operand of an m16n8k16 MMA: two 8-column atoms per k step.
template <class Layout>
__device__ __forceinline__ constexpr auto acc_as_a(Layout const& acc) {
  auto d = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(d), get<2, 0>(d)), get<1>(d), get<2, 1>(d));
}

// Rows [first, first + len) of (b, h) of an operand with kCols columns (the last axis dense),
// as a (len, kCols) CuTe tensor: what every flash kernel tiles its loads from.
template <int kCols, class T>
__device__ __forceinline__ auto head_rows(T* base, const Strides& s, std::int64_t b, std::int64_t h,
                                          std::int64_t first, std::int64_t len) {
  return make_tensor(make_gmem_ptr(base + s.at(b, h, first)), make_shape(len, Int<kCols>{}), make_stride(s.s, _1{}));
}

// Copies the rows of a (CPY, CPY_ROWS, CPY_COLS) partition whose row coordinate is below
// `rows`, zero-filling the others (tails of sequences shorter than the tile).
template <class Copy, class Src, class Dst, class Coords>
__device__ __forceinline__ void copy_rows(Copy const& copy, Src const& src, Dst& dst, Coords const& coords,
                                          std::int64_t rows) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < rows)
      cute::copy(copy, src(_, m, _), dst(_, m, _));
    else
      cute::clear(dst(_, m, _));
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The steps of the forward main loop that the sm80 and sm90a kernels share (they differ only in
// how S = Q K^T is computed), all on the mma.sync accumulator layout.

// Scores of one key block, in place, in cuda::log2_factor's units: -inf where hidden or outside the
// sequences; else the raw dot (kPlain: the problem has none of the options but causal,
// Problem::plain_scores) or the whole transform (scale, softcap, bias, masks). coords(i) is the
// (row, col) of accumulator element i within the BM x BN tile. A plain tile inside both
// sequences and wholly below the causal diagonal (most tiles of a long sequence) is left as it is.
template <bool kPlain, int BM, int BN, class Acc, class Coords>
__device__ __forceinline__ void mask_scores(Acc& acc_s, const Coords& coords, const Problem& p, std::int64_t b,
                                            std::int64_t h, std::int64_t m0, std::int64_t n0, std::int64_t len_q,
                                            std::int64_t len_k) {
  if constexpr (kPlain) {
    const bool interior =
        m0 + BM <= len_q && n0 + BN <= len_k && (!p.causal || n0 + BN - 1 <= m0 + len_k - len_q);
    if (interior) return;  // uniform over the CTA
  }
  // The tile's limits in 32-bit tile coordinates (compares per score stay 32-bit): rows below
  // rows_in and columns below cols_in are inside the sequences; plain causal shows column c to
  // row r where c - r <= diag (clamped: beyond [-BM, BN] every pair is on one side).
  const int rows_in = int(len_q - m0 < BM ? len_q - m0 : BM), cols_in = int(len_k - n0 < BN ? len_k - n0 : BN);
  const std::int64_t diag64 = kPlain && p.causal ? m0 - n0 + len_k - len_q : BN;
  const int diag = int(diag64 < -BM ? -BM : diag64 > BN ? BN : diag64);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) {
    const int r = get<0>(coords(i)), c = get<1>(coords(i));
    const bool inside = r < rows_in && c < cols_in;
    float t;
    if constexpr (kPlain)
      acc_s(i) = inside && c - r <= diag ? acc_s(i) : -INFINITY;
    else
      acc_s(i) = inside ? cuda::general_logit(p, acc_s(i), b, h, m0 + r, n0 + c, len_q, len_k, &t) : -INFINITY;
  }
}

// Online softmax over one key block, the scores' part (scores in cuda::log2_factor's units, `to_log2`):
// new row maxima (in the scores' units); row sums rescaled by correction = e^(old max - new max)
// and grown by the new terms; scores replaced by e^(score - max). What was accumulated in O still
// needs the correction (rescale_rows).
template <int kRows, class Acc>
__device__ __forceinline__ void online_softmax_scores(Acc& acc_s, float (&row_max)[kRows], float (&row_sum)[kRows],
                                                      float (&correction)[kRows], float to_log2) {
  cute::Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    float mx = row_max[r];
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c) mx = fmaxf(mx, s_rc(r, c));
    mx = quad_max(mx);
    const float base = mx == -INFINITY ? 0.0f : mx * to_log2;  // a row with nothing visible yet stays 0
    correction[r] = cuda::exp2_ftz(row_max[r] * to_log2 - base);
    row_max[r] = mx;
    row_sum[r] *= correction[r];
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c) {
      const float e = cuda::exp2_ftz(fmaf(s_rc(r, c), to_log2, -base));
      s_rc(r, c) = e;
      row_sum[r] += e;
    }
  }
}

template <int kRows, class AccO>
__device__ __forceinline__ void rescale_rows(AccO& acc_o_rc, const float (&correction)[kRows]) {
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc_o_rc); ++c) acc_o_rc(r, c) *= correction[r];
  }
}

// Both parts at once, for kernels whose O accumulation of the previous block is complete here.
template <int kRows, class Acc, class AccO>
__device__ __forceinline__ void online_softmax_step(Acc& acc_s, AccO& acc_o_rc, float (&row_max)[kRows],
                                                    float (&row_sum)[kRows], float to_log2) {
  float correction[kRows];
  online_softmax_scores(acc_s, row_max, row_sum, correction, to_log2);
  rescale_rows(acc_o_rc, correction);
}

// O += P V for one key block: P (the exponentiated scores) rounded to Element and reused in
// registers as the A operand; V read from shared memory once its copy has landed.
// `prefetch_next_k` runs once every warp is past its reads of sK (after the barrier that
// publishes V), so the next key block's copy into sK overlaps these MMAs. The caller's next
// iteration waits for that copy and synchronizes before anything overwrites sV.
template <class Element, class Acc, class Mma, class CopyV, class SrcV, class ViewV, class FragV, class AccO,
          class Prefetch>
__device__ __forceinline__ void accumulate_pv(const Acc& acc_s, Mma& mma, const CopyV& copy_v, const SrcV& tOsVt,
                                              ViewV& tOrVt_view, FragV& tOrVt, AccO& acc_o,
                                              Prefetch&& prefetch_next_k) {
  cute::Tensor rP = make_tensor_like<Element>(acc_s);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) rP(i) = static_cast<Element>(acc_s(i));
  cute::Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));

  cp_async_wait<0>();  // V has landed (the only copy in flight)
  __syncthreads();     // ... for every warp; and every warp is done reading sK
  prefetch_next_k();
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(tOrP); ++kk) {
    cute::copy(copy_v, tOsVt(_, _, kk), tOrVt_view(_, _, kk));
    cute::gemm(mma, tOrP(_, _, kk), tOrVt(_, _, kk), acc_o);
  }
}

// Epilogue: out = acc / sum, lse = max + log(sum) (max back in natural units from cuda::log2_factor's,
// `to_log2`); rows that saw nothing: 0 and -inf.
template <class Element, int kRows, class AccO, class Coords>
__device__ __forceinline__ void store_forward_output(const AccO& acc_o_rc, const Coords& tOcO_rc,
                                                     const float (&row_max)[kRows], const float (&row_sum)[kRows],
                                                     float to_log2, const Problem& p, std::int64_t b,
                                                     std::int64_t h, std::int64_t q0, std::int64_t m0,
                                                     std::int64_t len_q, Element* out, float* lse, int tid) {
  Element* o_base = out + p.out.at(b, h, q0);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const std::int64_t row = m0 + get<0>(tOcO_rc(r, 0));
    if (row < len_q) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc_o_rc); ++c)
        o_base[row * p.out.s + get<1>(tOcO_rc(r, c))] = static_cast<Element>(acc_o_rc(r, c) * inv);
      if (lse != nullptr && tid % 4 == 0)
        lse[p.lse.at(b, h, q0 + row)] = sum > 0.0f ? row_max[r] * (to_log2 * cuda::kLn2) + logf(sum) : -INFINITY;
    }
  }
}

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(Sm80Config<Element, kHeadDim, kHeadDimV>::kThreads)
    forward_sm80_kernel(const __grid_constant__ Problem p, const Element* __restrict__ q, const Element* __restrict__ k,
                        const Element* __restrict__ v, Element* __restrict__ out, float* __restrict__ lse) {
  using Cfg = Sm80Config<Element, kHeadDim, kHeadDimV>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const int m_block = cuda::query_block_heaviest_first();
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t m0 = std::int64_t(m_block) * BM;
  if (m0 >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x;

  // Global views: rows of this (batch, head), the last axis dense.
  cute::Tensor gQ = head_rows<kHeadDim>(q, p.q, b, h, q0, len_q);
  cute::Tensor gK = head_rows<kHeadDim>(k, p.k, b, hk, k0, len_k);
  cute::Tensor gV = head_rows<kHeadDimV>(v, p.v, b, hk, k0, len_k);
  cute::Tensor gQtile = local_tile(gQ, Shape<Int<BM>, Int<kHeadDim>>{}, make_coord(m_block, 0));  // (BM, D)
  cute::Tensor gKtiles = local_tile(gK, Shape<Int<BN>, Int<kHeadDim>>{}, make_coord(_, 0));       // (BN, D, n)
  cute::Tensor gVtiles = local_tile(gV, Shape<Int<BN>, Int<kHeadDimV>>{}, make_coord(_, 0));  // (BN, Dv, n)

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sK = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sVt = make_tensor(sV.data(), typename Cfg::SmemLayoutVt{});

  // Global -> shared (cp.async), with row coordinates for the tail predicates.
  typename Cfg::GmemCopy gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  cute::Tensor tQg = gmem_thr.partition_S(gQtile);
  cute::Tensor tQs = gmem_thr.partition_D(sQ);
  cute::Tensor tKg = gmem_thr.partition_S(gKtiles);
  cute::Tensor tKs = gmem_thr.partition_D(sK);
  cute::Tensor tVg = gmem_thr.partition_S(gVtiles);
  cute::Tensor tVs = gmem_thr.partition_D(sV);
  cute::Tensor tQc = gmem_thr.partition_S(make_identity_tensor(Shape<Int<BM>, Int<kHeadDim>>{}));
  cute::Tensor tKc = gmem_thr.partition_S(make_identity_tensor(Shape<Int<BN>, Int<kHeadDim>>{}));
  cute::Tensor tVc = gmem_thr.partition_S(make_identity_tensor(Shape<Int<BN>, Int<kHeadDimV>>{}));

  // Tensor-core partitions and the shared -> register (ldmatrix) copies feeding them.
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_mma.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K)
  cute::Tensor tSrK = thr_mma.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K)
  cute::Tensor tOrVt = thr_mma.partition_fragment_B(sVt);  // (MMA, MMA_D, MMA_KEYS)
  cute::Tensor acc_o = partition_fragment_C(mma, Shape<Int<BM>, Int<kHeadDimV>>{});
  clear(acc_o);

  auto copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_q = copy_q.get_thread_slice(tid);
  cute::Tensor tSsQ = thr_copy_q.partition_S(sQ);
  cute::Tensor tSrQ_view = thr_copy_q.retile_D(tSrQ);
  auto copy_k = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_k = copy_k.get_thread_slice(tid);
  cute::Tensor tSsK = thr_copy_k.partition_S(sK);
  cute::Tensor tSrK_view = thr_copy_k.retile_D(tSrK);
  auto copy_v = make_tiled_copy_B(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  auto thr_copy_v = copy_v.get_thread_slice(tid);
  cute::Tensor tOsVt = thr_copy_v.partition_S(sVt);
  cute::Tensor tOrVt_view = thr_copy_v.retile_D(tOrVt);

  // (row, col) of every accumulator element of this thread.
  cute::Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
  cute::Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<kHeadDimV>>{}));
  cute::Tensor tOcO_rc = make_tensor(tOcO.data(), rowcol(tOcO.layout()));
  cute::Tensor acc_o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  float row_max[kRows], row_sum[kRows];  // maxima in the scores' units (cuda::log2_factor)
  const float to_log2 = cuda::log2_factor<kPlain>(p);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;

  std::int64_t n_first, n_last;
  const std::int64_t rows_here = len_q - m0 < BM ? len_q - m0 : BM;
  cuda::key_block_range(p, m0, rows_here, len_q, len_k, BN, n_first, n_last);

  // Loads overlap the MMAs (FlashAttention-2's order): V of block n streams in while S = Q K^T
  // and the softmax run, K of block n + 1 while O += P V runs. One buffer each for K and V.
  copy_rows(gmem_copy, tQg, tQs, tQc, len_q - m0);
  if (n_first < n_last) copy_rows(gmem_copy, tKg(_, _, _, n_first), tKs, tKc, len_k - n_first * BN);
  cp_async_fence();

  for (std::int64_t n = n_first; n < n_last; ++n) {
    const std::int64_t n0 = n * BN;
    cp_async_wait<0>();  // Q and K of block n have landed
    __syncthreads();     // ... for every warp; and every warp is done with sV (last block's P V)
    copy_rows(gmem_copy, tVg(_, _, _, n), tVs, tVc, len_k - n0);
    cp_async_fence();

    cute::Tensor acc_s = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
    clear(acc_s);
    CUTE_UNROLL
    for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
      cute::copy(copy_q, tSsQ(_, _, kk), tSrQ_view(_, _, kk));
      cute::copy(copy_k, tSsK(_, _, kk), tSrK_view(_, _, kk));
      cute::gemm(mma, tSrQ(_, _, kk), tSrK(_, _, kk), acc_s);
    }

    mask_scores<kPlain, BM, BN>(acc_s, tScS, p, b, h, m0, n0, len_q, len_k);
    online_softmax_step(acc_s, acc_o_rc, row_max, row_sum, to_log2);
    accumulate_pv<Element>(acc_s, mma, copy_v, tOsVt, tOrVt_view, tOrVt, acc_o, [&] {
      if (n + 1 < n_last) {
        copy_rows(gmem_copy, tKg(_, _, _, n + 1), tKs, tKc, len_k - n0 - BN);
        cp_async_fence();
      }
    });
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (the Q load when no key block was visible)

  store_forward_output(acc_o_rc, tOcO_rc, row_max, row_sum, to_log2, p, b, h, q0, m0, len_q, out, lse, tid);
}

}  // namespace rudnn::attention::flash

#include "core/cuda_check.hpp"

namespace rudnn::attention::flash {

// Host side of every flash forward kernel: one CTA of `threads` per `rows_per_cta` query rows of
// each (head, sequence), the plain instantiation when Problem::plain_scores() allows it, the
// general one otherwise. supports (attention_cuda.cu) has checked dtype, head dims, alignment and
// grid limits. `extra` follows lse among the kernel's arguments (the sm90ws kernel's TMA
// descriptors).
template <class Element, class Kernel, class... Extra>
void launch_forward_kernel(const Problem& p, Kernel plain, Kernel general, int rows_per_cta, int threads,
                           int smem_bytes, const void* q, const void* k, const void* v, void* out, float* lse,
                           Stream stream, const Extra&... extra) {
  const std::int64_t m_blocks = (p.sq + rows_per_cta - 1) / rows_per_cta;
  if (m_blocks == 0 || p.hq == 0 || p.batch == 0) return;
  const dim3 grid(unsigned(m_blocks), unsigned(p.hq), unsigned(p.batch));
  Kernel kernel = p.plain_scores() ? plain : general;
  if (smem_bytes > 48 * 1024)
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, static_cast<cudaStream_t>(stream)>>>(
      p, static_cast<const Element*>(q), static_cast<const Element*>(k), static_cast<const Element*>(v),
      static_cast<Element*>(out), lse, extra...);
  RUDNN_CUDA_CHECK_LAUNCH("attention flash forward kernel");
}

// Calls launch(Element{}) with the problem's element type, float16 or bfloat16: what each
// flash_*_d*.cu instantiation file does for its head dims.
template <class Launch>
void with_element_type(DType dtype, Launch&& launch) {
  if (dtype == DType::f16)
    launch(cute::half_t{});
  else
    launch(cute::bfloat16_t{});
}

template <class Element, int kHeadDim, int kHeadDimV = kHeadDim>
void launch_forward_sm80(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                         Stream stream) {
  using Cfg = Sm80Config<Element, kHeadDim, kHeadDimV>;
  launch_forward_kernel<Element>(p, forward_sm80_kernel<Element, kHeadDim, kHeadDimV, true>,
                                 forward_sm80_kernel<Element, kHeadDim, kHeadDimV, false>, Cfg::kBlockM, Cfg::kThreads,
                                 Cfg::kSmemBytes, q, k, v, out, lse, stream);
}

}  // namespace rudnn::attention::flash
