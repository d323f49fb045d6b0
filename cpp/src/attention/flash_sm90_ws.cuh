// The warp-specialized "flash" forward for Hopper (sm90a), FlashAttention-3's CTA structure:
// three warpgroups per CTA of 128 query rows.
//   producer    warpgroup 0 (registers given back with setmaxnreg), its first warp only: one
//               thread issues every load as a TMA copy (cp.async.bulk.tensor, flash tiles in boxes
//               of 64 rows of one 128-byte slab of D; tma.hpp): Q once, then the K and V tiles of
//               the key blocks (128 keys, 64 for Dv = 256: forward_keys_per_block) into a ring of
//               three stages (two for D > 128) in shared memory. Each copy completes bytes on its
//               tile's "full" mbarrier, which the thread armed with the tile's size; rows past the
//               tensor arrive as zeros from the hardware. In a packed variable-length batch (one
//               descriptor over all its rows) a tail V tile's rows past the sequence are the next
//               sequence's: the warp clears them before arriving on the full barrier itself;
//   consumers   warpgroups 1 and 2, 64 query rows each: S = Q K^T (wgmma SS), masking and the
//               online softmax in registers, O += P V (wgmma RS, P from registers). A stage's K
//               and V tiles are handed back apart, each on its own "empty" mbarrier: K once
//               S = Q K^T has been waited for, V once P V has (FlashAttention-3's order: the
//               producer refills K a whole softmax and P V earlier than with one barrier). Within a
//               consumer, the softmax of the next block overlaps P V of this one; between the
//               consumers, named barriers alternate GEMM issue so one's softmax overlaps the
//               other's GEMMs (FlashAttention-3's two overlaps; see the consumer loop).
// K and V have separate full barriers, so S = Q K^T starts while V is still landing. Both
// consumers walk the key blocks any row of the CTA sees; the masking handles the rest.
//
// Persistent (FlashAttention-3's scheduler, static): the grid is min(work items, SMs) CTAs, and CTA
// c takes items c, c + gridDim.x, ... (Sm90WsWork: an item is one block of 128 query rows of one
// head of one sequence, those with the most key blocks first). The producer runs ahead across
// items: Q has its own "empty" mbarrier, released once the item's last S = Q K^T has been waited
// for, so the next item's Q and first K/V tiles land under this item's last P V and epilogue; the
// ring's position and every barrier's phase carry over from item to item. An item whose rows see
// no key (a keyless sequence of a packed batch, or a window that leaves the block none) loads
// nothing and skips the consumers' turn-taking: they store zeros and lse = -inf at once.
//
// TMA needs a base and strides in 16-byte multiples, so broadcast (zero-stride) operands are left
// to the sm90 kernel (flash_sm90.cuh); tma_forward_supports (tma.hpp) says which. Layouts, the
// wgmma atoms and the per-element code are the sm90a kernel's.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "attention/flash_sm90.cuh"
#include "attention/tma.hpp"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim, int kHeadDimV = kHeadDim>
struct Sm90WsConfig : Sm90Config<Element, kHeadDim, kHeadDimV, forward_keys_per_block(kHeadDim, kHeadDimV, true)> {
  using Base = Sm90Config<Element, kHeadDim, kHeadDimV, forward_keys_per_block(kHeadDim, kHeadDimV, true)>;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "TMA boxes of 64 columns (128-byte swizzle)");
  static constexpr int kConsumers = 2;                            // warpgroups, 64 query rows each
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kRowsPerCta = 64 * kConsumers;
  // Registers per thread after setmaxnreg (producer + 2 consumers <= 512 per thread slot): a
  // consumer's O accumulator takes Dv / 2 of them, and the persistent consumers also hold their
  // item's coordinates, so every head dim takes what the producer can spare (below Dv = 256 it
  // was 40 / 232 before the kernel was persistent; at 232 the persistent D = 192 softcap
  // instantiation spilled in its key-block loop, and the general ones twice as much there).
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             Shape<Int<kRowsPerCta>, Int<kHeadDim>>{}));
  static constexpr int kQBytes = kRowsPerCta * kHeadDim * int(sizeof(Element));
  static constexpr int kTileBytesK = Base::kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kTileBytesV = Base::kBlockN * kHeadDimV * int(sizeof(Element));
  // A TMA box: 64 rows of one 128-byte slab of D (or Dv). In shared memory every tile (Q: 128
  // rows, K and V: kBlockN) is its 128-byte slabs one after the other, each slab its rows in
  // order, so the box of rows [64 j, 64 j + 64) of slab s of a tile of `bytes` lands at
  // s * bytes / slabs + j * kBoxBytes (box_offset; flash_sm90_layout_check.cu checks that the
  // GMMA layouts are these boxes).
  static constexpr int kSlabsK = kHeadDim / 64;
  static constexpr int kSlabsV = kHeadDimV / 64;
  static constexpr int kBoxBytes = 64 * 64 * int(sizeof(Element));
  static constexpr int kBoxesPerSlab = Base::kBlockN / 64;  // of a K or V tile (Q's: kConsumers)
  static constexpr int box_offset(int tile_bytes, int slabs, int slab, int box) {
    return slab * (tile_bytes / slabs) + box * kBoxBytes;
  }
  // Three stages where they fit in the 227 KiB a block may have (two would do: a stage is handed
  // back before the next is waited for; the third gives the producer slack); two otherwise
  // (D = 192 and 256).
  static constexpr int kStages = kQBytes + 3 * (kTileBytesK + kTileBytesV) + 1024 <= 227 * 1024 ? 3 : 2;
  // Q, then the stages' K tiles, then their V tiles, then the mbarriers (full Q; full K, full V,
  // empty K, empty V per stage; V's tail landed; empty Q).
  static constexpr int kVOffset = kQBytes + kStages * kTileBytesK;
  static constexpr int kBarrierOffset = kVOffset + kStages * kTileBytesV;
  static constexpr int kSmemBytes = kBarrierOffset + (3 + 4 * kStages) * 8;
  // The ring's position (key blocks loaded so far) is kept modulo two rounds: its stage and the
  // parity of that stage's barriers, exact however many blocks a CTA walks.
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on Hopper");
  static constexpr std::uint32_t kRingPeriod = 2 * kStages;
  static RUDNN_HD int stage_of(std::uint32_t position) { return int(position % kStages); }
  static RUDNN_HD std::uint32_t round_parity(std::uint32_t position) { return (position / kStages) & 1u; }
};

// The persistent forward's work items: (query block of kRowsPerCta rows, head, sequence). Item t is
// query block m_blocks - 1 - t / (hq batch), head t % hq, sequence t / hq % batch: under causal
// masking the blocks with the most key blocks come first, so the last wave holds the shortest
// items (in a packed batch m_blocks counts blocks of the longest possible sequence, Tq rows; the
// blocks past a sequence's end are skipped at once). Heads vary fastest: the CTAs running at
// once share K and V across a GQA group.
struct Sm90WsWork {
  std::int64_t m_blocks, heads_x_batch, items;
  RUDNN_HD Sm90WsWork(const Problem& p, int rows_per_cta)
      : m_blocks((p.sq + rows_per_cta - 1) / rows_per_cta),
        heads_x_batch(p.hq * p.batch),
        items(m_blocks * heads_x_batch) {}
  RUDNN_HD void item(const Problem& p, std::int64_t t, std::int64_t& m_block, std::int64_t& h,
                     std::int64_t& b) const {
    const std::int64_t round = t / heads_x_batch, rest = t - round * heads_x_batch;
    m_block = m_blocks - 1 - round;
    b = rest / p.hq;
    h = rest - b * p.hq;
  }
  // CTAs of the persistent grid: one per SM (a CTA fills one: launch bounds 1, ~200 KiB of shared
  // memory), fewer when there are fewer items.
  std::int64_t ctas(int sm_count) const { return items < sm_count ? items : sm_count < 1 ? 1 : sm_count; }
};

// Three instantiations per head dim: kPlain (Problem::plain_scores: no mask, bias or softcap;
// raw dots, causal and window by position), kSoftcap (Problem::softcap_scores: the softcap
// transform inline, then visibility by position; no call per score), and neither (masks and bias:
// the out-of-line cuda::general_logit per score).
template <class Element, int kHeadDim, int kHeadDimV, bool kPlain, bool kSoftcap = false>
__global__ void __launch_bounds__(Sm90WsConfig<Element, kHeadDim, kHeadDimV>::kThreads, 1)
    forward_sm90ws_kernel(const __grid_constant__ Problem p, const Element* __restrict__ q,
                          const Element* __restrict__ k, const Element* __restrict__ v, Element* __restrict__ out,
                          float* __restrict__ lse, const __grid_constant__ TmaLoads tma,
                          const __grid_constant__ Sm90WsWork work) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(!(kPlain && kSoftcap), "plain scores have no softcap");
  using Cfg = Sm90WsConfig<Element, kHeadDim, kHeadDimV>;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN;
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;

  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the SW128 atom repeats every 8 rows
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  cute::Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
  auto sK = [&](int stage) {
    return make_tensor(make_smem_ptr(smem + (Cfg::kQBytes + stage * Cfg::kTileBytesK) / int(sizeof(Element))),
                       typename Cfg::SmemLayoutK{});
  };
  auto sVt = [&](int stage) {
    return make_tensor(make_smem_ptr(smem + (Cfg::kVOffset + stage * Cfg::kTileBytesV) / int(sizeof(Element))),
                       typename Cfg::SmemLayoutVt{});
  };
  std::uint64_t* full_q = reinterpret_cast<std::uint64_t*>(smem_raw + Cfg::kBarrierOffset);
  std::uint64_t* full_k = full_q + 1;
  std::uint64_t* full_v = full_k + Cfg::kStages;
  std::uint64_t* empty_k = full_v + Cfg::kStages;  // K of the stage read (S = Q K^T waited for) by both consumers
  std::uint64_t* empty_v = empty_k + Cfg::kStages;  // V of the stage read (P V waited for)
  std::uint64_t* tail_landed = empty_v + Cfg::kStages;  // a packed batch's tail V tile, before its clearing
  std::uint64_t* empty_q = tail_landed + 1;  // Q read by both consumers (the item's last S = Q K^T waited for)

  if (threadIdx.x == 0) {
    Barrier::init(full_q, 1);  // the producer's arming arrival, then the bytes of the copies
    for (int s = 0; s < Cfg::kStages; ++s) {
      Barrier::init(&full_k[s], 1);
      Barrier::init(&full_v[s], 1);
      Barrier::init(&empty_k[s], 128 * Cfg::kConsumers);  // every consumer thread is done with it
      Barrier::init(&empty_v[s], 128 * Cfg::kConsumers);
    }
    Barrier::init(tail_landed, 1);
    Barrier::init(empty_q, 128 * Cfg::kConsumers);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // Every role walks the same items and skips the same ones (blocks past the sequence's rows);
  // body(h, b, q0, len_q, k0, len_k, cta_m0, n_first, blocks): the item's key blocks
  // [n_first, n_first + blocks), none when its rows see no key. (`work` is a kernel parameter:
  // Sm90WsWork(p, kRowsPerCta) computed once on the host, the object the grid was sized with.)
  auto for_each_item = [&](auto&& body) {
    for (std::int64_t t = blockIdx.x; t < work.items; t += gridDim.x) {
      std::int64_t m_block, h, b, q0, len_q, k0, len_k, n_first, n_last;
      work.item(p, t, m_block, h, b);
      p.sequence(b, q0, len_q, k0, len_k);
      const std::int64_t cta_m0 = m_block * Cfg::kRowsPerCta;
      if (cta_m0 >= len_q) continue;
      const std::int64_t rows_here = len_q - cta_m0 < Cfg::kRowsPerCta ? len_q - cta_m0 : Cfg::kRowsPerCta;
      cuda::key_block_range(p, cta_m0, rows_here, len_q, len_k, BN, n_first, n_last);
      body(h, b, q0, len_q, k0, len_k, cta_m0, n_first, n_last - n_first);
    }
  };

  if (warpgroup == 0) {
    // ---- producer: the first warp; lane 0 issues every copy ----
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegisters>();
    if (tid >= 32) return;
    const bool issuer = tid == 0;
    using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
    constexpr std::uint64_t kCacheHint = std::uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
    unsigned char* q_bytes = smem_raw;
    unsigned char* k_tiles = smem_raw + Cfg::kQBytes;
    unsigned char* v_tiles = smem_raw + Cfg::kVOffset;
    // Carried across items: the ring's position, the Q tiles and the tail tiles loaded so far.
    std::uint32_t ring = 0, q_loads = 0, tails = 0;
    // A tile's second 64-row box wholly past the sequence is not loaded, so that no box of this
    // kernel lies outside its tensor (whether TMA credits such a box's bytes to its mbarrier was
    // not checked on hardware; a wrong guess would hang). Rows past the sequence feed nothing
    // stored: Q's make rows of O and lse that are not stored, K's scores are masked by position;
    // V's would be multiplied by P = 0, so a V tile with a box not loaded is cleared as a packed
    // batch's tail (below).
    static_assert(Cfg::kConsumers == 2 && Cfg::kBoxesPerSlab <= 2, "tiles of one or two boxes");
    for_each_item([&](std::int64_t h, std::int64_t b, std::int64_t q0, std::int64_t len_q, std::int64_t k0,
                      std::int64_t len_k, std::int64_t cta_m0, std::int64_t n_first, std::int64_t blocks) {
      if (blocks == 0) return;  // nothing to load: the consumers read neither Q nor a stage
      const int batch = tma_batch(p, b);  // rows of a packed batch: from its sequence's first (tma_operand)
      const std::int64_t hk = h / p.group;
      // The previous item's Q is no longer read (the __syncwarp: as for the stages, below).
      Barrier::wait(empty_q, (q_loads++ & 1u) ^ 1u);
      __syncwarp();
      if (issuer) {
        const int q_halves = len_q - cta_m0 > 64 ? 2 : 1;
        TxBarrier::arrive_and_expect_tx(full_q, q_halves * Cfg::kSlabsK * Cfg::kBoxBytes);
        for (int half = 0; half < q_halves; ++half)
          for (int slab = 0; slab < Cfg::kSlabsK; ++slab)
            SM90_TMA_LOAD_4D::copy(&tma.q, full_q, kCacheHint,
                                   q_bytes + Cfg::box_offset(Cfg::kQBytes, Cfg::kSlabsK, slab, half), slab * 64,
                                   int(q0 + cta_m0 + 64 * half), int(h), batch);
      }
      // Key block n of K or V into one stage: every (64-key box, 64-column slab) that holds keys,
      // counted on `bar`.
      auto load_key_tile = [&](const auto& desc, std::uint64_t* bar, unsigned char* tile, int tile_bytes, int slabs,
                               std::int64_t n) {
        const int boxes = len_k - n * BN > 64 ? Cfg::kBoxesPerSlab : 1;
        TxBarrier::arrive_and_expect_tx(bar, boxes * slabs * Cfg::kBoxBytes);
        for (int box = 0; box < boxes; ++box)
          for (int slab = 0; slab < slabs; ++slab)
            SM90_TMA_LOAD_4D::copy(&desc, bar, kCacheHint, tile + Cfg::box_offset(tile_bytes, slabs, slab, box),
                                   slab * 64, int(k0 + n * BN + 64 * box), int(hk), batch);
      };
      auto load_v = [&](std::uint64_t* bar, unsigned char* v_stage, std::int64_t n) {
        load_key_tile(tma.v, bar, v_stage, Cfg::kTileBytesV, Cfg::kSlabsV, n);
      };
      for (std::int64_t i = 0; i < blocks; ++i) {
        const std::int64_t n = n_first + i;
        const std::uint32_t position = ring + std::uint32_t(i);
        const int stage = Cfg::stage_of(position);
        const std::uint32_t free_parity = Cfg::round_parity(position) ^ 1u;  // the first round passes
        unsigned char* k_stage = k_tiles + stage * Cfg::kTileBytesK;
        unsigned char* v_stage = v_tiles + stage * Cfg::kTileBytesV;
        // Every lane waits, but only lane 0's copies let the consumers free the stage again: without
        // the __syncwarp a lane left behind could find the stage freed twice over and wait for a
        // parity that has come round again (the emulator hung so in the persistent version).
        Barrier::wait(&empty_k[stage], free_parity);
        __syncwarp();
        if (issuer) load_key_tile(tma.k, &full_k[stage], k_stage, Cfg::kTileBytesK, Cfg::kSlabsK, n);
        Barrier::wait(&empty_v[stage], free_parity);
        __syncwarp();
        // K's rows past the sequence are masked by position (their scores are set to -inf, never
        // multiplied), but V's would be multiplied by P = 0: in a packed batch they are the next
        // sequence's keys, and a box not loaded holds whatever was there; cleared once landed,
        // before the consumers are told (the sequence's last block, the item's last; at most once
        // per item).
        const bool v_tail = (p.varlen && (n + 1) * BN > len_k) || (Cfg::kBoxesPerSlab == 2 && len_k - n * BN <= 64);
        if (v_tail) {
          if (issuer) load_v(tail_landed, v_stage, n);
          Barrier::wait(tail_landed, tails++ & 1u);
          clear_tile_rows(v_stage, Cfg::kTileBytesV / Cfg::kSlabsV, Cfg::kSlabsV, BN, int(len_k - n * BN), tid, 32);
          cutlass::arch::fence_view_async_shared();  // the stores, before wgmma's (async-proxy) reads
          __syncwarp();
          if (issuer) Barrier::arrive(&full_v[stage]);
        } else if (issuer) {
          load_v(&full_v[stage], v_stage, n);
        }
      }
      ring = (ring + std::uint32_t(blocks % Cfg::kRingPeriod)) % Cfg::kRingPeriod;
    });
    return;
  }

  // ---- consumers ----
  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  cute::Tensor sQmine = local_tile(sQ, Shape<Int<BM>, Int<kHeadDim>>{}, make_coord(consumer, 0));

  typename Cfg::TiledMmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  cute::Tensor tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQmine));  // descriptors (MMA, 1, D/16)
  typename Cfg::TiledMmaO mma_o;
  auto thr_o = mma_o.get_thread_slice(tid);
  cute::Tensor acc_o90 = partition_fragment_C(mma_o, Shape<Int<BM>, Int<kHeadDimV>>{});

  typename Cfg::TiledMma mma;  // the mma.sync-ordered views of the accumulators
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

  cute::Tensor acc_s90 = partition_fragment_C(mma_s, Shape<Int<BM>, Int<BN>>{});
  cute::Tensor acc_s = make_tensor(acc_s90.data(), AccLayoutS{});
  cute::Tensor rP = make_tensor_like<Element>(acc_s);
  cute::Tensor tOrP = make_tensor(rP.data(), acc_as_a(rP.layout()));
  float correction[kRows];
  // Named barriers 1 and 2: 0 is __syncthreads' (every thread of the block, the producer's too).
  const std::uint32_t my_turn = std::uint32_t(1 + consumer), other_turn = std::uint32_t(2 - consumer);
  constexpr std::uint32_t kConsumerThreads = 128 * Cfg::kConsumers;
  // Carried across items, as the producer's: the ring's position, the Q tiles waited for.
  std::uint32_t ring = 0, q_loads = 0;

  for_each_item([&](std::int64_t h64, std::int64_t b64, std::int64_t q0, std::int64_t len_q64, std::int64_t,
                    std::int64_t len_k64, std::int64_t cta_m0, std::int64_t n_first64, std::int64_t blocks64) {
    // The item's coordinates in 32 bits: fewer registers held across the general instantiation's
    // call per score (m0 in 64 bits was spilled and reloaded for every call). Rows and keys of a
    // sequence are under 2^31, as the TMA copies' 32-bit row coordinates already require.
    const int h = int(h64), b = int(b64), blocks = int(blocks64);
    const int m0 = int(cta_m0) + 64 * consumer, len_q = int(len_q64), len_k = int(len_k64), n_first = int(n_first64);
    clear(acc_o90);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;
    if (blocks > 0) {
      Barrier::wait(full_q, q_loads++ & 1u);
      // Q K^T of key block i (the i-th of the item) into acc_s90: issued and committed, not waited for.
      auto issue_scores = [&](int i) {
        const std::uint32_t position = ring + std::uint32_t(i);
        const int stage = Cfg::stage_of(position);
        Barrier::wait(&full_k[stage], Cfg::round_parity(position));
        cute::Tensor tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK(stage)));
        warpgroup_fence_operand(acc_s90);
        warpgroup_arrive();
        wgmma_overwrite(mma_s, tSrQ, tSrK, acc_s90);
        warpgroup_commit_batch();
      };
      // Once Q K^T of block i has been waited for: its K stage is no longer read, nor Q after the
      // item's last block (the producer may load the next item's Q under this one's P V and epilogue).
      auto release_scores = [&](int i) {
        Barrier::arrive(&empty_k[Cfg::stage_of(ring + std::uint32_t(i))]);
        if (i + 1 == blocks) Barrier::arrive(empty_q);
      };
      // Masking and the online softmax of block i's scores (complete in acc_s90); O's correction is
      // kept for later, P goes to rP (Element, the RS wgmma's A operand registers).
      auto softmax = [&](int i) {
        if constexpr (kSoftcap)
          softcap_scores<BM, BN>(acc_s, tScS, p, m0, std::int64_t(n_first + i) * BN, len_q, len_k);
        else
          mask_scores<kPlain, BM, BN>(acc_s, tScS, p, b, h, m0, std::int64_t(n_first + i) * BN, len_q, len_k);
        online_softmax_scores(acc_s, row_max, row_sum, correction, to_log2);
      };
      auto to_p = [&] {
        CUTE_UNROLL
        for (int e = 0; e < size(acc_s); ++e) rP(e) = static_cast<Element>(acc_s(e));
      };

      // FlashAttention-3's schedule, both parts:
      // * intra-warpgroup: Q K^T of block i + 1 and P V of block i are issued together, then the
      //   softmax of block i + 1 runs on the CUDA cores while P V of block i runs on the tensor cores,
      //   and O's rescale by block i's correction runs between the two issues, under Q K^T of
      //   block i + 1 (O is complete then: P V of block i - 1 was waited for in the step before);
      // * ping-pong between the two consumers: named barriers hand the right to issue GEMMs back and
      //   forth, so that one warpgroup's softmax runs while the other's GEMMs do. Consumer 0 goes
      //   first. The barriers order issue only; every data dependency is on the mbarriers and wgmma
      //   waits. Each item's exchange is complete in itself (consumer 1's last turn, handed to no
      //   one, matches its free first one); an item without keys takes no part, or consumer 1 could
      //   arrive twice in a row and complete a barrier without consumer 0.
      if (consumer == 1) cutlass::arch::NamedBarrier::arrive(kConsumerThreads, other_turn);
      cutlass::arch::NamedBarrier::sync(kConsumerThreads, my_turn);
      issue_scores(0);
      cutlass::arch::NamedBarrier::arrive(kConsumerThreads, other_turn);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s90);
      release_scores(0);  // K of block 0 is no longer read
      softmax(0);
      to_p();  // (block 0's correction rescales O while it is zero: 0 x 0, the row's first max)
      // One key block; kMore: another follows (its Q K^T is issued here). The last block is a separate
      // instantiation rather than a branch: with the next block's wgmma issued under a condition,
      // ptxas cannot tell which groups wait<1> completes and serializes every wgmma (C7514).
      auto step = [&](int i, auto more) {
        constexpr bool kMore = decltype(more)::value;
        const std::uint32_t position = ring + std::uint32_t(i);
        const int stage = Cfg::stage_of(position);
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, my_turn);
        if constexpr (kMore) issue_scores(i + 1);  // acc_s90 is free: block i's P is in rP
        rescale_rows(acc_o_rc, correction);  // block i's correction, under Q K^T of block i + 1
        Barrier::wait(&full_v[stage], Cfg::round_parity(position));
        cute::Tensor tOrV = thr_o.make_fragment_B(thr_o.partition_B(sVt(stage)));
        warpgroup_fence_operand(acc_o90);
        warpgroup_arrive();
        wgmma_accumulate(mma_o, tOrP, tOrV, acc_o90);
        warpgroup_commit_batch();  // pending: [Q K^T of i + 1,] P V of i
        if (kMore || consumer == 0)  // consumer 1's last turn is handed to no one (its first was free)
          cutlass::arch::NamedBarrier::arrive(kConsumerThreads, other_turn);
        if constexpr (kMore) {
          warpgroup_wait<1>();  // groups complete in order: Q K^T of block i + 1 is done
          warpgroup_fence_operand(acc_s90);
          release_scores(i + 1);  // ... and K of block i + 1 no longer read
          softmax(i + 1);  // overlaps P V of block i; block i + 1's correction, for the next step
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o90);
        Barrier::arrive(&empty_v[stage]);  // V of block i is no longer read
        if constexpr (kMore) to_p();  // rP is free now that P V of block i is done
      };
      for (int i = 0; i + 1 < blocks; ++i) step(i, std::true_type{});
      step(blocks - 1, std::false_type{});
      ring = (ring + std::uint32_t(blocks)) % Cfg::kRingPeriod;
    }
    store_forward_output(acc_o_rc, tOcO_rc, row_max, row_sum, to_log2, p, b, h, q0, m0, len_q, out, lse, tid);
  });
#else
  (void)p, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)work;  // compiled for sm_90a only
#endif
}

}  // namespace rudnn::attention::flash

#include "core/cuda_check.hpp"
#include "core/device.hpp"

namespace rudnn::attention::flash {

template <class Element, int kHeadDim, int kHeadDimV>
void launch_forward_sm90ws(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                           Stream stream) {
  using Cfg = Sm90WsConfig<Element, kHeadDim, kHeadDimV>;
  if (p.sq == 0 || p.hq == 0 || p.batch == 0) return;
  const TmaLoads tma = tma_forward_loads(p, q, k, v, [&](const TmaTensor4d& t) { return encode_tma(t, p.dtype); });
  // Persistent: one CTA per SM at most (the device's SM count, cached by core::device_props); the
  // plain, softcap or general instantiation, launched as the other flash forwards are.
  const Sm90WsWork work(p, Cfg::kRowsPerCta);
  const std::int64_t ctas = work.ctas(core::device_props(core::current_device()).sm_count);
  if (ctas == 0) return;
  auto kernel = p.plain_scores()     ? forward_sm90ws_kernel<Element, kHeadDim, kHeadDimV, true>
                : p.softcap_scores() ? forward_sm90ws_kernel<Element, kHeadDim, kHeadDimV, false, true>
                                     : forward_sm90ws_kernel<Element, kHeadDim, kHeadDimV, false>;
  launch_forward_kernel_on<Element>(dim3(unsigned(ctas)), p, kernel, Cfg::kThreads, Cfg::kSmemBytes, q, k, v, out,
                                    lse, stream, tma, work);
}

}  // namespace rudnn::attention::flash
