// Device helpers shared by the attention CUDA kernels: element conversion and the score
// transform (scale, softcap, bias, masks, causal/window visibility) exactly as the CPU
// reference defines it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/problem.hpp"

namespace rudnn::attention::cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A mask/bias element of any supported dtype as float (bool: 1 keep, 0 drop).
__device__ __forceinline__ float load_any(const void* data, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[offset];
    case DType::f16: return __half2float(static_cast<const __half*>(data)[offset]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[offset]);
    case DType::boolean: return static_cast<const std::uint8_t*>(data)[offset] ? 1.0f : 0.0f;
    default: return 0.0f;
  }
}

// True where key j takes no part in query i's softmax before any arithmetic (causal,
// window, boolean mask). Additive -inf masks are handled by the arithmetic itself.
__device__ __forceinline__ bool hidden(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                                       std::int64_t j, std::int64_t len_q, std::int64_t len_k) {
  if (!p.visible(i, j, len_q, len_k)) return true;
  return p.mask.data != nullptr && p.mask_is_bool && load_any(p.mask.data, p.mask.dtype, p.mask.at(b, h, i, j)) == 0.0f;
}

// The logit from the raw dot product q_i . k_j; *tanh_out receives tanh(scale*dot/softcap)
// (0 without softcap) for the backward's chain rule.
__device__ __forceinline__ float logit(const Problem& p, float dot, std::int64_t b, std::int64_t h, std::int64_t i,
                                       std::int64_t j, float* tanh_out) {
  float s = dot * p.scale;
  float t = 0.0f;
  if (p.softcap > 0.0f) {
    t = tanhf(s / p.softcap);
    s = p.softcap * t;
  }
  if (p.bias.data != nullptr) s += load_any(p.bias.data, p.bias.dtype, p.bias.at(b, h, i, j));
  if (p.mask.data != nullptr && !p.mask_is_bool) s += load_any(p.mask.data, p.mask.dtype, p.mask.at(b, h, i, j));
  *tanh_out = t;
  return s;
}

}  // namespace rudnn::attention::cuda
