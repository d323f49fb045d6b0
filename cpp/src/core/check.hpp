// Small helpers for the validate step of each op family. Messages name the
// argument, what was expected and what was given.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::core {

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

inline void expect_float(const Tensor& t, const std::string& name) {
  if (!is_float(t.dtype))
    fail(ErrorKind::dtype, name + ": expected float32, float16 or bfloat16, got " + dtype_name(t.dtype));
}

inline void expect_dtype(const Tensor& t, DType dtype, const std::string& name) {
  if (t.dtype != dtype)
    fail(ErrorKind::dtype, name + ": expected " + dtype_name(dtype) + ", got " + dtype_name(t.dtype));
}

inline void expect_same_device(const Tensor& t, const Tensor& ref, const std::string& name,
                               const std::string& ref_name) {
  if (t.device != ref.device)
    fail(ErrorKind::device, name + ": expected the device of " + ref_name + " (" + ref.device.str() + "), got " +
                                t.device.str());
}

inline void expect_dtype_of(const Tensor& t, const Tensor& ref, const std::string& name, const std::string& ref_name) {
  if (t.dtype != ref.dtype)
    fail(ErrorKind::dtype, name + ": expected the dtype of " + ref_name + " (" + dtype_name(ref.dtype) + "), got " +
                               dtype_name(t.dtype));
}

inline std::string shape_str(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  for (auto it = dims.begin(); it != dims.end(); ++it) s += (it == dims.begin() ? "" : ", ") + std::to_string(*it);
  return s + "]";
}

inline bool has_shape(const Tensor& t, std::initializer_list<std::int64_t> dims) {
  if (t.rank != int(dims.size())) return false;
  int d = 0;
  for (std::int64_t n : dims)
    if (t.shape[d++] != n) return false;
  return true;
}

// "name: expected shape [2, 3] <what>, got [2, 4]" (what: how the expected shape arises, may be empty).
inline void expect_shape(const Tensor& t, std::initializer_list<std::int64_t> dims, const std::string& name,
                         const std::string& what) {
  if (!has_shape(t, dims))
    fail(ErrorKind::shape, name + ": expected shape " + shape_str(dims) + (what.empty() ? "" : " " + what) +
                               ", got " + t.shape_str());
}

inline void expect_same_shape(const Tensor& t, const Tensor& ref, const std::string& name,
                              const std::string& ref_name) {
  bool same = t.rank == ref.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == ref.shape[d];
  if (!same)
    fail(ErrorKind::shape, name + ": expected the shape of " + ref_name + " " + ref.shape_str() + ", got " +
                               t.shape_str());
}

// The last axis must be dense (stride 1) so rows can be read with vector loads.
// An empty array passes: it has no element to read or write, and frameworks report any strides
// for one (torch's gradient of a sum over an empty output is expanded: every stride 0).
inline void expect_last_dim_contiguous(const Tensor& t, const std::string& name) {
  if (t.rank > 0 && t.numel() > 0 && t.shape[t.rank - 1] > 1 && t.strides[t.rank - 1] != 1)
    fail(ErrorKind::shape, name + ": the last axis must be contiguous (stride 1), got stride " +
                               std::to_string(t.strides[t.rank - 1]));
}

inline void expect_data(const Tensor& t, const std::string& name) {
  if (t.data == nullptr && t.numel() > 0) fail(ErrorKind::value, name + ": data pointer is null");
}

inline void expect_positive_finite(double v, const std::string& name) {
  if (!(std::isfinite(v) && v > 0))
    fail(ErrorKind::value, name + ": expected a finite value > 0, got " + std::to_string(v));
}

}  // namespace rudnn::core
