// LayerNorm / RMSNorm backward on CUDA.
//
// With xhat = (x - mean) * rstd (layer) or x * rstd (rms) and g = dy * w:
//   layer: dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))
//   rms:   dx = rstd * (g - xhat * mean_j(g * xhat))        (the layer formula with mean = 0 and
//                                                            without the mean_j(g) term)
//   dweight[j] = sum_r dy[r, j] * xhat[r, j],  dbias[j] = sum_r dy[r, j]   (float32, deterministic)
//
// Weight gradients never use atomics. Either
//   * fused (H small enough for two float32 rows per team in shared memory, H <= ~28K on sm90):
//     the dx kernel runs `splits` blocks, block b owning a fixed contiguous range of rows; every
//     team accumulates dy * xhat and dy for its own columns in its shared-memory rows, in row
//     order; at the end the block adds its teams in order and writes one partial row per
//     gradient; or
//   * a column kernel (longer rows): blocks of 32 columns x 8 row lanes sum fixed row ranges.
// and then, when splits > 1, a reduction kernel adds the partial rows [splits, H] in split order.
// Every order is fixed by (rows, H, device), so results are bitwise identical run to run.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "norm/kernels.cuh"
#include "norm/problem.hpp"

namespace rudnn::norm {

namespace {

using namespace kern;

template <class T, class P>
struct BackwardParams {
  const T* dy;
  const T* x;
  T* dx;
  const P* weight;      // null: w = 1
  const float* mean;    // per row; layer norm only
  const float* rstd;    // per row
  float* dweight_part;  // [gridDim.x][H] partial sums (the output itself when gridDim.x == 1); null: not wanted
  float* dbias_part;    // same for dbias
  core::RowIndexer dy_rows, x_rows, dx_rows, mean_rows, rstd_rows;
  i64 rows, hidden, rows_per_block;
  int team;
  bool layer;
};

// Per-element pieces of the row math.
struct RowStats {
  float mean, rstd;
};

template <bool kCollapsed = false, class T, class P>
__device__ __forceinline__ RowStats row_stats(const BackwardParams<T, P>& p, i64 row) {
  return RowStats{p.layer ? *row_at<kCollapsed>(p.mean, p.mean_rows, row) : 0.f,
                  *row_at<kCollapsed>(p.rstd, p.rstd_rows, row)};
}

// The weights of the row helpers below: `w` holds either every slot's chunk (loaded once, before
// the row loop: the pipelined kernel) or, with one slot, nothing, and the helper loads each slot's
// chunk from global memory (L1 after the first row) into a register chunk of that slot's own (a
// chunk shared across the slots or the helpers makes the 64-register kernels spill).
template <class WRegs>
inline constexpr int kWeightSlots = int(decltype(cute::size<1>(std::declval<WRegs>()))::value);

// The shared-memory weight-gradient rows of one team: [2][H] floats (dweight, then dbias), seen
// as CuTe tensors of VEC-float chunks. Each thread only ever touches its own columns, so no
// barrier is needed while accumulating.
template <int VEC>
__device__ __forceinline__ auto wgrad_chunk(float* team_rows, i64 hidden, i64 chunk) {
  return cute::make_tensor(cute::make_smem_ptr(team_rows + chunk * VEC),
                           cute::make_layout(cute::make_shape(cute::Int<VEC>{}, cute::Int<2>{}),
                                             cute::make_stride(cute::Int<1>{}, hidden)));
}

// End of a fused block: zero-initialized team rows were accumulated; add the teams in order and
// write this block's partial rows.
template <class T, class P>
__device__ __forceinline__ void write_wgrad_partials(const BackwardParams<T, P>& p, const float* team_rows,
                                                     int teams) {
  __syncthreads();
  float* dw_out = p.dweight_part != nullptr ? p.dweight_part + i64(blockIdx.x) * p.hidden : nullptr;
  float* db_out = p.dbias_part != nullptr ? p.dbias_part + i64(blockIdx.x) * p.hidden : nullptr;
  for (i64 j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    float dw = 0.f, db = 0.f;
    for (int t = 0; t < teams; ++t) {
      dw += team_rows[i64(t) * 2 * p.hidden + j];
      db += team_rows[i64(t) * 2 * p.hidden + p.hidden + j];
    }
    if (dw_out != nullptr) dw_out[j] = dw;
    if (db_out != nullptr) db_out[j] = db;
  }
}

__device__ __forceinline__ void zero_shared(float* data, i64 count) {
  for (i64 i = threadIdx.x; i < count; i += blockDim.x) data[i] = 0.f;
  __syncthreads();
}

// The fused weight-gradient accumulators of a block ([teams][2][H] floats of dynamic shared memory,
// zeroed here: every thread of the block must call this) and this team's rows of them; both null
// when the call wants no weight gradients.
struct WgradRows {
  float* block;
  float* team;
};

template <class T, class P>
__device__ __forceinline__ WgradRows wgrad_rows(const BackwardParams<T, P>& p, const Team& team, float4* smem) {
  if (p.dweight_part == nullptr && p.dbias_part == nullptr) return WgradRows{nullptr, nullptr};
  float* rows = reinterpret_cast<float*>(smem);
  zero_shared(rows, i64(team.count) * 2 * p.hidden);
  return WgradRows{rows, rows + i64(team.index) * 2 * p.hidden};
}

// dx (and the weight-gradient terms) of the chunks in registers. Sums of the row are done.
// Computes every slot first (weight loads, if w holds one slot, and shared-memory accumulators
// only), then stores dx, so the loads of all slots can overlap.
template <int VEC, int N, class T, class P, class Regs, class WRegs, class Chunk>
__device__ __forceinline__ void store_dx(const BackwardParams<T, P>& p, T* dx_row, i64 chunks, Regs& dy, const Regs& x,
                                         const WRegs& w, const bool (&valid)[N], Chunk chunk_of, RowStats st, float mean_g,
                                         float mean_gx, float* team_rows) {
  using cute::_;
  const bool accumulate = team_rows != nullptr;
  constexpr bool kPerSlot = kWeightSlots<WRegs> == 1;
  static_assert(kPerSlot || kWeightSlots<WRegs> == N, "w holds one slot or all of them");
  const auto gw = chunked_row<VEC>(p.weight, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (!valid[s]) continue;
    auto own_w = chunk_registers<P, VEC, 1>();
    if (kPerSlot && p.weight != nullptr) load_chunk(gw(_, chunk_of(s)), own_w(_, 0));
    const auto weight = [&](int v) { return kPerSlot ? to_float(own_w(v, 0)) : to_float(w(v, s)); };
    // (VEC, 2): running dweight and dbias of this chunk's columns.
    auto acc = chunk_registers<float, VEC, 2>();
    if (accumulate) cute::copy_aligned(wgrad_chunk<VEC>(team_rows, p.hidden, chunk_of(s)), acc);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const float dyv = to_float(dy(v, s));
      const float g = p.weight != nullptr ? dyv * weight(v) : dyv;
      const float xhat = (to_float(x(v, s)) - st.mean) * st.rstd;
      acc(v, 0) += dyv * xhat;
      acc(v, 1) += dyv;
      dy(v, s) = from_float<T>(st.rstd * (g - mean_g - xhat * mean_gx));  // dy(v, s) is not needed again
    }
    if (accumulate) cute::copy_aligned(acc, wgrad_chunk<VEC>(team_rows, p.hidden, chunk_of(s)));
  }
  auto gdx = chunked_row<VEC>(dx_row, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) store_chunk(dy(_, s), gdx(_, chunk_of(s)));
}

// Sum_j g and Sum_j g * xhat over the chunks in registers (this thread's share); w as store_dx's.
template <int VEC, int N, class T, class P, class Regs, class WRegs, class Chunk>
__device__ __forceinline__ void add_row_sums(const BackwardParams<T, P>& p, i64 chunks, const Regs& dy, const Regs& x,
                                             const WRegs& w, const bool (&valid)[N], Chunk chunk_of, RowStats st,
                                             float (&sums)[2]) {
  using cute::_;
  constexpr bool kPerSlot = kWeightSlots<WRegs> == 1;
  static_assert(kPerSlot || kWeightSlots<WRegs> == N, "w holds one slot or all of them");
  const auto gw = chunked_row<VEC>(p.weight, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (!valid[s]) continue;
    auto own_w = chunk_registers<P, VEC, 1>();
    if (kPerSlot && p.weight != nullptr) load_chunk(gw(_, chunk_of(s)), own_w(_, 0));
    const auto weight = [&](int v) { return kPerSlot ? to_float(own_w(v, 0)) : to_float(w(v, s)); };
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const float dyv = to_float(dy(v, s));
      const float g = p.weight != nullptr ? dyv * weight(v) : dyv;
      const float xhat = (to_float(x(v, s)) - st.mean) * st.rstd;
      sums[0] += g;
      sums[1] += g * xhat;
    }
  }
}

// kHint: the stream kernel's L2 eviction priority (kernels.cuh): pass 1 reads rows pass 2 reads
// again (evict_last), pass 2's reads are the last (evict_first).
template <int VEC, L2Hint kHint = L2Hint::none, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void load_rows(const T* dy_row, const T* x_row, i64 chunks, Regs& dy, Regs& x,
                                          const bool (&valid)[N], Chunk chunk_of) {
  using cute::_;
  const auto gdy = chunked_row<VEC>(dy_row, chunks);
  const auto gx = chunked_row<VEC>(x_row, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) {
      load_chunk<kHint>(gdy(_, chunk_of(s)), dy(_, s));
      load_chunk<kHint>(gx(_, chunk_of(s)), x(_, s));
    }
}

// Rows of up to kPairSlots * team chunks: dy and x stay in registers between the row sums and dx.
// With weight gradients wanted, dynamic shared memory holds [teams][2][H] float accumulators.
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kMaxTeam) norm_backward_regs(const BackwardParams<T, P> p) {
  extern __shared__ float4 wgrad_smem[];
  __shared__ float scratch[2 * 32];
  const Team team = make_team(p.team);
  const i64 chunks = p.hidden / VEC;
  const float hidden = float(p.hidden);
  const auto chunk_of = [&](int s) { return slot_chunk(team, s); };
  const WgradRows wgrad = wgrad_rows(p, team, wgrad_smem);
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 base = mine.begin; base < mine.end; base += team.count) {
    const i64 row = base + team.index;
    const bool active = row < mine.end;
    bool valid[kPairSlots];
#pragma unroll
    for (int s = 0; s < kPairSlots; ++s) valid[s] = active && chunk_of(s) < chunks;

    auto dy = chunk_registers<T, VEC, kPairSlots>();
    auto x = chunk_registers<T, VEC, kPairSlots>();
    const auto w = chunk_registers<P, VEC, 1>();  // one slot: the helpers load the weights
    RowStats st{0.f, 0.f};
    float sums[2] = {0.f, 0.f};
    if (active) {
      load_rows<VEC>(row_ptr(p.dy, p.dy_rows, row), row_ptr(p.x, p.x_rows, row), chunks, dy, x, valid, chunk_of);
      st = row_stats(p, row);
      add_row_sums<VEC>(p, chunks, dy, x, w, valid, chunk_of, st, sums);
    }
    team_allreduce(sums, team, scratch, SumOp{}, 0.f);
    if (!active) continue;  // no barrier follows in this iteration
    const float mean_g = p.layer ? sums[0] / hidden : 0.f;
    const float mean_gx = sums[1] / hidden;
    store_dx<VEC>(p, row_ptr(p.dx, p.dx_rows, row), chunks, dy, x, w, valid, chunk_of, st, mean_g, mean_gx,
                  wgrad.team);
  }
  if (wgrad.block != nullptr) write_wgrad_partials(p, wgrad.block, team.count);
}

// The same rows for teams of at most kRegsBlockTarget threads (blocks of that size), with the
// changes of the forward's norm_forward_regs_pipelined, which need registers the 1024-thread bound
// above does not leave:
//   * a thread's weight chunks (its columns are the same in every row) are loaded once, before the
//     row loop, and stay in registers (where a chunk of them is one 16-byte piece: 16-bit weights,
//     or float32 ones with float32 rows; float32 weights of 16-bit rows are loaded per slot, from
//     L1 after the first row, as norm_backward_regs does);
//   * the loads of the team's next row (dy, x, mean, rstd) are issued before the current row's
//     reductions, so they are in flight while it reduces and writes dx.
// Per row the arithmetic and its order are norm_backward_regs's (add_row_sums, store_dx), so dx
// has the same bits; the weight gradients, summed per team in row order and then over the block's
// teams, differ in rounding where a block holds fewer teams than norm_backward_regs's would.
// Chosen by plan::regs_pipelined (16-byte chunks, teams of <= 256 threads, collapsed row tensors).
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kRegsBlockTarget, kPipelinedMinBlocks)
    norm_backward_regs_pipelined(const BackwardParams<T, P> p) {
  using cute::_;
  extern __shared__ float4 wgrad_smem[];
  __shared__ float scratch[2 * 32];
  const Team team = make_team(p.team);
  const i64 chunks = p.hidden / VEC;
  const float hidden = float(p.hidden);
  const auto chunk_of = [&](int s) { return slot_chunk(team, s); };
  const WgradRows wgrad = wgrad_rows(p, team, wgrad_smem);
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  bool column[kPairSlots];  // this thread's slots that fall inside a row: the same for every row
#pragma unroll
  for (int s = 0; s < kPairSlots; ++s) column[s] = chunk_of(s) < chunks;

  constexpr bool kCache = VEC * int(sizeof(P)) <= 16;
  auto w = chunk_registers<P, VEC, kCache ? kPairSlots : 1>();
  if constexpr (kCache) {
#pragma unroll
    for (int s = 0; s < kPairSlots; ++s)
      if (column[s] && p.weight != nullptr) load_chunk(chunked_row<VEC>(p.weight, chunks)(_, chunk_of(s)), w(_, s));
  }

  // dy, x and the statistics of the team's next row, in flight.
  auto next_dy = chunk_registers<T, VEC, kPairSlots>();
  auto next_x = chunk_registers<T, VEC, kPairSlots>();
  RowStats next_st{0.f, 0.f};
  i64 row = mine.begin + team.index;
  if (row < mine.end) {
    load_rows<VEC>(row_at<true>(p.dy, p.dy_rows, row), row_at<true>(p.x, p.x_rows, row), chunks, next_dy, next_x,
                   column, chunk_of);
    next_st = row_stats<true>(p, row);
  }

  // Every thread runs the same number of iterations (teams past the end idle), so the barriers
  // inside team_allreduce are reached by the whole block.
  for (i64 base = mine.begin; base < mine.end; base += team.count, row += team.count) {
    const bool active = row < mine.end;
    bool valid[kPairSlots];
#pragma unroll
    for (int s = 0; s < kPairSlots; ++s) valid[s] = active && column[s];
    auto dy = next_dy;
    const auto x = next_x;
    const RowStats st = next_st;

    // The next row's loads go out before this row's reductions.
    const i64 next = row + team.count;
    if (next < mine.end) {
      load_rows<VEC>(row_at<true>(p.dy, p.dy_rows, next), row_at<true>(p.x, p.x_rows, next), chunks, next_dy,
                     next_x, column, chunk_of);
      next_st = row_stats<true>(p, next);
    }
    // (w is converted to float32 in each row: hoisted, the float32 copies would take twice the
    // registers)
    if constexpr (kCache) forget_values(w);

    float sums[2] = {0.f, 0.f};
    if (active) add_row_sums<VEC>(p, chunks, dy, x, w, valid, chunk_of, st, sums);
    team_allreduce(sums, team, scratch, SumOp{}, 0.f);
    if (!active) continue;  // no barrier follows in this iteration
    const float mean_g = p.layer ? sums[0] / hidden : 0.f;
    const float mean_gx = sums[1] / hidden;
    if constexpr (kCache) forget_values(w);
    store_dx<VEC>(p, row_at<true>(p.dx, p.dx_rows, row), chunks, dy, x, w, valid, chunk_of, st, mean_g, mean_gx,
                  wgrad.team);
  }
  if (wgrad.block != nullptr) write_wgrad_partials(p, wgrad.block, team.count);
}

// Rows too long for registers (one block per row at a time): pass 1 sums, pass 2 re-reads dy and
// x (mostly from L2) and writes dx. Accumulates weight gradients like the regs kernel when asked
// (one team: [2][H] floats of dynamic shared memory).
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks) norm_backward_stream(const BackwardParams<T, P> p) {
  constexpr int U = kPairStreamUnroll;
  extern __shared__ float4 wgrad_smem[];
  __shared__ float scratch[2 * 32];
  const Team team = make_team(p.team);  // the whole block
  const i64 chunks = p.hidden / VEC;
  const float hidden = float(p.hidden);
  const i64 step = i64(U) * team.size;
  const WgradRows wgrad = wgrad_rows(p, team, wgrad_smem);  // one team: the block
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 row = mine.begin; row < mine.end; ++row) {
    const T* dy_row = row_ptr(p.dy, p.dy_rows, row);
    const T* x_row = row_ptr(p.x, p.x_rows, row);
    const RowStats st = row_stats(p, row);
    float sums[2] = {0.f, 0.f};
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto dy = chunk_registers<T, VEC, U>();
      auto x = chunk_registers<T, VEC, U>();
      const auto w = chunk_registers<P, VEC, 1>();  // one slot: the helpers load the weights
      load_rows<VEC, L2Hint::evict_last>(dy_row, x_row, chunks, dy, x, valid, chunk_of);
      add_row_sums<VEC>(p, chunks, dy, x, w, valid, chunk_of, st, sums);
    }
    team_allreduce(sums, team, scratch, SumOp{}, 0.f);
    const float mean_g = p.layer ? sums[0] / hidden : 0.f;
    const float mean_gx = sums[1] / hidden;

    T* dx_row = row_ptr(p.dx, p.dx_rows, row);
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto dy = chunk_registers<T, VEC, U>();
      auto x = chunk_registers<T, VEC, U>();
      const auto w = chunk_registers<P, VEC, 1>();
      load_rows<VEC, L2Hint::evict_first>(dy_row, x_row, chunks, dy, x, valid, chunk_of);
      store_dx<VEC>(p, dx_row, chunks, dy, x, w, valid, chunk_of, st, mean_g, mean_gx, wgrad.team);
    }
  }
  if (wgrad.block != nullptr) write_wgrad_partials(p, wgrad.block, 1);
}

// Weight gradients for rows too long for the fused path: block (column tile, row split) sums
// kWgradColumns columns over its rows; row lane k takes rows begin + k, begin + k + 8, ... in order,
// then the 8 lanes are added in order. Runs before the dx kernel.
template <class T>
struct WgradParams {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  float* dweight_part;  // [splits][H], or the output when splits == 1; null: not wanted
  float* dbias_part;
  core::RowIndexer dy_rows, x_rows, mean_rows, rstd_rows;
  i64 rows, hidden, rows_per_split;
  bool layer;
};

template <class T>
__global__ void __launch_bounds__(kWgradColumns* kWgradRowLanes) norm_wgrad_columns(const WgradParams<T> p) {
  __shared__ float partial[2][kWgradRowLanes][kWgradColumns];
  const int lane = int(threadIdx.x) % kWgradColumns;
  const int row_lane = int(threadIdx.x) / kWgradColumns;
  const i64 col = i64(blockIdx.x) * kWgradColumns + lane;
  const i64 begin = i64(blockIdx.y) * p.rows_per_split;
  const i64 end = begin + p.rows_per_split < p.rows ? begin + p.rows_per_split : p.rows;
  float dw = 0.f, db = 0.f;
  if (col < p.hidden) {
#pragma unroll 4
    for (i64 row = begin + row_lane; row < end; row += kWgradRowLanes) {
      const float mean = p.layer ? *row_ptr(p.mean, p.mean_rows, row) : 0.f;
      const float rstd = *row_ptr(p.rstd, p.rstd_rows, row);
      const float dyv = to_float(row_ptr(p.dy, p.dy_rows, row)[col]);
      const float xhat = (to_float(row_ptr(p.x, p.x_rows, row)[col]) - mean) * rstd;
      dw += dyv * xhat;
      db += dyv;
    }
  }
  partial[0][row_lane][lane] = dw;
  partial[1][row_lane][lane] = db;
  __syncthreads();
  if (row_lane != 0 || col >= p.hidden) return;
  dw = 0.f;
  db = 0.f;
#pragma unroll
  for (int k = 0; k < kWgradRowLanes; ++k) {
    dw += partial[0][k][lane];
    db += partial[1][k][lane];
  }
  const i64 at = i64(blockIdx.y) * p.hidden + col;
  if (p.dweight_part != nullptr) p.dweight_part[at] = dw;
  if (p.dbias_part != nullptr) p.dbias_part[at] = db;
}

// out[j] = sum over splits s (in order) of part[s][j].
__global__ void __launch_bounds__(kReduceThreads)
    norm_wgrad_reduce(const float* dweight_part, const float* dbias_part, i64 splits, i64 hidden, float* dweight,
                      float* dbias) {
  const i64 j = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= hidden) return;
  if (dweight != nullptr) {
    float sum = 0.f;
#pragma unroll 8
    for (i64 s = 0; s < splits; ++s) sum += dweight_part[s * hidden + j];
    dweight[j] = sum;
  }
  if (dbias != nullptr) {
    float sum = 0.f;
#pragma unroll 8
    for (i64 s = 0; s < splits; ++s) sum += dbias_part[s * hidden + j];
    dbias[j] = sum;
  }
}

// dx of few long rows on Hopper (plan::cluster_blocks with kPairSlots), as norm_forward_cluster
// shares a row: the cluster's thread g = rank * kClusterThreads + t keeps dy and x of chunks g,
// g + C * kClusterThreads (kPairSlots at most) in registers, so a row of up to C * 1024 chunks
// (65536 bf16 columns at C = 8) is read once, where the stream kernel reads it twice through one
// block. The row's two sums (add_row_sums) go through one cluster_allreduce; dx is store_dx's. No
// weight gradients: it runs only when the call wants none or the column kernel computes them (rows
// too long for the fused shared-memory accumulators), so the plan and its workspace are unchanged.
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kClusterThreads, 1) norm_backward_cluster(const BackwardParams<T, P> p) {
  extern __shared__ float cluster_smem[];
  const i64 chunks = p.hidden / VEC;
  const float hidden = float(p.hidden);
  ClusterShare<kPairSlots> share(cluster_smem, chunks);
  const auto chunk_of = [&](int s) { return share.chunk(s); };
  const auto w = chunk_registers<P, VEC, 1>();  // one slot: the helpers load the weights

  for (i64 row = blockIdx.y; row < p.rows; row += gridDim.y) {
    auto dy = chunk_registers<T, VEC, kPairSlots>();
    auto x = chunk_registers<T, VEC, kPairSlots>();
    load_rows<VEC>(row_ptr(p.dy, p.dy_rows, row), row_ptr(p.x, p.x_rows, row), chunks, dy, x, share.valid, chunk_of);
    const RowStats st = row_stats(p, row);
    float sums[2] = {0.f, 0.f};
    add_row_sums<VEC>(p, chunks, dy, x, w, share.valid, chunk_of, st, sums);
    share.allreduce(sums);
    const float mean_g = p.layer ? sums[0] / hidden : 0.f;
    const float mean_gx = sums[1] / hidden;
    store_dx<VEC>(p, row_ptr(p.dx, p.dx_rows, row), chunks, dy, x, w, share.valid, chunk_of, st, mean_g, mean_gx,
                  nullptr);
  }
  cluster_barrier();  // no block leaves while a peer may still read its exchange slots
}

// Whether every row tensor of a backward call has at most one leading axis after collapsing (the
// pipelined kernel's precondition).
template <class T, class P>
bool rows_collapsed(const BackwardParams<T, P>& p) {
  return indexers_collapsed({&p.dy_rows, &p.x_rows, &p.dx_rows, &p.mean_rows, &p.rstd_rows});
}

// The weight gradients' destinations of one call: the outputs, and the partial rows the kernels
// write: [2][splits][H] floats in `workspace` for several splits, the outputs themselves for one.
struct WgradTargets {
  float* dweight = nullptr;
  float* dbias = nullptr;
  float* dweight_part = nullptr;
  float* dbias_part = nullptr;
  bool wanted() const { return dweight != nullptr || dbias != nullptr; }
};

inline WgradTargets wgrad_targets(const NormBackwardArgs& args, const plan::WgradPlan& wgrad, i64 hidden,
                                  float* workspace) {
  WgradTargets t;
  t.dweight = t.dweight_part = args.dweight != nullptr ? args.dweight->ptr<float>() : nullptr;
  t.dbias = t.dbias_part = args.dbias != nullptr ? args.dbias->ptr<float>() : nullptr;
  if (t.wanted() && wgrad.splits > 1) {
    t.dweight_part = t.dweight != nullptr ? workspace : nullptr;
    t.dbias_part = t.dbias != nullptr ? workspace + wgrad.splits * hidden : nullptr;
  }
  return t;
}

// The column kernel's parameters (weight gradients the fused path cannot hold).
template <class T>
WgradParams<T> wgrad_params(const NormBackwardArgs& args, const BackwardProblem& pr, const plan::WgradPlan& wgrad,
                            const WgradTargets& t) {
  const bool layer = args.kind == NormKind::layer;
  WgradParams<T> w{};
  w.dy = args.dy.ptr<const T>();
  w.x = args.x.ptr<const T>();
  w.mean = layer ? args.mean->ptr<const float>() : nullptr;
  w.rstd = args.rstd.ptr<const float>();
  w.dweight_part = t.dweight_part;
  w.dbias_part = t.dbias_part;
  w.dy_rows = pr.dy;
  w.x_rows = pr.x;
  w.mean_rows = pr.mean;
  w.rstd_rows = pr.rstd;
  w.rows = pr.rows;
  w.hidden = pr.hidden;
  w.rows_per_split = wgrad.rows_per_split;
  w.layer = layer;
  return w;
}

// The dx kernels' parameters (team and rows_per_block are the launch's); they accumulate the weight
// gradients when the plan fuses them.
template <class T, class P>
BackwardParams<T, P> backward_params(const NormBackwardArgs& args, const BackwardProblem& pr,
                                     const plan::WgradPlan& wgrad, const WgradTargets& t) {
  const bool layer = args.kind == NormKind::layer;
  BackwardParams<T, P> p{};
  p.dy = args.dy.ptr<const T>();
  p.x = args.x.ptr<const T>();
  p.dx = args.dx.ptr<T>();
  p.weight = args.weight != nullptr ? args.weight->ptr<const P>() : nullptr;
  p.mean = layer ? args.mean->ptr<const float>() : nullptr;
  p.rstd = args.rstd.ptr<const float>();
  p.dweight_part = wgrad.fused ? t.dweight_part : nullptr;
  p.dbias_part = wgrad.fused ? t.dbias_part : nullptr;
  p.dy_rows = pr.dy;
  p.x_rows = pr.x;
  p.dx_rows = pr.dx;
  p.mean_rows = pr.mean;
  p.rstd_rows = pr.rstd;
  p.rows = pr.rows;
  p.hidden = pr.hidden;
  p.layer = layer;
  return p;
}

// (tests/emulation/norm_emu.cpp runs everything from `using namespace kern;` above to this line on the CPU.)

template <class T, class P, int VEC>
void run_backward(BackwardParams<T, P> p, const plan::WgradPlan& wgrad, cudaStream_t stream) {
  const bool accumulate = p.dweight_part != nullptr || p.dbias_part != nullptr;
  if constexpr (VEC > 1)  // few long rows on sm_90 whose weight gradients are not fused (plan::cluster_blocks)
    if (!accumulate && plan::launch_row_cluster(reinterpret_cast<const void*>(&norm_backward_cluster<T, P, VEC>), &p,
                                                p.rows, p.hidden / VEC, kPairSlots, stream))
      return;
  plan::RowLaunch launch = plan::row_shape(p.hidden / VEC, kPairSlots, kPairSlots);
  // The pipelined kernel exists for 16-byte chunks only (the VEC = 1 path is the fallback).
  bool pipelined = false;
  if constexpr (VEC > 1) pipelined = plan::regs_pipelined(launch, VEC, rows_collapsed(p));
  const void* kernel = launch.stream ? reinterpret_cast<const void*>(&norm_backward_stream<T, P, VEC>)
                                     : reinterpret_cast<const void*>(&norm_backward_regs<T, P, VEC>);
  if constexpr (VEC > 1)
    if (pipelined) kernel = reinterpret_cast<const void*>(&norm_backward_regs_pipelined<T, P, VEC>);
  if (accumulate) {
    plan::fused_wgrad_launch(launch, wgrad, p.hidden, pipelined ? kRegsBlockTarget : kFusedBlockMax);
    plan::resident_blocks(kernel, launch.block, launch.smem);  // opts in to > 48 KB of shared memory
  } else {
    plan::spread_rows(launch, p.rows, kernel);
  }
  p.team = launch.team;
  p.rows_per_block = launch.rows_per_block;
  if (launch.stream) {
    norm_backward_stream<T, P, VEC><<<launch.grid, launch.block, launch.smem, stream>>>(p);
    RUDNN_CUDA_CHECK_LAUNCH("norm_backward_stream");
    return;
  }
  if constexpr (VEC > 1) {
    if (pipelined) {
      norm_backward_regs_pipelined<T, P, VEC><<<launch.grid, launch.block, launch.smem, stream>>>(p);
      RUDNN_CUDA_CHECK_LAUNCH("norm_backward_regs_pipelined");
      return;
    }
  }
  norm_backward_regs<T, P, VEC><<<launch.grid, launch.block, launch.smem, stream>>>(p);
  RUDNN_CUDA_CHECK_LAUNCH("norm_backward_regs");
}

template <class T, class P>
void launch_backward(const NormBackwardArgs& args, const BackwardProblem& pr, cudaStream_t stream) {
  const plan::WgradPlan wgrad = plan::wgrad_plan(pr.rows, pr.hidden, core::current_device());
  float* ws = args.workspace != nullptr ? args.workspace->ptr<float>() : nullptr;
  const WgradTargets targets = wgrad_targets(args, wgrad, pr.hidden, ws);
  // Partial sums are read and written as single floats: 4-byte alignment is all they need.
  if (targets.wanted() && wgrad.splits > 1 &&
      (ws == nullptr || reinterpret_cast<std::uintptr_t>(ws) % alignof(float) != 0))
    throw Error(ErrorKind::value, "norm backward: workspace must be a 4-byte aligned device buffer of " +
                                      std::to_string(wgrad.workspace_bytes) + " bytes");

  if (targets.wanted() && !wgrad.fused) {
    const dim3 grid(unsigned((pr.hidden + kWgradColumns - 1) / kWgradColumns), unsigned(wgrad.splits));
    norm_wgrad_columns<T>
        <<<grid, kWgradColumns * kWgradRowLanes, 0, stream>>>(wgrad_params<T>(args, pr, wgrad, targets));
    RUDNN_CUDA_CHECK_LAUNCH("norm_wgrad_columns");
  }

  BackwardParams<T, P> p = backward_params<T, P>(args, pr, wgrad, targets);
  constexpr int kVec = kVec16<T>;
  bool vec = pr.hidden % kVec == 0 && plan::rows_vectorizable(p.dy, pr.dy, kVec) &&
             plan::rows_vectorizable(p.x, pr.x, kVec) && plan::rows_vectorizable(p.dx, pr.dx, kVec);
  if (p.weight != nullptr) vec = vec && plan::aligned16(p.weight);
  if (vec) {
    run_backward<T, P, kVec>(p, wgrad, stream);
  } else {
    run_backward<T, P, 1>(p, wgrad, stream);
  }

  if (targets.wanted() && wgrad.splits > 1) {
    const unsigned blocks = unsigned((pr.hidden + kReduceThreads - 1) / kReduceThreads);
    norm_wgrad_reduce<<<blocks, kReduceThreads, 0, stream>>>(targets.dweight_part, targets.dbias_part, wgrad.splits,
                                                             pr.hidden, targets.dweight, targets.dbias);
    RUDNN_CUDA_CHECK_LAUNCH("norm_wgrad_reduce");
  }
}

}  // namespace

std::size_t backward_workspace_bytes_cuda(const BackwardProblem& p, int device) {
  return plan::wgrad_plan(p.rows, p.hidden, device).workspace_bytes;
}

void backward_cuda(const NormBackwardArgs& args, const BackwardProblem& p, Stream stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (p.rows == 0) {
    // Sums over no rows: the weight gradients are zero; there is no dx to write.
    if (args.dweight != nullptr)
      RUDNN_CUDA_CHECK(cudaMemsetAsync(args.dweight->data, 0, std::size_t(p.hidden) * sizeof(float), cuda_stream));
    if (args.dbias != nullptr)
      RUDNN_CUDA_CHECK(cudaMemsetAsync(args.dbias->data, 0, std::size_t(p.hidden) * sizeof(float), cuda_stream));
    return;
  }
  core::dispatch_float<__half, __nv_bfloat16>(args.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.param_dtype == DType::f32) {
      launch_backward<T, float>(args, p, cuda_stream);
    } else {
      launch_backward<T, T>(args, p, cuda_stream);
    }
  });
}

}  // namespace rudnn::norm
