// The tensor-core MLA decode kernel (DeepSeek's shapes: latent R = 512, rotary P = 64; f16/bf16).
//
// paged_mla_decode_kernel: one CTA of 8 warps per (query row, block of 64 query heads, split).
// All H heads of MLA share one latent cache, so the CTA reads the row's latent rows once per 64
// heads (the decode kernel, forward_cuda.cu, reads them once per 16 heads and multiplies on CUDA
// cores). The row's visible history (its split's share, the decode kernel's chunks) is walked in
// tiles of 32 KV slots; each slot's latent row (512) and rotary-key row (64) are gathered from
// their page into one 32 x 576 tile (gather_sm80.cuh: one thread per slot looks up its page, the
// bounded reads of cuda_common.cuh, then 16-byte cp.async with zero-fill for slots past the
// history or with a page id outside the caches; double-buffered: tile n + 1 streams in while
// tile n is used). The query tile, 64 heads x (q | qp) = 64 x 576, stays in shared memory.
// Per tile, with the sm80 flash kernels' atoms and layouts (attention/flash_sm80.cuh):
//   S = Q K^T (64 x 32, K = 576): the two halves of the CTA (4 warps each, 16 heads per warp)
//       each multiply half of K (288) with mma.sync, exchange their float32 partial sums through
//       shared memory and add them (both halves then hold the same S: a + b = b + a exactly);
//   scores of slots without a row (past the history, absent page) are -inf; the online softmax
//       in base 2 with the scale folded in (flash::online_softmax_step, float32), P rounded to the
//       dtype as the flash kernels do;
//   O += P V with V the latent part of the same tile (the latent is read once, as key and as
//       value), as 4 products of 128 latent columns: warp (m, n) adds the 16 heads of m over 64
//       columns (n) of each, so the 64 x 512 float32 accumulator is 128 floats per thread, and
//       only one chunk's V fragments are live beside it (the whole row's spilled on sm_90a).
// Outputs as the decode kernel writes them: out [queries, H, R] and lse without splits; with
// splits each split's normalized partial and lse in the float32 workspace, which the decode
// path's merge kernel combines. Other R / P, float32, rows or caches not 16-byte aligned, and
// GPUs without 162 KB of shared memory per CTA (sm_86, sm_89) keep the decode kernel
// (mla_decode_serves_cuda). No wgmma (sm90a) version yet; mma.sync runs on
// Hopper too.
#include <string>

#include "attention/flash_sm80.cuh"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "paged/cuda_backend.hpp"
#include "paged/cuda_common.cuh"
#include "paged/gather_sm80.cuh"  // TileSlots, locate_slot, PageGather

namespace rudnn::paged::cuda {

namespace {

template <class Element>
struct MlaConfig {
  static constexpr int kLatent = 512, kRope = 64, kDim = kLatent + kRope;  // R, P, the score dim
  static constexpr int kHeads = 64;                                        // M: query heads per CTA
  static constexpr int kSlots = 32;                                        // KV slots per tile
  // O += P V: 8 warps, 4 along the heads x 2 along the latent; S = Q K^T: 4 warps along the heads
  // (the flash configurations of those warp shapes: atoms, swizzled shared-memory layouts).
  using Wide = flash::Sm80Config<Element, kDim, kLatent, 2>;
  using Narrow = flash::Sm80Config<Element, kDim, kLatent, 1>;
  static constexpr int kThreads = Wide::kThreads;          // 256
  static constexpr int kHalfThreads = Narrow::kThreads;    // 128: one half of the CTA, one S product
  static constexpr int kHalfKSteps = kDim / 16 / 2;        // 18 k-steps of 16 per half
  static constexpr int kCopyThreadsPerRow = Wide::kCopyThreadsPerRow;
  using SmemLayoutQ = typename Wide::SmemLayoutQ;          // [64 heads, 576]
  using SmemLayoutKV = decltype(cute::tile_to_shape(typename Wide::SmemAtom{},
                                                    cute::Shape<cute::Int<kSlots>, cute::Int<kDim>>{}));
  // The tile's latent part seen as [R, slots] (its transpose) for the B operand of O += P V.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kLatent>, cute::Int<kSlots>>{}, cute::GenRowMajor{})));
  static constexpr int kOutChunks = 4;  // O += P V as 4 products of 128 latent columns
  static constexpr int kQElems = kHeads * kDim, kTileElems = kSlots * kDim;
  static constexpr int kScoreFloats = kHeads * kSlots / kHalfThreads;  // S elements per thread (16)
  // Dynamic shared memory: Q, two KV tiles, the S exchange ([2 halves][kScoreFloats][128] floats;
  // before the first tile the query rows' offsets, after the last the lse), three slot tables
  // (int64 [3][2][kSlots] row offsets, bytes [3][kSlots] present: the tile in use, the next one
  // being gathered, the one after being located).
  static constexpr int kOffTiles = kQElems * int(sizeof(Element));
  static constexpr int kOffExchange = kOffTiles + 2 * kTileElems * int(sizeof(Element));
  static constexpr int kOffSlots = kOffExchange + 2 * kScoreFloats * kHalfThreads * int(sizeof(float));
  static constexpr int kSmemBytes = kOffSlots + 3 * 2 * kSlots * int(sizeof(i64)) + 3 * kSlots;
  static_assert(kSmemBytes <= 163 * 1024, "fits an sm_80 CTA's 163 KB of shared memory");
  static_assert(kHeads * kLatent * int(sizeof(float)) <= kOffExchange, "the float32 output fits over Q and the tiles");
  static_assert(2 * kHeads * int(sizeof(i64)) <= 2 * kScoreFloats * kHalfThreads * int(sizeof(float)),
                "the query rows' offsets fit in the exchange");
};

// Whether the tensor-core kernel serves p (dtype, shapes, 16-byte rows for cp.async, grid limits).
inline bool mla_decode_serves(const Problem& p) {
  using Cfg = MlaConfig<cute::bfloat16_t>;
  const std::size_t elem = 2;
  const auto aligned = [](std::uint64_t bytes) { return bytes % 16 == 0; };
  const auto rows_aligned = [&](const void* base, const RowStrides& at) {
    return aligned(reinterpret_cast<std::uintptr_t>(base)) && aligned(std::uint64_t(at.row) * elem) &&
           aligned(std::uint64_t(at.head) * elem);
  };
  return p.mla && (p.dtype == DType::f16 || p.dtype == DType::bf16) && p.d == Cfg::kLatent && p.dv == Cfg::kLatent &&
         p.d2 == Cfg::kRope && p.sched.queries <= 0x7fffffff && (p.hq + Cfg::kHeads - 1) / Cfg::kHeads <= 65535 &&
         p.sched.page_size <= 0x7fffffff && rows_aligned(p.q, p.q_at) && rows_aligned(p.q2, p.q2_at) &&
         rows_copy_in_16_bytes(p.k, p.k_at, p.d, elem) && rows_copy_in_16_bytes(p.k2, p.k2_at, p.d2, elem);
}

// See the top of this file. part_out / part_lse: the split workspace (null without splits).
template <class Element>
__global__ void __launch_bounds__(MlaConfig<Element>::kThreads, 1)
    paged_mla_decode_kernel(const __grid_constant__ Problem p, float* part_out, float* part_lse) {
  using Cfg = MlaConfig<Element>;
  constexpr int BM = Cfg::kHeads, BN = Cfg::kSlots, R = Cfg::kLatent;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int tid = threadIdx.x, half = tid / Cfg::kHalfThreads, htid = tid % Cfg::kHalfThreads;
  const Schedule& s = p.sched;
  // blockIdx.x = row * head blocks + head block: the head blocks of a row are adjacent in launch
  // order, so they run together and each tile comes from HBM once (the other CTAs hit L2).
  const unsigned head_blocks = unsigned((p.hq + BM - 1) / BM);
  const i64 r = blockIdx.x / head_blocks, h0 = i64(blockIdx.x % head_blocks) * BM;
  const int split = blockIdx.z;
  const int heads = int(p.hq - h0 < BM ? p.hq - h0 : BM);

  Element* smem = reinterpret_cast<Element*>(smem_raw);
  float* exchange = reinterpret_cast<float*>(smem_raw + Cfg::kOffExchange);
  i64* offsets_s = reinterpret_cast<i64*>(smem_raw + Cfg::kOffSlots);
  unsigned char* present_s = reinterpret_cast<unsigned char*>(offsets_s + 3 * 2 * BN);
  const auto slots = [&](int n) {  // the slot table of tile n
    const int b = n % 3;
    return TileSlots{offsets_s + b * 2 * BN, offsets_s + b * 2 * BN + BN, present_s + b * BN};
  };
  const auto tile = [&](int n) { return smem + Cfg::kQElems + (n & 1) * Cfg::kTileElems; };

  const RowHistory hist = row_history(p, r);
  i64 t_begin = 0, t_end = hist.visible;  // below 2^31: lengths are int32
  if (p.splits > 1) {  // the CPU backend's chunks: ceil(n / splits) positions each
    const i64 chunk = (hist.visible + p.splits - 1) / p.splits;
    t_begin = split * chunk < hist.visible ? split * chunk : hist.visible;
    t_end = (split + 1) * chunk < hist.visible ? (split + 1) * chunk : hist.visible;
  }
  const int n_tiles = int((t_end - t_begin + BN - 1) / BN);
  const auto locate = [&](int n, int slot) {  // slot `slot` of tile n
    locate_slot(s, p.pages, p.k_at, 0, p.k2_at, 0, hist.seq, int(t_begin) + n * BN, int(t_end), slots(n), slot);
  };

  // The query rows' offsets (heads past H: none, zero rows) and the first two tiles' slots.
  i64* q_off = reinterpret_cast<i64*>(exchange);  // [2][BM]: q, then qp
  if (tid < BM) {
    const bool in = tid < heads;
    q_off[tid] = in ? p.q_at.at(r, h0 + tid) : -1;
    q_off[BM + tid] = in ? p.q2_at.at(r, h0 + tid) : -1;
  } else if (tid < BM + BN) {
    if (n_tiles > 0) locate(0, tid - BM);
  } else if (tid < BM + 2 * BN) {
    if (n_tiles > 1) locate(1, tid - BM - BN);
  }
  __syncthreads();
  const PageGather<Element, typename Cfg::SmemLayoutQ, Cfg::kThreads, Cfg::kCopyThreadsPerRow> q_gather(tid);
  const PageGather<Element, typename Cfg::SmemLayoutKV, Cfg::kThreads, Cfg::kCopyThreadsPerRow> kv_gather(tid);
  const Element* latent = static_cast<const Element*>(p.k);
  const Element* rope = static_cast<const Element*>(p.k2);
  q_gather.template gather_two<R>(static_cast<const Element*>(p.q), q_off, static_cast<const Element*>(p.q2),
                                  q_off + BM, smem);
  if (n_tiles > 0) kv_gather.template gather_two<R>(latent, slots(0).a_off, rope, slots(0).b_off, tile(0));
  stage_commit();

  // Tensor-core partitions: S by the CTA half's 4 warps (thread htid), O by all 8.
  typename Cfg::Narrow::TiledMma mma_s;
  typename Cfg::Wide::TiledMma mma_o;
  auto thr_s = mma_s.get_thread_slice(htid);
  auto thr_o = mma_o.get_thread_slice(tid);
  auto sQ = cute::make_tensor(cute::make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  auto sKV0 = cute::make_tensor(cute::make_smem_ptr(tile(0)), typename Cfg::SmemLayoutKV{});
  auto sVt0 = cute::make_tensor(cute::make_smem_ptr(tile(0)), typename Cfg::SmemLayoutVt{});
  // O in kChunks column chunks of the latent, each its own product (its own accumulator fragment
  // and V fragment, reused chunk after chunk): the V fragments of one chunk at a time are live
  // beside the 128 accumulators, not the whole row's.
  constexpr int kChunks = Cfg::kOutChunks, CW = R / kChunks;
  const auto chunk_of = [](auto& t, int c) {  // columns [CW c, CW c + CW) of a [R, BN] view
    return cute::local_tile(t, cute::Shape<cute::Int<CW>, cute::Int<BN>>{}, cute::make_coord(c, 0));
  };
  auto tSrQ = thr_s.partition_fragment_A(sQ);    // (MMA, 1, 36): the half's 18 k-steps are used
  auto tSrK = thr_s.partition_fragment_B(sKV0);  // (MMA, MMA_N, 36)
  auto tOrVt = thr_o.partition_fragment_B(chunk_of(sVt0, 0));
  using AccO = decltype(cute::partition_fragment_C(mma_o, cute::Shape<cute::Int<BM>, cute::Int<CW>>{}));
  AccO acc_o[kChunks];
  CUTE_UNROLL
  for (int c = 0; c < kChunks; ++c) cute::clear(acc_o[c]);
  auto copy_q = cute::make_tiled_copy_A(cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>{}, mma_s);
  auto thr_copy_q = copy_q.get_thread_slice(htid);
  auto tSsQ = thr_copy_q.partition_S(sQ);
  auto tSrQ_view = thr_copy_q.retile_D(tSrQ);
  auto copy_k = cute::make_tiled_copy_B(cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>{}, mma_s);
  auto thr_copy_k = copy_k.get_thread_slice(htid);
  auto tSrK_view = thr_copy_k.retile_D(tSrK);
  auto copy_v = cute::make_tiled_copy_B(cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>{}, mma_o);
  auto thr_copy_v = copy_v.get_thread_slice(tid);
  auto tOrVt_view = thr_copy_v.retile_D(tOrVt);

  // (row, col) of every accumulator element of this thread.
  auto tScS = thr_s.partition_C(cute::make_identity_tensor(cute::Shape<cute::Int<BM>, cute::Int<BN>>{}));
  auto tOcO = thr_o.partition_C(cute::make_identity_tensor(cute::Shape<cute::Int<BM>, cute::Int<CW>>{}));
  auto tOcO_rc = cute::make_tensor(tOcO.data(), flash::rowcol(tOcO.layout()));  // (chunk 0's columns)
  const auto rows_cols = [](AccO& acc) { return cute::make_tensor(acc.data(), flash::rowcol(acc.layout())); };
  constexpr int kRows = decltype(cute::size<0>(tOcO_rc))::value;
  float row_max[kRows], row_sum[kRows];  // maxima in raw-dot units
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
  const float to_log2 = p.scale * kLog2e;
  float* mine = exchange + half * Cfg::kScoreFloats * Cfg::kHalfThreads;
  const float* theirs = exchange + (1 - half) * Cfg::kScoreFloats * Cfg::kHalfThreads;

  for (int n = 0; n < n_tiles; ++n) {
    stage_wait<0>();  // tile n (and Q) has landed
    __syncthreads();  // ... for every warp; tile n + 1's slots are located; tile n - 1 is done with
                      // (its buffer, the exchange and its slot table are free)
    if (n + 1 < n_tiles)
      kv_gather.template gather_two<R>(latent, slots(n + 1).a_off, rope, slots(n + 1).b_off, tile(n + 1));
    stage_commit();
    if (n + 2 < n_tiles && tid < BN) locate(n + 2, tid);

    auto sKV = cute::make_tensor(cute::make_smem_ptr(tile(n)), typename Cfg::SmemLayoutKV{});
    auto sVt = cute::make_tensor(cute::make_smem_ptr(tile(n)), typename Cfg::SmemLayoutVt{});
    auto tSsK = thr_copy_k.partition_S(sKV);

    // This half's part of S (k-steps 18 half .. 18 half + 17), then the other half's added.
    auto acc_s = cute::partition_fragment_C(mma_s, cute::Shape<cute::Int<BM>, cute::Int<BN>>{});
    static_assert(decltype(cute::size(acc_s))::value == Cfg::kScoreFloats, "the exchange holds S");
    cute::clear(acc_s);
    // k0 a constant in each branch (the half is uniform over a warp): the swizzled shared-memory
    // addresses of every k-step are then fixed offsets, not registers held across the loop.
    const auto s_part = [&](auto k0) {
      CUTE_UNROLL
      for (int kk = 0; kk < Cfg::kHalfKSteps; ++kk) {
        cute::copy(copy_q, tSsQ(cute::_, cute::_, k0 + kk), tSrQ_view(cute::_, cute::_, kk));
        cute::copy(copy_k, tSsK(cute::_, cute::_, k0 + kk), tSrK_view(cute::_, cute::_, kk));
        cute::gemm(mma_s, tSrQ(cute::_, cute::_, kk), tSrK(cute::_, cute::_, kk), acc_s);
      }
    };
    if (half == 0)
      s_part(cute::Int<0>{});
    else
      s_part(cute::Int<Cfg::kHalfKSteps>{});
    CUTE_UNROLL
    for (int i = 0; i < Cfg::kScoreFloats; ++i) mine[i * Cfg::kHalfThreads + htid] = acc_s(i);
    __syncthreads();
    // Slots without a row (past the split's history, a page outside the caches) take no part.
    const unsigned char* present = slots(n).present;
    CUTE_UNROLL
    for (int i = 0; i < Cfg::kScoreFloats; ++i) {
      const float sum = acc_s(i) + theirs[i * Cfg::kHalfThreads + htid];
      acc_s(i) = present[cute::get<1>(tScS(i))] ? sum : -INFINITY;
    }
    float correction[kRows];
    flash::online_softmax_scores(acc_s, row_max, row_sum, correction, to_log2);

    // O += P V: P rounded to the dtype as the A operand, V the tile's latent part.
    auto rP = cute::make_tensor_like<Element>(acc_s);
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_s); ++i) rP(i) = static_cast<Element>(acc_s(i));
    auto tOrP = cute::make_tensor(rP.data(), flash::acc_as_a(rP.layout()));
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      auto acc_rc = rows_cols(acc_o[c]);
      flash::rescale_rows(acc_rc, correction);
      auto tOsVt = thr_copy_v.partition_S(chunk_of(sVt, c));
      CUTE_UNROLL
      for (int kk = 0; kk < cute::size<2>(tOrP); ++kk) {
        cute::copy(copy_v, tOsVt(cute::_, cute::_, kk), tOrVt_view(cute::_, cute::_, kk));
        cute::gemm(mma_o, tOrP(cute::_, cute::_, kk), tOrVt(cute::_, cute::_, kk), acc_o[c]);
      }
    }
  }
  stage_wait<0>();  // no copy outlives the CTA (Q's, when the split saw nothing)

  // Outputs: out = O / sum and lse = max + log(sum) (a row that saw nothing: 0 and -inf), staged
  // as float32 over Q and the tiles (free now) and written by all threads head after head.
  __syncthreads();  // every warp is done with Q, the tiles and the exchange
  float* o_s = reinterpret_cast<float*>(smem_raw);  // [BM][R]
  float* lse_s = exchange;                          // [BM]
  CUTE_UNROLL
  for (int i = 0; i < kRows; ++i) {
    const float sum = flash::quad_sum(row_sum[i]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int m = cute::get<0>(tOcO_rc(i, 0));
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      auto acc_rc = rows_cols(acc_o[c]);
      CUTE_UNROLL
      for (int j = 0; j < cute::size<1>(acc_rc); ++j)
        o_s[m * R + c * CW + cute::get<1>(tOcO_rc(i, j))] = acc_rc(i, j) * inv;
    }
    if (half == 0 && tid % 4 == 0) lse_s[m] = sum > 0.0f ? row_max[i] * (to_log2 * kLn2) + logf(sum) : -INFINITY;
  }
  __syncthreads();
  const bool partial = p.splits > 1;
  Element* out = static_cast<Element*>(p.out);
  for (int i = tid; i < heads * R; i += Cfg::kThreads) {
    const int m = i / R, e = i % R;
    const i64 h = h0 + m;
    if (partial)
      part_out[((i64(split) * s.queries + r) * p.hq + h) * R + e] = o_s[i];
    else
      out[p.out_at.at(r, h) + e] = static_cast<Element>(o_s[i]);
  }
  for (int m = tid; m < heads; m += Cfg::kThreads) {
    if (partial)
      part_lse[(i64(split) * s.queries + r) * p.hq + h0 + m] = lse_s[m];
    else if (p.lse)
      p.lse[p.lse_at.at(r, h0 + m)] = lse_s[m];
  }
}

}  // namespace

bool mla_decode_serves_cuda(const Problem& p) {
  if (!mla_decode_serves(p)) return false;
  // mma.sync bf16 and cp.async (sm_80+), and the 162 KB of shared memory per CTA, which sm_80 and
  // sm_90 have and sm_86 / sm_89 (99 KB) do not: those keep the decode kernel.
  const auto& props = core::device_props(core::current_device());
  return props.cc_major >= 8 && props.max_smem_per_block_optin >= MlaConfig<cute::bfloat16_t>::kSmemBytes;
}

int mla_decode_head_blocks(const Problem& p) {
  return int((p.hq + MlaConfig<cute::bfloat16_t>::kHeads - 1) / MlaConfig<cute::bfloat16_t>::kHeads);
}

void mla_decode_cuda(const Problem& p, float* part_out, float* part_lse, cudaStream_t stream) {
  flash::with_element_type(p.dtype, [&](auto e) {
    using Element = decltype(e);
    using Cfg = MlaConfig<Element>;
    auto kernel = paged_mla_decode_kernel<Element>;
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    const i64 blocks = p.sched.queries * mla_decode_head_blocks(p);
    if (blocks > 0x7fffffff)
      core::fail(ErrorKind::unsupported, "paged_mla: " + std::to_string(p.sched.queries) + " query rows x " +
                                             std::to_string(mla_decode_head_blocks(p)) +
                                             " head blocks exceed the CUDA grid");
    const dim3 grid(unsigned(blocks), 1u, unsigned(p.splits));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, part_out, part_lse);
    RUDNN_CUDA_CHECK_LAUNCH("paged_mla_decode_kernel");
  });
}

}  // namespace rudnn::paged::cuda
