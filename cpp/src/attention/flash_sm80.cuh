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
#include "core/pack.cuh"

namespace rudnn::attention::flash {

using namespace cute;

// Rows of one (batch, head) of a global operand whose last axis is dense: row i of the sequence
// at base + i * stride, `len` rows in it. What every flash kernel loads its tiles from.
template <class Element>
struct HeadRows {
  const Element* base;
  std::int64_t stride, len;
};

template <class Element>
__device__ __forceinline__ HeadRows<Element> head_rows(const Element* base, const Strides& s, std::int64_t b,
                                                       std::int64_t h, std::int64_t first, std::int64_t len) {
  return {base + s.at(b, h, first), s.s, len};
}

// Whether a swizzled layout's swizzle acts on byte addresses (CuTe's GMMA layouts, whose offset is
// an smem_ptr_flag) rather than on element offsets.
template <class Offset>
struct swizzles_bytes : std::false_type {};
template <int kBits>
struct swizzles_bytes<cute::smem_ptr_flag_bits<kBits>> : std::true_type {};

// cp.async loads of (kRows x kCols) tiles of 16-bit elements into the swizzled shared-memory
// layout SmemLayout, by kThreads threads in rows of kThreadsPerRow, 16 bytes per copy. A thread's
// chunks are rows r0 + i kRowStep and columns c0 + j kColStep; kRowStep is a multiple of the
// swizzle atom's 8 rows and kColStep an atom's width, so in shared memory each chunk is a fixed
// offset from the thread's first (chunk_offsets_are_fixed_steps, checked at compile time), and
// in global memory a row step is one pointer add. CuTe's partitions work out each
// chunk's swizzled address and 64-bit row offset afresh: ~15 instructions per 16-byte copy in the
// sm90a forward's loop, where this takes one or two. Rows at or past the sequence's end are
// zero-filled by the copy itself (src-size 0 reads nothing), so a tail tile needs no stores.
template <class Element, class SmemLayout, int kThreads, int kThreadsPerRow>
struct TileLoader {
  static constexpr int kRows = decltype(size<0>(SmemLayout{}))::value;
  static constexpr int kCols = decltype(size<1>(SmemLayout{}))::value;
  static constexpr int kChunk = 16 / int(sizeof(Element));  // elements per copy
  static constexpr int kRowStep = kThreads / kThreadsPerRow;
  static constexpr int kColStep = kChunk * kThreadsPerRow;
  static constexpr int kRowSteps = kRows / kRowStep, kColSteps = kCols / kColStep;
  static_assert(sizeof(Element) == 2 && kThreads % kThreadsPerRow == 0 && kRows % kRowStep == 0 &&
                    kCols % kColStep == 0,
                "the threads tile the tile in whole 16-byte chunks");
  // Where the layout puts element (r, c): Swizzle(Unswizzled(r, c)). A plain composition (the sm80
  // layouts) swizzles element offsets; the GMMA layouts (their offset an smem_ptr_flag) swizzle
  // byte addresses, the same thing for a tile that starts on the swizzle's period.
  using Unswizzled = decltype(SmemLayout{}.layout_b());
  using Swizzle = decltype(SmemLayout{}.layout_a());
  static constexpr int kUnit = swizzles_bytes<decltype(SmemLayout{}.offset())>::value ? int(sizeof(Element)) : 1;
  static constexpr int kSwizzlePeriod = 1 << (Swizzle::num_bits + Swizzle::num_base + Swizzle::num_shft);
  static constexpr int kSmemRowStep = kRowSteps > 1 ? Unswizzled{}(kRowStep, 0) - Unswizzled{}(0, 0) : 0;
  static constexpr int kSmemColStep = kColSteps > 1 ? Unswizzled{}(0, kColStep) - Unswizzled{}(0, 0) : 0;
  // Why chunk (i, j) of a thread is its first chunk + i kSmemRowStep + j kSmemColStep: Unswizzled
  // is a sum of a function of r and one of c (a CuTe layout sums its modes); both advance by
  // their step for every step of the thread's (checked for every row and column); the steps are
  // whole periods of the swizzle, which only permutes bits below a period (x ^ z + d = (x + d) ^ z
  // when z is below the period and d a multiple of it); and a chunk is kChunk adjacent elements
  // starting on a multiple of kChunk, below the bits the swizzle moves.
  static constexpr bool chunk_offsets_are_fixed_steps() {
    constexpr Unswizzled lb{};
    if (Swizzle::num_shft <= 0 || kSmemRowStep * kUnit % kSwizzlePeriod != 0 ||
        kSmemColStep * kUnit % kSwizzlePeriod != 0 || (1 << Swizzle::num_base) % (kChunk * kUnit) != 0)
      return false;
    for (int r = 0; r < kRows; ++r)
      if ((lb(r, 0) - lb(0, 0)) % kChunk != 0 || (r >= kRowStep && lb(r, 0) != lb(r - kRowStep, 0) + kSmemRowStep))
        return false;
    for (int c = 0; c < kCols; ++c)
      if (lb(0, c) != lb(0, c / kChunk * kChunk) + c % kChunk || (lb(0, c - c % kChunk) - lb(0, 0)) % kChunk != 0 ||
          (c >= kColStep && lb(0, c) != lb(0, c - kColStep) + kSmemColStep))
        return false;
    return lb(0, 0) % kChunk == 0;
  }
  static_assert(chunk_offsets_are_fixed_steps(), "TileLoader's offsets would disagree with the shared-memory layout");

  int row, col;  // the thread's first chunk

  __device__ explicit TileLoader(int tid) : row(tid / kThreadsPerRow), col(tid % kThreadsPerRow * kChunk) {}

  // Rows [first, first + kRows) of `src` into the tile at `tile`; rows at or past src.len as zeros.
  __device__ __forceinline__ void load(const HeadRows<Element>& src, std::int64_t first, Element* tile) const {
    const Element* from = src.base + (first + row) * src.stride + col;
    Element* to = &make_tensor(make_smem_ptr(tile), SmemLayout{})(row, col);
    const std::int64_t valid = src.len - first - row;  // of this thread's rows, those below it
    CUTE_UNROLL
    for (int i = 0; i < kRowSteps; ++i) {
      const bool in = i * kRowStep < valid;
      CUTE_UNROLL
      for (int j = 0; j < kColSteps; ++j)
        SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
            *reinterpret_cast<const cute::uint128_t*>(from + j * kColStep),
            *reinterpret_cast<cute::uint128_t*>(to + i * kSmemRowStep + j * kSmemColStep), in);
      from += kRowStep * src.stride;
    }
  }
};

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

  // cp.async loads by rows of kAtomCols / 8 threads: one swizzle atom's width of a row, 16 bytes each.
  static constexpr int kCopyThreadsPerRow = kAtomCols / 8;
  template <class SmemLayout>
  using Loader = TileLoader<Element, SmemLayout, kThreads, kCopyThreadsPerRow>;

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
// sequences; else, in the plain kernels (Problem::plain_scores: no mask, bias or softcap), the raw
// dot with causal and window visibility by position (cuda::TileBand), or the whole transform
// (scale, softcap, bias, masks; cuda::general_logit). coords(i) is the (row, col) of accumulator
// element i within the BM x BN tile. A plain tile that the band covers whole (most tiles of a
// long sequence) needs no masking.
template <bool kPlain, int BM, int BN, class Acc, class Coords>
__device__ __forceinline__ void mask_scores(Acc& acc_s, const Coords& coords, const Problem& p, std::int64_t b,
                                            std::int64_t h, std::int64_t m0, std::int64_t n0, std::int64_t len_q,
                                            std::int64_t len_k) {
  const cuda::TileBand band = cuda::tile_band(p, m0, n0, len_q, len_k);
  if constexpr (kPlain) {
    if (band.covers(BM, BN)) return;  // uniform over the CTA
  }
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) {
    const int r = get<0>(coords(i)), c = get<1>(coords(i));
    float t;
    if constexpr (kPlain)
      acc_s(i) = band.visible(r, c) ? acc_s(i) : -INFINITY;
    else
      acc_s(i) = r < band.rows_in && c < band.cols_in
                     ? cuda::general_logit(p, acc_s(i), b, h, m0 + r, n0 + c, len_q, len_k, &t)
                     : -INFINITY;
  }
}

// The softcap instantiation's scores (Problem::softcap_scores: softcap, no mask or bias), in place,
// in natural units (cuda::log2_factor<false>): the transform inline (cuda::SoftcapTransform), then
// causal and window visibility by position as in the plain kernels (masked after the transform,
// so a NaN key outside the sequence still ends as -inf).
template <int BM, int BN, class Acc, class Coords>
__device__ __forceinline__ void softcap_scores(Acc& acc_s, const Coords& coords, const Problem& p, std::int64_t m0,
                                               std::int64_t n0, std::int64_t len_q, std::int64_t len_k) {
  const cuda::SoftcapTransform transform(p);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i) acc_s(i) = transform(acc_s(i));
  const cuda::TileBand band = cuda::tile_band(p, m0, n0, len_q, len_k);
  if (band.covers(BM, BN)) return;  // uniform over the CTA
  CUTE_UNROLL
  for (int i = 0; i < size(acc_s); ++i)
    acc_s(i) = band.visible(get<0>(coords(i)), get<1>(coords(i))) ? acc_s(i) : -INFINITY;
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
// `to_log2`); rows that saw nothing: 0 and -inf. Columns c and c + 1 (c even) of a thread's
// accumulator rows are neighbouring output columns, the first even (the mma.sync and wgmma C
// fragments hold two adjacent columns per thread): stored as one pair where out's rows allow it
// (even row stride, base aligned to the pair), else one element at a time. A quad's four pairs
// fill 8 (16-bit: 16) contiguous bytes of a row, where single elements left gaps per store.
template <class Element, int kRows, class AccO, class Coords>
__device__ __forceinline__ void store_forward_output(const AccO& acc_o_rc, const Coords& tOcO_rc,
                                                     const float (&row_max)[kRows], const float (&row_sum)[kRows],
                                                     float to_log2, const Problem& p, std::int64_t b,
                                                     std::int64_t h, std::int64_t q0, std::int64_t m0,
                                                     std::int64_t len_q, Element* out, float* lse, int tid) {
  Element* o_base = out + p.out.at(b, h, q0);
  constexpr int kCols = decltype(size<1>(acc_o_rc))::value;
  static_assert(kCols % 2 == 0, "pairs of adjacent columns");
  const bool pairs = p.out.s % 2 == 0 && core::pack_aligned<Element, 2>(o_base);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const std::int64_t row = m0 + get<0>(tOcO_rc(r, 0));
    if (row < len_q) {
      Element* o_row = o_base + row * p.out.s;
      if (pairs) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; c += 2)
          core::store_pack<Element, 2>(o_row + get<1>(tOcO_rc(r, c)),
                                       {{static_cast<Element>(acc_o_rc(r, c) * inv),
                                         static_cast<Element>(acc_o_rc(r, c + 1) * inv)}});
      } else {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) o_row[get<1>(tOcO_rc(r, c))] = static_cast<Element>(acc_o_rc(r, c) * inv);
      }
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

  // Rows of this (batch, head) in global memory, and their tiles in shared memory.
  const HeadRows<Element> rows_q = head_rows(q, p.q, b, h, q0, len_q);
  const HeadRows<Element> rows_k = head_rows(k, p.k, b, hk, k0, len_k);
  const HeadRows<Element> rows_v = head_rows(v, p.v, b, hk, k0, len_k);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sK = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sVt = make_tensor(sV.data(), typename Cfg::SmemLayoutVt{});
  const typename Cfg::template Loader<typename Cfg::SmemLayoutQ> q_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutK> k_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutV> v_loader(tid);

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
  q_loader.load(rows_q, m0, raw_pointer_cast(sQ.data()));
  if (n_first < n_last) k_loader.load(rows_k, n_first * BN, raw_pointer_cast(sK.data()));
  cp_async_fence();

  for (std::int64_t n = n_first; n < n_last; ++n) {
    const std::int64_t n0 = n * BN;
    cp_async_wait<0>();  // Q and K of block n have landed
    __syncthreads();     // ... for every warp; and every warp is done with sV (last block's P V)
    v_loader.load(rows_v, n0, raw_pointer_cast(sV.data()));
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
        k_loader.load(rows_k, n0 + BN, raw_pointer_cast(sK.data()));
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

// Host side of every flash forward kernel: launch_forward_kernel_on launches `kernel` on `grid`
// (the persistent sm90ws forward: its own grid and instantiation); launch_forward_kernel takes one
// CTA of `threads` per `rows_per_cta` query rows of each (head, sequence), the plain instantiation
// when Problem::plain_scores() allows it, the general one otherwise. supports (attention_cuda.cu)
// has checked dtype, head dims, alignment and grid limits. `extra` follows lse among the kernel's
// arguments (the sm90ws kernel's TMA descriptors and work items).
template <class Element, class Kernel, class... Extra>
void launch_forward_kernel_on(dim3 grid, const Problem& p, Kernel kernel, int threads, int smem_bytes, const void* q,
                              const void* k, const void* v, void* out, float* lse, Stream stream,
                              const Extra&... extra) {
  if (smem_bytes > 48 * 1024)
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, static_cast<cudaStream_t>(stream)>>>(
      p, static_cast<const Element*>(q), static_cast<const Element*>(k), static_cast<const Element*>(v),
      static_cast<Element*>(out), lse, extra...);
  RUDNN_CUDA_CHECK_LAUNCH("attention flash forward kernel");
}
template <class Element, class Kernel, class... Extra>
void launch_forward_kernel(const Problem& p, Kernel plain, Kernel general, int rows_per_cta, int threads,
                           int smem_bytes, const void* q, const void* k, const void* v, void* out, float* lse,
                           Stream stream, const Extra&... extra) {
  const std::int64_t m_blocks = (p.sq + rows_per_cta - 1) / rows_per_cta;
  if (m_blocks == 0 || p.hq == 0 || p.batch == 0) return;
  launch_forward_kernel_on<Element>(dim3(unsigned(m_blocks), unsigned(p.hq), unsigned(p.batch)), p,
                                    p.plain_scores() ? plain : general, threads, smem_bytes, q, k, v, out, lse,
                                    stream, extra...);
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
