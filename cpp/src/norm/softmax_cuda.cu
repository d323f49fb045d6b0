// Softmax over the last axis on CUDA, forward and backward.
//   forward:  y = exp(x - max) / sum_j exp(x_j - max)   (a row that is all -inf gives NaN, like torch)
//   backward: dx = y * (dy - sum_j dy_j * y_j)
// Same structure as the norm kernels (kernels.cuh): "regs" kernels keep the row in registers,
// "stream" kernels read it twice (forward: one read for an online max/sum, one to write y).
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"
#include "norm/kernels.cuh"
#include "norm/problem.hpp"

namespace rudnn::norm {

namespace {

using namespace kern;

template <class T>
struct SoftmaxParams {
  const T* a;  // forward: x; backward: dy
  const T* b;  // backward: y
  T* out;      // forward: y; backward: dx
  core::RowIndexer a_rows, b_rows, out_rows;
  i64 rows, hidden, rows_per_block;
  int team;
};

// kHint: the stream kernels' L2 eviction priority (kernels.cuh): their first pass reads rows the
// second reads again (evict_last), the second pass's reads are the last (evict_first).
template <int VEC, L2Hint kHint = L2Hint::none, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void load_row(const T* row, i64 chunks, Regs& regs, const bool (&valid)[N], Chunk chunk_of) {
  using cute::_;
  const auto g = chunked_row<VEC>(row, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) load_chunk<kHint>(g(_, chunk_of(s)), regs(_, s));
}

// y = exp(x - max) * (1 / sum) for the chunks in registers, written in place and stored.
template <int VEC, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void store_softmax(T* row, i64 chunks, Regs& x, const bool (&valid)[N], Chunk chunk_of,
                                              float max, float inv_sum) {
  using cute::_;
  auto g = chunked_row<VEC>(row, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (!valid[s]) continue;
#pragma unroll
    for (int v = 0; v < VEC; ++v) x(v, s) = from_float<T>(softmax_exp<T>(to_float(x(v, s)) - max) * inv_sum);
    store_chunk(x(_, s), g(_, chunk_of(s)));
  }
}

// dx = y * (dy - dot) for the chunks in registers (written into dy's registers) and stored.
template <int VEC, int N, class T, class Regs, class Chunk>
__device__ __forceinline__ void store_softmax_grad(T* row, i64 chunks, Regs& dy, const Regs& y, const bool (&valid)[N],
                                                   Chunk chunk_of, float dot) {
  using cute::_;
  auto g = chunked_row<VEC>(row, chunks);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (!valid[s]) continue;
#pragma unroll
    for (int v = 0; v < VEC; ++v) dy(v, s) = from_float<T>(to_float(y(v, s)) * (to_float(dy(v, s)) - dot));
    store_chunk(dy(_, s), g(_, chunk_of(s)));
  }
}

// max and sum_j exp(x_j - max) of the row in registers `x` (chunks `valid`), this thread's shares
// combined over the row's threads by `over_row(float (&)[1], op, identity)` (the register kernel: a
// team all-reduction; the cluster kernel: cluster_allreduce). The one arithmetic of both.
template <class T, int VEC, int N, class Regs, class OverRow>
__device__ __forceinline__ void softmax_statistics(const Regs& x, const bool (&valid)[N], OverRow&& over_row,
                                                   float& max, float& sum) {
  float stat[1] = {-INFINITY};
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) stat[0] = fmaxf(stat[0], to_float(x(v, s)));
    }
  over_row(stat, MaxOp{}, -INFINITY);
  max = stat[0];
  stat[0] = 0.f;
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) stat[0] += softmax_exp<T>(to_float(x(v, s)) - max);
    }
  over_row(stat, SumOp{}, 0.f);
  sum = stat[0];
}

// This thread's share of sum_j dy_j * y_j over the chunks in registers.
template <int VEC, int N, class Regs>
__device__ __forceinline__ float softmax_dot_share(const Regs& dy, const Regs& y, const bool (&valid)[N]) {
  float dot = 0.f;
#pragma unroll
  for (int s = 0; s < N; ++s)
    if (valid[s]) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) dot += to_float(dy(v, s)) * to_float(y(v, s));
    }
  return dot;
}

template <class T, int VEC>
__global__ void __launch_bounds__(kMaxTeam) softmax_forward_regs(const SoftmaxParams<T> p) {
  __shared__ float scratch[32];
  const Team team = make_team(p.team);
  const i64 chunks = p.hidden / VEC;
  const auto chunk_of = [&](int s) { return slot_chunk(team, s); };
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 base = mine.begin; base < mine.end; base += team.count) {
    const i64 row = base + team.index;
    const bool active = row < mine.end;
    bool valid[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) valid[s] = active && chunk_of(s) < chunks;

    auto x = chunk_registers<T, VEC, kSlots>();
    if (active) load_row<VEC>(row_ptr(p.a, p.a_rows, row), chunks, x, valid, chunk_of);
    float max, sum;
    softmax_statistics<T, VEC>(
        x, valid, [&](float (&v)[1], auto op, float identity) { team_allreduce(v, team, scratch, op, identity); },
        max, sum);
    if (!active) continue;  // no barrier follows in this iteration
    store_softmax<VEC>(row_ptr(p.out, p.out_rows, row), chunks, x, valid, chunk_of, max, 1.f / sum);
  }
}

// Long rows: pass 1 keeps a running (max, sum of exp(x - max)) per thread, rescaling the sum when
// the max grows, and merges them over the block; pass 2 re-reads x and writes y.
template <class T, int VEC>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks) softmax_forward_stream(const SoftmaxParams<T> p) {
  constexpr int U = kStreamUnroll;
  __shared__ float scratch[2 * 32];
  const Team team = make_team(p.team);  // the whole block
  const i64 chunks = p.hidden / VEC;
  const i64 step = i64(U) * team.size;
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 row = mine.begin; row < mine.end; ++row) {
    const T* x_row = row_ptr(p.a, p.a_rows, row);
    MaxSum run{-INFINITY, 0.f};
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto x = chunk_registers<T, VEC, U>();
      load_row<VEC, L2Hint::evict_last>(x_row, chunks, x, valid, chunk_of);
      float step_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (valid[u]) {
#pragma unroll
          for (int v = 0; v < VEC; ++v) step_max = fmaxf(step_max, to_float(x(v, u)));
        }
      const float new_max = fmaxf(run.max, step_max);
      if (new_max == -INFINITY) continue;  // everything so far is -inf: the sum stays 0
      float step_sum = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (valid[u]) {
#pragma unroll
          for (int v = 0; v < VEC; ++v) step_sum += softmax_exp<T>(to_float(x(v, u)) - new_max);
        }
      run = MaxSum{new_max, run.sum * softmax_exp<T>(run.max - new_max) + step_sum};
    }
    // Block merge: butterflies of the commutative merge (same bits in every lane), then across warps.
    for (int offset = 16; offset > 0; offset /= 2)
      run = merge_softmax<T>(run, MaxSum{__shfl_xor_sync(kFullMask, run.max, offset),
                                         __shfl_xor_sync(kFullMask, run.sum, offset)});
    const int lane = int(threadIdx.x) % 32;
    const int warp = int(threadIdx.x) / 32;
    if (lane == 0) {
      scratch[warp] = run.max;
      scratch[32 + warp] = run.sum;
    }
    __syncthreads();
    run = lane < team.size / 32 ? MaxSum{scratch[lane], scratch[32 + lane]} : MaxSum{-INFINITY, 0.f};
    for (int offset = 16; offset > 0; offset /= 2)
      run = merge_softmax<T>(run, MaxSum{__shfl_xor_sync(kFullMask, run.max, offset),
                                         __shfl_xor_sync(kFullMask, run.sum, offset)});
    __syncthreads();  // scratch is reused by the next row
    const float inv_sum = 1.f / run.sum;

    T* y_row = row_ptr(p.out, p.out_rows, row);
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto x = chunk_registers<T, VEC, U>();
      load_row<VEC, L2Hint::evict_first>(x_row, chunks, x, valid, chunk_of);
      store_softmax<VEC>(y_row, chunks, x, valid, chunk_of, run.max, inv_sum);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kMaxTeam) softmax_backward_regs(const SoftmaxParams<T> p) {
  __shared__ float scratch[32];
  const Team team = make_team(p.team);
  const i64 chunks = p.hidden / VEC;
  const auto chunk_of = [&](int s) { return slot_chunk(team, s); };
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 base = mine.begin; base < mine.end; base += team.count) {
    const i64 row = base + team.index;
    const bool active = row < mine.end;
    bool valid[kPairSlots];
#pragma unroll
    for (int s = 0; s < kPairSlots; ++s) valid[s] = active && chunk_of(s) < chunks;

    auto dy = chunk_registers<T, VEC, kPairSlots>();
    auto y = chunk_registers<T, VEC, kPairSlots>();
    float dot[1] = {0.f};
    if (active) {
      load_row<VEC>(row_ptr(p.a, p.a_rows, row), chunks, dy, valid, chunk_of);
      load_row<VEC>(row_ptr(p.b, p.b_rows, row), chunks, y, valid, chunk_of);
      dot[0] = softmax_dot_share<VEC>(dy, y, valid);
    }
    team_allreduce(dot, team, scratch, SumOp{}, 0.f);
    if (!active) continue;  // no barrier follows in this iteration
    store_softmax_grad<VEC>(row_ptr(p.out, p.out_rows, row), chunks, dy, y, valid, chunk_of, dot[0]);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks) softmax_backward_stream(const SoftmaxParams<T> p) {
  constexpr int U = kPairStreamUnroll;
  __shared__ float scratch[32];
  const Team team = make_team(p.team);  // the whole block
  const i64 chunks = p.hidden / VEC;
  const i64 step = i64(U) * team.size;
  const BlockRows mine = block_rows(p.rows, p.rows_per_block);

  for (i64 row = mine.begin; row < mine.end; ++row) {
    const T* dy_row = row_ptr(p.a, p.a_rows, row);
    const T* y_row = row_ptr(p.b, p.b_rows, row);
    float dot[1] = {0.f};
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto dy = chunk_registers<T, VEC, U>();
      auto y = chunk_registers<T, VEC, U>();
      load_row<VEC, L2Hint::evict_last>(dy_row, chunks, dy, valid, chunk_of);
      load_row<VEC, L2Hint::evict_last>(y_row, chunks, y, valid, chunk_of);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (valid[u]) {
#pragma unroll
          for (int v = 0; v < VEC; ++v) dot[0] += to_float(dy(v, u)) * to_float(y(v, u));
        }
    }
    team_allreduce(dot, team, scratch, SumOp{}, 0.f);

    T* dx_row = row_ptr(p.out, p.out_rows, row);
    for (i64 first = team.rank; first < chunks; first += step) {
      const auto chunk_of = [&](int u) { return first + i64(u) * team.size; };
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) valid[u] = chunk_of(u) < chunks;
      auto dy = chunk_registers<T, VEC, U>();
      auto y = chunk_registers<T, VEC, U>();
      load_row<VEC, L2Hint::evict_first>(dy_row, chunks, dy, valid, chunk_of);
      load_row<VEC, L2Hint::evict_first>(y_row, chunks, y, valid, chunk_of);
      store_softmax_grad<VEC>(dx_row, chunks, dy, y, valid, chunk_of, dot[0]);
    }
  }
}

// Few long rows on Hopper (plan::cluster_blocks), as norm_forward_cluster / norm_backward_cluster:
// a row shared by the C blocks of a cluster, each thread's chunks in registers (forward: x, kSlots;
// backward: dy and y, kPairSlots each), the row's reductions by cluster_allreduce (max and sum
// forward, the dot product backward), the rest softmax_forward_regs's / softmax_backward_regs's.
template <class T, int VEC>
__global__ void __launch_bounds__(kClusterThreads, 1) softmax_forward_cluster(const SoftmaxParams<T> p) {
  extern __shared__ float cluster_smem[];
  const i64 chunks = p.hidden / VEC;
  ClusterShare<kSlots> share(cluster_smem, chunks);
  const auto chunk_of = [&](int s) { return share.chunk(s); };
  for (i64 row = blockIdx.y; row < p.rows; row += gridDim.y) {
    auto x = chunk_registers<T, VEC, kSlots>();
    load_row<VEC>(row_ptr(p.a, p.a_rows, row), chunks, x, share.valid, chunk_of);
    float max, sum;
    softmax_statistics<T, VEC>(
        x, share.valid, [&](float (&v)[1], auto op, float identity) { share.allreduce(v, op, identity); }, max, sum);
    store_softmax<VEC>(row_ptr(p.out, p.out_rows, row), chunks, x, share.valid, chunk_of, max, 1.f / sum);
  }
  cluster_barrier();  // no block leaves while a peer may still read its exchange slots
}

template <class T, int VEC>
__global__ void __launch_bounds__(kClusterThreads, 1) softmax_backward_cluster(const SoftmaxParams<T> p) {
  extern __shared__ float cluster_smem[];
  const i64 chunks = p.hidden / VEC;
  ClusterShare<kPairSlots> share(cluster_smem, chunks);
  const auto chunk_of = [&](int s) { return share.chunk(s); };
  for (i64 row = blockIdx.y; row < p.rows; row += gridDim.y) {
    auto dy = chunk_registers<T, VEC, kPairSlots>();
    auto y = chunk_registers<T, VEC, kPairSlots>();
    load_row<VEC>(row_ptr(p.a, p.a_rows, row), chunks, dy, share.valid, chunk_of);
    load_row<VEC>(row_ptr(p.b, p.b_rows, row), chunks, y, share.valid, chunk_of);
    float dot[1] = {softmax_dot_share<VEC>(dy, y, share.valid)};
    share.allreduce(dot);
    store_softmax_grad<VEC>(row_ptr(p.out, p.out_rows, row), chunks, dy, y, share.valid, chunk_of, dot[0]);
  }
  cluster_barrier();  // no block leaves while a peer may still read its exchange slots
}

// (tests/emulation/norm_emu.cpp runs everything from `using namespace kern;` above to this line on the CPU.)

// Launches the regs or stream variant of one softmax kernel pair.
template <class T, int VEC, bool Backward>
void run_softmax(SoftmaxParams<T> p, cudaStream_t stream) {
  if constexpr (VEC > 1) {  // few long rows on sm_90 (plan::cluster_blocks)
    const void* cluster = Backward ? reinterpret_cast<const void*>(&softmax_backward_cluster<T, VEC>)
                                   : reinterpret_cast<const void*>(&softmax_forward_cluster<T, VEC>);
    if (plan::launch_row_cluster(cluster, &p, p.rows, p.hidden / VEC, Backward ? kPairSlots : kSlots, stream)) return;
  }
  // Backward keeps two rows (dy, y) in registers: half the slots per thread.
  plan::RowLaunch launch = Backward ? plan::row_shape(p.hidden / VEC, kPairSlots, kPairSlots)
                                    : plan::row_shape(p.hidden / VEC, kSlots, kSlots);
  const void* kernel;
  if constexpr (Backward) {
    kernel = launch.stream ? reinterpret_cast<const void*>(&softmax_backward_stream<T, VEC>)
                           : reinterpret_cast<const void*>(&softmax_backward_regs<T, VEC>);
  } else {
    kernel = launch.stream ? reinterpret_cast<const void*>(&softmax_forward_stream<T, VEC>)
                           : reinterpret_cast<const void*>(&softmax_forward_regs<T, VEC>);
  }
  plan::spread_rows(launch, p.rows, kernel);
  p.team = launch.team;
  p.rows_per_block = launch.rows_per_block;
  if constexpr (Backward) {
    if (launch.stream) {
      softmax_backward_stream<T, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
      RUDNN_CUDA_CHECK_LAUNCH("softmax_backward_stream");
    } else {
      softmax_backward_regs<T, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
      RUDNN_CUDA_CHECK_LAUNCH("softmax_backward_regs");
    }
  } else {
    if (launch.stream) {
      softmax_forward_stream<T, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
      RUDNN_CUDA_CHECK_LAUNCH("softmax_forward_stream");
    } else {
      softmax_forward_regs<T, VEC><<<launch.grid, launch.block, 0, stream>>>(p);
      RUDNN_CUDA_CHECK_LAUNCH("softmax_forward_regs");
    }
  }
}

template <class T, bool Backward>
void launch_softmax(const T* a, const T* b, T* out, const SoftmaxProblem& pr, cudaStream_t stream) {
  SoftmaxParams<T> p{};
  p.a = a;
  p.b = b;
  p.out = out;
  p.a_rows = pr.a;
  p.b_rows = pr.b;
  p.out_rows = pr.out;
  p.rows = pr.rows;
  p.hidden = pr.hidden;
  constexpr int kVec = kVec16<T>;
  bool vec = pr.hidden % kVec == 0 && plan::rows_vectorizable(a, pr.a, kVec) &&
             plan::rows_vectorizable(out, pr.out, kVec);
  if (Backward) vec = vec && plan::rows_vectorizable(b, pr.b, kVec);
  if (vec) {
    run_softmax<T, kVec, Backward>(p, stream);
  } else {
    run_softmax<T, 1, Backward>(p, stream);
  }
}

}  // namespace

void softmax_forward_cuda(const Tensor& x, const Tensor& y, const SoftmaxProblem& p, Stream stream) {
  if (p.rows == 0) return;
  core::dispatch_float<__half, __nv_bfloat16>(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_softmax<T, false>(x.ptr<const T>(), nullptr, y.ptr<T>(), p, static_cast<cudaStream_t>(stream));
  });
}

void softmax_backward_cuda(const Tensor& dy, const Tensor& y, const Tensor& dx, const SoftmaxProblem& p,
                           Stream stream) {
  if (p.rows == 0) return;
  core::dispatch_float<__half, __nv_bfloat16>(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_softmax<T, true>(dy.ptr<const T>(), y.ptr<const T>(), dx.ptr<T>(), p, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace rudnn::norm
