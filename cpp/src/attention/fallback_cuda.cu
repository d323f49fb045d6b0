// The "fallback" attention strategy: simple CUDA kernels for any float dtype, any head
// dims and every option, correct first and fast second. No Sq x Sk matrix is stored:
//   forward      one block per 16 query rows (and up to 256 output columns): 32-key tiles,
//                scores from 64-column slices of Q and K staged in shared memory, online
//                softmax per row in registers, P V accumulated in shared memory (CUDA cores).
//   backward     one block per query row computes delta = dout . out and dq; then one
//                block per key row gathers dk and dv over the query rows of every head of
//                its group. Every sum runs in a fixed order: no atomics, deterministic.
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
constexpr int kWarps = kThreads / 32;

// a (float32, shared memory) . b (global, element type T) over n elements.
template <class T>
__device__ __forceinline__ float dot(const float* a, const T* b, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t d = 0; d < n; ++d) s = fmaf(a[d], to_float(b[d]), s);
  return s;
}

__device__ float block_sum(float v) {
  __shared__ float part[kWarps];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < kWarps; ++w) s += part[w];  // same order in every thread
  return s;
}

__device__ __forceinline__ std::int64_t delta_index(const Problem& p, std::int64_t b, std::int64_t h,
                                                    std::int64_t row) {
  return ((p.varlen ? 0 : b) * p.hq + h) * p.sq + row;
}

// Forward tiling. A team of kTeam consecutive lanes owns one query row of the block; per key
// tile each lane computes kScoresPerLane scores (keys lane, lane + kTeam, ...) and owns the
// output columns d = lane (mod kTeam) of its row.
constexpr int kRowsPerBlock = 16;
constexpr int kTeam = kThreads / kRowsPerBlock;           // 8 lanes per row
constexpr int kKeysPerTile = 32;
constexpr int kScoresPerLane = kKeysPerTile / kTeam;      // 4
constexpr int kSlice = 64;                                // head-dim columns staged at a time
constexpr int kMaxOutCols = 256;                          // output columns per block
constexpr int kQ = 0;                                     // shared-memory offsets, in floats
constexpr int kK = kQ + kRowsPerBlock * kSlice;           // K slice rows padded to kSlice + 1:
constexpr int kP = kK + kKeysPerTile * (kSlice + 1);      //   a team's 8 keys on 8 banks
constexpr int kV = kP + kRowsPerBlock * kKeysPerTile;
constexpr int kAcc = kV + kKeysPerTile * kSlice;          // then [kRowsPerBlock][out columns]

// Shuffle reductions over a row's team (kTeam consecutive lanes of one warp).
__device__ __forceinline__ float team_max(float v) {
  for (int offset = 1; offset < kTeam; offset <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float team_sum(float v) {
  for (int offset = 1; offset < kTeam; offset <<= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// blockIdx.x = query block * column blocks + column block; blockIdx.y = head; blockIdx.z = sequence.
template <class T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const Problem p, int out_cols, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse) {
  const int col_blocks = int((p.dv + out_cols - 1) / out_cols);
  const std::int64_t m0 = std::int64_t(blockIdx.x / col_blocks) * kRowsPerBlock;
  const std::int64_t c_first = std::int64_t(blockIdx.x % col_blocks) * out_cols;
  const int n_cols = int(p.dv - c_first < out_cols ? p.dv - c_first : out_cols);
  const std::int64_t h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  if (m0 >= len_q) return;  // uniform over the block
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x, r = tid / kTeam, lane = tid % kTeam;
  const std::int64_t row = m0 + r;  // rows past len_q take part in the barriers and write nothing

  extern __shared__ float smem[];
  float* q_s = smem + kQ;
  float* k_s = smem + kK;
  float* p_s = smem + kP;
  float* v_s = smem + kV;
  float* acc = smem + kAcc;  // [kRowsPerBlock][n_cols]; a lane only ever touches its own columns
  for (int dd = lane; dd < n_cols; dd += kTeam) acc[r * n_cols + dd] = 0.0f;

  std::int64_t t_first, t_last;
  const std::int64_t rows_here = len_q - m0 < kRowsPerBlock ? len_q - m0 : kRowsPerBlock;
  key_block_range(p, m0, rows_here, len_q, len_k, kKeysPerTile, t_first, t_last);
  float row_max = -INFINITY, row_sum = 0.0f;
  for (std::int64_t t = t_first; t < t_last; ++t) {
    const std::int64_t j0 = t * kKeysPerTile;
    // S = Q K^T for the tile, a slice of the head dim at a time.
    float s[kScoresPerLane] = {};
    for (std::int64_t c0 = 0; c0 < p.d; c0 += kSlice) {
      const int n = int(p.d - c0 < kSlice ? p.d - c0 : kSlice);
      __syncthreads();  // the previous slice (or tile) is consumed
      for (int i = tid; i < kRowsPerBlock * kSlice; i += kThreads) {
        const int rr = i / kSlice, cc = i % kSlice;
        q_s[i] = m0 + rr < len_q && cc < n ? to_float(q[p.q.at(b, h, q0 + m0 + rr) + c0 + cc]) : 0.0f;
      }
      for (int i = tid; i < kKeysPerTile * kSlice; i += kThreads) {
        const int kk = i / kSlice, cc = i % kSlice;
        k_s[kk * (kSlice + 1) + cc] =
            j0 + kk < len_k && cc < n ? to_float(k[p.k.at(b, hk, k0 + j0 + kk) + c0 + cc]) : 0.0f;
      }
      __syncthreads();
      for (int dd = 0; dd < n; ++dd) {
        const float qv = q_s[r * kSlice + dd];
#pragma unroll
        for (int u = 0; u < kScoresPerLane; ++u) s[u] = fmaf(qv, k_s[(lane + u * kTeam) * (kSlice + 1) + dd], s[u]);
      }
    }
    // Scores, then the online softmax of the row (its team merges the tile's max and sum).
    float tile_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kScoresPerLane; ++u) {
      const std::int64_t col = j0 + lane + u * kTeam;
      float tanh_s;
      s[u] = row < len_q && col < len_k && !hidden(p, b, h, row, col, len_q, len_k)
                 ? logit(p, s[u], b, h, row, col, &tanh_s)
                 : -INFINITY;
      tile_max = fmaxf(tile_max, s[u]);
    }
    const float new_max = fmaxf(row_max, team_max(tile_max));
    const float base = new_max == -INFINITY ? 0.0f : new_max;  // nothing visible yet: stays 0
    const float correction = expf(row_max - base);
    float tile_sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kScoresPerLane; ++u) {
      const float e = expf(s[u] - base);
      p_s[r * kKeysPerTile + lane + u * kTeam] = e;
      tile_sum += e;
    }
    row_sum = row_sum * correction + team_sum(tile_sum);
    row_max = new_max;
    // O = O * correction + P V over this block's output columns, a slice of V at a time.
    for (int c0 = 0; c0 < n_cols; c0 += kSlice) {
      const int n = n_cols - c0 < kSlice ? n_cols - c0 : kSlice;
      __syncthreads();  // P is complete; the previous V slice is consumed
      for (int i = tid; i < kKeysPerTile * kSlice; i += kThreads) {
        const int kk = i / kSlice, cc = i % kSlice;
        v_s[i] = j0 + kk < len_k && cc < n ? to_float(v[p.v.at(b, hk, k0 + j0 + kk) + c_first + c0 + cc]) : 0.0f;
      }
      __syncthreads();
      for (int dd = lane; dd < n; dd += kTeam) {
        float a = acc[r * n_cols + c0 + dd] * correction;
        for (int kk = 0; kk < kKeysPerTile; ++kk) {
          const float pk = p_s[r * kKeysPerTile + kk];
          if (pk != 0.0f) a = fmaf(pk, v_s[kk * kSlice + dd], a);  // hidden keys add nothing, even inf V
        }
        acc[r * n_cols + c0 + dd] = a;
      }
    }
  }
  // Epilogue: out = acc / sum; a row that saw no key gets 0 and lse -inf. Each lane reads only
  // the accumulator columns it wrote.
  if (row >= len_q) return;
  const float inv = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
  T* o = out + p.out.at(b, h, q0 + row) + c_first;
  for (int dd = lane; dd < n_cols; dd += kTeam) o[dd] = from_float<T>(acc[r * n_cols + dd] * inv);
  if (lse != nullptr && c_first == 0 && lane == 0)
    lse[p.lse.at(b, h, q0 + row)] = row_sum > 0.0f ? row_max + logf(row_sum) : -INFINITY;
}

// dS_ij = P_ij (dP_ij - delta_i) * d(softcap)/d(score) * scale, the gradient of q_i . k_j.
__device__ __forceinline__ float dscore(const Problem& p, float prob, float dp, float delta, float tanh_s) {
  float ds = prob * (dp - delta);
  if (p.softcap > 0.0f) ds *= 1.0f - tanh_s * tanh_s;
  return ds * p.scale;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const BackwardProblem bp, const T* __restrict__ dout, const T* __restrict__ q,
                       const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ out,
                       const float* __restrict__ lse, T* __restrict__ dq, float* __restrict__ delta_ws) {
  const Problem& p = bp.fwd;
  const std::int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  if (i >= len_q) return;
  const std::int64_t hk = h / p.group;
  const int tid = threadIdx.x;

  extern __shared__ float smem[];
  float* q_s = smem;           // [D]
  float* do_s = q_s + p.d;     // [Dv]
  float* acc = do_s + p.dv;    // [D] dq
  float* ds_s = acc + p.d;     // [kThreads]
  const T* q_row = q + p.q.at(b, h, q0 + i);
  const T* do_row = dout + bp.dout.at(b, h, q0 + i);
  const T* o_row = out + p.out.at(b, h, q0 + i);
  float partial = 0.0f;
  for (std::int64_t d = tid; d < p.d; d += kThreads) q_s[d] = to_float(q_row[d]), acc[d] = 0.0f;
  for (std::int64_t d = tid; d < p.dv; d += kThreads) {
    do_s[d] = to_float(do_row[d]);
    partial = fmaf(do_s[d], to_float(o_row[d]), partial);
  }
  const float delta = block_sum(partial);  // also orders the shared-memory writes above
  if (tid == 0) delta_ws[delta_index(p, b, h, q0 + i)] = delta;
  const float row_lse = lse[p.lse.at(b, h, q0 + i)];
  T* dq_row = dq + bp.dq.at(b, h, q0 + i);
  if (row_lse == -INFINITY) {  // the row saw no key: no gradient
    for (std::int64_t d = tid; d < p.d; d += kThreads) dq_row[d] = from_float<T>(0.0f);
    return;
  }

  float t;
  for (std::int64_t c = 0; c < len_k; c += kThreads) {
    const std::int64_t j = c + tid;
    float ds = 0.0f;
    if (j < len_k && !hidden(p, b, h, i, j, len_q, len_k)) {
      const float s = logit(p, dot(q_s, k + p.k.at(b, hk, k0 + j), p.d), b, h, i, j, &t);
      const float pr = expf(s - row_lse);
      if (pr != 0.0f) ds = dscore(p, pr, dot(do_s, v + p.v.at(b, hk, k0 + j), p.dv), delta, t);
    }
    ds_s[tid] = ds;
    __syncthreads();
    const int n = int(len_k - c < kThreads ? len_k - c : kThreads);
    for (std::int64_t d = tid; d < p.d; d += kThreads) {
      float a = acc[d];
      for (int u = 0; u < n; ++u)
        if (ds_s[u] != 0.0f) a = fmaf(ds_s[u], to_float(k[p.k.at(b, hk, k0 + c + u) + d]), a);
      acc[d] = a;
    }
    __syncthreads();
  }
  for (std::int64_t d = tid; d < p.d; d += kThreads) dq_row[d] = from_float<T>(acc[d]);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    backward_dkdv_kernel(const BackwardProblem bp, const T* __restrict__ dout, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ lse,
                         const float* __restrict__ delta_ws, T* __restrict__ dk, T* __restrict__ dv) {
  const Problem& p = bp.fwd;
  const std::int64_t j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  std::int64_t q0, len_q, k0, len_k;
  p.sequence(b, q0, len_q, k0, len_k);
  if (j >= len_k) return;
  const int tid = threadIdx.x;

  extern __shared__ float smem[];
  float* k_s = smem;             // [D]
  float* v_s = k_s + p.d;        // [Dv]
  float* dk_acc = v_s + p.dv;    // [D]
  float* dv_acc = dk_acc + p.d;  // [Dv]
  float* ds_s = dv_acc + p.dv;   // [kThreads]
  float* p_s = ds_s + kThreads;  // [kThreads]
  const T* k_row = k + p.k.at(b, hk, k0 + j);
  const T* v_row = v + p.v.at(b, hk, k0 + j);
  for (std::int64_t d = tid; d < p.d; d += kThreads) k_s[d] = to_float(k_row[d]), dk_acc[d] = 0.0f;
  for (std::int64_t d = tid; d < p.dv; d += kThreads) v_s[d] = to_float(v_row[d]), dv_acc[d] = 0.0f;
  __syncthreads();

  float t;
  for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    for (std::int64_t c = 0; c < len_q; c += kThreads) {
      const std::int64_t i = c + tid;
      float pr = 0.0f, ds = 0.0f;
      if (i < len_q && !hidden(p, b, h, i, j, len_q, len_k)) {
        const float row_lse = lse[p.lse.at(b, h, q0 + i)];
        if (row_lse != -INFINITY) {
          const float s = logit(p, dot(k_s, q + p.q.at(b, h, q0 + i), p.d), b, h, i, j, &t);
          pr = expf(s - row_lse);
          if (pr != 0.0f)
            ds = dscore(p, pr, dot(v_s, dout + bp.dout.at(b, h, q0 + i), p.dv), delta_ws[delta_index(p, b, h, q0 + i)],
                        t);
        }
      }
      p_s[tid] = pr;
      ds_s[tid] = ds;
      __syncthreads();
      const int n = int(len_q - c < kThreads ? len_q - c : kThreads);
      for (std::int64_t d = tid; d < p.d; d += kThreads) {
        float a = dk_acc[d];
        for (int u = 0; u < n; ++u)
          if (ds_s[u] != 0.0f) a = fmaf(ds_s[u], to_float(q[p.q.at(b, h, q0 + c + u) + d]), a);
        dk_acc[d] = a;
      }
      for (std::int64_t d = tid; d < p.dv; d += kThreads) {
        float a = dv_acc[d];
        for (int u = 0; u < n; ++u)
          if (p_s[u] != 0.0f) a = fmaf(p_s[u], to_float(dout[bp.dout.at(b, h, q0 + c + u) + d]), a);
        dv_acc[d] = a;
      }
      __syncthreads();
    }
  }
  T* dk_row = dk + bp.dk.at(b, hk, k0 + j);
  T* dv_row = dv + bp.dv.at(b, hk, k0 + j);
  for (std::int64_t d = tid; d < p.d; d += kThreads) dk_row[d] = from_float<T>(dk_acc[d]);
  for (std::int64_t d = tid; d < p.dv; d += kThreads) dv_row[d] = from_float<T>(dv_acc[d]);
}

// One block per (row, head, batch); the grid limits are checked here, not assumed.
dim3 row_grid(std::int64_t rows, std::int64_t heads, std::int64_t batch, const char* op) {
  if (rows > 0x7fffffffLL || heads > 65535 || batch > 65535)
    core::fail(ErrorKind::unsupported, std::string(op) + ": strategy 'fallback' supports at most 2^31-1 rows, 65535 "
                                                         "heads and 65535 sequences per call");
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
  // Output columns per block: at most kMaxOutCols, spread evenly over the column blocks.
  const std::int64_t col_blocks = (p.dv + kMaxOutCols - 1) / kMaxOutCols;
  const int out_cols = int((p.dv + col_blocks - 1) / col_blocks);
  const std::int64_t m_blocks = (p.sq + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid = row_grid(m_blocks * col_blocks, p.hq, p.batch, "attention");
  const std::size_t smem = std::size_t(kAcc + kRowsPerBlock * out_cols) * sizeof(float);
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    set_smem(forward_kernel<T>, smem, p, "attention");
    forward_kernel<T><<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(
        p, out_cols, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<T*>(out), lse);
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
      const dim3 grid = row_grid(p.sq, p.hq, p.batch, "attention_backward");
      const std::size_t smem = std::size_t(2 * p.d + p.dv + kThreads) * sizeof(float);
      set_smem(backward_dq_kernel<T>, smem, p, "attention_backward");
      backward_dq_kernel<T><<<grid, kThreads, smem, s>>>(bp, static_cast<const T*>(dout), static_cast<const T*>(q),
                                                          static_cast<const T*>(k), static_cast<const T*>(v),
                                                          static_cast<const T*>(out), lse, static_cast<T*>(dq), delta);
      RUDNN_CUDA_CHECK_LAUNCH("attention fallback backward_dq_kernel");
    }
    if (p.sk > 0) {  // runs after the dq kernel on the stream: delta is ready
      const dim3 grid = row_grid(p.sk, p.hkv, p.batch, "attention_backward");
      const std::size_t smem = std::size_t(2 * p.d + 2 * p.dv + 2 * kThreads) * sizeof(float);
      set_smem(backward_dkdv_kernel<T>, smem, p, "attention_backward");
      backward_dkdv_kernel<T><<<grid, kThreads, smem, s>>>(bp, static_cast<const T*>(dout), static_cast<const T*>(q),
                                                            static_cast<const T*>(k), static_cast<const T*>(v), lse,
                                                            delta, static_cast<T*>(dk), static_cast<T*>(dv));
      RUDNN_CUDA_CHECK_LAUNCH("attention fallback backward_dkdv_kernel");
    }
  });
}

}  // namespace rudnn::attention
