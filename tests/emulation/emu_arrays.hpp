// Host arrays of the spatial-family emulators (pooling, interpolate, conv, grid_sample): dense tensors filled
// with multiples of 1/64 in [-2, 2) (exact in bf16, with ties for max pooling's first-maximum
// rule), and the bitwise comparison the emulators judge the kernels by. Include after
// core/convert.cuh (host f16/bf16).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "rudnn/tensor.hpp"

namespace rudnn::emu {

struct Array {
  Tensor t;
  std::vector<std::uint64_t> storage;  // 8 bytes per element: room for every dtype, 16-byte aligned
};

// A dense array of `shape` (in the order its layout gives), filled unless `fill` is false, its
// values times `scale`.
inline Array make(DType dtype, const std::vector<std::int64_t>& shape, std::uint32_t seed, bool fill = true,
                  float scale = 1.0f) {
  Array a;
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  a.storage.assign(std::size_t(n) + 2, 0);
  a.t = Tensor::contiguous(a.storage.data(), dtype, Device{}, shape.data(), int(shape.size()));
  std::uint32_t state = seed * 2654435761u + 1;
  for (std::int64_t i = 0; fill && i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float v = float(int(state >> 24) - 128) / 64.0f * scale;
    switch (dtype) {
      case DType::f32: a.t.ptr<float>()[i] = v; break;
      case DType::f16: a.t.ptr<host::f16>()[i] = host::from_float<host::f16>(v); break;
      case DType::bf16: a.t.ptr<host::bf16>()[i] = host::from_float<host::bf16>(v); break;
      default: break;
    }
  }
  return a;
}

// Element i of a dense float array (f32, f16 or bf16), as float.
inline float value_at(const Tensor& t, std::int64_t i) {
  switch (t.dtype) {
    case DType::f32: return t.ptr<float>()[i];
    case DType::f16: return host::to_float(t.ptr<host::f16>()[i]);
    default: return host::to_float(t.ptr<host::bf16>()[i]);
  }
}

inline std::vector<std::int64_t> dims_of(const Tensor& t) { return std::vector<std::int64_t>(t.shape, t.shape + t.rank); }

// The rank and sizes of a shape struct (PoolShape, InterpolateShape, ...: `rank` and `dims`).
template <class Shape>
std::vector<std::int64_t> dims_of(const Shape& s) {
  return std::vector<std::int64_t>(s.dims, s.dims + s.rank);
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const std::size_t bytes = std::size_t(a.numel()) * dtype_size(a.dtype);
  return bytes == std::size_t(b.numel()) * dtype_size(b.dtype) && std::memcmp(a.data, b.data, bytes) == 0;
}

}  // namespace rudnn::emu
