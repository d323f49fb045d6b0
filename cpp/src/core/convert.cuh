// Element conversions shared by every CUDA kernel: arithmetic is float32, results are
// rounded once, to nearest even, to the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "rudnn/tensor.hpp"

namespace rudnn::core {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Element `offset` of an array whose dtype is known only at run time, as float
// (bool: 1 keep, 0 drop; dtypes that are not float or bool read as 0).
__device__ __forceinline__ float load_as_float(const void* data, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[offset];
    case DType::f16: return __half2float(static_cast<const __half*>(data)[offset]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[offset]);
    case DType::boolean: return static_cast<const std::uint8_t*>(data)[offset] ? 1.0f : 0.0f;
    default: return 0.0f;
  }
}

}  // namespace rudnn::core
