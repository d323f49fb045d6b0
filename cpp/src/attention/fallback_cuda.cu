// The "fallback" attention strategy: simple CUDA kernels for any float dtype, any head
// dims and every option, correct first and fast second. No Sq x Sk matrix is stored:
//   forward      one block per 16 query rows (and up to 256 output columns): 32-key tiles,
//                scores from 64-column slices of Q and K staged in shared memory, online
//                softmax per row in registers, P V accumulated in shared memory (CUDA cores).
//   backward     the same tiles: blocks of 16 query rows compute delta = dout . out and dq
//                over 32-key tiles; then blocks of 16 key rows gather dk (or dv) over 32-query
//                tiles of every head of their group. Every sum runs in a fixed order: no
//                atomics, deterministic.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "attention/cuda_common.cuh"
#include "attention/kernels.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/dispatch.hpp"

namespace rudnn::attention {

namespace cuda {

namespace {

constexpr int kThreads = 128;
// Tiling of every fallback kernel. A block owns kRowsPerBlock rows (queries, or keys in the
// dk/dv kernel), a team of kTeam consecutive lanes each, and walks tiles of kKeysPerTile rows of
// the other side. Each lane computes kScoresPerLane scores of its row (tile rows lane,
// lane + kTeam, ...) and owns the accumulator columns c = lane (mod kTeam) of its row.
constexpr int kRowsPerBlock = 16;
constexpr int kTeam = kThreads / kRowsPerBlock;           // 8 lanes per row
constexpr int kKeysPerTile = 32;
constexpr int kScoresPerLane = kKeysPerTile / kTeam;      // 4
constexpr int kSlice = 64;                                // columns staged at a time
constexpr int kMaxOutCols = 256;                          // accumulator columns per block
constexpr int kA = 0;                                     // shared memory, in floats: own rows' slice
constexpr int kB = kA + kRowsPerBlock * kSlice;           // tile rows' slice, rows padded to kSlice + 1
constexpr int kW = kB + kKeysPerTile * (kSlice + 1);      //   (a team's 8 rows on 8 banks); the weights
constexpr int kW2 = kW + kRowsPerBlock * kKeysPerTile;    //   of a tile, a second weight tile (dk/dv);
constexpr int kAcc = kW2 + kRowsPerBlock * kKeysPerTile;  //   then [kRowsPerBlock][columns] accumulators

// Shuffle reductions over a row's team (kTeam consecutive lanes of one warp).
__device__ __forceinline__ float team_max(float v) {
  for (int offset = 1; offset < kTeam; offset <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float team_sum(float v) {
  for (int offset = 1; offset < kTeam; offset <<= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Accumulator columns per block (at most kMaxOutCols, spread evenly) and how many blocks.
struct ColumnSplit {
  std::int64_t blocks;
  int cols;
};
__host__ __device__ __forceinline__ ColumnSplit split_columns(std::int64_t width) {
  const std::int64_t blocks = width > 0 ? (width + kMaxOutCols - 1) / kMaxOutCols : 1;
  return {blocks, int(width > 0 ? (width + blocks - 1) / blocks : 1)};
}

// s[u] = A_r . B_(lane + u kTeam) over n columns, for the block's own rows A_r (a_row(r)) and a
// tile of rows B (b_row(i)); a row pointer of nullptr reads as zeros. Slices of kSlice columns are
// staged in shared memory; the leading barrier makes the buffers free to overwrite.
template <class T, class RowA, class RowB>
__device__ __forceinline__ void tile_dots(float (&s)[kScoresPerLane], std::int64_t n, const RowA a_row,
                                          const RowB b_row, float* smem) {
  const int tid = threadIdx.x, r = tid / kTeam, lane = tid % kTeam;
  float* a_s = smem + kA;
  float* b_s = smem + kB;
#pragma unroll
  for (int u = 0; u < kScoresPerLane; ++u) s[u] = 0.0f;
  for (std::int64_t c0 = 0; c0 < n; c0 += kSlice) {
    const int w = int(n - c0 < kSlice ? n - c0 : kSlice);
    __syncthreads();
    for (int i = tid; i < kRowsPerBlock * kSlice; i += kThreads) {
      const T* row = a_row(i / kSlice);
      a_s[i] = row != nullptr && i % kSlice < w ? to_float(row[c0 + i % kSlice]) : 0.0f;
    }
    for (int i = tid; i < kKeysPerTile * kSlice; i += kThreads) {
      const T* row = b_row(i / kSlice);
      b_s[i / kSlice * (kSlice + 1) + i % kSlice] = row != nullptr && i % kSlice < w ? to_float(row[c0 + i % kSlice])
                                                                                     : 0.0f;
    }
    __syncthreads();
    for (int dd = 0; dd < w; ++dd) {
      const float a = a_s[r * kSlice + dd];
#pragma unroll
      for (int u = 0; u < kScoresPerLane; ++u) s[u] = fmaf(a, b_s[(lane + u * kTeam) * (kSlice + 1) + dd], s[u]);
    }
  }
}

// acc[r][c] = acc[r][c] * scale + sum_i W[r][i] B_i[c_first + c] over the lane's columns c of
// [0, n_cols), W ([kRowsPerBlock][kKeysPerTile] at w_s) the tile weights in shared memory
// (complete before the call: the leading barrier publishes them). Zero weights add nothing,
// even against inf or NaN rows of B.
template <class T, class RowB>
__device__ __forceinline__ void tile_accumulate(float* acc, int n_cols, std::int64_t c_first, float scale,
                                                const float* w_s, const RowB b_row, float* smem) {
  const int tid = threadIdx.x, r = tid / kTeam, lane = tid % kTeam;
  float* b_s = smem + kB;
  for (int c0 = 0; c0 < n_cols; c0 += kSlice) {
    const int w = n_cols - c0 < kSlice ? n_cols - c0 : kSlice;
    __syncthreads();
    for (int i = tid; i < kKeysPerTile * kSlice; i += kThreads) {
      const T* row = b_row(i / kSlice);
      b_s[i] = row != nullptr && i % kSlice < w ? to_float(row[c_first + c0 + i % kSlice]) : 0.0f;
    }
    __syncthreads();
    for (int dd = lane; dd < w; dd += kTeam) {
      float a = acc[r * n_cols + c0 + dd] * scale;
      for (int i = 0; i < kKeysPerTile; ++i) {
        const float wi = w_s[r * kKeysPerTile + i];
        if (wi != 0.0f) a = fmaf(wi, b_s[i * kSlice + dd], a);
      }
      acc[r * n_cols + c0 + dd] = a;
    }
  }
}

// Row pointers of a tensor's rows [first, first + count) for the tile helpers (nullptr past them).
template <class T, class Stride>
struct Rows {
  const T* base;
  Stride stride;
  std::int64_t b, h, first, count;
  __device__ __forceinline__ const T* operator()(int i) const {
    return i < count ? base + stride.at(b, h, first + i) : nullptr;
  }
};
template <class T, class Stride>
__device__ __forceinline__ Rows<T, Stride> rows(const T* base, const Stride& stride, std::int64_t b, std::int64_t h,
                                               std::int64_t first, std::int64_t count) {
  return {base, stride, b, h, first, count};
}

// Forward. blockIdx.x = query block * column blocks + column block of Dv; y = head; z = sequence.
// The kernels take the problem as __grid_constant__: general_logit (out of line) reads it through
// a reference, which would otherwise copy the whole struct to every thread's stack.
template <class T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const __grid_constant__ Problem p, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse) {
  const ColumnSplit split = split_columns(p.dv);
  const std::int64_t m0 = std::int64_t(blockIdx.x / split.blocks) * kRowsPerBlock;
  const std::int64_t c_first = std::int64_t(blockIdx.x % split.blocks) * split.cols;
  const int n_cols = int(p.dv - c_first < split.cols ? p.dv - c_first : split.cols);
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  if (m0 >= len_q) return;  // uniform over the block
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x, r = tid / kTeam, lane = tid % kTeam;
  const std::int64_t row = m0 + r;  // rows past len_q take part in the barriers and write nothing

  extern __shared__ float smem[];
  float* w_s = smem + kW;
  float* acc = smem + kAcc;  // [kRowsPerBlock][n_cols]; a lane only ever touches its own columns
  for (int dd = lane; dd < n_cols; dd += kTeam) acc[r * n_cols + dd] = 0.0f;
  const auto q_rows = rows(q, p.q, b, h, q0 + m0, len_q - m0);

  std::int64_t t_first, t_last;
  key_block_range(p, m0, len_q - m0 < kRowsPerBlock ? len_q - m0 : kRowsPerBlock, len_q, len_k, kKeysPerTile,
                  t_first, t_last);
  float row_max = -INFINITY, row_sum = 0.0f;
  for (std::int64_t t = t_first; t < t_last; ++t) {
    const std::int64_t j0 = t * kKeysPerTile;
    float s[kScoresPerLane];
    tile_dots<T>(s, p.d, q_rows, rows(k, p.k, b, hk, k0 + j0, len_k - j0), smem);
    // Scores, then the online softmax of the row (its team merges the tile's max and sum).
    float tile_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kScoresPerLane; ++u) {
      const std::int64_t col = j0 + lane + u * kTeam;
      float tanh_s;
      s[u] = row < len_q && col < len_k ? general_logit(p, s[u], b, h, row, col, len_q, len_k, &tanh_s) : -INFINITY;
      tile_max = fmaxf(tile_max, s[u]);
    }
    const float new_max = fmaxf(row_max, team_max(tile_max));
    const float base = new_max == -INFINITY ? 0.0f : new_max;  // nothing visible yet: stays 0
    const float correction = expf(row_max - base);
    float tile_sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kScoresPerLane; ++u) {
      const float e = expf(s[u] - base);
      w_s[r * kKeysPerTile + lane + u * kTeam] = e;
      tile_sum += e;
    }
    row_sum = row_sum * correction + team_sum(tile_sum);
    row_max = new_max;
    tile_accumulate<T>(acc, n_cols, c_first, correction, w_s, rows(v, p.v, b, hk, k0 + j0, len_k - j0), smem);
  }
  // out = acc / sum; a row that saw no key gets 0 and lse -inf.
  if (row >= len_q) return;
  const float inv = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
  T* o = out + p.out.at(b, h, q0 + row) + c_first;
  for (int dd = lane; dd < n_cols; dd += kTeam) o[dd] = from_float<T>(acc[r * n_cols + dd] * inv);
  if (lse != nullptr && c_first == 0 && lane == 0)
    lse[p.lse.at(b, h, q0 + row)] = row_sum > 0.0f ? row_max + logf(row_sum) : -INFINITY;
}

// dq. blockIdx.x = query block * column blocks of D + column block; y = head; z = sequence.
// Column block 0 also writes delta_i = dout_i . out_i for the dk/dv kernel.
template <class T>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const __grid_constant__ BackwardProblem bp, const T* __restrict__ dout,
                       const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ out,
                       const float* __restrict__ lse, T* __restrict__ dq, float* __restrict__ delta_ws) {
  const Problem& p = bp.fwd;
  const ColumnSplit split = split_columns(p.d);
  const std::int64_t m0 = std::int64_t(blockIdx.x / split.blocks) * kRowsPerBlock;
  const std::int64_t c_first = std::int64_t(blockIdx.x % split.blocks) * split.cols;
  const int n_cols = int(p.d - c_first < split.cols ? p.d - c_first : split.cols);
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  if (m0 >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x, r = tid / kTeam, lane = tid % kTeam;
  const std::int64_t row = m0 + r;

  extern __shared__ float smem[];
  float* w_s = smem + kW;
  float* acc = smem + kAcc;
  for (int dd = lane; dd < n_cols; dd += kTeam) acc[r * n_cols + dd] = 0.0f;
  float partial = 0.0f;
  if (row < len_q) {
    const T* do_row = dout + bp.dout.at(b, h, q0 + row);
    const T* o_row = out + p.out.at(b, h, q0 + row);
    for (std::int64_t d = lane; d < p.dv; d += kTeam) partial = fmaf(to_float(do_row[d]), to_float(o_row[d]), partial);
  }
  const float dout_dot_out = team_sum(partial);  // every lane of the warp shuffles
  const float delta = row < len_q ? bp.row_delta(dout_dot_out, b, h, q0 + row) : 0.0f;
  if (row < len_q && c_first == 0 && lane == 0) delta_ws[delta_index(p, b, h, q0 + row)] = delta;
  const float row_lse = row < len_q ? lse[p.lse.at(b, h, q0 + row)] : -INFINITY;  // -inf: no gradient
  const auto q_rows = rows(q, p.q, b, h, q0 + m0, len_q - m0);
  const auto do_rows = rows(dout, bp.dout, b, h, q0 + m0, len_q - m0);

  std::int64_t t_first, t_last;
  key_block_range(p, m0, len_q - m0 < kRowsPerBlock ? len_q - m0 : kRowsPerBlock, len_q, len_k, kKeysPerTile,
                  t_first, t_last);
  for (std::int64_t t = t_first; t < t_last; ++t) {
    const std::int64_t j0 = t * kKeysPerTile;
    const auto k_rows = rows(k, p.k, b, hk, k0 + j0, len_k - j0);
    float s[kScoresPerLane], dp[kScoresPerLane];
    tile_dots<T>(s, p.d, q_rows, k_rows, smem);
    tile_dots<T>(dp, p.dv, do_rows, rows(v, p.v, b, hk, k0 + j0, len_k - j0), smem);
#pragma unroll
    for (int u = 0; u < kScoresPerLane; ++u) {
      const std::int64_t col = j0 + lane + u * kTeam;
      float prob = 0.0f, ds = 0.0f, tanh_s;
      if (row < len_q && col < len_k && row_lse != -INFINITY) {
        const float score = general_logit(p, s[u], b, h, row, col, len_q, len_k, &tanh_s);  // sets tanh_s first
        probability_and_dscore(p, score, kLog2e, tanh_s, row_lse, dp[u], delta, prob, ds);
      }
      w_s[r * kKeysPerTile + lane + u * kTeam] = ds;
    }
    tile_accumulate<T>(acc, n_cols, c_first, 1.0f, w_s, k_rows, smem);
  }
  if (row >= len_q) return;
  T* dq_row = dq + bp.dq.at(b, h, q0 + row) + c_first;
  for (int dd = lane; dd < n_cols; dd += kTeam) dq_row[dd] = from_float<T>(acc[r * n_cols + dd]);
}

// dk and dv. blockIdx.x = key block * column blocks + column block c: the block accumulates
// column block c of dk (if D has one) and of dv (if Dv has one), so S and P are computed once for
// both (at most 256 columns each; most head dims take one block). y = key/value head; z =
// sequence. The sums run over the query tiles of every query head of the group, in order.
template <class T>
__global__ void __launch_bounds__(kThreads)
    backward_dkdv_kernel(const __grid_constant__ BackwardProblem bp, const T* __restrict__ dout,
                         const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const float* __restrict__ lse,
                         const float* __restrict__ delta_ws, T* __restrict__ dk, T* __restrict__ dv) {
  const Problem& p = bp.fwd;
  const ColumnSplit dk_split = split_columns(p.d), dv_split = split_columns(p.dv);
  const std::int64_t col_blocks = dk_split.blocks > dv_split.blocks ? dk_split.blocks : dv_split.blocks;
  const std::int64_t n0 = std::int64_t(blockIdx.x / col_blocks) * kRowsPerBlock;
  const std::int64_t cb = blockIdx.x % col_blocks;
  const std::int64_t dk_first = cb * dk_split.cols, dv_first = cb * dv_split.cols;
  // Columns of each gradient in this block (0: none); uniform over the block.
  const int n_dk = int(dk_first >= p.d ? 0 : p.d - dk_first < dk_split.cols ? p.d - dk_first : dk_split.cols);
  const int n_dv = int(dv_first >= p.dv ? 0 : p.dv - dv_first < dv_split.cols ? p.dv - dv_first : dv_split.cols);
  const std::int64_t hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  if (n0 >= len_k) return;
  const int tid = threadIdx.x, r = tid / kTeam, lane = tid % kTeam;
  const std::int64_t key = n0 + r;

  extern __shared__ float smem[];
  float* p_s = smem + kW;   // P of the tile (dv's weights)
  float* ds_s = smem + kW2;  // dS of the tile (dk's weights)
  float* dk_acc = smem + kAcc;                   // [kRowsPerBlock][n_dk]
  float* dv_acc = dk_acc + kRowsPerBlock * n_dk;  // [kRowsPerBlock][n_dv]
  for (int dd = lane; dd < n_dk; dd += kTeam) dk_acc[r * n_dk + dd] = 0.0f;
  for (int dd = lane; dd < n_dv; dd += kTeam) dv_acc[r * n_dv + dd] = 0.0f;
  const auto k_rows = rows(k, p.k, b, hk, k0 + n0, len_k - n0);
  const auto v_rows = rows(v, p.v, b, hk, k0 + n0, len_k - n0);
  const std::int64_t keys_here = len_k - n0 < kRowsPerBlock ? len_k - n0 : kRowsPerBlock;

  for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    std::int64_t t_first, t_last;
    query_block_range(p, n0, keys_here, len_q, len_k, kKeysPerTile, t_first, t_last);
    for (std::int64_t t = t_first; t < t_last; ++t) {
      const std::int64_t i0 = t * kKeysPerTile;
      const auto q_rows = rows(q, p.q, b, h, q0 + i0, len_q - i0);
      const auto do_rows = rows(dout, bp.dout, b, h, q0 + i0, len_q - i0);
      float s[kScoresPerLane], dp[kScoresPerLane] = {};
      tile_dots<T>(s, p.d, k_rows, q_rows, smem);
      if (n_dk > 0) tile_dots<T>(dp, p.dv, v_rows, do_rows, smem);  // dP only feeds dS
#pragma unroll
      for (int u = 0; u < kScoresPerLane; ++u) {
        const std::int64_t i = i0 + lane + u * kTeam;
        float prob = 0.0f, ds = 0.0f, tanh_s;
        if (key < len_k && i < len_q) {
          const float score = general_logit(p, s[u], b, h, i, key, len_q, len_k, &tanh_s);  // sets tanh_s first
          probability_and_dscore(p, score, kLog2e, tanh_s, lse[p.lse.at(b, h, q0 + i)], dp[u],
                                 delta_ws[delta_index(p, b, h, q0 + i)], prob, ds);
        }
        p_s[r * kKeysPerTile + lane + u * kTeam] = prob;
        ds_s[r * kKeysPerTile + lane + u * kTeam] = ds;
      }
      if (n_dv > 0) tile_accumulate<T>(dv_acc, n_dv, dv_first, 1.0f, p_s, do_rows, smem);
      if (n_dk > 0) tile_accumulate<T>(dk_acc, n_dk, dk_first, 1.0f, ds_s, q_rows, smem);
    }
  }
  if (key >= len_k) return;
  T* dk_row = dk + bp.dk.at(b, hk, k0 + key) + dk_first;
  T* dv_row = dv + bp.dv.at(b, hk, k0 + key) + dv_first;
  for (int dd = lane; dd < n_dk; dd += kTeam) dk_row[dd] = from_float<T>(dk_acc[r * n_dk + dd]);
  for (int dd = lane; dd < n_dv; dd += kTeam) dv_row[dd] = from_float<T>(dv_acc[r * n_dv + dd]);
}

// Grid of (blocks, heads, sequences); the limits are checked here, not assumed.
dim3 row_grid(std::int64_t rows, std::int64_t heads, std::int64_t batch, const char* op) {
  if (rows > 0x7fffffffLL || heads > 65535 || batch > 65535)
    core::fail(ErrorKind::unsupported, std::string(op) + ": strategy 'fallback' supports at most 2^31-1 row blocks, "
                                                         "65535 heads and 65535 sequences per call");
  return dim3(unsigned(rows), unsigned(heads), unsigned(batch));
}

// Dynamic shared memory above the 48 KB default needs an opt-in per kernel.
template <class Kernel>
void set_smem(Kernel kernel, std::size_t bytes, const Problem& p, const char* op) {
  if (bytes <= 48 * 1024) return;
  const int limit = core::device_props(core::current_device()).max_smem_per_block_optin;
  if (bytes > std::size_t(limit))
    core::fail(ErrorKind::unsupported, std::string(op) + ": head dims D = " + std::to_string(p.d) + ", Dv = " +
                                           std::to_string(p.dv) + " need " + std::to_string(bytes) +
                                           " bytes of shared memory per block in strategy 'fallback', more than this "
                                           "device allows (" + std::to_string(limit) + ")");
  RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

}  // namespace

}  // namespace cuda

void fallback_forward(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                      Stream stream) {
  using namespace cuda;
  if (p.batch == 0 || p.hq == 0 || p.sq == 0) return;
  const ColumnSplit split = split_columns(p.dv);
  const std::int64_t m_blocks = (p.sq + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid = row_grid(m_blocks * split.blocks, p.hq, p.batch, "attention");
  const std::size_t smem = std::size_t(kAcc + kRowsPerBlock * split.cols) * sizeof(float);
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    set_smem(forward_kernel<T>, smem, p, "attention");
    forward_kernel<T><<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(
        p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), lse);
    RUDNN_CUDA_CHECK_LAUNCH("attention fallback forward_kernel");
  });
}

std::size_t fallback_backward_workspace_bytes(const Problem& p) {
  const std::int64_t rows = (p.varlen ? 1 : p.batch) * p.hq * p.sq;  // delta_i per query row
  return std::size_t(rows) * sizeof(float);
}

void fallback_backward(const BackwardProblem& bp, const void* dout, const void* q, const void* k, const void* v,
                       const void* out, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                       Stream stream) {
  using namespace cuda;
  const Problem& p = bp.fwd;
  if (p.batch == 0 || p.hq == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  float* delta = static_cast<float*>(workspace);
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.sq > 0) {
      const ColumnSplit split = split_columns(p.d);
      const dim3 grid = row_grid((p.sq + kRowsPerBlock - 1) / kRowsPerBlock * split.blocks, p.hq, p.batch,
                                 "attention_backward");
      const std::size_t smem = std::size_t(kAcc + kRowsPerBlock * split.cols) * sizeof(float);
      set_smem(backward_dq_kernel<T>, smem, p, "attention_backward");
      backward_dq_kernel<T><<<grid, kThreads, smem, s>>>(bp, static_cast<const T*>(dout), static_cast<const T*>(q),
                                                          static_cast<const T*>(k), static_cast<const T*>(v),
                                                          static_cast<const T*>(out), lse, static_cast<T*>(dq), delta);
      RUDNN_CUDA_CHECK_LAUNCH("attention fallback backward_dq_kernel");
    }
    if (p.sk > 0) {  // runs after the dq kernel on the stream: delta is ready
      const ColumnSplit dk_split = split_columns(p.d), dv_split = split_columns(p.dv);
      const std::int64_t col_blocks = dk_split.blocks > dv_split.blocks ? dk_split.blocks : dv_split.blocks;
      const dim3 grid = row_grid((p.sk + kRowsPerBlock - 1) / kRowsPerBlock * col_blocks, p.hkv, p.batch,
                                 "attention_backward");
      const std::size_t smem = std::size_t(kAcc + kRowsPerBlock * (dk_split.cols + dv_split.cols)) * sizeof(float);
      set_smem(backward_dkdv_kernel<T>, smem, p, "attention_backward");
      backward_dkdv_kernel<T><<<grid, kThreads, smem, s>>>(bp, static_cast<const T*>(dout), static_cast<const T*>(q),
                                                            static_cast<const T*>(k), static_cast<const T*>(v), lse,
                                                            delta, static_cast<T*>(dk), static_cast<T*>(dv));
      RUDNN_CUDA_CHECK_LAUNCH("attention fallback backward_dkdv_kernel");
    }
  });
}

}  // namespace rudnn::attention
