// The "flash" forward kernel for Hopper (sm90a): the sm80 kernel's schedule with both GEMMs
// issued as warpgroup MMAs (wgmma). One warpgroup (4 warps) owns 64 query rows and walks the keys
// in blocks of 128 (64 for D < 128 and Dv = 256: forward_keys_per_block). Head dims: D any
// multiple of 32 (the library builds 64, 96, 128, 192, 256), Dv 64, 96, 128 or 256 (one wgmma
// atom wide).
//   S = Q K^T   wgmma SS: Q and K read from shared memory in the GMMA 128-byte-swizzled K-major
//               layout;
//   O += P V    wgmma RS: P (the exponentiated scores, rounded to Element) straight from the
//               registers of the S accumulator, V from shared memory in the 128-byte-swizzled
//               MN-major layout (V rows are keys = the GEMM's K; Dv, its N, is contiguous).
//
// What it does NOT have yet (FlashAttention-3's schedule): TMA loads, producer/consumer warp
// specialization with an mbarrier pipeline, two consumer warpgroups with softmax overlapped
// against the other's GEMMs. Loads are cp.async, overlapped with the MMAs in FlashAttention-2's
// order.
//
// Both wgmma accumulators hold, per thread, exactly the (row, col) elements of the mma.sync
// accumulator in the same register order (checked on the host by
// cpp/tools/flash_sm90_layout_check.cu), so the sm80 masking, softmax and epilogue apply unchanged
// through mma.sync-ordered views of the same registers.
#pragma once

#include <cutlass/arch/barrier.h>

#include "attention/flash_sm80.cuh"

namespace rudnn::attention::flash {

// The f16 or the bf16 one of two wgmma atoms, by Element.
template <class Element, class Half, class BFloat>
using ByElement = std::conditional_t<std::is_same_v<Element, cute::half_t>, Half, BFloat>;

// The RS wgmma atom of width N (A = a 64 x 16 register fragment, B an MN-major tile of shared
// memory): O += P V (N = Dv) here, and the backward's dQ, dK (N = D) and dV products.
template <class Element, int N>
struct GmmaRSAtom {
  static_assert(N == 64 || N == 96 || N == 128 || N == 192 || N == 256, "RS wgmma widths: 64, 96, 128, 192, 256");
  using Major = GMMA::Major;
  template <class Half, class BFloat>
  using ByType = ByElement<Element, Half, BFloat>;
  using type = std::conditional_t<
      N == 64,
      ByType<SM90::GMMA::MMA_64x64x16_F32F16F16_RS<Major::K, Major::MN>,
             SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<Major::K, Major::MN>>,
      std::conditional_t<
          N == 96,
          ByType<SM90::GMMA::MMA_64x96x16_F32F16F16_RS<Major::K, Major::MN>,
                 SM90::GMMA::MMA_64x96x16_F32BF16BF16_RS<Major::K, Major::MN>>,
          std::conditional_t<
              N == 128,
              ByType<SM90::GMMA::MMA_64x128x16_F32F16F16_RS<Major::K, Major::MN>,
                     SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<Major::K, Major::MN>>,
              std::conditional_t<N == 192,
                                 ByType<SM90::GMMA::MMA_64x192x16_F32F16F16_RS<Major::K, Major::MN>,
                                        SM90::GMMA::MMA_64x192x16_F32BF16BF16_RS<Major::K, Major::MN>>,
                                 ByType<SM90::GMMA::MMA_64x256x16_F32F16F16_RS<Major::K, Major::MN>,
                                        SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<Major::K, Major::MN>>>>>>;
};
template <class Element, int N>
using TiledMmaRS = decltype(make_tiled_mma(typename GmmaRSAtom<Element, N>::type{}));

// The SS wgmma atom of width N (A and B K-major tiles of shared memory): S = Q K^T with N the
// keys of a block (forward_keys_per_block: 64 or 128), and the backward's S^T and dP^T (64).
template <class Element, int N>
struct GmmaSSAtom {
  static_assert(N == 64 || N == 128, "SS wgmma widths: 64, 128");
  using Major = GMMA::Major;
  using type = std::conditional_t<N == 64,
                                  ByElement<Element, SM90::GMMA::MMA_64x64x16_F32F16F16_SS<Major::K, Major::K>,
                                            SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<Major::K, Major::K>>,
                                  ByElement<Element, SM90::GMMA::MMA_64x128x16_F32F16F16_SS<Major::K, Major::K>,
                                            SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<Major::K, Major::K>>>;
};

// D = kHeadDim (the K dim of S = Q K^T), Dv = kHeadDimV (the N of O += P V: one RS wgmma atom
// of that width) and kKeys keys per block (the N of S: 64 in the backward, the forwards'
// forward_keys_per_block). Rows of 64-multiple head dims sit in 128-byte swizzle atoms
// (64 columns each), others (96) in 64-byte ones (32 columns). The mma.sync TiledMma of the base
// stays: the accumulators are seen through it (see the top of this file).
template <class Element, int kHeadDim, int kHeadDimV = kHeadDim, int kKeys = 64>
struct Sm90Config : Sm80Config<Element, kHeadDim, kHeadDimV> {
  using Base = Sm80Config<Element, kHeadDim, kHeadDimV>;
  static_assert(Base::kBlockM == 64, "one 64-row warpgroup");
  static_assert(kHeadDim % 32 == 0, "D in whole 64- or 128-byte swizzle atoms");
  static constexpr int kBlockN = kKeys;
  using Major = GMMA::Major;

  using TiledMmaS = decltype(make_tiled_mma(typename GmmaSSAtom<Element, kKeys>::type{}));
  using TiledMmaO = TiledMmaRS<Element, kHeadDimV>;

  using AtomK = std::conditional_t<kHeadDim % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                   GMMA::Layout_K_SW64_Atom<Element>>;
  using AtomMN = std::conditional_t<kHeadDimV % 64 == 0, GMMA::Layout_MN_SW128_Atom<Element>,
                                    GMMA::Layout_MN_SW64_Atom<Element>>;
  using SmemLayoutQ = decltype(tile_to_shape(AtomK{}, Shape<Int<Base::kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(AtomK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V as the B operand of P V: [Dv, BN] with Dv contiguous (MN-major), and the same bytes seen as
  // [BN, Dv] for the loads of V's rows. The slabs of Dv (64 columns, or 32 for Dv = 96) are
  // outermost (each BN keys x the atom's row bytes, like K's): TMA boxes of 64 keys of one
  // 64-column slab (flash_sm90_ws.cuh).
  using SmemLayoutVt =
      decltype(tile_to_shape(AtomMN{}, Shape<Int<kHeadDimV>, Int<kBlockN>>{}, Step<_2, _1>{}));
  using SmemLayoutV = decltype(composition(SmemLayoutVt{},
                                           make_layout(Shape<Int<kBlockN>, Int<kHeadDimV>>{}, GenRowMajor{})));
  static constexpr int kSmemBytes =
      (Base::kBlockM * kHeadDim + kBlockN * (kHeadDim + kHeadDimV)) * int(sizeof(Element));
};

// Keys per block of the sm90a forwards: 128 where a warpgroup's S (64 x 128 floats) fits its
// registers beside O (64 x Dv) and P (Dv <= 128), as FlashAttention-3 takes, else 64. Twice the
// keys per block halves the per-block work that does not scale with the keys (waits, barriers,
// the row maxima's shuffles, O's rescale), and S = Q K^T at N = 128 reads a byte of shared
// memory per 43 flops instead of 32 (each wgmma reads its 64 x 16 slice of Q, whatever its N).
// The warp-specialized kernel runs one CTA per SM anyway; the sm90 kernel takes 128 only where
// its occupancy stays (D >= 128: ~180 registers at 64 keys, ~250 at 128, two CTAs per SM either
// way; at D = 64 and 96 the 64-key kernel's ~130 registers allow three or four).
constexpr int forward_keys_per_block(int head_dim, int head_dim_v, bool warp_specialized) {
  return head_dim_v <= 128 && (warp_specialized || head_dim >= 128) ? 128 : 64;
}
template <class Element, int kHeadDim, int kHeadDimV>
using Sm90ForwardConfig =
    Sm90Config<Element, kHeadDim, kHeadDimV, forward_keys_per_block(kHeadDim, kHeadDimV, false)>;

// Zeroes rows [first_row, rows) of a tile that TMA loaded in 128-byte slabs (`slabs` of them,
// `slab_bytes` apart, each its `rows` rows of 128 bytes in order: the 128-byte swizzle permutes the
// 16-byte chunks within a row only), shared among `lanes` threads of which this is `lane`. For the
// warp-specialized kernels' packed variable-length batches (tma_operand): a tail tile's rows past
// its sequence hold the next sequence's, which a product must not read, since P = 0 or dS = 0 there
// does not stop 0 x Inf = NaN. The caller orders these generic-proxy stores before the wgmma reads
// (fence.proxy.async, then the tile's mbarrier).
__device__ __forceinline__ void clear_tile_rows(unsigned char* tile, int slab_bytes, int slabs, int rows,
                                                int first_row, int lane, int lanes) {
  if (first_row < 0) first_row = 0;
  const int chunks_per_slab = (rows - first_row) * 8;  // 16-byte chunks
  for (int c = lane; c < slabs * chunks_per_slab; c += lanes) {
    const int slab = c / chunks_per_slab, chunk = c % chunks_per_slab;
    *reinterpret_cast<uint4*>(tile + slab * slab_bytes + first_row * 128 + chunk * 16) = uint4{0u, 0u, 0u, 0u};
  }
}

// The k steps of one wgmma product, issue only (the caller fences, arrives, commits and waits):
// acc = A B, the first k step overwriting the accumulator ...
template <class Mma, class FragA, class FragB, class Acc>
__device__ __forceinline__ void wgmma_overwrite(Mma& mma, FragA const& a, FragB const& b, Acc& acc) {
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(a); ++kk) {
    cute::gemm(mma, a(_, _, kk), b(_, _, kk), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
}

// ... or acc += A B.
template <class Mma, class FragA, class FragB, class Acc>
__device__ __forceinline__ void wgmma_accumulate(Mma& mma, FragA const& a, FragB const& b, Acc& acc) {
  mma.accumulate_ = GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(a); ++kk) cute::gemm(mma, a(_, _, kk), b(_, _, kk), acc);
}

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(128)
    forward_sm90_kernel(const __grid_constant__ Problem p, const Element* __restrict__ q, const Element* __restrict__ k,
                        const Element* __restrict__ v, Element* __restrict__ out, float* __restrict__ lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90ForwardConfig<Element, kHeadDim, kHeadDimV>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const int m_block = cuda::query_block_heaviest_first();
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t m0 = std::int64_t(m_block) * BM;
  if (m0 >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x;

  const HeadRows<Element> rows_q = head_rows(q, p.q, b, h, q0, len_q);
  const HeadRows<Element> rows_k = head_rows(k, p.k, b, hk, k0, len_k);
  const HeadRows<Element> rows_v = head_rows(v, p.v, b, hk, k0, len_k);
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  cute::Tensor sK = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutK{});
  cute::Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutV{});
  cute::Tensor sVt = make_tensor(sV.data(), typename Cfg::SmemLayoutVt{});
  const typename Cfg::template Loader<typename Cfg::SmemLayoutQ> q_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutK> k_loader(tid);
  const typename Cfg::template Loader<typename Cfg::SmemLayoutV> v_loader(tid);

  // S = Q K^T: wgmma with shared-memory descriptors for both operands.
  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));  // descriptors (MMA, 1, D/16)
  cute::Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK));

  // O += P V: wgmma with P from registers and V through shared-memory descriptors.
  typename Cfg::TiledMmaO mma_o;  // the accumulator starts cleared and always accumulates
  auto thr_o = mma_o.get_thread_slice(tid);
  cute::Tensor tOrV = thr_o.make_fragment_B(thr_o.partition_B(sVt));  // descriptors (MMA, 1, BN/16)
  cute::Tensor acc_o90 = partition_fragment_C(mma_o, Shape<Int<BM>, Int<kHeadDimV>>{});
  clear(acc_o90);

  // The accumulators seen in mma.sync order (the same registers; see the top of this file), with
  // the (row, col) of each element: what the shared masking, softmax and epilogue take.
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  using AccLayoutS = decltype(partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{}).layout());
  using AccLayoutO = decltype(partition_fragment_C(mma, Shape<Int<BM>, Int<kHeadDimV>>{}).layout());
  cute::Tensor acc_o = make_tensor(acc_o90.data(), AccLayoutO{});
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

  // Loads overlap the MMAs as in the sm80 kernel: V of block n during S and the softmax, K of
  // block n + 1 during O += P V.
  q_loader.load(rows_q, m0, raw_pointer_cast(sQ.data()));
  if (n_first < n_last) k_loader.load(rows_k, n_first * BN, raw_pointer_cast(sK.data()));
  cp_async_fence();

  for (std::int64_t n = n_first; n < n_last; ++n) {
    const std::int64_t n0 = n * BN;
    cp_async_wait<0>();                        // Q and K of block n have landed
    cutlass::arch::fence_view_async_shared();  // make these generic-proxy writes visible to wgmma
    __syncthreads();                           // ... for every warp; every warp is done with sV
    v_loader.load(rows_v, n0, raw_pointer_cast(sV.data()));
    cp_async_fence();

    cute::Tensor acc_s90 = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
    warpgroup_fence_operand(acc_s90);
    warpgroup_arrive();
    wgmma_overwrite(mma_s, tSrQ, tSrK, acc_s90);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s90);
    cute::Tensor acc_s = make_tensor(acc_s90.data(), AccLayoutS{});

    mask_scores<kPlain, BM, BN>(acc_s, tScS, p, b, h, m0, n0, len_q, len_k);
    online_softmax_step(acc_s, acc_o_rc, row_max, row_sum, to_log2);

    // P rounded to Element, in the registers the RS wgmma reads as its A operand (per k step of 16
    // keys, the m16n8k16-style fragment of the thread's rows: the mma.sync A order).
    cute::Tensor rP = make_tensor_like<Element>(acc_s);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) rP(i) = static_cast<Element>(acc_s(i));
    cute::Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));

    cp_async_wait<0>();                        // V has landed (the only copy in flight)
    cutlass::arch::fence_view_async_shared();  // ... visible to wgmma
    __syncthreads();                           // ... for every warp; every warp is done reading sK
    if (n + 1 < n_last) {                      // K of block n + 1 streams in during P V
      k_loader.load(rows_k, n0 + BN, raw_pointer_cast(sK.data()));
      cp_async_fence();
    }
    warpgroup_fence_operand(rP);  // P is in its registers before the fence (else ptxas adds one: C7519)
    warpgroup_fence_operand(acc_o90);
    warpgroup_arrive();
    wgmma_accumulate(mma_o, tOrP, tOrV, acc_o90);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o90);
  }
  cp_async_wait<0>();

  store_forward_output(acc_o_rc, tOcO_rc, row_max, row_sum, to_log2, p, b, h, q0, m0, len_q, out, lse, tid);
#else
  (void)p, (void)q, (void)k, (void)v, (void)out, (void)lse;  // compiled for sm_90a only
#endif
}

template <class Element, int kHeadDim, int kHeadDimV>
void launch_forward_sm90(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                         Stream stream) {
  using Cfg = Sm90ForwardConfig<Element, kHeadDim, kHeadDimV>;
  launch_forward_kernel<Element>(p, forward_sm90_kernel<Element, kHeadDim, kHeadDimV, true>,
                                 forward_sm90_kernel<Element, kHeadDim, kHeadDimV, false>, Cfg::kBlockM, 128,
                                 Cfg::kSmemBytes, q, k, v, out, lse, stream);
}

}  // namespace rudnn::attention::flash
