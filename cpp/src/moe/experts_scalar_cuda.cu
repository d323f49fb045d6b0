// The "scalar" strategy of SwiGluExperts: plain CUDA-core tiled GEMMs over the expert
// segments, for every float dtype. Row tiles never straddle two experts: a tiny kernel turns
// the device-side offsets into per-expert row-tile offsets, and each block finds its expert
// by binary search, so the launch needs no host synchronization (the grid is sized by the
// upper bound ceil(N / 16) + E tiles; surplus blocks exit at once).
//
// Forward:  [a | b] = x · [gate | up]^T, h = silu(a) * b    (swiglu_forward_kernel)
//           y = h · down^T                                    (rows_gemm_kernel, weights [C, K])
// Backward: dh = dy · down; da, db from dh, a, b; h again     (swiglu_backward_kernel)
//           dx = da · gate + db · up                          (rows_gemm_kernel, weights [K, C])
//           dgate = da^T x, dup = db^T x, ddown = dy^T h      (weight_grad_kernel, per expert)
// a, b, h, da and db are rounded to the dtype where they are stored, as in the CPU reference.
#include "moe/cuda_common.cuh"
#include "moe/problem.hpp"

namespace rudnn::moe {

using namespace cuda;

namespace {

constexpr int kTile = 16;  // rows, columns and reduction step of every tile
constexpr int kTileThreads = kTile * kTile;

// tile_offsets[e] = row tiles of the experts before e; tile_offsets[E] = all row tiles.
__global__ void row_tiles_kernel(const int* __restrict__ offsets, int E, std::int64_t rows,
                                 int* __restrict__ tile_offsets) {
  if (threadIdx.x != 0) return;
  int acc = 0;
  for (int e = 0; e < E; ++e) {
    tile_offsets[e] = acc;
    const Segment s = segment_of(offsets, e, rows);
    acc += int((s.end - s.begin + kTile - 1) / kTile);
  }
  tile_offsets[E] = acc;
}

struct RowTile {
  int expert = -1;  // -1: a surplus block
  std::int64_t row0 = 0, row_end = 0;
};

__device__ RowTile find_row_tile(const int* offsets, const int* tile_offsets, int E, std::int64_t rows,
                                 std::int64_t tile) {
  RowTile rt;
  if (tile >= tile_offsets[E]) return rt;
  int lo = 0, hi = E - 1;  // the last expert whose first tile is <= tile (empty experts are skipped)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const Segment s = segment_of(offsets, lo, rows);
  rt.expert = lo;
  rt.row0 = s.begin + (tile - tile_offsets[lo]) * kTile;
  rt.row_end = s.end;
  return rt;
}

using TileBuffer = float[kTile][kTile + 1];  // +1: no shared-memory bank conflicts

// One 16x16 output tile of sum_k A[n, k] * B(k, c) over rows [row0, row_end) of one expert.
// kWeightKMajor: B(k, c) = w[c * K + k] (w is [C, K]); otherwise B(k, c) = w[k * C + c].
// Thread (ty, tx) gets output (row0 + ty, col0 + tx).
template <class T, bool kWeightKMajor>
__device__ float tile_product(const T* __restrict__ a, std::int64_t a_stride, std::int64_t row0,
                              std::int64_t row_end, const T* __restrict__ w, std::int64_t K, std::int64_t C,
                              std::int64_t col0, TileBuffer& As, TileBuffer& Bs) {
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  float acc = 0.0f;
  for (std::int64_t k0 = 0; k0 < K; k0 += kTile) {
    {
      const std::int64_t n = row0 + ty, k = k0 + tx;
      As[ty][tx] = (n < row_end && k < K) ? to_float(a[n * a_stride + k]) : 0.0f;
    }
    if (kWeightKMajor) {  // read along k (contiguous), store transposed
      const std::int64_t c = col0 + ty, k = k0 + tx;
      Bs[tx][ty] = (c < C && k < K) ? to_float(w[c * K + k]) : 0.0f;
    } else {  // read along c (contiguous)
      const std::int64_t k = k0 + ty, c = col0 + tx;
      Bs[ty][tx] = (k < K && c < C) ? to_float(w[k * C + c]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += As[ty][kk] * Bs[kk][tx];
    __syncthreads();
  }
  return acc;
}

struct RowTiles {
  const int* offsets;
  const int* tile_offsets;
  int experts;
  std::int64_t rows;
};

// [a | b] = x · [gate | up]^T on one tile; h = silu(a) * b into `h` (and a, b when asked).
template <class T>
__global__ void __launch_bounds__(kTileThreads)
    swiglu_forward_kernel(const T* __restrict__ x, std::int64_t x_stride, const T* __restrict__ gate,
                          const T* __restrict__ up, std::int64_t H, std::int64_t I, RowTiles tiles,
                          T* __restrict__ h, T* __restrict__ gate_pre, T* __restrict__ up_pre) {
  __shared__ TileBuffer As, Bs;
  const RowTile rt = find_row_tile(tiles.offsets, tiles.tile_offsets, tiles.experts, tiles.rows, blockIdx.x);
  if (rt.expert < 0) return;  // block-uniform
  const std::int64_t col0 = std::int64_t(blockIdx.y) * kTile;
  const std::int64_t expert_size = I * H;
  const float a_acc = tile_product<T, true>(x, x_stride, rt.row0, rt.row_end, gate + rt.expert * expert_size, H, I,
                                            col0, As, Bs);
  const float b_acc = tile_product<T, true>(x, x_stride, rt.row0, rt.row_end, up + rt.expert * expert_size, H, I,
                                            col0, As, Bs);
  const std::int64_t n = rt.row0 + threadIdx.x / kTile, i = col0 + threadIdx.x % kTile;
  if (n >= rt.row_end || i >= I) return;
  const float a = round_to<T>(a_acc), b = round_to<T>(b_acc);
  h[n * I + i] = from_float<T>(a * sigmoid(a) * b);
  if (gate_pre) {
    gate_pre[n * I + i] = from_float<T>(a);
    up_pre[n * I + i] = from_float<T>(b);
  }
}

// out[n, c] = sum_k A[n, k] B(k, c) (+ the same with A2, B2), B as in tile_product.
template <class T, bool kWeightKMajor>
__global__ void __launch_bounds__(kTileThreads)
    rows_gemm_kernel(const T* __restrict__ a, const T* __restrict__ w, const T* __restrict__ a2,
                     const T* __restrict__ w2, std::int64_t a_stride, std::int64_t K, std::int64_t C, RowTiles tiles,
                     T* __restrict__ out, std::int64_t out_stride) {
  __shared__ TileBuffer As, Bs;
  const RowTile rt = find_row_tile(tiles.offsets, tiles.tile_offsets, tiles.experts, tiles.rows, blockIdx.x);
  if (rt.expert < 0) return;
  const std::int64_t col0 = std::int64_t(blockIdx.y) * kTile;
  const std::int64_t expert_size = K * C;
  float acc = tile_product<T, kWeightKMajor>(a, a_stride, rt.row0, rt.row_end, w + rt.expert * expert_size, K, C,
                                             col0, As, Bs);
  if (a2)
    acc += tile_product<T, kWeightKMajor>(a2, a_stride, rt.row0, rt.row_end, w2 + rt.expert * expert_size, K, C,
                                          col0, As, Bs);
  const std::int64_t n = rt.row0 + threadIdx.x / kTile, c = col0 + threadIdx.x % kTile;
  if (n < rt.row_end && c < C) out[n * out_stride + c] = from_float<T>(acc);
}

// dh = dy · down[e] ([H, I] seen as B(k = h, c = i)), then the SwiGLU backward:
// da = dh * b * silu'(a), db = dh * silu(a), and h = silu(a) * b for ddown.
template <class T>
__global__ void __launch_bounds__(kTileThreads)
    swiglu_backward_kernel(const T* __restrict__ dy, std::int64_t dy_stride, const T* __restrict__ down,
                           const T* __restrict__ gate_pre, const T* __restrict__ up_pre, std::int64_t H,
                           std::int64_t I, RowTiles tiles, T* __restrict__ h, T* __restrict__ da,
                           T* __restrict__ db) {
  __shared__ TileBuffer As, Bs;
  const RowTile rt = find_row_tile(tiles.offsets, tiles.tile_offsets, tiles.experts, tiles.rows, blockIdx.x);
  if (rt.expert < 0) return;
  const std::int64_t col0 = std::int64_t(blockIdx.y) * kTile;
  const float dh = tile_product<T, false>(dy, dy_stride, rt.row0, rt.row_end, down + rt.expert * H * I, H, I, col0,
                                          As, Bs);
  const std::int64_t n = rt.row0 + threadIdx.x / kTile, i = col0 + threadIdx.x % kTile;
  if (n >= rt.row_end || i >= I) return;
  const float a = to_float(gate_pre[n * I + i]), b = to_float(up_pre[n * I + i]);
  const float sig = sigmoid(a);
  h[n * I + i] = from_float<T>(a * sig * b);
  da[n * I + i] = from_float<T>(dh * b * sig * (1.0f + a * (1.0f - sig)));
  db[n * I + i] = from_float<T>(dh * a * sig);
}

// out[e][r, c] = sum over the rows n of expert e of A[n, r] * B[n, c], in row order
// (deterministic); experts without rows get zeros.
template <class T>
__global__ void __launch_bounds__(kTileThreads)
    weight_grad_kernel(const T* __restrict__ a, std::int64_t a_stride, const T* __restrict__ b, std::int64_t b_stride,
                       std::int64_t R, std::int64_t C, const int* __restrict__ offsets, std::int64_t rows,
                       float* __restrict__ out) {
  __shared__ TileBuffer As, Bs;
  const int e = blockIdx.z;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const std::int64_t r0 = std::int64_t(blockIdx.y) * kTile, c0 = std::int64_t(blockIdx.x) * kTile;
  const Segment s = segment_of(offsets, e, rows);
  float acc = 0.0f;
  for (std::int64_t n0 = s.begin; n0 < s.end; n0 += kTile) {
    const std::int64_t n = n0 + ty;
    As[ty][tx] = (n < s.end && r0 + tx < R) ? to_float(a[n * a_stride + r0 + tx]) : 0.0f;
    Bs[ty][tx] = (n < s.end && c0 + tx < C) ? to_float(b[n * b_stride + c0 + tx]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += As[kk][ty] * Bs[kk][tx];
    __syncthreads();
  }
  if (r0 + ty < R && c0 + tx < C) out[std::int64_t(e) * R * C + (r0 + ty) * C + c0 + tx] = acc;
}

// Workspace: tile offsets, then [N, I] buffers of the dtype (h; plus da, db for the backward).
constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct Workspace {
  int* tile_offsets;
  void* buffers[3];
};

std::size_t workspace_bytes(const ExpertsProblem& p, DType dtype, int buffers) {
  const std::size_t buffer = align_up(std::size_t(p.rows) * std::size_t(p.inter) * dtype_size(dtype));
  return align_up(std::size_t(p.experts + 1) * sizeof(int)) + buffers * buffer;
}

Workspace carve(const Tensor& ws, const ExpertsProblem& p, DType dtype, int buffers) {
  Workspace w{};
  char* base = static_cast<char*>(ws.data);
  w.tile_offsets = reinterpret_cast<int*>(base);
  base += align_up(std::size_t(p.experts + 1) * sizeof(int));
  const std::size_t buffer = align_up(std::size_t(p.rows) * std::size_t(p.inter) * dtype_size(dtype));
  for (int i = 0; i < buffers; ++i) w.buffers[i] = base + i * buffer;
  return w;
}

dim3 row_grid(const ExpertsProblem& p, std::int64_t cols) {
  return dim3(unsigned((p.rows + kTile - 1) / kTile + p.experts), unsigned((cols + kTile - 1) / kTile));
}

}  // namespace

std::size_t experts_forward_workspace_bytes_cuda(const ExpertsProblem& p, DType dtype) {
  return workspace_bytes(p, dtype, 1);
}

std::size_t experts_backward_workspace_bytes_cuda(const ExpertsProblem& p, DType dtype) {
  return workspace_bytes(p, dtype, 3);
}

void experts_forward_cuda(const MoeExpertsForwardArgs& a, const ExpertsProblem& p, Stream s) {
  const cudaStream_t stream = as_cuda(s);
  const Workspace ws = carve(*a.workspace, p, a.x.dtype, 1);
  const int* offsets = a.offsets.ptr<int>();
  row_tiles_kernel<<<1, 32, 0, stream>>>(offsets, p.experts, p.rows, ws.tile_offsets);
  RUDNN_CUDA_CHECK_LAUNCH(row_tiles_kernel);
  const RowTiles tiles{offsets, ws.tile_offsets, p.experts, p.rows};
  dispatch_float(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* h = static_cast<T*>(ws.buffers[0]);
    swiglu_forward_kernel<T><<<row_grid(p, p.inter), kTileThreads, 0, stream>>>(
        a.x.ptr<T>(), p.x_stride, a.gate.ptr<T>(), a.up.ptr<T>(), p.hidden, p.inter, tiles, h,
        a.gate_pre ? a.gate_pre->ptr<T>() : nullptr, a.up_pre ? a.up_pre->ptr<T>() : nullptr);
    RUDNN_CUDA_CHECK_LAUNCH(swiglu_forward_kernel);
    rows_gemm_kernel<T, true><<<row_grid(p, p.hidden), kTileThreads, 0, stream>>>(
        h, a.down.ptr<T>(), nullptr, nullptr, p.inter, p.inter, p.hidden, tiles, a.y.ptr<T>(), p.y_stride);
    RUDNN_CUDA_CHECK_LAUNCH(rows_gemm_kernel);
  });
}

void experts_backward_cuda(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p, Stream s) {
  const cudaStream_t stream = as_cuda(s);
  const Workspace ws = carve(*a.workspace, p, a.x.dtype, 3);
  const int* offsets = a.offsets.ptr<int>();
  row_tiles_kernel<<<1, 32, 0, stream>>>(offsets, p.experts, p.rows, ws.tile_offsets);
  RUDNN_CUDA_CHECK_LAUNCH(row_tiles_kernel);
  const RowTiles tiles{offsets, ws.tile_offsets, p.experts, p.rows};
  const auto weight_grid = [&](std::int64_t R, std::int64_t C) {
    return dim3(unsigned((C + kTile - 1) / kTile), unsigned((R + kTile - 1) / kTile), unsigned(p.experts));
  };
  dispatch_float(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* h = static_cast<T*>(ws.buffers[0]);
    T* da = static_cast<T*>(ws.buffers[1]);
    T* db = static_cast<T*>(ws.buffers[2]);
    swiglu_backward_kernel<T><<<row_grid(p, p.inter), kTileThreads, 0, stream>>>(
        a.dy.ptr<T>(), p.dy_stride, a.down.ptr<T>(), a.gate_pre.ptr<T>(), a.up_pre.ptr<T>(), p.hidden, p.inter, tiles,
        h, da, db);
    RUDNN_CUDA_CHECK_LAUNCH(swiglu_backward_kernel);
    rows_gemm_kernel<T, false><<<row_grid(p, p.hidden), kTileThreads, 0, stream>>>(
        da, a.gate.ptr<T>(), db, a.up.ptr<T>(), p.inter, p.inter, p.hidden, tiles, a.dx.ptr<T>(), p.y_stride);
    RUDNN_CUDA_CHECK_LAUNCH(rows_gemm_kernel);
    weight_grad_kernel<T><<<weight_grid(p.inter, p.hidden), kTileThreads, 0, stream>>>(
        da, p.inter, a.x.ptr<T>(), p.x_stride, p.inter, p.hidden, offsets, p.rows, a.dgate.ptr<float>());
    RUDNN_CUDA_CHECK_LAUNCH(weight_grad_kernel);
    weight_grad_kernel<T><<<weight_grid(p.inter, p.hidden), kTileThreads, 0, stream>>>(
        db, p.inter, a.x.ptr<T>(), p.x_stride, p.inter, p.hidden, offsets, p.rows, a.dup.ptr<float>());
    RUDNN_CUDA_CHECK_LAUNCH(weight_grad_kernel);
    weight_grad_kernel<T><<<weight_grid(p.hidden, p.inter), kTileThreads, 0, stream>>>(
        a.dy.ptr<T>(), p.dy_stride, h, p.inter, p.hidden, p.inter, offsets, p.rows, a.ddown.ptr<float>());
    RUDNN_CUDA_CHECK_LAUNCH(weight_grad_kernel);
  });
}

}  // namespace rudnn::moe
