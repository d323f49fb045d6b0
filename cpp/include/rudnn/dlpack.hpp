// DLTensor -> rudnn::Tensor for C++ consumers that bring their own dlpack.h
// (include it before this header). Header-only, so libruDNN itself does not
// depend on any particular DLPack version.
#pragma once

#if !defined(DLPACK_VERSION) && !defined(DLPACK_MAJOR_VERSION)
#error "include dlpack.h (your copy of DLPack) before <rudnn/dlpack.hpp>"
#endif

#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

inline DType dtype_from_dlpack(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
    if (t.code == kDLUInt && t.bits == 32) return DType::u32;
    if (t.code == kDLUInt && t.bits == 8) return DType::u8;
    if (t.code == kDLBool && t.bits == 8) return DType::boolean;
  }
  throw Error(ErrorKind::dtype, "unsupported DLPack dtype (code " + std::to_string(int(t.code)) + ", " +
                                    std::to_string(int(t.bits)) + " bits, " + std::to_string(int(t.lanes)) + " lanes)");
}

// A view of `t` (data offset applied; NULL strides mean row-major).
inline Tensor from_dlpack(const DLTensor& t) {
  Tensor out;
  out.data = static_cast<char*>(t.data) + t.byte_offset;
  out.dtype = dtype_from_dlpack(t.dtype);
  if (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost) {
    out.device = Device{DeviceType::cpu, 0};
  } else if (t.device.device_type == kDLCUDA || t.device.device_type == kDLCUDAManaged) {
    out.device = Device{DeviceType::cuda, t.device.device_id};
  } else {
    throw Error(ErrorKind::device, "unsupported DLPack device type " + std::to_string(int(t.device.device_type)));
  }
  if (t.ndim < 0 || t.ndim > kMaxRank)
    throw Error(ErrorKind::shape, "DLPack tensor rank " + std::to_string(t.ndim) + " is outside 0.." +
                                      std::to_string(kMaxRank));
  out.rank = t.ndim;
  std::int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    out.shape[d] = t.shape[d];
    out.strides[d] = t.strides ? t.strides[d] : stride;
    stride *= t.shape[d];
  }
  return out;
}

}  // namespace rudnn
