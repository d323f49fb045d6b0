// LayerNorm / RMSNorm forward on CUDA (with the optional fused residual add).
//
// h = x (+ residual, rounded to T and written to residual_out)
// layer: y = T((h - mean) * rstd * w + b), rstd = 1/sqrt(var + eps), var = mean((h - mean)^2)
// rms:   y = T(h * rstd * w),              rstd = 1/sqrt(mean(h^2) + eps)
// RMSNorm runs the LayerNorm code with mean = 0 and no bias, which is exactly its definition.
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "norm/kernels.cuh"
#include "norm/problem.hpp"

namespace rudnn::norm {

namespace {

using namespace kern;

template <class T, class P>
struct ForwardParams {
  const T* x;
  const T* residual;  // null: no residual add
  T* y;
  T* residual_out;    // receives h when residual is set
  const P* weight;    // null: w = 1
  const P* bias;      // null: b = 0 (always null for RMSNorm)
  float* mean;        // per-row outputs, optional
  float* rstd;
  core::RowIndexer x_rows, residual_rows, y_rows, residual_out_rows, mean_rows, rstd_rows;
  i64 rows, hidden, rows_per_block;
  int team;
  float eps;
  bool layer;
};

// Where h of one row comes from and goes to.
template <class T>
struct RowH {
  const T* x;         // x, or residual_out when re-reading h
  const T* residual;  // null: h = x
  T* residual_out;
};

// Which read of a row an access belongs to, for its L2 eviction priority: the register kernels read
// a row once (no hint); the two-read stream kernel keeps in L2 what its second pass reads again.
enum class RowRead {
  only,    // register kernels: plain accesses
  first,   // stream pass 1: x alone evict_last (read again); with a residual, x and residual
           // evict_first (read once) and residual_out, which pass 2 reads, evict_last
  second,  // stream pass 2: the re-read of x or residual_out, evict_first (its last use)
};

// Issues the loads of one row's chunks: x into `x`, and with a residual, the residual into `r`.
template <int VEC, RowRead kRead = RowRead::only, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void load_row(const RowH<T>& src, i64 chunks, Regs& x, Regs& r, const bool (&valid)[N],
                                         Chunk chunk_of) {
  using cute::_;
  const auto gx = chunked_row<VEC>(src.x, chunks);
  const auto gr = chunked_row<VEC>(src.residual, chunks);
  if constexpr (kRead == RowRead::only) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (valid[s]) load_chunk(gx(_, chunk_of(s)), x(_, s));
    if (src.residual == nullptr) return;
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (valid[s]) load_chunk(gr(_, chunk_of(s)), r(_, s));
  } else if constexpr (kRead == RowRead::first) {
    if (src.residual == nullptr) {
#pragma unroll
      for (int s = 0; s < N; ++s)
        if (valid[s]) load_chunk<L2Hint::evict_last>(gx(_, chunk_of(s)), x(_, s));
      return;
    }
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (valid[s]) load_chunk<L2Hint::evict_first>(gx(_, chunk_of(s)), x(_, s));
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (valid[s]) load_chunk<L2Hint::evict_first>(gr(_, chunk_of(s)), r(_, s));
  } else {  // RowRead::second: src.x is the row to read again, no residual
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (valid[s]) load_chunk<L2Hint::evict_first>(gx(_, chunk_of(s)), x(_, s));
  }
}

// h from the loaded x (and residual): with a residual, rounds x + residual to T and writes it to
// residual_out. Each thread writes only the chunks it has read, so in-place aliasing of
// residual_out with x or residual is safe. `h` may be `x` itself.
template <int VEC, RowRead kRead = RowRead::only, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void finish_h(const RowH<T>& src, i64 chunks, const Regs& x, const Regs& r, Regs& h,
                                         const bool (&valid)[N], Chunk chunk_of) {
  using cute::_;
  if (src.residual == nullptr) {  // h = x (nothing to do when h is x)
#pragma unroll
    for (int s = 0; s < N; ++s)
#pragma unroll
      for (int v = 0; v < VEC; ++v) h(v, s) = x(v, s);
    return;
  }
  auto gout = chunked_row<VEC>(src.residual_out, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (!valid[s]) continue;
#pragma unroll
    for (int v = 0; v < VEC; ++v) h(v, s) = from_float<T>(to_float(x(v, s)) + to_float(r(v, s)));
    if constexpr (kRead == RowRead::first) {
      store_chunk<L2Hint::evict_last>(h(_, s), gout(_, chunk_of(s)));
    } else {
      store_chunk(h(_, s), gout(_, chunk_of(s)));
    }
  }
}

// Loads h for the given chunks into registers (load_row, then finish_h in place).
template <int VEC, RowRead kRead = RowRead::only, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void load_h(const RowH<T>& src, i64 chunks, Regs& h, const bool (&valid)[N],
                                       Chunk chunk_of) {
  auto r = chunk_registers<T, VEC, N>();
  load_row<VEC, kRead>(src, chunks, h, r, valid, chunk_of);
  finish_h<VEC, kRead>(src, chunks, h, r, h, valid, chunk_of);
}

template <bool kCollapsed = false, class T, class P>
__device__ __forceinline__ RowH<T> row_h(const ForwardParams<T, P>& p, i64 row) {
  if (p.residual == nullptr) return RowH<T>{row_at<kCollapsed>(p.x, p.x_rows, row), nullptr, nullptr};
  return RowH<T>{row_at<kCollapsed>(p.x, p.x_rows, row), row_at<kCollapsed>(p.residual, p.residual_rows, row),
                 row_at<kCollapsed>(p.residual_out, p.residual_out_rows, row)};
}

// y of one chunk, in place: T((h - mean) * rstd * w + b), w and b where present. The one
// expression of both register kernels (so both round alike).
template <int VEC, class T, class P, class HChunk, class WChunk>
__device__ __forceinline__ void normalize_chunk(const ForwardParams<T, P>& p, HChunk&& h, const WChunk& w,
                                                const WChunk& b, float mean, float rstd) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    float out = (to_float(h(v)) - mean) * rstd;
    if (p.weight != nullptr) out *= to_float(w(v));
    if (p.bias != nullptr) out += to_float(b(v));
    h(v) = from_float<T>(out);
  }
}

// y for the chunks in registers: normalizes in place, then stores. The parameters are loaded one
// slot at a time (they are shared by all rows and hit L1/L2; holding all slots' float32 weight and
// bias at once would take 64 registers). No store sits between those loads, so the compiler can
// overlap them; all stores come after.
template <int VEC, int N, class T, class P, class Regs, class Chunk>
__device__ __forceinline__ void store_y(const ForwardParams<T, P>& p, T* y_row, i64 chunks, Regs& h,
                                        const bool (&valid)[N], Chunk chunk_of, float mean, float rstd) {
  using cute::_;
  const auto gw = chunked_row<VEC>(p.weight, chunks);
  const auto gb = chunked_row<VEC>(p.bias, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (!valid[s]) continue;
    auto w = chunk_registers<P, VEC, 1>();
    auto b = chunk_registers<P, VEC, 1>();
    if (p.weight != nullptr) load_chunk(gw(_, chunk_of(s)), w(_, 0));
    if (p.bias != nullptr) load_chunk(gb(_, chunk_of(s)), b(_, 0));
    normalize_chunk<VEC>(p, h(_, s), w(_, 0), b(_, 0), mean, rstd);
  }
  auto gy = chunked_row<VEC>(y_row, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) store_chunk(h(_, s), gy(_, chunk_of(s)));
}

template <bool kCollapsed = false, class T, class P>
__device__ __forceinline__ void store_stats(const ForwardParams<T, P>& p, i64 row, float mean, float rstd) {
  if (p.layer && p.mean != nullptr) *row_at<kCollapsed>(p.mean, p.mean_rows, row) = mean;
  if (p.rstd != nullptr) *row_at<kCollapsed>(p.rstd, p.rstd_rows, row) = rstd;
}

// Whether every row tensor of a forward call has at most one leading axis after collapsing (the
// pipelined kernel's precondition).
template <class T, class P>
bool rows_collapsed(const ForwardParams<T, P>& p) {
  return indexers_collapsed({&p.x_rows, &p.residual_rows, &p.y_rows, &p.residual_out_rows, &p.mean_rows, &p.rstd_rows});
}

// mean and rstd of the row in registers `h` (chunks `valid`): the exact two-pass statistics (sum,
// then the sum of squared deviations), each this thread's share summed over the row's threads by
// `sum_over_row(float (&)[1])` (the register kernels: a team all-reduction, which every thread of the
// block must reach; the cluster kernel: cluster_allreduce). The one arithmetic of all three.
template <int VEC, int N, class T, class P, class Regs, class SumOverRow>
__device__ __forceinline__ void row_statistics(const ForwardParams<T, P>& p, const Regs& h, const bool (&valid)[N],
                                               SumOverRow&& sum_over_row, float& mean, float& rstd) {
  const float hidden = float(p.hidden);
  float stat[1];
  mean = 0.f;
  if (p.layer) {
    stat[0] = 0.f;
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (valid[s]) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) stat[0] += to_float(h(v, s));
      }
    sum_over_row(stat);
    mean = stat[0] / hidden;
  }
  stat[0] = 0.f;
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const float d = to_float(h(v, s)) - mean;
        stat[0] += d * d;
      }
    }
  sum_over_row(stat);
  rstd = rsqrtf(stat[0] / hidden + p.eps);
}

// row_statistics's sum_over_row for the register kernels: a team all-reduction.
struct TeamSum {
  const Team& team;
  float* scratch;
  __device__ __forceinline__ void operator()(float (&v)[1]) const { team_allreduce(v, team, scratch, SumOp{}, 0.f); }
};

// Rows of up to kSlots * team chunks: the row stays in registers between the two reductions
// (sum, then sum of squared deviations: the exact two-pass variance) and the output pass.
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kMaxTeam) norm_forward_regs(const ForwardParams<T, P> p) {
  __shared__ float scratch[32];
  const Team team = make_team(p.team);
  const i64 chunks = p.hidden / VEC;
  const auto chunk_of = [&](int s) { return slot_chunk(team, s); };
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  // Every thread runs the same number of iterations (teams past the end idle), so the barriers
  // inside team_allreduce are reached by the whole block.
  for (i64 base = mine.begin; base < mine.end; base += team.count) {
    const i64 row = base + team.index;
    const bool active = row < mine.end;
    bool valid[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) valid[s] = active && chunk_of(s) < chunks;

    // h is a T value by definition, so keeping it as T in registers loses nothing.
    auto h = chunk_registers<T, VEC, kSlots>();
    if (active) load_h<VEC>(row_h(p, row), chunks, h, valid, chunk_of);

    float mean, rstd;
    row_statistics<VEC>(p, h, valid, TeamSum{team, scratch}, mean, rstd);

    if (!active) continue;  // no barrier follows in this iteration
    if (team.rank == 0) store_stats(p, row, mean, rstd);
    store_y<VEC>(p, row_ptr(p.y, p.y_rows, row), chunks, h, valid, chunk_of, mean, rstd);
  }
}

// The same rows for teams of at most kRegsBlockTarget threads (blocks of that size), with two
// changes that need registers the 1024-thread bound above does not leave:
//   * a thread's weight and bias chunks (its columns are the same in every row) are loaded once,
//     before the row loop, and stay in registers;
//   * the loads of the team's next row are issued before the current row's reductions, so they
//     are in flight while it reduces, normalizes and stores (software pipelining across the rows
//     of a team: one row's x and residual in flight beside the row in work).
// Per row the arithmetic and reduction order are those of norm_forward_regs (row_statistics,
// normalize_chunk): both give the same bits for the same inputs. The planner
// (plan::regs_pipelined) picks this kernel for 16-byte chunks, teams of <= 256 threads and row
// tensors whose leading axes collapse to one (rows_collapsed: one multiply per row offset; the
// general path's 64-bit divisions cost registers this kernel does not have).
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kRegsBlockTarget, kPipelinedMinBlocks) norm_forward_regs_pipelined(
    const ForwardParams<T, P> p) {
  using cute::_;
  __shared__ float scratch[32];
  const Team team = make_team(p.team);
  const i64 chunks = p.hidden / VEC;
  const auto chunk_of = [&](int s) { return slot_chunk(team, s); };
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  bool column[kSlots];  // this thread's slots that fall inside a row: the same for every row
#pragma unroll
  for (int s = 0; s < kSlots; ++s) column[s] = chunk_of(s) < chunks;

  // Weight and bias stay in registers when a chunk of them is one 16-byte piece (16-bit
  // parameters, or float32 ones with float32 x: 8 registers per slot); float32 parameters of 16-bit
  // rows (32 bytes a chunk, 64 registers for all slots) are loaded per row from L1 as
  // norm_forward_regs does.
  constexpr bool kCache = VEC * int(sizeof(P)) <= 16;
  constexpr int kCached = kCache ? kSlots : 1;
  auto w = chunk_registers<P, VEC, kCached>();
  auto b = chunk_registers<P, VEC, kCached>();
  const auto gw = chunked_row<VEC>(p.weight, chunks);
  const auto gb = chunked_row<VEC>(p.bias, chunks);
  if constexpr (kCache) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!column[s]) continue;
      if (p.weight != nullptr) load_chunk(gw(_, chunk_of(s)), w(_, s));
      if (p.bias != nullptr) load_chunk(gb(_, chunk_of(s)), b(_, s));
    }
  }

  // x and residual of the team's next row, in flight.
  auto x = chunk_registers<T, VEC, kSlots>();
  auto r = chunk_registers<T, VEC, kSlots>();
  i64 row = mine.begin + team.index;
  if (row < mine.end) load_row<VEC>(row_h<true>(p, row), chunks, x, r, column, chunk_of);

  // Every thread runs the same number of iterations (teams past the end idle), so the barriers
  // inside team_allreduce are reached by the whole block.
  for (i64 base = mine.begin; base < mine.end; base += team.count, row += team.count) {
    const bool active = row < mine.end;
    bool valid[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) valid[s] = active && column[s];

    auto h = chunk_registers<T, VEC, kSlots>();
    if (active) finish_h<VEC>(row_h<true>(p, row), chunks, x, r, h, valid, chunk_of);

    // The next row's loads go out before this row's reductions.
    const i64 next = row + team.count;
    if (next < mine.end) load_row<VEC>(row_h<true>(p, next), chunks, x, r, column, chunk_of);

    float mean, rstd;
    row_statistics<VEC>(p, h, valid, TeamSum{team, scratch}, mean, rstd);

    if (!active) continue;  // no barrier follows in this iteration
    if (team.rank == 0) store_stats<true>(p, row, mean, rstd);
    if constexpr (kCache) {
      // (converted to float32 here, in each row: hoisted, the float32 copies would need twice the
      // registers)
      forget_values(w);
      forget_values(b);
    }
    forget_values(h);  // converted again here, not kept as float32 since the reductions
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!valid[s]) continue;
      if constexpr (kCache) {
        normalize_chunk<VEC>(p, h(_, s), w(_, s), b(_, s), mean, rstd);
      } else {
        if (p.weight != nullptr) load_chunk(gw(_, chunk_of(s)), w(_, 0));
        if (p.bias != nullptr) load_chunk(gb(_, chunk_of(s)), b(_, 0));
        normalize_chunk<VEC>(p, h(_, s), w(_, 0), b(_, 0), mean, rstd);
      }
    }
    auto gy = chunked_row<VEC>(row_at<true>(p.y, p.y_rows, row), chunks);
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (valid[s]) store_chunk(h(_, s), gy(_, chunk_of(s)));
  }
}

// Rows too long for registers (one block per row at a time). Pass 1 reads h once and merges
// per-step (count, mean, M2) statistics (Chan et al.; stable); pass 2 reads h again (from L2 when
// the rows in flight fit there; from residual_out when a residual was added, which holds the
// rounded h) and writes y. L2 eviction hints (RowRead): what pass 2 reads again is marked
// evict_last in pass 1 and evict_first in pass 2, lines read once evict_first.
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks) norm_forward_stream(const ForwardParams<T, P> p) {
  constexpr int U = kStreamUnroll;
  __shared__ float scratch[3 * 32];
  const Team team = make_team(p.team);  // the whole block
  const i64 chunks = p.hidden / VEC;
  const float hidden = float(p.hidden);
  const i64 step = i64(U) * team.size;
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 row = mine.begin; row < mine.end; ++row) {
    const RowH<T> src = row_h(p, row);
    MeanM2 moments{0.f, 0.f, 0.f};
    float sum_sq = 0.f;
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto h = chunk_registers<T, VEC, U>();
      load_h<VEC, RowRead::first>(src, chunks, h, valid, chunk_of);
      if (p.layer) {
        // Exact two-pass statistics of this step's chunks, merged into the running ones.
        float n = 0.f, sum = 0.f;
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (valid[u]) {
            n += float(VEC);
#pragma unroll
            for (int v = 0; v < VEC; ++v) sum += to_float(h(v, u));
          }
        const float step_mean = __fdividef(sum, n);  // n >= VEC: chunk 0 of a step is always valid
        float m2 = 0.f;
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (valid[u]) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
              const float d = to_float(h(v, u)) - step_mean;
              m2 += d * d;
            }
          }
        moments = merge(moments, MeanM2{n, step_mean, m2});
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (valid[u]) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) sum_sq += to_float(h(v, u)) * to_float(h(v, u));
          }
      }
    }

    float mean = 0.f, rstd;
    if (p.layer) {
      moments = block_allreduce(moments, scratch);
      mean = moments.mean;
      rstd = rsqrtf(moments.m2 / hidden + p.eps);
    } else {
      float stat[1] = {sum_sq};
      team_allreduce(stat, team, scratch, SumOp{}, 0.f);
      rstd = rsqrtf(stat[0] / hidden + p.eps);
    }
    if (team.rank == 0) store_stats(p, row, mean, rstd);

    // Pass 2: read h back (this thread's own chunks only), write y.
    const RowH<T> again{src.residual != nullptr ? src.residual_out : src.x, nullptr, nullptr};
    T* y_row = row_ptr(p.y, p.y_rows, row);
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto h = chunk_registers<T, VEC, U>();
      load_h<VEC, RowRead::second>(again, chunks, h, valid, chunk_of);
      store_y<VEC>(p, y_row, chunks, h, valid, chunk_of, mean, rstd);
    }
  }
}

// Few long rows on Hopper (plan::cluster_blocks): the row is shared by a cluster of C blocks of
// kClusterThreads threads, the cluster's thread g = rank * kClusterThreads + t owning chunks g,
// g + C * kClusterThreads, ... (kSlots at most, kept in registers: one read of the row, where the
// stream kernel reads rows too long for one block twice). The statistics are those of the register
// kernels (sum, then the sum of squared deviations) summed over the cluster by
// cluster_allreduce (partials through distributed shared memory, added in rank order).
// Clusters are (C, 1, 1) and grid.x = C: cluster y takes rows y, y + gridDim.y, ...
template <class T, class P, int VEC>
__global__ void __launch_bounds__(kClusterThreads, 1) norm_forward_cluster(const ForwardParams<T, P> p) {
  extern __shared__ float cluster_smem[];
  const i64 chunks = p.hidden / VEC;
  ClusterShare<kSlots> share(cluster_smem, chunks);
  const auto chunk_of = [&](int s) { return share.chunk(s); };

  for (i64 row = blockIdx.y; row < p.rows; row += gridDim.y) {
    auto h = chunk_registers<T, VEC, kSlots>();
    load_h<VEC>(row_h(p, row), chunks, h, share.valid, chunk_of);
    float mean, rstd;
    row_statistics<VEC>(p, h, share.valid, [&](float (&v)[1]) { share.allreduce(v); }, mean, rstd);
    if (share.team.rank == 0) store_stats(p, row, mean, rstd);
    store_y<VEC>(p, row_ptr(p.y, p.y_rows, row), chunks, h, share.valid, chunk_of, mean, rstd);
  }
  cluster_barrier();  // no block leaves while a peer may still read its exchange slots
}

// (tests/emulation/norm_emu.cpp runs everything from `using namespace kern;` above to this line on the CPU.)

template <class T, class P, int VEC>
void run_forward(ForwardParams<T, P> p, cudaStream_t stream) {
  if constexpr (VEC > 1)  // few long rows on sm_90 (plan::cluster_blocks)
    if (plan::launch_row_cluster(reinterpret_cast<const void*>(&norm_forward_cluster<T, P, VEC>), &p, p.rows,
                                 p.hidden / VEC, kSlots, stream))
      return;
  plan::RowLaunch launch = plan::row_shape(p.hidden / VEC, kSlots, kSlots);
  // The pipelined kernel exists for 16-byte chunks only (the VEC = 1 path is the fallback).
  bool pipelined = false;
  if constexpr (VEC > 1) pipelined = plan::regs_pipelined(launch, VEC, rows_collapsed(p));
  const void* kernel = launch.stream ? reinterpret_cast<const void*>(&norm_forward_stream<T, P, VEC>)
                                     : reinterpret_cast<const void*>(&norm_forward_regs<T, P, VEC>);
  if constexpr (VEC > 1)
    if (pipelined) kernel = reinterpret_cast<const void*>(&norm_forward_regs_pipelined<T, P, VEC>);
  plan::spread_rows(launch, p.rows, kernel);
  p.team = launch.team;
  p.rows_per_block = launch.rows_per_block;
  if (launch.stream) {
    norm_forward_stream<T, P, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
    RUDNN_CUDA_CHECK_LAUNCH("norm_forward_stream");
    return;
  }
  if constexpr (VEC > 1) {
    if (pipelined) {
      norm_forward_regs_pipelined<T, P, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
      RUDNN_CUDA_CHECK_LAUNCH("norm_forward_regs_pipelined");
      return;
    }
  }
  norm_forward_regs<T, P, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
  RUDNN_CUDA_CHECK_LAUNCH("norm_forward_regs");
}

template <class T, class P>
void launch_forward(const NormForwardArgs& args, const ForwardProblem& pr, cudaStream_t stream) {
  const bool layer = args.kind == NormKind::layer;
  ForwardParams<T, P> p{};
  p.x = args.x.ptr<const T>();
  p.y = args.y.ptr<T>();
  p.residual = args.residual != nullptr ? args.residual->ptr<const T>() : nullptr;
  p.residual_out = args.residual != nullptr ? args.residual_out->ptr<T>() : nullptr;
  p.weight = args.weight != nullptr ? args.weight->ptr<const P>() : nullptr;
  p.bias = layer && args.bias != nullptr ? args.bias->ptr<const P>() : nullptr;
  p.mean = layer && args.mean != nullptr ? args.mean->ptr<float>() : nullptr;
  p.rstd = args.rstd != nullptr ? args.rstd->ptr<float>() : nullptr;
  p.x_rows = pr.x;
  p.residual_rows = pr.residual;
  p.y_rows = pr.y;
  p.residual_out_rows = pr.residual_out;
  p.mean_rows = pr.mean;
  p.rstd_rows = pr.rstd;
  p.rows = pr.rows;
  p.hidden = pr.hidden;
  p.eps = args.eps;
  p.layer = layer;

  constexpr int kVec = kVec16<T>;
  bool vec = pr.hidden % kVec == 0 && plan::rows_vectorizable(p.x, pr.x, kVec) &&
             plan::rows_vectorizable(p.y, pr.y, kVec);
  if (p.residual != nullptr)
    vec = vec && plan::rows_vectorizable(p.residual, pr.residual, kVec) &&
          plan::rows_vectorizable(p.residual_out, pr.residual_out, kVec);
  if (p.weight != nullptr) vec = vec && plan::aligned16(p.weight);
  if (p.bias != nullptr) vec = vec && plan::aligned16(p.bias);
  if (vec) {
    run_forward<T, P, kVec>(p, stream);
  } else {
    run_forward<T, P, 1>(p, stream);
  }
}

}  // namespace

void forward_cuda(const NormForwardArgs& args, const ForwardProblem& p, Stream stream) {
  if (p.rows == 0) return;
  core::dispatch_float<__half, __nv_bfloat16>(args.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Parameters are float32 or x's dtype (for float32 x both are float).
    if (p.param_dtype == DType::f32) {
      launch_forward<T, float>(args, p, static_cast<cudaStream_t>(stream));
    } else {
      launch_forward<T, T>(args, p, static_cast<cudaStream_t>(stream));
    }
  });
}

}  // namespace rudnn::norm
