// CUDA backward of the paged family (SPEC section 3): attention and MLA, f32/f16/bf16, the
// probabilities recomputed (the API takes no forward lse).
//
// Row pass (paged_bwd_rows_kernel): one block per (query row, KV head), its 4 warps taking the
// query heads of that KV head in turn (GQA packing: the heads of one block read the same K/V
// rows, which stay in L1/L2 between them). A warp holds its head's q, qp, dout rows and its dq,
// dqp accumulators in shared memory as float32 (lanes own the elements e = lane + 32 i) and walks
// the row's visible KV positions twice, reading each slot through the page table:
//   pass 1: s_t = scale (q . k_t + qp . kp_t) and dP_t = dout . v_t, by lane sums and a warp
//           butterfly (every lane ends with the same bits); online max m, l = sum exp(s - m) and
//           a = sum exp(s - m) dP, so that lse = m + log l and delta = a / l - dlse (= dout . out
//           - dlse) need no out vector;
//   pass 2: P_t = exp(s_t - lse), dS_t = P_t (dP_t - delta) scale; dq += dS k_t (one writer per
//           row and head: no atomics) and the history terms dk += dS q (MLA: + P dout, the latent
//           is the value too), dv += P dout, dkp += dS qp.
// Default ("cuda_atomic"): the history terms go by float32 atomicAdd to the gradients themselves
// when they are float32, else to a dense float32 workspace that paged_bwd_store_kernel rounds into
// them. Every slot starts at zero (slots without a visible key stay zero; a shared page sums
// every reader).
// Ordered ("cuda_ordered", an OrderedBackwardWorkspace; paged.hpp): the row pass writes lse and
// delta (and with the row cache P and dS) to the workspace instead of adding history terms;
// paged_bwd_history_kernel then gives each listed page one block per KV head whose warps own
// slots and walk the page's reader entries in index order, recomputing P and dS through the same
// function as the row pass (or reading the cache): one writer per slot, a fixed order, bitwise
// repeatable. Inactive pages (history compaction) are zeroed by paged_bwd_fill_kernel.
//
// Metadata read on the device is bounded before use (cuda_common.cuh's row_history and page_of:
// a sequence id outside [0, num_seqs), a table entry outside [0, pages) are absent), and so are
// the ordered workspace's entries (rows outside [0, queries), cache positions outside the
// cache): their terms are dropped, never followed outside an operand.
//
// Instantiations: the 3 dtypes x {rows, history, store}; attention/MLA, ordered/atomic, the dims
// are run-time values (the rows live in shared memory, sized at launch).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/check.hpp"
#include "core/convert.cuh"
#include "core/cuda_check.hpp"
#include "core/dispatch.hpp"
#include "paged/cuda_backend.hpp"
#include "paged/cuda_common.cuh"  // row_history, page_of, group_sum
#include "paged/problem.hpp"

namespace rudnn::paged::cuda {

namespace {
// ---- emulated from here (tests/test_paged_backward_emulation.py) ----

using core::from_float;
using core::to_float;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Where the history terms of the atomic mode go: float32 arrays of a cache's shape (the
// gradients themselves, or the dense workspace), null when that gradient is not asked for.
struct History {
  float *dk = nullptr, *dv = nullptr, *dk2 = nullptr;
  CacheStrides dk_at, dv_at, dk2_at;
};

// a . b over n elements: lane-strided partial sums, then the warp's butterfly sum (each step
// adds the same two values in both lanes of a pair, and addition commutes, so every lane ends
// with the same bits, in an order fixed by the lane numbers).
template <class A, class B>
__device__ __forceinline__ float warp_dot(const A* a, const B* b, i64 n, int lane) {
  float s = 0.0f;
  for (i64 e = lane; e < n; e += 32) s += to_float(a[e]) * to_float(b[e]);
  return group_sum(s, 32);
}

// s = scale (q . k + q2 . k2) and dP = dout . v of one (row, head) and one slot; q, q2, dout are
// float32 rows in shared memory or the operands themselves (the same values: the history pass
// recomputes exactly what the row pass computed).
template <class T, class R>
__device__ __forceinline__ void score_and_dp(const Problem& p, const R* q, const R* q2, const R* dout, i64 k_off,
                                             i64 k2_off, i64 v_off, int lane, float& s, float& dp) {
  const T* K = static_cast<const T*>(p.k);
  float dot = warp_dot(q, K + k_off, p.d, lane);
  if (p.mla) dot += warp_dot(q2, static_cast<const T*>(p.k2) + k2_off, p.d2, lane);
  s = p.scale * dot;
  dp = warp_dot(dout, static_cast<const T*>(p.v) + v_off, p.dv, lane);
}

__device__ __forceinline__ void terms_of(const Problem& p, float s, float dp, float lse, float delta, float& P,
                                         float& dS) {
  P = expf(s - lse);
  dS = P * (dp - delta) * p.scale;
}

__device__ __forceinline__ bool pruned_pair(float lse) { return lse == INFINITY; }

template <class T>
__global__ void __launch_bounds__(kThreads) paged_bwd_rows_kernel(BackwardProblem b, History hist) {
  extern __shared__ float smem[];
  const Problem& p = b.fwd;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const i64 r = blockIdx.x, hk = blockIdx.y;
  float* q = smem + warp * (2 * p.d + 2 * p.d2 + p.dv);
  float* q2 = q + p.d;
  float* dout = q2 + p.d2;
  float* dq = dout + p.dv;
  float* dq2 = dq + p.d;
  const T* Q = static_cast<const T*>(p.q);
  const T* Q2 = static_cast<const T*>(p.q2);
  const T* dO = static_cast<const T*>(p.out);
  const T* K = static_cast<const T*>(p.k);
  const T* K2 = static_cast<const T*>(p.k2);
  const i64 ps = p.sched.page_size;
  const RowHistory row = row_history(p, r);
  const i64 seq = row.seq, n = row.visible;
  for (i64 h = hk * p.group + warp; h < (hk + 1) * p.group; h += kWarps) {
    float nonzero = 0.0f;
    for (i64 e = lane; e < p.d; e += 32) {
      q[e] = to_float(Q[p.q_at.at(r, h) + e]);
      dq[e] = 0.0f;
    }
    for (i64 e = lane; e < p.d2; e += 32) {
      q2[e] = to_float(Q2[p.q2_at.at(r, h) + e]);
      dq2[e] = 0.0f;
    }
    for (i64 e = lane; e < p.dv; e += 32) {
      dout[e] = to_float(dO[p.out_at.at(r, h) + e]);
      nonzero += dout[e] != 0.0f ? 1.0f : 0.0f;
    }
    const float dlse = b.dlse ? b.dlse[b.dlse_at.at(r, h)] : 0.0f;
    __syncwarp();
    float* st = b.ordered ? b.order.stats + (r * p.hq + h) * 2 : nullptr;
    // Query pruning (ordered mode): a zero dout row and zero dlse give exactly zero terms.
    const bool pruned = b.ordered && b.order.pruning && group_sum(nonzero, 32) == 0.0f && dlse == 0.0f;
    if (!pruned) {
      float m = -INFINITY, l = 0.0f, a = 0.0f;
      for (i64 t = 0; t < n; ++t) {
        const i64 pg = page_of(p.sched, p.pages, seq, t);
        if (pg < 0) continue;
        float s, dp;
        score_and_dp<T>(p, q, q2, dout, p.k_at.at(pg, t % ps, hk), p.mla ? p.k2_at.at(pg, t % ps, 0) : 0,
                        p.v_at.at(pg, t % ps, hk), lane, s, dp);
        const float m_new = fmaxf(m, s);
        const float rescale = expf(m - m_new), w = expf(s - m_new);
        l = l * rescale + w;
        a = a * rescale + w * dp;
        m = m_new;
      }
      const float lse = l > 0.0f ? m + logf(l) : -INFINITY;
      const float delta = l > 0.0f ? a / l - dlse : -dlse;
      if (st && lane == 0) {
        st[0] = lse;
        st[1] = delta;
      }
      for (i64 t = 0; t < n; ++t) {
        const i64 pg = page_of(p.sched, p.pages, seq, t);
        if (pg < 0) continue;
        const i64 slot = t % ps, k_off = p.k_at.at(pg, slot, hk), k2_off = p.mla ? p.k2_at.at(pg, slot, 0) : 0;
        float s, dp, P, dS;
        score_and_dp<T>(p, q, q2, dout, k_off, k2_off, p.v_at.at(pg, slot, hk), lane, s, dp);
        terms_of(p, s, dp, lse, delta, P, dS);
        if (b.ordered && b.order.row_cache && lane == 0) {
          const i64 at = i64(b.order.row_start[r]) + t;
          if (at >= 0 && at < b.order.cached) {
            b.order.cache[(at * p.hq + h) * 2] = P;
            b.order.cache[(at * p.hq + h) * 2 + 1] = dS;
          }
        }
        for (i64 e = lane; e < p.d; e += 32) dq[e] += dS * to_float(K[k_off + e]);
        for (i64 e = lane; e < p.d2; e += 32) dq2[e] += dS * to_float(K2[k2_off + e]);
        if (b.ordered) continue;
        if (hist.dk) {
          float* g = hist.dk + hist.dk_at.at(pg, slot, hk);
          for (i64 e = lane; e < p.d; e += 32) atomicAdd(g + e, dS * q[e] + (p.mla ? P * dout[e] : 0.0f));
        }
        if (hist.dv) {
          float* g = hist.dv + hist.dv_at.at(pg, slot, hk);
          for (i64 e = lane; e < p.dv; e += 32) atomicAdd(g + e, P * dout[e]);
        }
        if (hist.dk2) {
          float* g = hist.dk2 + hist.dk2_at.at(pg, slot, 0);
          for (i64 e = lane; e < p.d2; e += 32) atomicAdd(g + e, dS * q2[e]);
        }
      }
    } else if (st && lane == 0) {
      st[0] = INFINITY;  // the history pass skips the pair
      st[1] = 0.0f;
    }
    if (b.dq) {
      T* g = static_cast<T*>(b.dq) + b.dq_at.at(r, h);
      for (i64 e = lane; e < p.d; e += 32) g[e] = from_float<T>(dq[e]);
    }
    if (b.dq2) {
      T* g = static_cast<T*>(b.dq2) + b.dq2_at.at(r, h);
      for (i64 e = lane; e < p.d2; e += 32) g[e] = from_float<T>(dq2[e]);
    }
    __syncwarp();  // the next head reuses the warp's rows
  }
}

// Ordered history: block (listed page i, KV head hk); warp w owns slots w, w + 4, ... and sums
// their terms over the page's reader entries in index order into float32 rows in shared memory,
// then writes each slot once.
template <class T>
__global__ void __launch_bounds__(kThreads) paged_bwd_history_kernel(BackwardProblem b) {
  extern __shared__ float smem[];
  const Problem& p = b.fwd;
  const Ordered& o = b.order;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const i64 i = blockIdx.x, hk = blockIdx.y, ps = p.sched.page_size;
  const i64 pg = o.listed_ids[i];
  if (pg < 0 || pg >= p.pages) return;
  float* dk = smem + warp * (p.d + p.dv + p.d2);
  float* dv = dk + p.d;
  float* dk2 = dv + p.dv;
  const T* Q = static_cast<const T*>(p.q);
  const T* Q2 = static_cast<const T*>(p.q2);
  const T* dO = static_cast<const T*>(p.out);
  i64 first = o.page_start[i], end = p.causal && o.pruning ? o.causal_end[i] : o.page_start[i + 1];
  for (i64 slot = warp; slot < ps; slot += kWarps) {
    for (i64 e = lane; e < p.d; e += 32) dk[e] = 0.0f;
    for (i64 e = lane; e < p.dv; e += 32) dv[e] = 0.0f;
    for (i64 e = lane; e < p.d2; e += 32) dk2[e] = 0.0f;
    const i64 k_off = p.k_at.at(pg, slot, hk), v_off = p.v_at.at(pg, slot, hk),
              k2_off = p.mla ? p.k2_at.at(pg, slot, 0) : 0;
    for (i64 x = first; x < end; ++x) {
      const i64 r = o.entry_row[x];
      if (r < 0 || r >= p.sched.queries) continue;
      const i64 t = i64(o.entry_index[x]) * ps + slot;
      if (t >= row_history(p, r).visible) continue;  // masked, or past the sequence's length
      for (i64 h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        const float* st = o.stats + (r * p.hq + h) * 2;
        if (pruned_pair(st[0])) continue;
        const T* qr = Q + p.q_at.at(r, h);
        const T* q2r = p.mla ? Q2 + p.q2_at.at(r, h) : nullptr;
        const T* dor = dO + p.out_at.at(r, h);
        float P = 0.0f, dS = 0.0f;
        if (o.row_cache) {
          const i64 at = i64(o.row_start[r]) + t;
          if (at < 0 || at >= o.cached) continue;
          P = o.cache[(at * p.hq + h) * 2];
          dS = o.cache[(at * p.hq + h) * 2 + 1];
        } else {
          float s, dp;
          score_and_dp<T>(p, qr, q2r, dor, k_off, k2_off, v_off, lane, s, dp);
          terms_of(p, s, dp, st[0], st[1], P, dS);
        }
        for (i64 e = lane; e < p.d; e += 32)
          dk[e] += dS * to_float(qr[e]) + (p.mla ? P * to_float(dor[e]) : 0.0f);
        for (i64 e = lane; e < p.dv; e += 32) dv[e] += P * to_float(dor[e]);
        for (i64 e = lane; e < p.d2; e += 32) dk2[e] += dS * to_float(q2r[e]);
      }
    }
    if (b.dk) {
      T* g = static_cast<T*>(b.dk) + b.dk_at.at(pg, slot, hk);
      for (i64 e = lane; e < p.d; e += 32) g[e] = from_float<T>(dk[e]);
    }
    if (b.dv) {
      T* g = static_cast<T*>(b.dv) + b.dv_at.at(pg, slot, hk);
      for (i64 e = lane; e < p.dv; e += 32) g[e] = from_float<T>(dv[e]);
    }
    if (b.dk2 && hk == 0) {
      T* g = static_cast<T*>(b.dk2) + b.dk2_at.at(pg, slot, 0);
      for (i64 e = lane; e < p.d2; e += 32) g[e] = from_float<T>(dk2[e]);
    }
    __syncwarp();
  }
}

// Every element of `grid_pages` pages of a cache-shaped array [pages, page_size, heads, dim]
// (the pages listed in `ids`, or pages 0, 1, ...): out = src (float32 of strides src_at)
// rounded to T, or zero when src is null. Listed ids outside [0, pages) are skipped.
template <class T>
__global__ void __launch_bounds__(kThreads)
    paged_bwd_store_kernel(T* out, CacheStrides out_at, const float* src, CacheStrides src_at, const std::int32_t* ids,
                           i64 pages, i64 page_size, i64 heads, i64 dim, i64 count) {
  for (i64 idx = i64(blockIdx.x) * blockDim.x + threadIdx.x; idx < count; idx += i64(gridDim.x) * blockDim.x) {
    const i64 e = idx % dim, h = idx / dim % heads, slot = idx / dim / heads % page_size;
    const i64 pg = ids ? i64(ids[idx / dim / heads / page_size]) : idx / dim / heads / page_size;
    if (pg < 0 || pg >= pages) continue;
    out[out_at.at(pg, slot, h) + e] = from_float<T>(src ? src[src_at.at(pg, slot, h) + e] : 0.0f);
  }
}

// (tests/emulation/paged_backward_emu.cpp runs everything above this line on the CPU.)

int store_blocks(i64 count) {
  const i64 b = (count + kThreads - 1) / kThreads;
  return int(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// Dense float32 strides of a cache [pages, page_size, heads, dim].
CacheStrides dense(i64 page_size, i64 heads, i64 dim) { return CacheStrides{page_size * heads * dim, heads * dim, dim}; }

struct Part {
  void* out;
  CacheStrides at;
  i64 heads, dim;
};

// The asked-for history gradients: dk (MLA: dlatent), dv, dk2 (MLA: dkp).
int parts_of(const BackwardProblem& b, Part (&parts)[3]) {
  const Problem& p = b.fwd;
  int n = 0;
  if (b.dk) parts[n++] = Part{b.dk, b.dk_at, p.hkv, p.d};
  if (b.dv) parts[n++] = Part{b.dv, b.dv_at, p.hkv, p.dv};
  if (b.dk2) parts[n++] = Part{b.dk2, b.dk2_at, 1, p.d2};
  return n;
}

i64 round4(i64 n) { return (n + 3) / 4 * 4; }

// The store over `grid_pages` pages (those listed in ids, or all `pages`).
template <class T>
void launch_store(const Part& part, const float* src, CacheStrides src_at, const std::int32_t* ids, i64 grid_pages,
                  i64 pages, i64 page_size, cudaStream_t s) {
  const i64 count = grid_pages * page_size * part.heads * part.dim;
  if (count == 0) return;
  paged_bwd_store_kernel<T><<<store_blocks(count), kThreads, 0, s>>>(
      static_cast<T*>(part.out), part.at, src, src_at, ids, pages, page_size, part.heads, part.dim, count);
  RUDNN_CUDA_CHECK_LAUNCH("paged_bwd_store_kernel");
}

template <class Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <class T>
const char* run(const BackwardProblem& b, const Tensor* workspace, cudaStream_t s) {
  const Problem& p = b.fwd;
  const i64 ps = p.sched.page_size;
  if (p.hkv > 65535 || (b.ordered && b.order.listed > 0x7fffffff))
    core::fail(ErrorKind::unsupported, "paged backward: more than 65535 key/value heads");
  Part parts[3];
  const int n_parts = parts_of(b, parts);
  History hist;
  const bool direct = std::is_same_v<T, float>;
  if (!b.ordered) {
    // Every slot starts at zero: the float32 gradients themselves, or the dense workspace.
    float* ws = workspace ? workspace->ptr<float>() : nullptr;
    i64 off = 0;
    for (int k = 0; k < n_parts; ++k) {
      const Part& part = parts[k];
      float* target;
      CacheStrides at;
      if (direct) {
        target = static_cast<float*>(part.out);
        at = part.at;
        launch_store<T>(part, nullptr, CacheStrides{}, nullptr, p.pages, p.pages, ps, s);
      } else {
        target = ws + off;
        at = dense(ps, part.heads, part.dim);
        const i64 count = p.pages * ps * part.heads * part.dim;
        if (count) RUDNN_CUDA_CHECK(cudaMemsetAsync(target, 0, std::size_t(count) * sizeof(float), s));
        off += round4(count);
      }
      if (part.out == b.dk) {
        hist.dk = target;
        hist.dk_at = at;
      } else if (part.out == b.dv) {
        hist.dv = target;
        hist.dv_at = at;
      } else {
        hist.dk2 = target;
        hist.dk2_at = at;
      }
    }
  }
  if (p.sched.queries > 0 && p.hq > 0) {
    const std::size_t smem = std::size_t(kWarps) * std::size_t(2 * p.d + 2 * p.d2 + p.dv) * sizeof(float);
    allow_smem(paged_bwd_rows_kernel<T>, smem);
    paged_bwd_rows_kernel<T><<<dim3(unsigned(p.sched.queries), unsigned(p.hkv)), kThreads, smem, s>>>(b, hist);
    RUDNN_CUDA_CHECK_LAUNCH("paged_bwd_rows_kernel");
  }
  if (!b.ordered) {
    if (!direct) {
      const float* ws = workspace ? workspace->ptr<float>() : nullptr;
      i64 off = 0;
      for (int k = 0; k < n_parts; ++k) {
        const Part& part = parts[k];
        launch_store<T>(part, ws + off, dense(ps, part.heads, part.dim), nullptr, p.pages, p.pages, ps, s);
        off += round4(p.pages * ps * part.heads * part.dim);
      }
    }
    return "cuda_atomic";
  }
  if (n_parts > 0 && b.order.listed > 0 && ps > 0) {
    const std::size_t smem = std::size_t(kWarps) * std::size_t(p.d + p.dv + p.d2) * sizeof(float);
    allow_smem(paged_bwd_history_kernel<T>, smem);
    paged_bwd_history_kernel<T><<<dim3(unsigned(b.order.listed), unsigned(p.hkv)), kThreads, smem, s>>>(b);
    RUDNN_CUDA_CHECK_LAUNCH("paged_bwd_history_kernel");
  }
  for (int k = 0; k < n_parts; ++k)
    launch_store<T>(parts[k], nullptr, CacheStrides{}, b.order.inactive_ids, b.order.inactive, p.pages, ps, s);
  return "cuda_ordered";
}

}  // namespace

std::size_t backward_workspace_bytes(const BackwardProblem& b) {
  if (b.ordered || b.fwd.dtype == DType::f32) return 0;
  Part parts[3];
  const int n = parts_of(b, parts);
  i64 floats = 0;
  for (int k = 0; k < n; ++k) floats += round4(b.fwd.pages * b.fwd.sched.page_size * parts[k].heads * parts[k].dim);
  return std::size_t(floats) * sizeof(float);
}

const char* backward_cuda(const BackwardProblem& b, const Tensor* workspace, cudaStream_t s) {
  return core::dispatch_float<__half, __nv_bfloat16>(b.fwd.dtype,
                                                     [&](auto tag) { return run<typename decltype(tag)::type>(b, workspace, s); });
}

}  // namespace rudnn::paged::cuda
