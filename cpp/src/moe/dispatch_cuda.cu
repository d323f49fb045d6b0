// CUDA dispatch and combine. The dispatch plan is a stable counting sort of the T*k
// (token, slot) pairs by expert, built without atomics so that the row order is the same on
// every run: the flattened slots are cut into chunks, one warp per chunk counts its experts,
// one block per expert scans its counts over the chunks (the per-(expert, chunk) bases), one
// block scans the experts' totals into the offsets, and the same warps walk their chunk again
// placing each slot at its base plus its rank (ranks inside a 32-slot step come from
// __match_any_sync, so token order is kept). Combine and the
// backward kernels gather in a fixed order with float32 accumulation (no atomics either). The
// gate/up interleaving of moe_interleave_gate_up, two strided copies of weight rows, is here too.
#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <utility>

#include "core/pack.cuh"
#include "moe/cuda_common.cuh"
#include "moe/problem.hpp"

namespace rudnn::moe {

using namespace cuda;

namespace {

// ---- dispatch plan (tests/emulation/moe_dispatch_emu.cpp runs this section on the CPU) ----

constexpr std::int64_t kMinChunk = 256;  // slots per chunk
constexpr std::int64_t kMaxChunks = 2048;  // bounds the count table at kMaxChunks * E ints
constexpr int kScanItems = 8;  // counts per thread of scan_chunks_kernel
constexpr int kScanMaxThreads = int(kMaxChunks) / kScanItems;

struct Chunks {
  std::int64_t slots = 0, size = 0, count = 0;
};

Chunks chunks_of(const DispatchPlanProblem& p) {
  Chunks c;
  c.slots = p.tokens * p.top_k;
  c.size = std::max(kMinChunk, (c.slots + kMaxChunks - 1) / kMaxChunks);
  c.size = (c.size + 31) / 32 * 32;
  c.count = (c.slots + c.size - 1) / c.size;
  return c;
}

// Ints of the workspace: the count table [E][chunks], then the experts' totals [E]; none for a
// single chunk (single_chunk_plan_kernel keeps its counts in shared memory).
std::int64_t workspace_ints(const DispatchPlanProblem& p) {
  const Chunks c = chunks_of(p);
  return c.count > 1 ? (c.count + 1) * p.experts : 0;
}

// Threads of scan_chunks_kernel for `chunks` counts per expert: kScanItems each, whole warps.
int scan_threads(std::int64_t chunks) {
  return int(std::min<std::int64_t>(kScanMaxThreads, ((chunks + kScanItems - 1) / kScanItems + 31) / 32 * 32));
}

// Threads of scan_totals_kernel: one per expert, whole warps.
int totals_threads(int experts) { return (experts + 31) / 32 * 32; }

template <class Idx>
__device__ __forceinline__ int expert_of(const Idx* indices, std::int64_t stride, int k, int E, std::int64_t slot) {
  const std::int64_t e = std::int64_t(indices[(slot / k) * stride + slot % k]);
  return (e >= 0 && e < E) ? int(e) : -1;
}

// The exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024) in a
// fixed order; *total gets the block's sum. `scratch` holds 33 ints and is used once per kernel.
__device__ __forceinline__ int block_exclusive_sum(int v, int* scratch, int* total) {
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  int inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int below = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += below;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int mine = lane < warps ? scratch[lane] : 0;
    int warps_inclusive = mine;
    for (int o = 1; o < 32; o <<= 1) {
      const int below = __shfl_up_sync(kFullMask, warps_inclusive, o);
      if (lane >= o) warps_inclusive += below;
    }
    scratch[lane] = warps_inclusive - mine;  // the warps before this lane's warp
    if (lane == 31) scratch[32] = warps_inclusive;
  }
  __syncthreads();
  *total = scratch[32];
  return scratch[warp] + inclusive - v;
}

// One warp walks one chunk of slots [begin, end) in order, 32 slots per step, over the cursors
// `cursor` [E] in shared memory. kPlace = false: count the chunk's slots per expert into the
// cursors. kPlace = true: place every slot at its expert's cursor (the expert's first row for
// this chunk) + its rank so far, and mark the chunk's share of the rows past `used` (offsets[E]:
// rows of no token, slots with an invalid expert index). `used` comes as a value: the
// single-chunk kernel writes offsets itself, and a read of it through the const __restrict__
// pointer could take the non-coherent path.
template <class Idx, bool kPlace>
__device__ __forceinline__ void walk_chunk(const Idx* __restrict__ indices, std::int64_t stride, int k, int E,
                                           std::int64_t begin, std::int64_t end, int* cursor, std::int64_t used,
                                           int* __restrict__ token_of_row, int* __restrict__ row_of_slot) {
  const int lane = int(threadIdx.x % 32);
  const unsigned lanes_below = (1u << lane) - 1u;
  for (std::int64_t base = begin; base < end; base += 32) {
    const std::int64_t slot = base + lane;
    const int e = slot < end ? expert_of(indices, stride, k, E, slot) : -2;  // -1: invalid, -2: past the end
    const unsigned same = __match_any_sync(kFullMask, e);
    const int rank = __popc(same & lanes_below);
    if (kPlace && e >= 0) {
      const int row = cursor[e] + rank;
      token_of_row[row] = int(slot / k);
      row_of_slot[slot] = row;
    } else if (kPlace && e == -1) {
      row_of_slot[slot] = -1;
    }
    __syncwarp();
    if (e >= 0 && rank == 0) cursor[e] += __popc(same);  // one writer per expert
    __syncwarp();
  }
  if (kPlace)  // rows and slots are both [0, slots): this chunk marks rows [begin, end) past the used ones
    for (std::int64_t r = std::max(begin, used) + lane; r < end; r += 32) token_of_row[r] = -1;
}

// One warp per chunk. kPlace = false: counts[e][chunk] = the chunk's slots of expert e
// (expert-major: scan_chunks_kernel reads each expert's counts as one contiguous row).
// kPlace = true: the cursors start at offsets[e] + counts[e][chunk] (the slots of earlier chunks).
template <class Idx, bool kPlace>
__global__ void __launch_bounds__(32)
    walk_chunks_kernel(const Idx* __restrict__ indices, std::int64_t stride, std::int64_t slots, int k, int E,
                       std::int64_t chunk, std::int64_t chunks, int* __restrict__ counts,
                       const int* __restrict__ offsets, int* __restrict__ token_of_row, int* __restrict__ row_of_slot) {
  extern __shared__ int cursor[];  // [E]
  const int lane = threadIdx.x;
  const std::int64_t c = blockIdx.x;
  for (int e = lane; e < E; e += 32) cursor[e] = kPlace ? offsets[e] + counts[e * chunks + c] : 0;
  __syncwarp();
  const std::int64_t begin = c * chunk;
  walk_chunk<Idx, kPlace>(indices, stride, k, E, begin, std::min(begin + chunk, slots), cursor,
                          kPlace ? std::int64_t(offsets[E]) : 0, token_of_row, row_of_slot);
  if (!kPlace)
    for (int e = lane; e < E; e += 32) counts[e * chunks + c] = cursor[e];
}

// Block e: counts[e][c] -> the slots of expert e in chunks before c (an exclusive scan of the
// row, kScanItems consecutive counts per thread), totals[e] = the row's sum.
__global__ void __launch_bounds__(kScanMaxThreads)
    scan_chunks_kernel(int* __restrict__ counts, std::int64_t chunks, int* __restrict__ totals) {
  __shared__ int scratch[33];
  int* row = counts + std::int64_t(blockIdx.x) * chunks;
  const std::int64_t first = std::int64_t(threadIdx.x) * kScanItems;
  int v[kScanItems], sum = 0;
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    v[i] = first + i < chunks ? row[first + i] : 0;
    sum += v[i];
  }
  int total;
  int before = block_exclusive_sum(sum, scratch, &total);
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    if (first + i < chunks) row[first + i] = before;
    before += v[i];
  }
  if (threadIdx.x == 0) totals[blockIdx.x] = total;
}

// offsets = the exclusive scan of the experts' totals, offsets[E] = their sum (one block, a
// thread per expert).
__global__ void __launch_bounds__(kMoeMaxExperts)
    scan_totals_kernel(const int* __restrict__ totals, int E, int* __restrict__ offsets) {
  __shared__ int scratch[33];
  const int e = threadIdx.x;
  int total;
  const int before = block_exclusive_sum(e < E ? totals[e] : 0, scratch, &total);
  if (e < E) offsets[e] = before;
  if (e == 0) offsets[E] = total;
}

// Slots that fit one chunk (decode: T * k <= kMinChunk) take the whole plan in one launch
// instead of four: warp 0 counts, the block scans the counts into the offsets (a thread per
// expert, as scan_totals_kernel), warp 0 places. The same walks and scan: the same plan, bitwise.
bool single_chunk(const Chunks& c) { return c.count == 1; }

template <class Idx>
__global__ void __launch_bounds__(kMoeMaxExperts)
    single_chunk_plan_kernel(const Idx* __restrict__ indices, std::int64_t stride, std::int64_t slots, int k, int E,
                             int* __restrict__ offsets, int* __restrict__ token_of_row,
                             int* __restrict__ row_of_slot) {
  extern __shared__ int cursor[];  // [E]
  __shared__ int scratch[33];
  const int e = threadIdx.x;  // blockDim.x = totals_threads(E) >= E
  if (e < E) cursor[e] = 0;
  __syncthreads();
  if (e < 32) walk_chunk<Idx, false>(indices, stride, k, E, 0, slots, cursor, 0, token_of_row, row_of_slot);
  __syncthreads();
  int total;
  const int before = block_exclusive_sum(e < E ? cursor[e] : 0, scratch, &total);
  if (e < E) offsets[e] = cursor[e] = before;
  if (e == 0) offsets[E] = total;
  __syncthreads();  // the cursors are written
  if (e < 32) walk_chunk<Idx, true>(indices, stride, k, E, 0, slots, cursor, total, token_of_row, row_of_slot);
}

// (tests/emulation/moe_dispatch_emu.cpp runs everything from the dispatch plan mark to this line on the CPU.)

// ---- row gather and combine (tests/emulation/moe_combine_emu.cpp runs this section on the CPU) ----
// One thread per pack of L hidden elements of one row (grid: rows or tokens × hidden slices), so a
// row moves as 16-byte accesses when its rows are dense and aligned (L = kVecLanes<T>), else as
// single elements (L = 1): the same code, two instantiations.

constexpr int kRowThreads = 256;
constexpr int kSlotBatch = 8;  // combine: slots whose rows are loaded before any is summed

struct CombineView {
  const int* row_of_slot;
  const void* weights;  // null: every weight is 1
  DType weight_dtype;
  std::int64_t weight_stride;
};

__device__ __forceinline__ float slot_weight(const CombineView& v, std::int64_t t, int j) {
  return v.weights ? load_as_float(v.weights, v.weight_dtype, t * v.weight_stride + j) : 1.0f;
}

// out[r] = x[token_of_row[r]] (zeros for a row of no token), pack by pack.
template <class T, int L>
__global__ void __launch_bounds__(kRowThreads)
    gather_rows_kernel(const T* __restrict__ x, std::int64_t x_stride, std::int64_t tokens,
                       const int* __restrict__ token_of_row, T* __restrict__ out, std::int64_t out_stride,
                       std::int64_t hidden) {
  using P = core::Pack<T, L>;
  const std::int64_t r = blockIdx.x;
  // This thread's pack. 32-bit (the grid bounds it to 2^24 packs): with a 64-bit index nvcc
  // splits the pack's store into four 4-byte stores.
  const unsigned c = blockIdx.y * unsigned(kRowThreads) + threadIdx.x;
  if (std::int64_t(c) * L >= hidden) return;
  const std::int64_t t = token_of_row[r];
  P v;
  if (t >= 0 && t < tokens) {
    v = core::load_pack<T, L>(x + t * x_stride + c * L);
  } else {
#pragma unroll
    for (int l = 0; l < L; ++l) v.v[l] = from_float<T>(0.0f);
  }
  core::store_pack<T, L>(out + r * out_stride + c * L, v);
}

// out[t] = sum_j w[t, j] * y[row_of_slot[t, j]], summed in slot order in float32; a bad row
// index makes the token NaN. The rows of kSlotBatch slots are all in flight before the first is
// added (the loads of a token's k rows overlap instead of waiting one after another).
template <class T, int L>
__global__ void __launch_bounds__(kRowThreads)
    combine_kernel(const T* __restrict__ y, std::int64_t y_stride, std::int64_t rows, CombineView v, int k,
                   T* __restrict__ out, std::int64_t out_stride, std::int64_t hidden) {
  using P = core::Pack<T, L>;
  const std::int64_t t = blockIdx.x;
  const unsigned c = blockIdx.y * unsigned(kRowThreads) + threadIdx.x;  // as in gather_rows_kernel
  if (std::int64_t(c) * L >= hidden) return;
  const int* slot_rows = v.row_of_slot + t * k;
  float acc[L];
#pragma unroll
  for (int l = 0; l < L; ++l) acc[l] = 0.0f;
  bool bad = false;
  for (int j0 = 0; j0 < k; j0 += kSlotBatch) {
    std::int64_t row[kSlotBatch];
    float w[kSlotBatch];
    P val[kSlotBatch];
#pragma unroll
    for (int b = 0; b < kSlotBatch; ++b) {
      row[b] = j0 + b < k ? slot_rows[j0 + b] : 0;
      w[b] = j0 + b < k ? slot_weight(v, t, j0 + b) : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kSlotBatch; ++b)
      if (j0 + b < k && row[b] >= 0 && row[b] < rows) val[b] = core::load_pack<T, L>(y + row[b] * y_stride + c * L);
#pragma unroll
    for (int b = 0; b < kSlotBatch; ++b) {
      if (j0 + b >= k) continue;
      if (row[b] < 0 || row[b] >= rows) {
        bad = true;
        continue;
      }
#pragma unroll
      for (int l = 0; l < L; ++l) acc[l] += w[b] * to_float(val[b].v[l]);
    }
  }
  P o;
#pragma unroll
  for (int l = 0; l < L; ++l) o.v[l] = from_float<T>(bad ? kNaN : acc[l]);
  core::store_pack<T, L>(out + t * out_stride + c * L, o);
}

// The pack width the rows of these arrays allow: kVecLanes<T> when every row start is aligned
// to a pack, else 1.
template <class T>
int row_lanes(std::int64_t hidden, std::initializer_list<std::pair<const void*, std::int64_t>> rows) {
  constexpr int L = core::kVecLanes<T>;
  if (hidden % L != 0) return 1;
  for (const auto& [data, stride] : rows)
    if (!core::pack_aligned<T, L>(data) || stride % L != 0) return 1;
  return L;
}

// combine_backward: the rows of dy that no slot points at get zeros; every other row is written
// whole by the slot kernels below. Rather than zero all rows first (and rewrite most of them), each
// valid slot s writes its index into the first 4 bytes of its row (a claim), then a row is zeroed
// unless its first 4 bytes name a slot that points at it. A row no slot points at fails that test
// whatever its memory held; a row some slot points at passes (whichever claim landed names such a
// slot) and is overwritten next. Rows narrower than 4 bytes are all zeroed first, as before.
template <class T>
constexpr int kClaimElements = sizeof(T) >= 4 ? 1 : 4 / int(sizeof(T));

template <class T>
__device__ __forceinline__ void write_claim(T* row, std::uint32_t slot) {
  if constexpr (sizeof(T) >= 4) {
    *reinterpret_cast<std::uint32_t*>(row) = slot;
  } else {  // a 16-bit row may start 2 bytes off a 4-byte boundary
    std::uint16_t* half = reinterpret_cast<std::uint16_t*>(row);
    half[0] = std::uint16_t(slot & 0xffffu);
    half[1] = std::uint16_t(slot >> 16);
  }
}

template <class T>
__device__ __forceinline__ std::uint32_t read_claim(const T* row) {
  if constexpr (sizeof(T) >= 4) {
    return *reinterpret_cast<const std::uint32_t*>(row);
  } else {
    const std::uint16_t* half = reinterpret_cast<const std::uint16_t*>(row);
    return std::uint32_t(half[0]) | (std::uint32_t(half[1]) << 16);
  }
}

template <class T>
__global__ void claim_rows_kernel(const int* __restrict__ row_of_slot, std::int64_t slots, std::int64_t rows,
                                  T* __restrict__ dy, std::int64_t dy_stride) {
  const std::int64_t s = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (s >= slots) return;
  const std::int64_t r = row_of_slot[s];
  if (r >= 0 && r < rows) write_claim(dy + r * dy_stride, std::uint32_t(s));
}

// One block per row: zeros unless the row's claim names a slot that points at it (or, with
// kAll, zeros always).
template <class T, bool kAll>
__global__ void zero_unclaimed_rows_kernel(T* __restrict__ dy, std::int64_t dy_stride, std::int64_t hidden,
                                           const int* __restrict__ row_of_slot, std::int64_t slots) {
  T* row = dy + blockIdx.x * dy_stride;
  bool claimed = false;
  if (!kAll) {
    const std::uint32_t s = read_claim(row);
    claimed = s < slots && row_of_slot[s] == std::int64_t(blockIdx.x);
    __syncthreads();  // every thread has read the claim before any thread clears it
  }
  if (claimed) return;
  for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) row[h] = from_float<T>(0.0f);
}

struct CombineBackwardView {
  CombineView v;
  std::int64_t rows, hidden, y_stride, dout_stride, dy_stride;
};

// "serial": one thread per (token, slot) reduces its dot product alone.
template <class T>
__global__ void combine_backward_serial_kernel(const T* __restrict__ y, const T* __restrict__ dout, T* __restrict__ dy,
                                               float* __restrict__ dweights, CombineBackwardView b, std::int64_t slots,
                                               int k) {
  const std::int64_t s = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (s >= slots) return;
  const std::int64_t t = s / k, r = b.v.row_of_slot[s];
  if (r < 0 || r >= b.rows) {
    dweights[s] = kNaN;
    return;
  }
  const float w = slot_weight(b.v, t, int(s % k));
  float dot = 0.0f;
  for (std::int64_t h = 0; h < b.hidden; ++h) {
    const float d = to_float(dout[t * b.dout_stride + h]);
    dot += d * to_float(y[r * b.y_stride + h]);
    dy[r * b.dy_stride + h] = from_float<T>(w * d);
  }
  dweights[s] = dot;
}

int row_threads(std::int64_t hidden) { return hidden >= 256 ? 256 : hidden >= 128 ? 128 : 64; }

// ---- rows no expert covers (the experts' outputs y, a, b and dx) ----
// An expert writes the rows of its segment (segment_of). Offsets from a dispatch plan tile the N
// rows, but device offsets are never read on the host, so any array may arrive; the rows that no
// segment covers are written zero here rather than left unwritten (the outputs need no fill
// before the call). Every block first reads the E + 1 offsets: a tiling (offsets[0] <= 0,
// non-decreasing, offsets[E] >= N) ends the kernel at once, so the usual call costs one short
// launch where a fill of the outputs would write all of them. Otherwise (a caller's offsets, or a
// plan whose device expert ids were partly out of range: offsets[E] < N) each block tests its
// rows against every segment: exact, and slower.
constexpr int kCoverThreads = 128;
constexpr int kCoverBlocks = 128;
constexpr int kMaxCoverArrays = 3;

struct CoverArrays {
  char* base[kMaxCoverArrays];
  std::int64_t stride_bytes[kMaxCoverArrays], row_bytes[kMaxCoverArrays];
  int count;
};

__global__ void __launch_bounds__(kCoverThreads)
    zero_uncovered_rows_kernel(CoverArrays out, const int* __restrict__ offsets, int E, std::int64_t rows) {
  bool tiled = true;
  for (int e = threadIdx.x; e <= E; e += kCoverThreads) {
    const std::int64_t o = offsets[e];
    if ((e == 0 && o > 0) || (e == E && o < rows) || (e < E && std::int64_t(offsets[e + 1]) < o)) tiled = false;
  }
  if (!__syncthreads_or(!tiled)) return;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    bool covered = false;
    for (int e = threadIdx.x; e < E && !covered; e += kCoverThreads) {
      const Segment seg = segment_of(offsets, e, rows);
      covered = r >= seg.begin && r < seg.end;
    }
    if (__syncthreads_or(covered)) continue;  // the same answer in every thread
#pragma unroll  // constant indices: the parameter's arrays stay out of local memory
    for (int a = 0; a < kMaxCoverArrays; ++a) {
      if (a >= out.count) break;
      char* row = out.base[a] + r * out.stride_bytes[a];
      for (std::int64_t b = threadIdx.x; b < out.row_bytes[a]; b += kCoverThreads) row[b] = 0;
    }
  }
}

unsigned cover_blocks(std::int64_t rows) { return unsigned(std::min<std::int64_t>(rows, kCoverBlocks)); }

// (tests/emulation/moe_combine_emu.cpp runs everything from the section mark above to this line on the CPU.)

// "plane": one block per token; the hidden axis is spread over the block and each dot
// product is reduced by a fixed-shape tree.
constexpr int kPlaneThreads = 256;

template <class T>
__global__ void __launch_bounds__(kPlaneThreads)
    combine_backward_plane_kernel(const T* __restrict__ y, const T* __restrict__ dout, T* __restrict__ dy,
                                  float* __restrict__ dweights, CombineBackwardView b, int k) {
  __shared__ float scratch[32];
  const std::int64_t t = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const std::int64_t r = b.v.row_of_slot[t * k + j];  // the same for the whole block
    if (r < 0 || r >= b.rows) {
      if (threadIdx.x == 0) dweights[t * k + j] = kNaN;
      continue;
    }
    const float w = slot_weight(b.v, t, j);
    float part = 0.0f;
    for (std::int64_t h = threadIdx.x; h < b.hidden; h += kPlaneThreads) {
      const float d = to_float(dout[t * b.dout_stride + h]);
      part += d * to_float(y[r * b.y_stride + h]);
      dy[r * b.dy_stride + h] = from_float<T>(w * d);
    }
    const float dot = block_sum<kPlaneThreads>(part, scratch);
    if (threadIdx.x == 0) dweights[t * k + j] = dot;
  }
}

}  // namespace

std::size_t dispatch_plan_workspace_bytes_cuda(const DispatchPlanProblem& p) {
  return std::size_t(workspace_ints(p)) * sizeof(int);
}

// Four launches (tests/emulation/moe_plan_launches.hpp replays them): count, scan each expert's
// counts over the chunks, scan the experts' totals into the offsets, place; one for a single chunk.
void dispatch_plan_cuda(const MoeDispatchPlanArgs& a, const DispatchPlanProblem& p, Stream s) {
  const Chunks c = chunks_of(p);
  const cudaStream_t stream = as_cuda(s);
  int* offsets = a.offsets.ptr<int>();
  if (c.count == 0) {  // no slots: every expert's segment is empty
    RUDNN_CUDA_CHECK(cudaMemsetAsync(offsets, 0, std::size_t(p.experts + 1) * sizeof(int), stream));
    return;
  }
  int* counts = a.workspace ? static_cast<int*>(a.workspace->data) : nullptr;  // none for a single chunk
  int* totals = counts ? counts + c.count * p.experts : nullptr;
  int* token_of_row = a.token_of_row.ptr<int>();
  int* row_of_slot = a.row_of_slot.ptr<int>();
  const std::size_t smem = std::size_t(p.experts) * sizeof(int);
  dispatch_index(a.expert_indices.dtype, [&](auto tag) {
    using Idx = typename decltype(tag)::type;
    const Idx* indices = a.expert_indices.ptr<Idx>();
    if (single_chunk(c)) {
      single_chunk_plan_kernel<Idx><<<1, totals_threads(p.experts), smem, stream>>>(
          indices, p.index_stride, c.slots, p.top_k, p.experts, offsets, token_of_row, row_of_slot);
      RUDNN_CUDA_CHECK_LAUNCH(single_chunk_plan_kernel);
      return;
    }
    walk_chunks_kernel<Idx, false><<<unsigned(c.count), 32, smem, stream>>>(
        indices, p.index_stride, c.slots, p.top_k, p.experts, c.size, c.count, counts, offsets, token_of_row,
        row_of_slot);
    RUDNN_CUDA_CHECK_LAUNCH(walk_chunks_kernel);
    scan_chunks_kernel<<<unsigned(p.experts), scan_threads(c.count), 0, stream>>>(counts, c.count, totals);
    RUDNN_CUDA_CHECK_LAUNCH(scan_chunks_kernel);
    scan_totals_kernel<<<1, totals_threads(p.experts), 0, stream>>>(totals, p.experts, offsets);
    RUDNN_CUDA_CHECK_LAUNCH(scan_totals_kernel);
    walk_chunks_kernel<Idx, true><<<unsigned(c.count), 32, smem, stream>>>(
        indices, p.index_stride, c.slots, p.top_k, p.experts, c.size, c.count, counts, offsets, token_of_row,
        row_of_slot);
    RUDNN_CUDA_CHECK_LAUNCH(walk_chunks_kernel);
  });
}

void zero_uncovered_rows_cuda(const Tensor& offsets, int experts, std::int64_t rows,
                              std::initializer_list<const Tensor*> outputs, Stream s) {
  if (rows == 0) return;
  if (outputs.size() > std::size_t(kMaxCoverArrays))
    throw std::logic_error("zero_uncovered_rows_cuda: too many outputs");
  CoverArrays out{};
  for (const Tensor* t : outputs) {
    if (!t || t->shape[1] == 0) continue;
    const std::int64_t size = std::int64_t(dtype_size(t->dtype));
    out.base[out.count] = static_cast<char*>(t->data);
    out.stride_bytes[out.count] = t->strides[0] * size;
    out.row_bytes[out.count] = t->shape[1] * size;
    ++out.count;
  }
  if (out.count == 0) return;
  zero_uncovered_rows_kernel<<<cover_blocks(rows), kCoverThreads, 0, as_cuda(s)>>>(out, offsets.ptr<int>(), experts,
                                                                                    rows);
  RUDNN_CUDA_CHECK_LAUNCH(zero_uncovered_rows_kernel);
}

void gather_rows_cuda(const Tensor& x, const Tensor& token_of_row, const Tensor& out, const GatherProblem& p,
                      Stream s) {
  dispatch_float(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.rows == 0 || p.hidden == 0) return;
    const int lanes = row_lanes<T>(p.hidden, {{x.data, p.x_stride}, {out.data, p.out_stride}});
    const dim3 grid(unsigned(p.rows), unsigned((p.hidden / lanes + kRowThreads - 1) / kRowThreads));
    const int threads = int(std::min<std::int64_t>(kRowThreads, (p.hidden / lanes + 31) / 32 * 32));
    if (lanes > 1)
      gather_rows_kernel<T, core::kVecLanes<T>><<<grid, threads, 0, as_cuda(s)>>>(
          x.ptr<T>(), p.x_stride, p.tokens, token_of_row.ptr<int>(), out.ptr<T>(), p.out_stride, p.hidden);
    else
      gather_rows_kernel<T, 1><<<grid, threads, 0, as_cuda(s)>>>(x.ptr<T>(), p.x_stride, p.tokens,
                                                                 token_of_row.ptr<int>(), out.ptr<T>(), p.out_stride,
                                                                 p.hidden);
    RUDNN_CUDA_CHECK_LAUNCH(gather_rows_kernel);
  });
}

void combine_cuda(const MoeCombineArgs& a, const CombineProblem& p, Stream s) {
  const CombineView v{a.row_of_slot.ptr<int>(), a.weights ? a.weights->data : nullptr,
                      a.weights ? a.weights->dtype : DType::f32, p.weight_stride};
  dispatch_float(a.y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.tokens == 0 || p.hidden == 0) return;
    const int lanes = row_lanes<T>(p.hidden, {{a.y.data, p.y_stride}, {a.out.data, p.out_stride}});
    const dim3 grid(unsigned(p.tokens), unsigned((p.hidden / lanes + kRowThreads - 1) / kRowThreads));
    const int threads = int(std::min<std::int64_t>(kRowThreads, (p.hidden / lanes + 31) / 32 * 32));
    if (lanes > 1)
      combine_kernel<T, core::kVecLanes<T>><<<grid, threads, 0, as_cuda(s)>>>(
          a.y.ptr<T>(), p.y_stride, p.rows, v, p.top_k, a.out.ptr<T>(), p.out_stride, p.hidden);
    else
      combine_kernel<T, 1><<<grid, threads, 0, as_cuda(s)>>>(a.y.ptr<T>(), p.y_stride, p.rows, v, p.top_k,
                                                             a.out.ptr<T>(), p.out_stride, p.hidden);
    RUDNN_CUDA_CHECK_LAUNCH(combine_kernel);
  });
}

void combine_backward_cuda(const MoeCombineBackwardArgs& a, const CombineProblem& p, Stream s) {
  const cudaStream_t stream = as_cuda(s);
  const CombineBackwardView b{{a.row_of_slot.ptr<int>(), a.weights.data, a.weights.dtype, p.weight_stride},
                              p.rows, p.hidden, p.y_stride, p.dout_stride, p.dy_stride};
  dispatch_float(a.y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::int64_t slots = p.tokens * p.top_k;
    if (p.rows > 0 && p.hidden > 0) {  // rows no slot points at get a zero gradient
      const int* row_of_slot = a.row_of_slot.ptr<int>();
      const unsigned grid = unsigned(p.rows), threads = unsigned(row_threads(p.hidden));
      if (p.hidden >= kClaimElements<T>) {
        if (slots > 0) {
          claim_rows_kernel<T><<<unsigned((slots + 255) / 256), 256, 0, stream>>>(row_of_slot, slots, p.rows,
                                                                                  a.dy.ptr<T>(), p.dy_stride);
          RUDNN_CUDA_CHECK_LAUNCH(claim_rows_kernel);
        }
        zero_unclaimed_rows_kernel<T, false><<<grid, threads, 0, stream>>>(a.dy.ptr<T>(), p.dy_stride, p.hidden,
                                                                          row_of_slot, slots);
      } else {
        zero_unclaimed_rows_kernel<T, true><<<grid, threads, 0, stream>>>(a.dy.ptr<T>(), p.dy_stride, p.hidden,
                                                                         row_of_slot, slots);
      }
      RUDNN_CUDA_CHECK_LAUNCH(zero_unclaimed_rows_kernel);
    }
    if (slots == 0) return;
    if (a.strategy == MoeCombineBackwardStrategy::serial) {
      combine_backward_serial_kernel<T><<<unsigned((slots + 127) / 128), 128, 0, stream>>>(
          a.y.ptr<T>(), a.dout.ptr<T>(), a.dy.ptr<T>(), a.dweights.ptr<float>(), b, slots, p.top_k);
      RUDNN_CUDA_CHECK_LAUNCH(combine_backward_serial_kernel);
    } else {
      combine_backward_plane_kernel<T><<<unsigned(p.tokens), kPlaneThreads, 0, stream>>>(
          a.y.ptr<T>(), a.dout.ptr<T>(), a.dy.ptr<T>(), a.dweights.ptr<float>(), b, p.top_k);
      RUDNN_CUDA_CHECK_LAUNCH(combine_backward_plane_kernel);
    }
  });
}

// Block b of 64 rows of gate (counted over all experts: the arrays are dense) is block 2 b of
// gate_up, block b of up is block 2 b + 1: each source is one strided 2-D copy (rows of one block's
// bytes, every other block's place in gate_up), which the copy engine takes at any alignment.
void interleave_gate_up_cuda(const Tensor& gate, const Tensor& up, const Tensor& gate_up, const InterleaveProblem& p,
                             Stream s) {
  const std::size_t block = std::size_t(kMoeGateUpBlock * p.hidden) * dtype_size(gate.dtype);
  const std::size_t blocks = std::size_t(p.experts * (p.inter / kMoeGateUpBlock));
  char* out = static_cast<char*>(gate_up.data);
  RUDNN_CUDA_CHECK(cudaMemcpy2DAsync(out, 2 * block, gate.data, block, block, blocks, cudaMemcpyDeviceToDevice,
                                     as_cuda(s)));
  RUDNN_CUDA_CHECK(cudaMemcpy2DAsync(out + block, 2 * block, up.data, block, block, blocks, cudaMemcpyDeviceToDevice,
                                     as_cuda(s)));
}

}  // namespace rudnn::moe
