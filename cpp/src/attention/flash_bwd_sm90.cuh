// The "flash" backward for Hopper (sm90a), every head-dim pair of the forward: the two kernels of
// the sm80 backward (flash_bwd_sm80.cuh, which also provides the delta kernel) with every product
// a warpgroup MMA (wgmma); 64 x 64 tiles.
//   dq     one warpgroup, 64 query rows per CTA; for each visible 64-key block
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
//          One warpgroup does all of it where dK and dV fit its registers together (D + Dv <= 256:
//          at most 128 accumulator floats per thread); wider heads ((192, 128), (256, 256)) split
//          it over two warpgroups, one per gradient (dkdv_sm90_split_kernel).
// Q, dO, K and V tiles are stored once each, [64, D] or [64, Dv] K-major with the GMMA swizzle;
// the MN-major B operands are the same bytes seen as [D, 64]. Loads are cp.async into two stages:
// the next block's tiles stream in during this block's products. Deterministic: no atomics.
#pragma once

#include "attention/flash_bwd_sm80.cuh"
#include "attention/flash_sm90.cuh"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim, int kHeadDimV = kHeadDim>
struct Sm90BwdConfig : Sm90Config<Element, kHeadDim, kHeadDimV> {
  using Base = Sm90Config<Element, kHeadDim, kHeadDimV>;
  static constexpr int BM = Base::kBlockM, BN = Base::kBlockN;
  static_assert(BM == BN, "every tile is [64, D] or [64, Dv]");
  // A [64, W] tile of rows (W = D: Q, K; W = Dv: dO, V), K-major in 128-byte swizzle atoms (64
  // columns) or 64-byte ones (32 columns: W = 96), and the same bytes seen as [W, 64] (MN-major).
  template <int W>
  using Rows = decltype(tile_to_shape(std::conditional_t<W % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                                         GMMA::Layout_K_SW64_Atom<Element>>{},
                                      Shape<Int<BM>, Int<W>>{}));
  template <int W>
  using RowsT = decltype(composition(Rows<W>{}, make_layout(Shape<Int<W>, Int<BM>>{}, GenRowMajor{})));
  using TiledMmaD = TiledMmaRS<Element, kHeadDim>;    // dQ += dS K and dK += dS^T Q
  using TiledMmaDv = TiledMmaRS<Element, kHeadDimV>;  // dV += P^T dO
  static constexpr int kBytesD = BM * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesDv = BM * kHeadDimV * int(sizeof(Element));
  // Shared memory of both kernels: the pair of tiles a CTA keeps (Q and dO in dq, K and V in
  // dk/dv: a D tile, then a Dv tile), then two stages of the pair it streams (K and V; Q and dO),
  // each at kPairBytes * (1 + stage); then, dk/dv, lse and delta of each stage's 64 queries, and in
  // the split kernel the dS weights one warpgroup hands the other (64 x 64 floats).
  static constexpr int kPairBytes = kBytesD + kBytesDv;
  static constexpr int kDqSmemBytes = 3 * kPairBytes;
  static constexpr int kStatsOffset = 3 * kPairBytes;
  static constexpr int kWeightsOffset = kStatsOffset + 2 * 2 * BM * int(sizeof(float));
  static constexpr bool kSplitDkdv = kHeadDim + kHeadDimV > 256;
  static constexpr int kDkdvSmemBytes = kWeightsOffset + (kSplitDkdv ? BM * BN * int(sizeof(float)) : 0);
  static constexpr int kDkdvThreads = kSplitDkdv ? 256 : 128;
  static_assert(kPairBytes % 1024 == 0, "tiles start on the 1024-byte period of the swizzle");
  // dkdv_sm90_kernel's cp.async thread layout (it does not use TileLoader; see there).
  using DkdvGmemCopy = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      Layout<Shape<Int<128 / Base::kCopyThreadsPerRow>, Int<Base::kCopyThreadsPerRow>>,
             Stride<Int<Base::kCopyThreadsPerRow>, _1>>{},
      Layout<Shape<_1, _8>>{}));
};

// The dynamic shared memory at a byte offset, and a tile there.
template <class Element>
__device__ __forceinline__ Element* smem_at(unsigned char* smem, int byte_offset) {
  return reinterpret_cast<Element*>(smem + byte_offset);
}
template <class Element, class Layout>
__device__ __forceinline__ auto smem_tile(unsigned char* smem, int byte_offset, Layout layout) {
  return make_tensor(make_smem_ptr(smem_at<Element>(smem, byte_offset)), layout);
}

// lse (thread t < 64) and delta (64 <= t < 128) of the 64 queries from m0 of head (b, h) into
// stats[t]: what the dk/dv kernels read per element (the accumulators leave no registers for
// them). -inf and 0 past the sequence.
__device__ __forceinline__ void load_query_stats(const Problem& p, const float* lse, const float* delta,
                                                 float* stats, std::int64_t b, std::int64_t h, std::int64_t q0,
                                                 std::int64_t m0, std::int64_t len_q, int t) {
  constexpr int BM = 64;
  if (t >= 2 * BM) return;
  const std::int64_t row = m0 + t % BM;
  float value = t < BM ? -INFINITY : 0.0f;
  if (row < len_q) value = t < BM ? lse[p.lse.at(b, h, q0 + row)] : delta[cuda::delta_index(p, b, h, q0 + row)];
  stats[t] = value;
}

// Two products as one wgmma group, waited for: acc1 = A1 B1 (kOverwrite1) or acc1 += A1 B1, then
// acc2 = A2 B2 (kOverwrite2) or acc2 += A2 B2. The MMA types may differ (dV and dK of different
// widths), and acc2 may be acc1 (acc = A1 B1 + A2 B2: dQ over both key halves).
template <bool kOverwrite1, bool kOverwrite2, class Mma1, class A1, class B1, class Acc1, class Mma2, class A2,
          class B2, class Acc2>
__device__ __forceinline__ void wgmma_pair(Mma1& mma1, A1 const& a1, B1 const& b1, Acc1& acc1, Mma2& mma2,
                                           A2 const& a2, B2 const& b2, Acc2& acc2) {
  warpgroup_fence_operand(acc1);
  warpgroup_fence_operand(acc2);
  warpgroup_arrive();
  if constexpr (kOverwrite1)
    wgmma_overwrite(mma1, a1, b1, acc1);
  else
    wgmma_accumulate(mma1, a1, b1, acc1);
  if constexpr (kOverwrite2)
    wgmma_overwrite(mma2, a2, b2, acc2);
  else
    wgmma_accumulate(mma2, a2, b2, acc2);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc1);
  warpgroup_fence_operand(acc2);
}

// One product as a wgmma group, waited for: acc = A B (kOverwrite) or acc += A B.
template <bool kOverwrite, class Mma, class A, class B, class Acc>
__device__ __forceinline__ void wgmma_one(Mma& mma, A const& a, B const& b, Acc& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  if constexpr (kOverwrite)
    wgmma_overwrite(mma, a, b, acc);
  else
    wgmma_accumulate(mma, a, b, acc);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
}

// The epilogue of a gradient: rows row0 + r (r < 64) of acc, those below `rows`, to out (row
// stride `stride`), each element at its (row, col) in coords (the mma.sync-order view).
template <class Acc, class Coords, class Element>
__device__ __forceinline__ void store_rows(Acc const& acc, Coords const& coords, Element* out, std::int64_t stride,
                                           std::int64_t row0, std::int64_t rows) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) {
    const std::int64_t row = row0 + get<0>(coords(i));
    if (row < rows) out[row * stride + get<1>(coords(i))] = static_cast<Element>(acc(i));
  }
}

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(128)
    dq_sm90_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout,
                   const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                   const float* __restrict__ lse, const float* __restrict__ delta, Element* __restrict__ dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
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
  using TileD = Shape<Int<BM>, Int<kHeadDim>>;

  const HeadRows<Element> rows_k = head_rows(k, p.k, b, hk, k0, len_k);
  const HeadRows<Element> rows_v = head_rows(v, p.v, b, hk, k0, len_k);

  // Q, dO, then K and V of two stages: the next key block streams in during this one's products.
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  using RowsD = typename Cfg::template Rows<kHeadDim>;
  using RowsDv = typename Cfg::template Rows<kHeadDimV>;
  cute::Tensor sQ = smem_tile<Element>(smem_raw, 0, RowsD{});
  cute::Tensor sdO = smem_tile<Element>(smem_raw, Cfg::kBytesD, RowsDv{});
  auto sK = [&](int stage) { return smem_tile<Element>(smem_raw, Cfg::kPairBytes * (1 + stage), RowsD{}); };
  auto sV = [&](int stage) {
    return smem_tile<Element>(smem_raw, Cfg::kPairBytes * (1 + stage) + Cfg::kBytesD, RowsDv{});
  };
  auto sKt = [&](int stage) {
    return smem_tile<Element>(smem_raw, Cfg::kPairBytes * (1 + stage), typename Cfg::template RowsT<kHeadDim>{});
  };

  const typename Cfg::template Loader<RowsD> tile_d_loader(tid);
  const typename Cfg::template Loader<RowsDv> tile_dv_loader(tid);
  auto load_kv = [&](std::int64_t n, int stage) {
    tile_d_loader.load(rows_k, n * BN, raw_pointer_cast(sK(stage).data()));
    tile_dv_loader.load(rows_v, n * BN, raw_pointer_cast(sV(stage).data()));
  };

  // S = Q K^T and dP = dO V^T: shared-memory descriptors for both operands.
  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ));
  cute::Tensor tPrdO = thr_s.make_fragment_A(thr_s.partition_A(sdO));
  // dQ += dS K: dS from registers, K^T [D, BN] by descriptors.
  typename Cfg::TiledMmaD mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  cute::Tensor acc_dq90 = partition_fragment_C(mma_dq, TileD{});
  clear(acc_dq90);

  // The accumulators in mma.sync order (flash_sm90.cuh) with each element's (row, col).
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  using AccLayoutS = decltype(partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{}).layout());
  using AccLayoutQ = decltype(partition_fragment_C(mma, TileD{}).layout());
  cute::Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<BM>, Int<BN>>{}));
  cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  float lse_r[kRows], delta_r[kRows];
  load_lse_delta(p, lse, delta, b, h, q0, m0, len_q, [&](int r) { return get<0>(tScS_rc(r, 0)); }, lse_r, delta_r);

  std::int64_t n_first, n_last;
  const std::int64_t rows_here = len_q - m0 < BM ? len_q - m0 : BM;
  cuda::key_block_range(p, m0, rows_here, len_q, len_k, BN, n_first, n_last);

  tile_d_loader.load(head_rows(q, p.q, b, h, q0, len_q), m0, raw_pointer_cast(sQ.data()));
  tile_dv_loader.load(head_rows(dout, bp.dout, b, h, q0, len_q), m0, raw_pointer_cast(sdO.data()));
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
    wgmma_pair<true, true>(mma_s, tSrQ, tSrK, acc_s90, mma_s, tPrdO, tPrV, acc_dp90);
    cute::Tensor acc_s = make_tensor(acc_s90.data(), AccLayoutS{});
    cute::Tensor acc_dp = make_tensor(acc_dp90.data(), AccLayoutS{});
    probabilities_and_dscores<kPlain>(p, acc_s, acc_dp, tScS, BM, BN, b, h, m0, n0, len_q, len_k,
                                      [&](int r) { return lse_r[r]; }, [&](int r) { return delta_r[r]; });

    cute::Tensor rdS = make_tensor_like<Element>(acc_dp);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dp); ++i) rdS(i) = static_cast<Element>(acc_dp(i));
    cute::Tensor tQrdS = make_tensor(rdS.data(), acc_as_a(rdS.layout()));
    cute::Tensor tQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt(stage)));
    wgmma_one<false>(mma_dq, tQrdS, tQrKt, acc_dq90);
    __syncthreads();  // every warp is done reading this stage before it is refilled
  }
  cp_async_wait<0>();

  store_rows(make_tensor(acc_dq90.data(), AccLayoutQ{}), thr_mma.partition_C(make_identity_tensor(TileD{})),
             dq + bp.dq.at(b, h, q0), bp.dq.s, m0, len_q);
#else
  (void)bp, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dq;  // compiled for sm_90a only
#endif
}

// dkdv_sm90_kernel alone still loads through CuTe's partitions, not TileLoader: at D = 128 it
// sits at the register limit (254 of 255, its four accumulators), and with TileLoader ptxas
// spills 144 B in its plain instantiation, though TileLoader's own code is not what grows (the
// kernel spills just as much with the loads taken out of its loop); register allocation at the
// limit, to be settled with a GPU measurement of both. The rows of (b, h) as a CuTe tensor, the
// copy's thread layout, and the copy of a partition's rows (zeros past `rows`):
template <int kCols, class T>
__device__ __forceinline__ auto head_rows_tensor(T* base, const Strides& s, std::int64_t b, std::int64_t h,
                                                 std::int64_t first, std::int64_t len) {
  return make_tensor(make_gmem_ptr(base + s.at(b, h, first)), make_shape(len, Int<kCols>{}), make_stride(s.s, _1{}));
}
template <class Copy, class Src, class Dst, class Coords>
__device__ __forceinline__ void copy_rows_partitioned(Copy const& copy, Src const& src, Dst& dst, Coords const& coords,
                                                      std::int64_t rows) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < rows)
      cute::copy(copy, src(_, m, _), dst(_, m, _));
    else
      cute::clear(dst(_, m, _));
  }
}

// What both dk/dv warpgroup schedules (DkdvWarpgroup, DkdvRole) name on 64 keys: the tiles, the
// mma.sync-order view of a 64 x 64 product, and the epilogue of a gradient (rows n0 + r below
// len_k of a [64, W] accumulator in its wgmma layout).
template <class Element, int kHeadDim, int kHeadDimV>
struct DkdvTiles {
  using Cfg = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
  static constexpr int BM = Cfg::BM, BN = Cfg::BN;
  using TileD = Shape<Int<BN>, Int<kHeadDim>>;
  using TileDv = Shape<Int<BN>, Int<kHeadDimV>>;
  using RowsD = typename Cfg::template Rows<kHeadDim>;
  using RowsDv = typename Cfg::template Rows<kHeadDimV>;
  using AccLayoutS = decltype(partition_fragment_C(typename Cfg::TiledMma{}, Shape<Int<BN>, Int<BM>>{}).layout());

  template <class Tile, class Acc>
  __device__ static void store_gradient(Tile tile, Acc const& acc, int tid, Element* out, std::int64_t stride,
                                        std::int64_t n0, std::int64_t len_k) {
    typename Cfg::TiledMma mma;
    store_rows(make_tensor(acc.data(), decltype(partition_fragment_C(mma, tile).layout()){}),
               mma.get_thread_slice(tid).partition_C(make_identity_tensor(tile)), out, stride, n0, len_k);
  }
};

// Every product of the dk/dv schedule on 64 keys, by one warpgroup (D + Dv <= 256: dK and dV fit
// its registers together): the warpgroup of dkdv_sm90_kernel, and each consumer warpgroup of
// dkdv_sm90ws_kernel on its half of that kernel's 128 keys. A visit (Q and dO of one query block):
//   S^T = K Q^T, dP^T = V dO^T   one wgmma group (SS)
//   P^T, dS^T                    elementwise in registers, keys by row
//   dV += P^T dO, dK += dS^T Q   one wgmma group (RS: P^T and dS^T from registers, dO^T and Q^T
//                                the stage's tiles seen as [Dv, 64] and [D, 64])
// K at kv_bytes of shared memory, V at kv_bytes + kBytesD. kPlain and kSoftcap as for_each_score's.
template <class Element, int kHeadDim, int kHeadDimV, bool kPlain, bool kSoftcap = false>
struct DkdvWarpgroup : DkdvTiles<Element, kHeadDim, kHeadDimV> {
  using Base = DkdvTiles<Element, kHeadDim, kHeadDimV>;
  using typename Base::AccLayoutS, typename Base::Cfg, typename Base::RowsD, typename Base::RowsDv;
  using typename Base::TileD, typename Base::TileDv;
  static_assert(!Cfg::kSplitDkdv, "dK and dV must fit one warpgroup's registers (else DkdvRole)");
  static constexpr int BM = Base::BM, BN = Base::BN;

  int tid;  // within the warpgroup
  unsigned char* smem;
  int kv_bytes;
  typename Cfg::TiledMmaS mma_s;    // S^T and dP^T: keys are the rows (M), queries the columns (N)
  typename Cfg::TiledMmaD mma_dk;   // dK += dS^T Q
  typename Cfg::TiledMmaDv mma_dv;  // dV += P^T dO
  typename Cfg::TiledMma mma;       // the mma.sync-order views of the accumulators
  decltype(partition_fragment_C(typename Cfg::TiledMmaD{}, TileD{})) acc_dk90;
  decltype(partition_fragment_C(typename Cfg::TiledMmaDv{}, TileDv{})) acc_dv90;

  __device__ DkdvWarpgroup(int tid_, unsigned char* smem_, int kv_bytes_)
      : tid(tid_), smem(smem_), kv_bytes(kv_bytes_) {
    clear(acc_dk90);
    clear(acc_dv90);
  }

  // One visit: Q and dO at stage_bytes, lse and delta of its queries at stats[0, BM) and
  // stats[BM, 2 BM). ds_ready(dS^T, its (key, query) coordinates) once dS^T is in registers
  // (Element, the accumulator's layout), before the updates are issued.
  template <class DsReady>
  __device__ void visit(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t m0, std::int64_t n0,
                        std::int64_t len_q, std::int64_t len_k, int stage_bytes, const float* stats,
                        DsReady&& ds_ready) {
    auto thr_s = mma_s.get_thread_slice(tid);
    cute::Tensor tScS = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<BN>, Int<BM>>{}));
    cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
    cute::Tensor acc_st90 = partition_fragment_C(mma_s, Shape<Int<BN>, Int<BM>>{});
    cute::Tensor acc_dpt90 = partition_fragment_C(mma_s, Shape<Int<BN>, Int<BM>>{});
    wgmma_pair<true, true>(
        mma_s, thr_s.make_fragment_A(thr_s.partition_A(smem_tile<Element>(smem, kv_bytes, RowsD{}))),
        thr_s.make_fragment_B(thr_s.partition_B(smem_tile<Element>(smem, stage_bytes, RowsD{}))), acc_st90, mma_s,
        thr_s.make_fragment_A(thr_s.partition_A(smem_tile<Element>(smem, kv_bytes + Cfg::kBytesD, RowsDv{}))),
        thr_s.make_fragment_B(thr_s.partition_B(smem_tile<Element>(smem, stage_bytes + Cfg::kBytesD, RowsDv{}))),
        acc_dpt90);
    cute::Tensor acc_st = make_tensor(acc_st90.data(), AccLayoutS{});
    cute::Tensor acc_dpt = make_tensor(acc_dpt90.data(), AccLayoutS{});
    probabilities_and_dscores<kPlain, true, kSoftcap>(
        p, acc_st, acc_dpt, tScS, BM, BN, b, h, m0, n0, len_q, len_k,
        [&](int c) { return stats[get<1>(tScS_rc(0, c))]; }, [&](int c) { return stats[BM + get<1>(tScS_rc(0, c))]; });

    cute::Tensor rPt = make_tensor_like<Element>(acc_st);
    cute::Tensor rdSt = make_tensor_like<Element>(acc_dpt);
    CUTE_UNROLL
    for (int j = 0; j < size(acc_st); ++j) {
      rPt(j) = static_cast<Element>(acc_st(j));
      rdSt(j) = static_cast<Element>(acc_dpt(j));
    }
    ds_ready(rdSt, tScS);
    auto thr_dv = mma_dv.get_thread_slice(tid);
    auto thr_dk = mma_dk.get_thread_slice(tid);
    cute::Tensor tVrPt = make_tensor(rPt.data(), acc_as_a(rPt.layout()));
    cute::Tensor tKrdSt = make_tensor(rdSt.data(), acc_as_a(rdSt.layout()));
    cute::Tensor tVrdOt = thr_dv.make_fragment_B(thr_dv.partition_B(
        smem_tile<Element>(smem, stage_bytes + Cfg::kBytesD, typename Cfg::template RowsT<kHeadDimV>{})));
    cute::Tensor tKrQt = thr_dk.make_fragment_B(
        thr_dk.partition_B(smem_tile<Element>(smem, stage_bytes, typename Cfg::template RowsT<kHeadDim>{})));
    // One wgmma group for both updates (the two MMA types of different widths). P^T and dS^T are
    // packed into their 32-bit A registers before it opens: under the 240 registers of the
    // warp-specialized kernel ptxas otherwise packed them after the fence and injected a
    // warpgroup.arrive before each product (C7519).
    warpgroup_fence_operand(rPt);
    warpgroup_fence_operand(rdSt);
    wgmma_pair<false, false>(mma_dv, tVrPt, tVrdOt, acc_dv90, mma_dk, tKrdSt, tKrQt, acc_dk90);
  }

  // dK and dV, rows n0 + r below len_k.
  __device__ void store(const BackwardProblem& bp, Element* dk, Element* dv, std::int64_t b, std::int64_t hk,
                        std::int64_t k0, std::int64_t n0, std::int64_t len_k) {
    Base::store_gradient(TileD{}, acc_dk90, tid, dk + bp.dk.at(b, hk, k0), bp.dk.s, n0, len_k);
    Base::store_gradient(TileDv{}, acc_dv90, tid, dv + bp.dv.at(b, hk, k0), bp.dv.s, n0, len_k);
  }
};

template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(128)
    dkdv_sm90_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout,
                     const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                     const float* __restrict__ lse, const float* __restrict__ delta, Element* __restrict__ dk,
                     Element* __restrict__ dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * BN;
  if (n0 >= len_k) return;
  const int tid = threadIdx.x;
  using TileD = Shape<Int<BN>, Int<kHeadDim>>;
  using TileDv = Shape<Int<BN>, Int<kHeadDimV>>;

  cute::Tensor gK = local_tile(head_rows_tensor<kHeadDim>(k, p.k, b, hk, k0, len_k), TileD{}, make_coord(n_block, 0));
  cute::Tensor gV = local_tile(head_rows_tensor<kHeadDimV>(v, p.v, b, hk, k0, len_k), TileDv{}, make_coord(n_block, 0));

  // K, V, then Q and dO of two stages (the next query block streams in during this one's
  // products), then lse and delta of each stage's queries: read per element from shared memory,
  // not held in registers (the four accumulators leave no room for them).
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  using RowsD = typename Cfg::template Rows<kHeadDim>;
  using RowsDv = typename Cfg::template Rows<kHeadDimV>;
  auto stage_bytes = [](int stage) { return Cfg::kPairBytes * (1 + stage); };  // Q, then dO
  float* s_stats = reinterpret_cast<float*>(smem_raw + Cfg::kStatsOffset);  // [stage][lse, delta][BM]

  typename Cfg::DkdvGmemCopy gmem_copy;
  auto gthr = gmem_copy.get_thread_slice(tid);
  cute::Tensor tRowsD = gthr.partition_S(make_identity_tensor(TileD{}));
  cute::Tensor tRowsDv = gthr.partition_S(make_identity_tensor(TileDv{}));
  auto copy_rows = [&](auto const& src, int bytes, auto rows_layout, auto const& coords, std::int64_t rows) {
    cute::Tensor dst = gthr.partition_D(smem_tile<Element>(smem_raw, bytes, rows_layout));
    copy_rows_partitioned(gmem_copy, gthr.partition_S(src), dst, coords, rows);
  };

  // The (query head, query block) pairs this CTA visits (query_visits).
  const QueryVisits visits = query_visits(p, hk, n0, len_q, len_k, BM, BN);
  const std::int64_t steps = visits.steps;
  auto load_qdo = [&](std::int64_t i, int stage) {
    const std::int64_t h = visits.head(i), m = visits.block(i), m0 = m * BM;
    cute::Tensor gQ = local_tile(head_rows_tensor<kHeadDim>(q, p.q, b, h, q0, len_q), TileD{}, make_coord(m, 0));
    cute::Tensor gdO = local_tile(head_rows_tensor<kHeadDimV>(dout, bp.dout, b, h, q0, len_q), TileDv{}, make_coord(m, 0));
    copy_rows(gQ, stage_bytes(stage), RowsD{}, tRowsD, len_q - m0);
    copy_rows(gdO, stage_bytes(stage) + Cfg::kBytesD, RowsDv{}, tRowsDv, len_q - m0);
    load_query_stats(p, lse, delta, s_stats + stage * 2 * BM, b, h, q0, m0, len_q, tid);
  };

  copy_rows(gK, 0, RowsD{}, tRowsD, len_k - n0);
  copy_rows(gV, Cfg::kBytesD, RowsDv{}, tRowsDv, len_k - n0);
  if (steps > 0) load_qdo(0, 0);
  cp_async_fence();

  DkdvWarpgroup<Element, kHeadDim, kHeadDimV, kPlain> keys(tid, smem_raw, 0);
  for (std::int64_t i = 0; i < steps; ++i) {
    const int stage = int(i & 1);
    if (i + 1 < steps) load_qdo(i + 1, stage ^ 1);  // its stage was last read two steps ago
    cp_async_fence();
    cp_async_wait<1>();                        // all but that copy: K, V, Q and dO of step i have landed
    cutlass::arch::fence_view_async_shared();  // ... visible to wgmma
    __syncthreads();                           // ... for every warp, with lse and delta
    keys.visit(p, b, visits.head(i), visits.block(i) * BM, n0, len_q, len_k, stage_bytes(stage),
               s_stats + stage * 2 * BM, [](auto const&, auto const&) {});
    __syncthreads();  // every warp is done reading this stage (and its lse, delta) before it is refilled
  }
  cp_async_wait<0>();
  keys.store(bp, dk, dv, b, hk, k0, n0, len_k);
#else
  (void)bp, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dk, (void)dv;  // sm_90a only
#endif
}

// One warpgroup's role in the two-warpgroup dk/dv schedule (dkdv_sm90_split_kernel here,
// dkdv_sm90ws_kernel in flash_bwd_sm90_ws.cuh) on the 64 keys of its CTA:
//   P side    S^T = K Q^T; P^T and the dS weights W^T (cuda::probability_and_weight), W^T to
//             shared memory; dV += P^T dO
//   dS side   dP^T = V dO^T; dS^T = W^T (dP^T - delta); dK += dS^T Q
// Thread t of either warpgroup holds the same (key, query) elements of its 64 x 64 accumulator, so
// W^T crosses in register order (weights[j][t]: no bank conflicts, no layout). Both roles share
// one set of registers, so that a kernel needs no more than one role does (two role-private sets
// spilled 780 B at D = 256): the gradient accumulator (dK; dV, on the P side, is a view of its
// first Dv / 2 floats) and the 64 x 64 product. The kernels say how the tiles arrive and how the
// weights are handed over (the hooks of visit()).
template <class Element, int kHeadDim, int kHeadDimV, bool kPlain, bool kSoftcap = false>
struct DkdvRole : DkdvTiles<Element, kHeadDim, kHeadDimV> {
  using Base = DkdvTiles<Element, kHeadDim, kHeadDimV>;
  using typename Base::AccLayoutS, typename Base::Cfg, typename Base::RowsD, typename Base::RowsDv;
  using typename Base::TileD, typename Base::TileDv;
  static_assert(kHeadDim >= kHeadDimV, "dV's accumulator is a view of dK's");
  static constexpr int BM = Base::BM, BN = Base::BN;
  using AccLayoutDv = decltype(partition_fragment_C(typename Cfg::TiledMmaDv{}, TileDv{}).layout());

  bool p_side;
  int tid;              // within the warpgroup
  unsigned char* smem;  // K at 0, V at kBytesD
  float* weights;       // [element j][thread]
  typename Cfg::TiledMmaS mma_s;   // S^T and dP^T: keys are the rows (M), queries the columns (N)
  typename Cfg::TiledMmaD mma_dk;  // dK += dS^T Q: dS^T from registers, Q^T [D, BM] by descriptors
  typename Cfg::TiledMmaDv mma_dv;  // dV += P^T dO: P^T from registers, dO^T [Dv, BM] by descriptors
  typename Cfg::TiledMma mma;       // the mma.sync-order views of the accumulators
  decltype(partition_fragment_C(typename Cfg::TiledMmaD{}, TileD{})) acc_dk90;

  __device__ DkdvRole(bool p_side_, int tid_, unsigned char* smem_, float* weights_)
      : p_side(p_side_), tid(tid_), smem(smem_), weights(weights_) {
    clear(acc_dk90);
  }

  // One visit: Q and dO at stage_bytes (a D tile, then a Dv tile), lse and delta of its queries at
  // stats[0, BM) and stats[BM, 2 BM). The P side calls before_write(), writes the weights, calls
  // written(); the dS side calls before_read(), reads them, calls read(), and, once dS^T is in
  // its registers (Element, the accumulator's layout), ds_ready(dS^T, its (key, query) coordinates)
  // before it issues dK += dS^T Q.
  template <class BeforeWrite, class Written, class BeforeRead, class Read>
  __device__ void visit(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t m0, std::int64_t n0,
                        std::int64_t len_q, std::int64_t len_k, int stage_bytes, const float* stats,
                        BeforeWrite&& before_write, Written&& written, BeforeRead&& before_read, Read&& read) {
    visit(p, b, h, m0, n0, len_q, len_k, stage_bytes, stats, before_write, written, before_read, read,
          [](auto const&, auto const&) {});
  }
  template <class BeforeWrite, class Written, class BeforeRead, class Read, class DsReady>
  __device__ void visit(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t m0, std::int64_t n0,
                        std::int64_t len_q, std::int64_t len_k, int stage_bytes, const float* stats,
                        BeforeWrite&& before_write, Written&& written, BeforeRead&& before_read, Read&& read,
                        DsReady&& ds_ready) {
    auto thr_s = mma_s.get_thread_slice(tid);
    cute::Tensor tScS = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<BN>, Int<BM>>{}));
    cute::Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
    constexpr int kCols = decltype(size<1>(tScS_rc))::value;
    auto weight_at = [&](int r, int c) -> float& { return weights[(r * kCols + c) * 128 + tid]; };
    auto query_of = [&](int c) { return get<1>(tScS_rc(0, c)); };

    cute::Tensor acc_x90 = partition_fragment_C(mma_s, Shape<Int<BN>, Int<BM>>{});
    if (p_side)  // S^T
      wgmma_one<true>(mma_s, thr_s.make_fragment_A(thr_s.partition_A(smem_tile<Element>(smem, 0, RowsD{}))),
                      thr_s.make_fragment_B(thr_s.partition_B(smem_tile<Element>(smem, stage_bytes, RowsD{}))),
                      acc_x90);
    else  // dP^T
      wgmma_one<true>(
          mma_s, thr_s.make_fragment_A(thr_s.partition_A(smem_tile<Element>(smem, Cfg::kBytesD, RowsDv{}))),
          thr_s.make_fragment_B(thr_s.partition_B(smem_tile<Element>(smem, stage_bytes + Cfg::kBytesD, RowsDv{}))),
          acc_x90);
    cute::Tensor acc_x = make_tensor(acc_x90.data(), AccLayoutS{});
    cute::Tensor x_rc = make_tensor(acc_x.data(), rowcol(acc_x.layout()));
    if (p_side) {  // S^T becomes P^T
      before_write();
      auto lse_of = [&](int c) { return stats[query_of(c)]; };
      const float to_log2 = cuda::log2_factor<kPlain>(p);
      for_each_score<kPlain, true, kSoftcap>(p, acc_x, tScS, BM, BN, b, h, m0, n0, len_q, len_k, lse_of,
                                             [&](int r, int c, int, float s, float t) {
                                               cuda::probability_and_weight(p, s, to_log2, t, lse_of(c), x_rc(r, c),
                                                                            weight_at(r, c));
                                             });
      written();
    } else {  // dP^T becomes dS^T
      before_read();
      CUTE_UNROLL
      for (int r = 0; r < size<0>(x_rc); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) x_rc(r, c) = cuda::dscore(weight_at(r, c), x_rc(r, c), stats[BM + query_of(c)]);
      }
      read();
    }

    cute::Tensor rX = make_tensor_like<Element>(acc_x);
    CUTE_UNROLL
    for (int j = 0; j < size(acc_x); ++j) rX(j) = static_cast<Element>(acc_x(j));
    cute::Tensor tXa = make_tensor(rX.data(), acc_as_a(rX.layout()));
    if (p_side) {
      auto thr_dv = mma_dv.get_thread_slice(tid);
      cute::Tensor acc_dv90 = make_tensor(acc_dk90.data(), AccLayoutDv{});
      wgmma_one<false>(mma_dv, tXa,
                       thr_dv.make_fragment_B(thr_dv.partition_B(smem_tile<Element>(
                           smem, stage_bytes + Cfg::kBytesD, typename Cfg::template RowsT<kHeadDimV>{}))),
                       acc_dv90);
    } else {
      ds_ready(rX, tScS);
      auto thr_dk = mma_dk.get_thread_slice(tid);
      wgmma_one<false>(mma_dk, tXa,
                       thr_dk.make_fragment_B(thr_dk.partition_B(
                           smem_tile<Element>(smem, stage_bytes, typename Cfg::template RowsT<kHeadDim>{}))),
                       acc_dk90);
    }
  }

  // This role's gradient, rows n0 + r below len_k.
  __device__ void store(const BackwardProblem& bp, Element* dk, Element* dv, std::int64_t b, std::int64_t hk,
                        std::int64_t k0, std::int64_t n0, std::int64_t len_k) {
    if (p_side)  // dV: a view of the accumulator's first Dv / 2 floats
      Base::store_gradient(TileDv{}, acc_dk90, tid, dv + bp.dv.at(b, hk, k0), bp.dv.s, n0, len_k);
    else
      Base::store_gradient(TileD{}, acc_dk90, tid, dk + bp.dk.at(b, hk, k0), bp.dk.s, n0, len_k);
  }
};

// dk/dv for heads whose dK and dV do not fit one warpgroup's registers together (D + Dv > 256):
// the two roles of DkdvRole on 64 keys, warpgroup 0 the P side, warpgroup 1 the dS side. Each
// warpgroup streams one tile of a step by cp.async: Q with lse and delta (P side), dO (dS side).
// Both warpgroups meet at three barriers per step: tiles landed, weights written, stage read.
template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
__global__ void __launch_bounds__(256)
    dkdv_sm90_split_kernel(const __grid_constant__ BackwardProblem bp, const Element* __restrict__ dout,
                           const Element* __restrict__ q, const Element* __restrict__ k,
                           const Element* __restrict__ v, const float* __restrict__ lse,
                           const float* __restrict__ delta, Element* __restrict__ dk, Element* __restrict__ dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
  static_assert(Cfg::kSplitDkdv, "narrow heads run dkdv_sm90_kernel");
  constexpr int BM = Cfg::BM, BN = Cfg::BN;
  const Problem& p = bp.fwd;
  const int n_block = blockIdx.x;
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  const std::int64_t n0 = std::int64_t(n_block) * BN;
  if (n0 >= len_k) return;
  const bool p_side = threadIdx.x < 128;  // warpgroup 0
  const int tid = threadIdx.x % 128;      // within the warpgroup
  using TileD = Shape<Int<BN>, Int<kHeadDim>>;
  using TileDv = Shape<Int<BN>, Int<kHeadDimV>>;

  // The layout of dkdv_sm90_kernel, then the weights.
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  using RowsD = typename Cfg::template Rows<kHeadDim>;
  using RowsDv = typename Cfg::template Rows<kHeadDimV>;
  auto stage_bytes = [](int stage) { return Cfg::kPairBytes * (1 + stage); };  // Q, then dO
  float* s_stats = reinterpret_cast<float*>(smem_raw + Cfg::kStatsOffset);  // [stage][lse, delta][BM]

  // 128 threads each: a warpgroup copies its own tiles.
  const typename Cfg::template Loader<RowsD> tile_d_loader(tid);
  const typename Cfg::template Loader<RowsDv> tile_dv_loader(tid);

  const QueryVisits visits = query_visits(p, hk, n0, len_q, len_k, BM, BN);
  const std::int64_t steps = visits.steps;
  auto load_step = [&](std::int64_t i, int stage) {  // this warpgroup's tile of step i
    const std::int64_t h = visits.head(i), m0 = visits.block(i) * BM;
    if (p_side) {
      tile_d_loader.load(head_rows(q, p.q, b, h, q0, len_q), m0, smem_at<Element>(smem_raw, stage_bytes(stage)));
      load_query_stats(p, lse, delta, s_stats + stage * 2 * BM, b, h, q0, m0, len_q, tid);
    } else {
      tile_dv_loader.load(head_rows(dout, bp.dout, b, h, q0, len_q), m0,
                     smem_at<Element>(smem_raw, stage_bytes(stage) + Cfg::kBytesD));
    }
  };

  if (p_side)
    tile_d_loader.load(head_rows(k, p.k, b, hk, k0, len_k), n0, smem_at<Element>(smem_raw, 0));
  else
    tile_dv_loader.load(head_rows(v, p.v, b, hk, k0, len_k), n0, smem_at<Element>(smem_raw, Cfg::kBytesD));
  if (steps > 0) load_step(0, 0);
  cp_async_fence();

  // Named barriers of both warpgroups (0 is __syncthreads'); each is a sync of the whole block.
  enum : std::uint32_t { kTilesLanded = 1, kWeightsWritten = 2, kStageRead = 3 };
  auto both = [](std::uint32_t id) { cutlass::arch::NamedBarrier::sync(256, id); };
  auto nothing = [] {};
  DkdvRole<Element, kHeadDim, kHeadDimV, kPlain> role(
      p_side, tid, smem_raw, reinterpret_cast<float*>(smem_raw + Cfg::kWeightsOffset));
  for (std::int64_t i = 0; i < steps; ++i) {
    const int stage = int(i & 1);
    if (i + 1 < steps) load_step(i + 1, stage ^ 1);  // its stage was last read two steps ago
    cp_async_fence();
    cp_async_wait<1>();                        // all but that copy: this warpgroup's tiles of step i have landed
    cutlass::arch::fence_view_async_shared();  // ... visible to wgmma
    both(kTilesLanded);                        // ... and the other warpgroup's
    role.visit(p, b, visits.head(i), visits.block(i) * BM, n0, len_q, len_k, stage_bytes(stage),
               s_stats + stage * 2 * BM, nothing, [&] { both(kWeightsWritten); }, [&] { both(kWeightsWritten); },
               nothing);
    both(kStageRead);  // the stage and the weights may be rewritten
  }
  cp_async_wait<0>();
  role.store(bp, dk, dv, b, hk, k0, n0, len_k);
#else
  (void)bp, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dk, (void)dv;  // sm_90a only
#endif
}

// The dk/dv kernel of a head-dim pair: one warpgroup, or two where dK and dV do not fit one.
template <class Element, int kHeadDim, int kHeadDimV, bool kPlain>
constexpr auto dkdv_sm90() {
  if constexpr (Sm90BwdConfig<Element, kHeadDim, kHeadDimV>::kSplitDkdv)
    return &dkdv_sm90_split_kernel<Element, kHeadDim, kHeadDimV, kPlain>;
  else
    return &dkdv_sm90_kernel<Element, kHeadDim, kHeadDimV, kPlain>;
}

template <class Element, int kHeadDim, int kHeadDimV>
void launch_backward_sm90(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                          const void* out, const float* lse, void* dq, void* dk, void* dv, float* delta,
                          Stream stream) {
  using Cfg = Sm90BwdConfig<Element, kHeadDim, kHeadDimV>;
  launch_backward_kernels<Element>(
      bp, BackwardKernels<Element>{dq_sm90_kernel<Element, kHeadDim, kHeadDimV, true>,
                                   dq_sm90_kernel<Element, kHeadDim, kHeadDimV, false>, Cfg::kDqSmemBytes, 128,
                                   dkdv_sm90<Element, kHeadDim, kHeadDimV, true>(),
                                   dkdv_sm90<Element, kHeadDim, kHeadDimV, false>(), Cfg::kDkdvSmemBytes,
                                   Cfg::kDkdvThreads},
      dout, q, k, v, out, lse, dq, dk, dv, delta, stream);
}

}  // namespace rudnn::attention::flash
