// The tensor-core prefill kernel of paged attention: the dense sm80 flash forward
// (attention/flash_sm80.cuh: its configuration, copy and MMA atoms, tile partitions, online
// softmax and P V step) over K/V tiles gathered from the physical pages.
//
// paged_prefill_kernel: one CTA of 4 warps per (window of 64 consecutive query rows, query head).
// The window's prefill runs (cuda_common.cuh: at least kPrefillMinRun consecutive rows of one
// valid sequence; the decode kernel skips exactly those rows) are computed one after another as
// one 64-row M tile each, the window's rows outside the run masked: Q is loaded once per window,
// and per run 64-slot K and V tiles of the run's sequence are gathered slot by slot from their
// pages (one thread per slot looks up its page and row offsets, the next tile's while the
// current one is used: page size 1, 16, 64 ... alike; the bounded reads of cuda_common.cuh, so
// corrupted device tables never read outside a cache: a slot whose page is out of range is
// staged as zeros and its scores are masked) with 16-byte cp.async into the flash kernel's
// swizzled tiles, and S = Q K^T, the online softmax and
// O += P V run as in the dense kernel (V of tile n streams in during S and the softmax, K of
// tile n + 1 during P V). Scores are masked by absolute position: row r sees KV positions
// [0, visible(r)) (row_history, the decode kernel's rule). Outputs as the decode kernel writes
// them: out and lse without splits; with splits the row's result as split 0's partial (lse) and
// -inf as the other splits' lse, so the merge kernel returns it unchanged.
//
// f16/bf16, D = Dv in {64, 128}, q rows and cache rows 16-byte aligned (prefill_serves); every
// other problem, and every row outside a prefill run, is the decode kernel's. No GQA packing yet:
// the query heads of one KV head read its tiles once each (the L2 serves the repeats).
#include <algorithm>
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

template <class Element, int kHeadDim>
using PrefillConfig = flash::Sm80Config<Element, kHeadDim, kHeadDim>;

// Dynamic shared memory: the flash tiles (Q, K, V), then the window's sequence ids (int32 [64]),
// each window row's visible positions in the current run (int32 [64], 0 outside it), and for
// two K/V tiles (the one in use and the next) each slot's K and V row offsets (int64 [2][2][64])
// and whether it has a page (bytes [2][64]).
template <class Cfg>
constexpr int prefill_smem_bytes() {
  return Cfg::kSmemBytes + 2 * kPrefillRows * int(sizeof(int)) + 2 * 2 * Cfg::kBlockN * int(sizeof(i64)) +
         2 * Cfg::kBlockN;
}

// Whether the prefill kernel serves p (the host's part of the decision; which rows it takes is
// the device's, cuda_common.cuh): attention in f16/bf16 with D = Dv in {64, 128}, enough rows for
// one run, 16-byte q and cache rows (cp.async), a grid CUDA can launch.
inline bool prefill_serves(const Problem& p) {
  const std::size_t elem = 2;
  const auto aligned = [](std::uint64_t bytes) { return bytes % 16 == 0; };
  return !p.mla && (p.dtype == DType::f16 || p.dtype == DType::bf16) && p.d == p.dv && (p.d == 64 || p.d == 128) &&
         p.sched.queries >= kPrefillMinRun && p.hq <= 65535 && p.sched.page_size <= 0x7fffffff &&
         (p.sched.queries + kPrefillRows - 1) / kPrefillRows <= 0x7fffffff &&
         aligned(reinterpret_cast<std::uintptr_t>(p.q)) && aligned(std::uint64_t(p.q_at.row) * elem) &&
         aligned(std::uint64_t(p.q_at.head) * elem) && rows_copy_in_16_bytes(p.k, p.k_at, p.d, elem) &&
         rows_copy_in_16_bytes(p.v, p.v_at, p.dv, elem);
}

// See the top of this file. part_out / part_lse: the split workspace (null without splits).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(PrefillConfig<Element, kHeadDim>::kThreads, 1)
    paged_prefill_kernel(const __grid_constant__ Problem p, float* part_out, float* part_lse) {
  using Cfg = PrefillConfig<Element, kHeadDim>;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  static_assert(BM == kPrefillRows, "a window of query rows is one flash row tile");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  int* seq_s = reinterpret_cast<int*>(smem_raw + Cfg::kSmemBytes);
  int* visible_s = seq_s + BM;
  i64* offsets_s = reinterpret_cast<i64*>(visible_s + BM);
  unsigned char* present_s = reinterpret_cast<unsigned char*>(offsets_s + 4 * BN);
  const auto slots = [&](int n) {  // the slot table of K/V tile n (two buffers)
    return TileSlots{offsets_s + (n & 1) * 2 * BN, offsets_s + (n & 1) * 2 * BN + BN, present_s + (n & 1) * BN};
  };
  const int tid = threadIdx.x;
  const Schedule& s = p.sched;
  const i64 w0 = i64(blockIdx.x) * BM, h = blockIdx.y, hk = h / p.group;

  load_window_sequences(s, w0, seq_s, tid);
  __syncthreads();
  bool any_run = false;
  for (int begin = 0, end = 0; begin < BM; begin = end) {
    end = window_run_end(seq_s, begin);
    any_run = any_run || is_prefill_run(s, seq_s, begin, end);
  }
  if (!any_run) return;  // uniform: every thread read the same ids (a decode-only window)

  Element* smem = reinterpret_cast<Element*>(smem_raw);
  auto sQ = cute::make_tensor(cute::make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  auto sK = cute::make_tensor(sQ.data() + cute::size(sQ), typename Cfg::SmemLayoutK{});
  auto sV = cute::make_tensor(sK.data() + cute::size(sK), typename Cfg::SmemLayoutV{});
  auto sVt = cute::make_tensor(sV.data(), typename Cfg::SmemLayoutVt{});
  const typename Cfg::template Loader<typename Cfg::SmemLayoutQ> q_loader(tid);
  const PageGather<Element, typename Cfg::SmemLayoutK, Cfg::kThreads, Cfg::kCopyThreadsPerRow> k_gather(tid);
  const PageGather<Element, typename Cfg::SmemLayoutV, Cfg::kThreads, Cfg::kCopyThreadsPerRow> v_gather(tid);

  // Tensor-core partitions and the ldmatrix copies feeding them, as in the dense kernel.
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  auto tSrQ = thr_mma.partition_fragment_A(sQ);
  auto tSrK = thr_mma.partition_fragment_B(sK);
  auto tOrVt = thr_mma.partition_fragment_B(sVt);
  auto acc_o = cute::partition_fragment_C(mma, cute::Shape<cute::Int<BM>, cute::Int<kHeadDim>>{});
  auto copy_q = cute::make_tiled_copy_A(cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_q = copy_q.get_thread_slice(tid);
  auto tSsQ = thr_copy_q.partition_S(sQ);
  auto tSrQ_view = thr_copy_q.retile_D(tSrQ);
  auto copy_k = cute::make_tiled_copy_B(cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>{}, mma);
  auto thr_copy_k = copy_k.get_thread_slice(tid);
  auto tSsK = thr_copy_k.partition_S(sK);
  auto tSrK_view = thr_copy_k.retile_D(tSrK);
  auto copy_v = cute::make_tiled_copy_B(cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>{}, mma);
  auto thr_copy_v = copy_v.get_thread_slice(tid);
  auto tOsVt = thr_copy_v.partition_S(sVt);
  auto tOrVt_view = thr_copy_v.retile_D(tOrVt);

  // (row, col) of every accumulator element of this thread.
  auto tScS = thr_mma.partition_C(cute::make_identity_tensor(cute::Shape<cute::Int<BM>, cute::Int<BN>>{}));
  auto tOcO = thr_mma.partition_C(cute::make_identity_tensor(cute::Shape<cute::Int<BM>, cute::Int<kHeadDim>>{}));
  auto tOcO_rc = cute::make_tensor(tOcO.data(), flash::rowcol(tOcO.layout()));
  auto acc_o_rc = cute::make_tensor(acc_o.data(), flash::rowcol(acc_o.layout()));
  constexpr int kRows = decltype(cute::size<0>(acc_o_rc))::value;
  const float to_log2 = p.scale * kLog2e;  // the raw dots enter the softmax (the plain flash kernel's units)

  const Element* k_cache = static_cast<const Element*>(p.k);
  const Element* v_cache = static_cast<const Element*>(p.v);
  const i64 window_rows = s.queries - w0 < BM ? s.queries - w0 : BM;
  const flash::HeadRows<Element> rows_q{static_cast<const Element*>(p.q) + p.q_at.at(w0, h), p.q_at.row, window_rows};
  q_loader.load(rows_q, 0, cute::raw_pointer_cast(sQ.data()));  // lands with the first run's first K tile

  for (int begin = 0, end = 0; begin < BM; begin = end) {
    end = window_run_end(seq_s, begin);
    if (!is_prefill_run(s, seq_s, begin, end)) continue;  // uniform
    const i64 seq = seq_s[begin];
    if (tid < BM) visible_s[tid] = tid >= begin && tid < end ? int(row_history(p, w0 + tid).visible) : 0;
    __syncthreads();
    int n_visible = 0;  // KV positions some row of the run sees
    for (int i = begin; i < end; ++i) n_visible = visible_s[i] > n_visible ? visible_s[i] : n_visible;
    int min_visible = n_visible;  // ... that every row of the run sees
    for (int i = begin; i < end; ++i) min_visible = visible_s[i] < min_visible ? visible_s[i] : min_visible;
    const int n_tiles = int((i64(n_visible) + BN - 1) / BN);  // (no int overflow near 2^31)

    float row_max[kRows], row_sum[kRows];  // maxima in raw-dot units
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;
    cute::clear(acc_o);

    // The slots of tile n + 1 are located while tile n is used, into the other buffer: every read
    // of that buffer (tile n - 1's) came before the barrier at the top of tile n, and the barrier
    // in accumulate_pv publishes it before K of tile n + 1 is gathered.
    if (tid < BN) locate_slot(s, p.pages, p.k_at, hk, p.v_at, hk, seq, 0, n_visible, slots(0), tid);
    __syncthreads();
    if (n_tiles > 0) k_gather.gather(k_cache, slots(0).a_off, cute::raw_pointer_cast(sK.data()));
    stage_commit();
    for (int n = 0; n < n_tiles; ++n) {
      const int n0 = n * BN;
      stage_wait<0>();  // K of tile n (and Q) has landed
      __syncthreads();  // ... for every warp; every warp is done with sV (tile n - 1's P V)
      v_gather.gather(v_cache, slots(n).b_off, cute::raw_pointer_cast(sV.data()));
      stage_commit();
      if (n + 1 < n_tiles && tid < BN)
        locate_slot(s, p.pages, p.k_at, hk, p.v_at, hk, seq, n0 + BN, n_visible, slots(n + 1), tid);
      const unsigned char* present = slots(n).present;

      auto acc_s = cute::partition_fragment_C(mma, cute::Shape<cute::Int<BM>, cute::Int<BN>>{});
      cute::clear(acc_s);
      CUTE_UNROLL
      for (int kk = 0; kk < cute::size<2>(tSrQ); ++kk) {
        cute::copy(copy_q, tSsQ(cute::_, cute::_, kk), tSrQ_view(cute::_, cute::_, kk));
        cute::copy(copy_k, tSsK(cute::_, cute::_, kk), tSrK_view(cute::_, cute::_, kk));
        cute::gemm(mma, tSrQ(cute::_, cute::_, kk), tSrK(cute::_, cute::_, kk), acc_s);
      }

      // Causal by absolute position (row r sees slots below its visible count) and slots whose
      // page is not one of the caches. A tile below every run row's count whose slots all have
      // pages needs nothing (most tiles of a long prefill; uniform over the CTA). The window's
      // rows outside the run are not masked: their results are never stored.
      const std::uint64_t* present_words = reinterpret_cast<const std::uint64_t*>(present);
      bool all_present = true;
      CUTE_UNROLL
      for (int w = 0; w < BN / 8; ++w) all_present = all_present && present_words[w] == 0x0101010101010101ull;
      if (i64(n0) + BN > min_visible || !all_present) {
        auto acc_s_rc = cute::make_tensor(acc_s.data(), flash::rowcol(acc_s.layout()));
        auto tScS_rc = cute::make_tensor(tScS.data(), flash::rowcol(tScS.layout()));
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int limit = visible_s[cute::get<0>(tScS_rc(r, 0))] - n0;  // columns below it are visible
          CUTE_UNROLL
          for (int c = 0; c < cute::size<1>(acc_s_rc); ++c) {
            const int col = cute::get<1>(tScS_rc(r, c));
            if (col >= limit || !present[col]) acc_s_rc(r, c) = -INFINITY;
          }
        }
      }
      flash::online_softmax_step(acc_s, acc_o_rc, row_max, row_sum, to_log2);
      flash::accumulate_pv<Element>(acc_s, mma, copy_v, tOsVt, tOrVt_view, tOrVt, acc_o, [&] {
        if (n + 1 < n_tiles) {
          k_gather.gather(k_cache, slots(n + 1).a_off, cute::raw_pointer_cast(sK.data()));
          stage_commit();
        }
      });
    }
    stage_wait<0>();  // no copy outlives the run (Q's, when the run saw nothing)

    // The decode kernel's outputs for the run's rows (rows that saw nothing: 0 and -inf), staged
    // as float32 through the K and V tiles (free now: 64 x D x 4 bytes together) and written by
    // all threads row after row. Stored from the accumulators directly, every element's 64-bit
    // address stayed live and the D = 128 kernel spilled.
    __syncthreads();  // every warp is done with sK and sV (the last P V)
    float* o_s = reinterpret_cast<float*>(cute::raw_pointer_cast(sK.data()));  // [BM][kHeadDim]
    float* lse_s = reinterpret_cast<float*>(visible_s);  // every thread has read visible_s
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = flash::quad_sum(row_sum[r]);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int m = cute::get<0>(tOcO_rc(r, 0));
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(acc_o_rc); ++c) o_s[m * kHeadDim + cute::get<1>(tOcO_rc(r, c))] = acc_o_rc(r, c) * inv;
      if (tid % 4 == 0) lse_s[m] = sum > 0.0f ? row_max[r] * (to_log2 * kLn2) + logf(sum) : -INFINITY;
    }
    __syncthreads();
    const bool partial = p.splits > 1;
    Element* out = static_cast<Element*>(p.out);
    for (int i = tid; i < (end - begin) * kHeadDim; i += Cfg::kThreads) {
      const int m = begin + i / kHeadDim, e = i % kHeadDim;
      const i64 row = w0 + m;
      if (partial)
        part_out[(row * p.hq + h) * kHeadDim + e] = o_s[m * kHeadDim + e];  // split 0
      else
        out[p.out_at.at(row, h) + e] = static_cast<Element>(o_s[m * kHeadDim + e]);
    }
    for (int m = begin + tid; m < end; m += Cfg::kThreads) {
      const i64 row = w0 + m;
      if (partial)
        for (int split = 0; split < p.splits; ++split)
          part_lse[(i64(split) * s.queries + row) * p.hq + h] = split == 0 ? lse_s[m] : -INFINITY;
      else if (p.lse)
        p.lse[p.lse_at.at(row, h)] = lse_s[m];
    }
    __syncthreads();  // every thread is past its reads of o_s, lse_s and the slot tables before the next run
  }
}

}  // namespace

bool prefill_cuda(const Problem& p, float* part_out, float* part_lse, cudaStream_t stream) {
  if (!prefill_serves(p)) return false;
  const auto& props = core::device_props(core::current_device());
  if (props.cc_major < 8) return false;  // mma.sync bf16, cp.async
  flash::with_element_type(p.dtype, [&](auto e) {
    using Element = decltype(e);
    auto launch = [&](auto head_dim) {
      constexpr int D = decltype(head_dim)::value;
      using Cfg = PrefillConfig<Element, D>;
      constexpr int smem = prefill_smem_bytes<Cfg>();
      auto kernel = paged_prefill_kernel<Element, D>;
      RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const dim3 grid(unsigned((p.sched.queries + kPrefillRows - 1) / kPrefillRows), unsigned(p.hq));
      kernel<<<grid, Cfg::kThreads, smem, stream>>>(p, part_out, part_lse);
      RUDNN_CUDA_CHECK_LAUNCH("paged_prefill_kernel");
    };
    if (p.d == 64)
      launch(cute::Int<64>{});
    else
      launch(cute::Int<128>{});
  });
  return true;
}

}  // namespace rudnn::paged::cuda
