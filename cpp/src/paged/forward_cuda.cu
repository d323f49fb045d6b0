// The CUDA forward of the paged family (attention and MLA) and its append kernel.
//
// paged_decode_kernel: one block per (query row, group of query heads of one KV head, split).
// A block serves up to kMaxHeads query heads that share a KV head (GQA packing: the KV head's
// rows are read once for all of them; MLA, whose H heads share the latent, takes H / heads
// blocks, each reading the latent once). The row's visible history (its split's share of it) is
// walked in tiles of `tile` KV slots, staged from their physical pages into shared memory
// (double-buffered: the copy of tile i + 1 is in flight while tile i is used; 16-byte cp.async
// where the rows allow, cuda_common.cuh). Per tile:
//   scores: thread (slot t, head set) dots its slot's key row with the staged float32 query rows
//           of its heads (MLA: the latent part and the rotary part of the one staged row), then
//           the online softmax in base 2 with the scale folded in (one exp2 per score) over the
//           tile's lanes;
//   values: thread owns 4-float groups of the block's [heads, Dv] output accumulators (float32,
//           registers) and adds the tile's probability-weighted value rows (MLA: the latent part
//           of the same staged rows: the latent is read once as key and as value).
// With splits the partial (normalized out, lse) of each chunk goes to the float32 workspace
// (layout of paged_split_workspace_bytes: out [splits, queries, Hq, Dv], then lse [splits,
// queries, Hq]) and merge_splits_kernel combines them by log-sum-exp as the CPU backend does.
//
// Rows of prefill runs (cuda_common.cuh: 16 or more consecutive rows of one sequence within a
// 64-row window) are the tensor-core prefill kernel's (prefill_cuda.cu) where it serves the
// problem (f16/bf16, D = Dv in {64, 128}); this kernel then skips them (DecodeShape::
// skip_prefill_rows, the same test on the same device ids) and computes every other row on its
// own. MLA calls with R = 512 and P = 64 in f16/bf16 (DeepSeek's shapes) run on the tensor-core
// MLA decode kernel instead (mla_decode_cuda.cu; this file's merge kernel combines its splits);
// other MLA shapes, float32 and unaligned rows stay here.
#include <algorithm>
#include <string>

#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "paged/cuda_backend.hpp"
#include "paged/cuda_common.cuh"

namespace rudnn::paged::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxHeads = 16;                                  // query heads one block serves
constexpr int kHeadSetsMin = kThreads / 32;                    // head sets of the score phase at tile 32
constexpr int kMaxHeadsPerThread = kMaxHeads / kHeadSetsMin;   // score-phase heads of one thread
constexpr int kAccGroups = 16;                                 // 4-float output groups per thread (64 floats)
// The variant for blocks whose [heads, Dv] output needs at most 2 groups per thread (GQA decode
// with up to 8 query heads per KV head at Dv = 128, ...): 8 accumulators, far fewer registers.
constexpr int kSmallAccGroups = 2;
constexpr int kTileBudget = 48 * 1024;                         // bytes of the two staged tiles
constexpr int kMergeThreads = 128;

// The launch shape of one problem (decode_shape), the same for every block.
struct DecodeShape {
  int heads = 1, head_blocks = 1;  // query heads per block; blocks per KV head
  int tile = 32;                   // KV slots per tile (a power of two <= 32)
  int k_chunks = 0, k2_chunks = 0; // 16-byte chunks of the staged score row: k (MLA: latent), then k2 (kp)
  int v_chunks = 0;                // of attention's staged value row (MLA: 0, values are the latent part)
  int k_pitch = 0, v_pitch = 0;    // bytes between staged rows
  int q_elems = 0;                 // floats of a staged query row, laid out as the score row
  bool k_vec = false, k2_vec = false, v_vec = false;
  int acc_groups = kAccGroups;     // output groups per thread the block needs: kSmallAccGroups or kAccGroups
  bool skip_prefill_rows = false;  // rows of prefill runs are the prefill kernel's (cuda_common.cuh)
  int off_p = 0, off_stats = 0, off_window = 0, off_tiles = 0;  // dynamic shared memory: q rows, then these
  std::size_t smem = 0;
};

inline int align16(std::size_t bytes) { return int((bytes + 15) / 16 * 16); }

template <class T>
DecodeShape decode_shape(const Problem& p) {
  DecodeShape sh;
  const i64 dv_groups = (p.dv + 3) / 4;
  sh.heads = int(std::min<i64>(std::min<i64>(p.group, kMaxHeads), kThreads * kAccGroups / dv_groups));
  sh.head_blocks = int((p.group + sh.heads - 1) / sh.heads);
  sh.acc_groups = sh.heads * dv_groups <= kThreads * kSmallAccGroups ? kSmallAccGroups : kAccGroups;
  sh.k_chunks = row_chunks<T>(p.d);
  sh.k2_chunks = p.mla ? row_chunks<T>(p.d2) : 0;
  sh.v_chunks = p.mla ? 0 : row_chunks<T>(p.dv);
  sh.k_pitch = staged_pitch(sh.k_chunks + sh.k2_chunks);
  sh.v_pitch = p.mla ? 0 : staged_pitch(sh.v_chunks);
  sh.q_elems = (sh.k_chunks + sh.k2_chunks) * kChunkElems<T>;
  sh.k_vec = rows_copy_in_16_bytes(p.k, p.k_at, p.d, sizeof(T));
  sh.k2_vec = p.mla && rows_copy_in_16_bytes(p.k2, p.k2_at, p.d2, sizeof(T));
  sh.v_vec = !p.mla && rows_copy_in_16_bytes(p.v, p.v_at, p.dv, sizeof(T));
  while (sh.tile > 1 && 2 * sh.tile * (sh.k_pitch + sh.v_pitch) > kTileBudget) sh.tile /= 2;
  sh.off_p = align16(std::size_t(sh.heads) * sh.q_elems * sizeof(float));
  sh.off_stats = sh.off_p + align16(std::size_t(sh.heads) * sh.tile * sizeof(float));
  sh.off_window = sh.off_stats + align16(3 * kMaxHeads * sizeof(float));
  sh.off_tiles = sh.off_window + align16(kPrefillRows * sizeof(int));
  sh.smem = std::size_t(sh.off_tiles) + 2 * std::size_t(sh.tile) * (sh.k_pitch + sh.v_pitch);
  return sh;
}

// See the top of this file. part_out / part_lse: the split workspace (null without splits).
// kGroups: the 4-float output groups per thread (sh.acc_groups).
template <class T, int kGroups>
__global__ void __launch_bounds__(kThreads, 1)
    paged_decode_kernel(const Problem p, const DecodeShape sh, float* part_out, float* part_lse) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* q_s = reinterpret_cast<float*>(smem_raw);               // [heads][q_elems], zero padded
  float* p_s = reinterpret_cast<float*>(smem_raw + sh.off_p);    // [heads][tile] probabilities
  float* alpha_s = reinterpret_cast<float*>(smem_raw + sh.off_stats);  // per head: the tile's rescale
  float* l_s = alpha_s + kMaxHeads;                              // final sums and maxima
  float* m_s = l_s + kMaxHeads;
  unsigned char* tiles = smem_raw + sh.off_tiles;

  constexpr int L = kChunkElems<T>;
  const int tid = threadIdx.x;
  const i64 r = blockIdx.x;
  const i64 hk = blockIdx.y / sh.head_blocks;
  const i64 in_group = i64(blockIdx.y % sh.head_blocks) * sh.heads;  // first head of the block within its group
  const i64 h0 = hk * p.group + in_group;
  const int heads = int(p.group - in_group < sh.heads ? p.group - in_group : sh.heads);
  const int split = blockIdx.z;

  if (sh.skip_prefill_rows) {  // the same test as the prefill kernel's, on the same device ids
    int* seq_s = reinterpret_cast<int*>(smem_raw + sh.off_window);
    const i64 w0 = r / kPrefillRows * kPrefillRows;
    load_window_sequences(p.sched, w0, seq_s, tid);
    __syncthreads();
    if (in_prefill_run(p.sched, seq_s, int(r - w0))) return;  // uniform over the block
  }

  const RowHistory hist = row_history(p, r);
  i64 t_begin = 0, t_end = hist.visible;
  if (p.splits > 1) {  // the CPU backend's chunks: ceil(n / splits) positions each
    const i64 chunk = (hist.visible + p.splits - 1) / p.splits;
    t_begin = split * chunk < hist.visible ? split * chunk : hist.visible;
    t_end = (split + 1) * chunk < hist.visible ? (split + 1) * chunk : hist.visible;
  }

  // The block's query rows as float32, laid out like the staged score rows.
  const T* Q = static_cast<const T*>(p.q);
  const T* Q2 = static_cast<const T*>(p.q2);
  const int k_elems = sh.k_chunks * L;
  for (int i = tid; i < sh.heads * sh.q_elems; i += kThreads) {
    const int hh = i / sh.q_elems, e = i % sh.q_elems;
    float v = 0.0f;
    if (hh < heads) {
      if (e < k_elems) {
        if (e < p.d) v = core::to_float(Q[p.q_at.at(r, h0 + hh) + e]);
      } else if (e - k_elems < p.d2) {
        v = core::to_float(Q2[p.q2_at.at(r, h0 + hh) + e - k_elems]);
      }
    }
    q_s[i] = v;
  }

  const int tile = sh.tile;
  const i64 ntiles = (t_end - t_begin + tile - 1) / tile;
  const CacheRows<T> k_rows{static_cast<const T*>(p.k), p.k_at, hk, int(p.d), sh.k_vec};
  const CacheRows<T> k2_rows{static_cast<const T*>(p.k2), p.k2_at, 0, int(p.d2), sh.k2_vec};
  const CacheRows<T> v_rows{static_cast<const T*>(p.v), p.v_at, hk, int(p.dv), sh.v_vec};
  const int buf_bytes = tile * (sh.k_pitch + sh.v_pitch);
  auto stage = [&](i64 i) {
    unsigned char* buf = tiles + (i & 1) * buf_bytes;
    const i64 t0 = t_begin + i * tile;
    stage_rows(buf, sh.k_pitch, k_rows, p.sched, p.pages, hist.seq, t0, t_end, tile, tid, kThreads);
    if (p.mla)
      stage_rows(buf + sh.k_chunks * 16, sh.k_pitch, k2_rows, p.sched, p.pages, hist.seq, t0, t_end, tile, tid,
                 kThreads);
    else
      stage_rows(buf + tile * sh.k_pitch, sh.v_pitch, v_rows, p.sched, p.pages, hist.seq, t0, t_end, tile, tid,
                 kThreads);
  };

  // Score phase: this thread's slot of the tile and its head set (heads set, set + sets, ...).
  const int t_lane = tid % tile, set = tid / tile, sets = kThreads / tile;
  float m_run[kMaxHeadsPerThread], l_run[kMaxHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kMaxHeadsPerThread; ++j) m_run[j] = -INFINITY, l_run[j] = 0.0f;
  const float to_log2 = p.scale * kLog2e;
  // Value phase: this thread's 4-float groups of the [heads, Dv] output (group g of the block:
  // head g / dv_groups, values 4 (g % dv_groups) ..).
  const int dv_groups = int((p.dv + 3) / 4);
  float acc[kGroups][4];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
  const int v_pitch = p.mla ? sh.k_pitch : sh.v_pitch;
  const int chunks = sh.k_chunks + sh.k2_chunks;

  if (ntiles > 0) stage(0);
  stage_commit();
  for (i64 i = 0; i < ntiles; ++i) {
    if (i + 1 < ntiles) stage(i + 1);
    stage_commit();
    stage_wait<1>();  // tile i has landed (tile i + 1 may still be in flight)
    __syncthreads();
    const unsigned char* k_buf = tiles + (i & 1) * buf_bytes;
    const unsigned char* v_buf = p.mla ? k_buf : k_buf + tile * sh.k_pitch;
    const i64 t = t_begin + i * tile + t_lane;
    const bool present = t < t_end && page_of(p.sched, p.pages, hist.seq, t) >= 0;

    float s[kMaxHeadsPerThread];
#pragma unroll
    for (int j = 0; j < kMaxHeadsPerThread; ++j) s[j] = 0.0f;
    const unsigned char* k_row = k_buf + t_lane * sh.k_pitch;
    for (int c = 0; c < chunks; ++c) {
      float kv[L];
      chunk_as_float<T>(k_row + c * 16, kv);
#pragma unroll
      for (int j = 0; j < kMaxHeadsPerThread; ++j) {
        const int hh = set + j * sets;
        if (hh < sh.heads) {
          const float* qq = q_s + hh * sh.q_elems + c * L;
#pragma unroll
          for (int l = 0; l < L; ++l) s[j] = fmaf(qq[l], kv[l], s[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxHeadsPerThread; ++j) {
      const int hh = set + j * sets;
      const float x = present ? s[j] * to_log2 : -INFINITY;
      const float m_new = fmaxf(m_run[j], group_max(x, tile));
      float alpha = 1.0f, prob = 0.0f;
      if (m_new != -INFINITY) {  // exp2(-inf) = 0: an earlier empty history, a masked slot
        alpha = exp2_ftz(m_run[j] - m_new);
        prob = exp2_ftz(x - m_new);
      }
      l_run[j] = l_run[j] * alpha + group_sum(prob, tile);
      m_run[j] = m_new;
      if (hh < sh.heads) {
        p_s[hh * tile + t_lane] = prob;
        if (t_lane == 0) alpha_s[hh] = alpha;
      }
    }
    __syncthreads();

    // Values: rescale by the tile's alpha, then add the tile's slots one after another (slot
    // outer, groups inner: one copy of the unrolled group body, not one per group and slot).
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int hh = (g * kThreads + tid) / dv_groups;
      if (hh < heads) {
        const float a = alpha_s[hh];
        acc[g][0] *= a, acc[g][1] *= a, acc[g][2] *= a, acc[g][3] *= a;
      }
    }
    for (int tt = 0; tt < tile; ++tt) {
      const unsigned char* v_row = v_buf + tt * v_pitch;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int idx = g * kThreads + tid, hh = idx / dv_groups;
        if (hh < heads) {
          const float w = p_s[hh * tile + tt];
          const T* vr = reinterpret_cast<const T*>(v_row) + (idx % dv_groups) * 4;
          acc[g][0] = fmaf(w, core::to_float(vr[0]), acc[g][0]);
          acc[g][1] = fmaf(w, core::to_float(vr[1]), acc[g][1]);
          acc[g][2] = fmaf(w, core::to_float(vr[2]), acc[g][2]);
          acc[g][3] = fmaf(w, core::to_float(vr[3]), acc[g][3]);
        }
      }
    }
    __syncthreads();  // before the staging of tile i + 2 overwrites this buffer
  }

#pragma unroll
  for (int j = 0; j < kMaxHeadsPerThread; ++j) {
    const int hh = set + j * sets;
    if (t_lane == 0 && hh < heads) l_s[hh] = l_run[j], m_s[hh] = m_run[j];
  }
  __syncthreads();

  const bool partial = p.splits > 1;
  const i64 q_rows = p.sched.queries;
  T* O = static_cast<T*>(p.out);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int idx = g * kThreads + tid, hh = idx / dv_groups;
    if (hh < heads) {
      const int e0 = (idx % dv_groups) * 4;
      const float l = l_s[hh], inv = l > 0.0f ? 1.0f / l : 0.0f;
      const i64 h = h0 + hh;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const i64 e = e0 + j;
        if (e >= p.dv) continue;
        const float v = acc[g][j] * inv;
        if (partial)
          part_out[((i64(split) * q_rows + r) * p.hq + h) * p.dv + e] = v;
        else
          O[p.out_at.at(r, h) + e] = core::from_float<T>(v);
      }
    }
  }
  for (int hh = tid; hh < heads; hh += kThreads) {
    const float l = l_s[hh];
    const float lse = l > 0.0f ? (m_s[hh] + log2f(l)) * kLn2 : -INFINITY;
    if (partial)
      part_lse[(i64(split) * q_rows + r) * p.hq + h0 + hh] = lse;
    else if (p.lse)
      p.lse[p.lse_at.at(r, h0 + hh)] = lse;
  }
}

// One block per (query row, head): out = sum_s w_s out_s / sum_s w_s with w_s = exp(lse_s - max
// lse), lse = max + log(sum w); a row without keys in any split gets out 0 and lse -inf.
template <class T>
__global__ void __launch_bounds__(kMergeThreads)
    merge_splits_kernel(const Problem p, const float* part_out, const float* part_lse) {
  const i64 row_head = blockIdx.x, r = row_head / p.hq, h = row_head % p.hq;
  const i64 stride = p.sched.queries * p.hq;
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, part_lse[s * stride + row_head]);
  float sum = 0.0f;
  if (m != -INFINITY)
    for (int s = 0; s < p.splits; ++s) sum += expf(part_lse[s * stride + row_head] - m);
  T* O = static_cast<T*>(p.out);
  for (i64 e = threadIdx.x; e < p.dv; e += kMergeThreads) {
    float acc = 0.0f;
    if (m != -INFINITY)
      for (int s = 0; s < p.splits; ++s) {
        const float lse = part_lse[s * stride + row_head];
        if (lse != -INFINITY) acc += expf(lse - m) * part_out[(s * stride + row_head) * p.dv + e];
      }
    O[p.out_at.at(r, h) + e] = core::from_float<T>(sum > 0.0f ? acc / sum : 0.0f);
  }
  if (threadIdx.x == 0 && p.lse) p.lse[p.lse_at.at(r, h)] = m == -INFINITY ? -INFINITY : m + logf(sum);
}

// One block per (row, KV head): its K/V rows (MLA: latent and kp rows) copied into their slot,
// as elements of E (the dtype's bits). Rows whose sequence, position or page is out of range
// (corrupted device metadata) write nothing.
template <class E>
__global__ void __launch_bounds__(kThreads)
    paged_append_kernel(const AppendProblem p, const E* k, const E* v, E* k_cache, E* v_cache) {
  const i64 r = blockIdx.x / p.hkv, h = blockIdx.x % p.hkv;
  const Schedule& s = p.sched;
  const i64 seq = s.sequence(r), t = s.position(r);
  if (seq < 0 || seq >= s.num_seqs || t < 0 || t >= s.width * s.page_size) return;
  const i64 page = page_of(s, p.pages, seq, t), slot = t % s.page_size;
  if (page < 0) return;
  for (i64 e = threadIdx.x; e < p.d; e += kThreads) k_cache[p.kc_at.at(page, slot, h) + e] = k[p.k_at.at(r, h) + e];
  for (i64 e = threadIdx.x; e < p.dv; e += kThreads) v_cache[p.vc_at.at(page, slot, h) + e] = v[p.v_at.at(r, h) + e];
}

}  // namespace

int default_splits_cuda(const Problem& p, i64 max_length) {
  constexpr i64 kMinChunk = 256;  // positions: below this a split's fixed cost dominates
  const i64 dv_groups = (p.dv + 3) / 4;
  const i64 heads = std::min<i64>(std::min<i64>(p.group, kMaxHeads), kThreads * kAccGroups / dv_groups);
  const i64 blocks = p.sched.queries * (mla_decode_serves_cuda(p) ? i64(mla_decode_head_blocks(p))
                                                                  : p.hkv * ((p.group + heads - 1) / heads));
  const i64 target = 2 * i64(core::device_props(core::current_device()).sm_count);
  if (blocks == 0 || blocks >= target || max_length < 2 * kMinChunk) return 1;
  i64 splits = std::min<i64>({32, (target + blocks - 1) / blocks, max_length / kMinChunk});
  constexpr i64 kCap = i64(64) << 20;  // paged_split_workspace_bytes's cap
  while (splits > 1 && 4 * (p.sched.queries * p.hq * splits * (p.dv + 1)) > kCap) --splits;
  return int(splits);
}

const char* forward_cuda(const Problem& p, const Tensor* workspace, cudaStream_t stream) {
  const char* algorithm = p.splits > 1 ? "cuda_decode_split" : "cuda_decode";
  if (p.sched.queries == 0) return algorithm;
  const std::string op = p.mla ? "paged_mla" : "paged_attention";
  float* part_out = p.splits > 1 ? workspace->ptr<float>() : nullptr;
  float* part_lse = part_out ? part_out + i64(p.splits) * p.sched.queries * p.hq * p.dv : nullptr;
  const auto merge = [&](auto tag) {  // the split partials into out and lse
    using T = typename decltype(tag)::type;
    if (p.splits <= 1) return;
    const i64 blocks = p.sched.queries * p.hq;
    if (blocks > 0x7fffffff)
      core::fail(ErrorKind::unsupported, op + ": " + std::to_string(blocks) + " (row, head) pairs exceed the CUDA grid");
    merge_splits_kernel<T><<<unsigned(blocks), kMergeThreads, 0, stream>>>(p, part_out, part_lse);
    RUDNN_CUDA_CHECK_LAUNCH("merge_splits_kernel");
  };
  const bool mla_tensor_cores = mla_decode_serves_cuda(p);
  if (mla_tensor_cores) {  // every row on the tensor-core MLA kernel (mla_decode_cuda.cu)
    mla_decode_cuda(p, part_out, part_lse, stream);
    algorithm = p.splits > 1 ? "cuda_mla_split" : "cuda_mla";
  }
  core::dispatch_float<__half, __nv_bfloat16>(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (mla_tensor_cores) {
      merge(tag);
      return;
    }
    DecodeShape sh = decode_shape<T>(p);
    const i64 head_blocks = p.hkv * sh.head_blocks;
    if (p.sched.queries > 0x7fffffff || head_blocks > 65535)
      core::fail(ErrorKind::unsupported, op + ": " + std::to_string(p.sched.queries) + " query rows x " +
                                             std::to_string(head_blocks) + " head blocks exceed the CUDA grid");
    const auto& props = core::device_props(core::current_device());
    if (sh.smem > std::size_t(props.max_smem_per_block_optin))
      core::fail(ErrorKind::unsupported, op + ": the decode kernel needs " + std::to_string(sh.smem) +
                                             " bytes of shared memory for these head dims, the device has " +
                                             std::to_string(props.max_smem_per_block_optin));
    // The rows of prefill runs (cuda_common.cuh) go to the tensor-core kernel where it serves p.
    sh.skip_prefill_rows = prefill_cuda(p, part_out, part_lse, stream);
    if (sh.skip_prefill_rows) algorithm = p.splits > 1 ? "cuda_mixed_split" : "cuda_mixed";
    auto kernel = sh.acc_groups == kSmallAccGroups ? paged_decode_kernel<T, kSmallAccGroups>
                                                   : paged_decode_kernel<T, kAccGroups>;
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sh.smem)));
    const dim3 grid(unsigned(p.sched.queries), unsigned(head_blocks), unsigned(p.splits));
    kernel<<<grid, kThreads, sh.smem, stream>>>(p, sh, part_out, part_lse);
    RUDNN_CUDA_CHECK_LAUNCH("paged_decode_kernel");
    merge(tag);
  });
  return algorithm;
}

const char* append_cuda(const PagedAppendArgs& a, const AppendProblem& p, cudaStream_t stream) {
  const i64 blocks = p.sched.queries * p.hkv;
  if (blocks == 0) return "cuda_append";
  if (blocks > 0x7fffffff)
    core::fail(ErrorKind::unsupported, "paged_append: " + std::to_string(blocks) + " (row, head) pairs exceed the CUDA grid");
  auto launch = [&](auto bits) {
    using E = decltype(bits);
    paged_append_kernel<E><<<unsigned(blocks), kThreads, 0, stream>>>(
        p, static_cast<const E*>(a.k.data), static_cast<const E*>(a.v.data), static_cast<E*>(a.k_cache.data),
        static_cast<E*>(a.v_cache.data));
    RUDNN_CUDA_CHECK_LAUNCH("paged_append_kernel");
  };
  if (dtype_size(p.dtype) == 4)
    launch(std::uint32_t{});
  else
    launch(std::uint16_t{});
  return "cuda_append";
}

}  // namespace rudnn::paged::cuda
