// What every CUDA kernel of the paged family needs (forward_cuda.cu, append_cuda.cu, and the
// backward kernels to come): the row's history read safely from device metadata, the page-slot
// addressing of a KV position, and the staging of a tile of KV slots from their physical pages
// into shared memory (16-byte cp.async where a head's bytes allow it, scalar loads otherwise).
//
// Device metadata is not checked on the host (that would need a synchronization), so every read
// here is bounded by what the validated Problem knows for sure: the table width, num_seqs, the
// page count of the caches. What falls outside is treated as absent, never read:
//   * a query row whose sequence id is outside [0, num_seqs) has no history (out 0, lse -inf);
//   * a sequence length is clamped to [0, width * page_size], a position to [-1, length - 1]
//     (causal: a negative position sees nothing);
//   * a KV position whose table entry is outside [0, pages) is skipped: its staged rows are
//     zeros and the kernels mask its score (it takes no part in the softmax), and append writes
//     nothing for it.
// A valid schedule (the HostPlan's checks) never meets any of these cases.
//
// The host emulator (tests/emulation/paged_emu.cpp) runs this file's text from the marker line
// below on, with the cp.async atoms replaced by its stand-ins.
#pragma once

#include <cute/arch/copy_sm80.hpp>

#include <cstdint>
#include <cstring>

#include "attention/cuda_common.cuh"  // exp2_ftz, kLog2e, kLn2: the base-2 softmax of the flash kernels
#include "core/convert.cuh"
#include "paged/problem.hpp"

namespace rudnn::paged::cuda {
// ---- emulated from here (tests/test_paged_emulation.py) ----

using i64 = std::int64_t;
using attention::cuda::exp2_ftz;
using attention::cuda::kLn2;
using attention::cuda::kLog2e;

// Whether every row of a cache head ([pages, page_size, heads, dim], strides in elements) can be
// copied in 16-byte pieces: the base, every page / slot / head step and the row itself are
// multiples of 16 bytes (cp.async.cg moves exactly 16 aligned bytes).
inline bool rows_copy_in_16_bytes(const void* base, const CacheStrides& at, i64 dim, std::size_t elem) {
  const auto aligned = [](std::uint64_t bytes) { return bytes % 16 == 0; };
  return aligned(reinterpret_cast<std::uintptr_t>(base)) && aligned(std::uint64_t(dim) * elem) &&
         aligned(std::uint64_t(at.page) * elem) && aligned(std::uint64_t(at.slot) * elem) &&
         aligned(std::uint64_t(at.head) * elem);
}

// 16-byte chunks of a row of `dim` elements of T (the staged row is padded to whole chunks).
template <class T>
__host__ __device__ __forceinline__ int row_chunks(i64 dim) {
  return int((dim * i64(sizeof(T)) + 15) / 16);
}
// Elements of T in one 16-byte chunk.
template <class T>
constexpr int kChunkElems = 16 / int(sizeof(T));

// Shared-memory pitch (bytes) of staged rows of `chunks` chunks: an odd number of chunks, so that
// the 16-byte reads of consecutive rows by consecutive lanes hit distinct bank groups.
__host__ __device__ __forceinline__ int staged_pitch(int chunks) { return 16 * (chunks | 1); }

// The KV history of query row r read safely from device metadata (see the top of this file).
struct RowHistory {
  i64 seq = 0;      // its sequence (valid only when visible > 0)
  i64 visible = 0;  // KV positions [0, visible) take part
};

__device__ __forceinline__ RowHistory row_history(const Problem& p, i64 r) {
  RowHistory h;
  const Schedule& s = p.sched;
  const i64 seq = s.sequence(r);
  if (seq < 0 || seq >= s.num_seqs) return h;
  const i64 capacity = s.width * s.page_size;
  i64 len = s.length(seq);
  len = len < 0 ? 0 : len > capacity ? capacity : len;
  i64 n = len;
  if (p.causal) {
    const i64 pos = s.position(r);
    n = pos < 0 ? 0 : pos + 1 < len ? pos + 1 : len;
  }
  h.seq = seq;
  h.visible = n;
  return h;
}

// The physical page of KV position t (0 <= t < width * page_size) of sequence seq, or -1 when
// its table entry is not a page of the caches.
__device__ __forceinline__ i64 page_of(const Schedule& s, i64 pages, i64 seq, i64 t) {
  const i64 page = s.page(seq, t / s.page_size);
  return page >= 0 && page < pages ? page : -1;
}

// One head of a cache as the staging sees it: rows of `dim` elements of T at at(page, slot, head).
template <class T>
struct CacheRows {
  const T* base = nullptr;
  CacheStrides at;
  i64 head = 0;
  int dim = 0;
  bool vec16 = false;  // rows_copy_in_16_bytes (decided on the host)
};

// Issues the staging of KV positions [t0, t0 + rows) of sequence seq into shared memory: the row
// of position t0 + i lands at dst + i * pitch (pitch a multiple of 16), as row_chunks<T>(dim)
// chunks. Positions at or past `end`, and those whose page is out of range, become zero rows.
// Threads tid of nthreads share the chunks. The 16-byte path issues cp.async (the caller commits
// and waits: stage_commit / stage_wait); the scalar path stores at once (a __syncthreads orders it).
template <class T>
__device__ __forceinline__ void stage_rows(unsigned char* dst, int pitch, const CacheRows<T>& src, const Schedule& s,
                                           i64 pages, i64 seq, i64 t0, i64 end, int rows, int tid, int nthreads) {
  const int chunks = row_chunks<T>(src.dim);
  for (int c = tid; c < rows * chunks; c += nthreads) {
    const int i = c / chunks, k = c % chunks;
    const i64 t = t0 + i;
    const i64 page = t < end ? page_of(s, pages, seq, t) : -1;
    unsigned char* to = dst + i * pitch + k * 16;
    const T* row = page >= 0 ? src.base + src.at.at(page, t % s.page_size, src.head) : src.base;
    if (src.vec16) {
      // src-size 0 when absent: nothing is read, 16 zero bytes are written.
      cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
          *reinterpret_cast<const cute::uint128_t*>(row + k * kChunkElems<T>), *reinterpret_cast<cute::uint128_t*>(to),
          page >= 0);
    } else {
      T pack[kChunkElems<T>];
#pragma unroll
      for (int l = 0; l < kChunkElems<T>; ++l) {
        const int e = k * kChunkElems<T> + l;
        pack[l] = page >= 0 && e < src.dim ? row[e] : core::from_float<T>(0.0f);
      }
      memcpy(to, pack, 16);
    }
  }
}

// The cp.async group boundary and wait of the staging (no-ops for what the scalar path stored).
__device__ __forceinline__ void stage_commit() { cute::cp_async_fence(); }
template <int kPending>
__device__ __forceinline__ void stage_wait() {
  cute::cp_async_wait<kPending>();
}

// The kChunkElems<T> elements of one staged 16-byte chunk, as float.
template <class T>
__device__ __forceinline__ void chunk_as_float(const unsigned char* chunk, float (&out)[kChunkElems<T>]) {
  T pack[kChunkElems<T>];
  memcpy(pack, chunk, 16);
#pragma unroll
  for (int l = 0; l < kChunkElems<T>; ++l) out[l] = core::to_float(pack[l]);
}

// Which query rows the tensor-core prefill kernel (prefill_cuda.cu) computes and the decode kernel
// leaves to it, decided on the device from the sequence ids alone so that no host plan data is
// needed and both kernels agree row for row whatever the device tables hold: the query rows are
// cut into windows of kPrefillRows (the flash tile's M), and a run (the maximal consecutive rows of
// one window with one sequence id) of at least kPrefillMinRun rows of a valid sequence is a
// prefill run. Rows past the last query read as sequence -1 (never valid).
constexpr int kPrefillRows = 64;
constexpr int kPrefillMinRun = 16;

// Threads 0 .. kPrefillRows - 1 store the sequence ids of the window's rows [w0, w0 + kPrefillRows);
// the caller synchronizes before reading them.
__device__ __forceinline__ void load_window_sequences(const Schedule& s, i64 w0, int* seq_s, int tid) {
  if (tid < kPrefillRows) seq_s[tid] = w0 + tid < s.queries ? s.sequence(w0 + tid) : -1;
}

// The end of the run that starts at window row `begin`.
__device__ __forceinline__ int window_run_end(const int* seq_s, int begin) {
  int end = begin + 1;
  while (end < kPrefillRows && seq_s[end] == seq_s[begin]) ++end;
  return end;
}

__device__ __forceinline__ bool is_prefill_run(const Schedule& s, const int* seq_s, int begin, int end) {
  return end - begin >= kPrefillMinRun && seq_s[begin] >= 0 && seq_s[begin] < s.num_seqs;
}

// Whether window row i lies in a prefill run.
__device__ __forceinline__ bool in_prefill_run(const Schedule& s, const int* seq_s, int i) {
  int begin = i;
  while (begin > 0 && seq_s[begin - 1] == seq_s[i]) --begin;
  return is_prefill_run(s, seq_s, begin, window_run_end(seq_s, begin));
}

// Butterfly reductions over aligned groups of `width` lanes (a power of two <= 32): every lane of
// the group receives the result. Every lane of the warp must call them.
__device__ __forceinline__ float group_max(float v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

}  // namespace rudnn::paged::cuda
