// Non-owning tensor view: the one currency every libruDNN function takes.
// Shapes and strides are in elements (not bytes), as in DLPack and PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rudnn {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64, u32, u8, boolean };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
inline bool is_float(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu" or "cuda:N"
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::cpu || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// A CUDA stream handle (cudaStream_t) kept opaque so that C++ consumers of the
// public headers do not need the CUDA toolkit. Ignored for CPU tensors.
using Stream = void*;

constexpr int kMaxRank = 8;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  std::int64_t shape[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};

  // A dense row-major view over `data`.
  static Tensor contiguous(void* data, DType dtype, Device device, const std::int64_t* shape, int rank);

  std::int64_t numel() const;
  // Negative dims count from the end, as in Python.
  std::int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  std::int64_t stride(int dim) const { return strides[dim < 0 ? dim + rank : dim]; }
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2, 3, 4]"
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

}  // namespace rudnn
