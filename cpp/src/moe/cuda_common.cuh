// Device helpers shared by the MoE CUDA kernels: element conversions, dtype dispatch,
// warp/block reductions and the (key, index) order used by every top-k of the family.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <climits>
#include <limits>

#include "core/convert.cuh"
#include "core/cuda_check.hpp"
#include "core/dispatch.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::moe::cuda {

using core::from_float;
using core::load_as_float;
using core::to_float;

// v rounded to T and back: the value a kernel stores in T and a later kernel reloads.
template <class T> __device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

template <class F>
decltype(auto) dispatch_float(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

// Index arrays of routing (uint32 from rudnn, int32/int64 from users) read as int64.
template <class F>
decltype(auto) dispatch_index(DType dtype, F&& f) {
  switch (dtype) {
    case DType::u32: return f(core::Tag<std::uint32_t>{});
    case DType::i32: return f(core::Tag<std::int32_t>{});
    default: return f(core::Tag<std::int64_t>{});
  }
}

constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kNaN = __builtin_nanf("");
constexpr float kInf = __builtin_huge_valf();

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ __forceinline__ int warp_or(int v) {
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Block-wide reductions for blocks of kThreads (a multiple of 32, <= 1024). `scratch` holds
// 32 floats; the result is returned to every thread. The tree has a fixed shape, so the
// result is the same on every run.
template <int kThreads>
__device__ float block_sum(float v, float* scratch) {
  constexpr int kWarps = kThreads / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kWarps ? scratch[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) v = warp_sum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

template <int kThreads>
__device__ float block_max(float v, float* scratch) {
  constexpr int kWarps = kThreads / 32;
  v = warp_max(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < kWarps ? scratch[threadIdx.x] : -kInf;
  if (threadIdx.x < 32) v = warp_max(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

// A candidate of a top-k round. Larger key first, then the lower index; index INT_MAX marks
// "no candidate", which loses against every real one (-inf keys included).
struct Candidate {
  float key;
  int index;
};
__device__ __forceinline__ bool better(const Candidate& a, const Candidate& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// The best eligible entry of keys[0, n) (eligible[i] != 0), for a block of kThreads.
// `scratch` holds 32 Candidates. Returns the index to every thread (-1: none eligible).
template <int kThreads>
__device__ int block_argmax(const float* keys, const unsigned char* eligible, int n, Candidate* scratch) {
  Candidate best{-kInf, INT_MAX};
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const Candidate c{keys[i], i};
    if (eligible[i] && better(c, best)) best = c;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const Candidate other{__shfl_xor_sync(kFullMask, best.key, o), __shfl_xor_sync(kFullMask, best.index, o)};
    if (better(other, best)) best = other;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = threadIdx.x < kThreads / 32 ? scratch[threadIdx.x] : Candidate{-kInf, INT_MAX};
    for (int o = 16; o > 0; o >>= 1) {
      const Candidate other{__shfl_xor_sync(kFullMask, best.key, o), __shfl_xor_sync(kFullMask, best.index, o)};
      if (better(other, best)) best = other;
    }
    if (threadIdx.x == 0) scratch[0] = best;
  }
  __syncthreads();
  const int index = scratch[0].index;
  return index == INT_MAX ? -1 : index;
}

inline cudaStream_t as_cuda(Stream s) { return static_cast<cudaStream_t>(s); }

inline unsigned grid_1d(std::int64_t work, int per_block, std::int64_t cap = 65535) {
  std::int64_t blocks = (work + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  return unsigned(blocks < cap ? blocks : cap);
}

}  // namespace rudnn::moe::cuda
