// Turn a runtime DType into a compile-time element type. Each backend supplies
// its own 16-bit types (host structs on the CPU, __half/__nv_bfloat16 on CUDA).
#pragma once

#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::core {

template <class T>
struct Tag { using type = T; };

template <class F16, class BF16, class F>
decltype(auto) dispatch_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(Tag<float>{});
    case DType::f16: return f(Tag<F16>{});
    case DType::bf16: return f(Tag<BF16>{});
    default: break;
  }
  throw Error(ErrorKind::dtype, std::string("internal: no float kernel for ") + dtype_name(dtype));
}

}  // namespace rudnn::core
