#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u32: return "uint32";
    case DType::u8: return "uint8";
    case DType::boolean: return "bool";
  }
  return "unknown";
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::shape: return "shape";
    case ErrorKind::dtype: return "dtype";
    case ErrorKind::device: return "device";
    case ErrorKind::value: return "value";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::cuda: return "cuda";
  }
  return "unknown";
}

std::string Device::str() const {
  return type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Tensor Tensor::contiguous(void* data, DType dtype, Device device, const std::int64_t* shape, int rank) {
  if (rank < 0 || rank > kMaxRank)
    throw Error(ErrorKind::shape, "tensor rank " + std::to_string(rank) + " exceeds the maximum of " +
                                      std::to_string(kMaxRank));
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = rank;
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d] > 0 ? shape[d] : 1;
  }
  return t;
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string Tensor::shape_str() const {
  // Plain string building: no iostreams in the library (nothing else needs their locale machinery).
  std::string s = "[";
  for (int d = 0; d < rank; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace rudnn
