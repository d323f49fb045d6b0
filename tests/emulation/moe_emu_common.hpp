// What the MoE emulators share: the device element types of a dtype (the kernels' __half and
// __nv_bfloat16), and the tolerance comparison of those whose kernels sum in another order than
// the CPU backend (routing's block trees, the scalar experts' split products). Include after
// emu_arrays.hpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/dispatch.hpp"
#include "emu_arrays.hpp"

namespace rudnn::emu {

// f(core::Tag<D>{}) with D the device type of a float dtype (float, __half, __nv_bfloat16).
template <class F>
decltype(auto) device_types(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

inline float ulp_of(DType dtype) { return dtype == DType::f32 ? 1e-5f : dtype == DType::f16 ? 1.0f / 512 : 1.0f / 64; }

// Rows of n values `stride` apart: NaN where the reference is NaN, else within ulp_of(dtype) of
// the row's largest reference magnitude (exact where that is 0).
inline bool close_rows(const Tensor& got, const Tensor& want, std::int64_t rows, std::int64_t n, std::int64_t stride,
                       const char* what) {
  const float tol = ulp_of(want.dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    float big = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      const float w = value_at(want, r * stride + i);
      if (!std::isnan(w)) big = std::max(big, std::fabs(w));
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const float g = value_at(got, r * stride + i), w = value_at(want, r * stride + i);
      const bool ok = std::isnan(w) ? std::isnan(g) : !std::isnan(g) && std::fabs(g - w) <= tol * big;
      if (!ok) {
        std::printf("  %s row %lld col %lld: %.9g, the CPU backend %.9g\n", what, static_cast<long long>(r),
                    static_cast<long long>(i), g, w);
        return false;
      }
    }
  }
  return true;
}

}  // namespace rudnn::emu
