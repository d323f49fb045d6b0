// Size arithmetic of the validate steps that must not wrap: a + b and a * b of int64 sizes, or an
// ArgumentError "<what> overflows int64". (Kept apart from check.hpp, which every kernel file
// includes, so that adding a helper here does not recompile the kernels.)
#pragma once

#include <cstdint>
#include <string>

#include "core/check.hpp"

namespace rudnn::core {

inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(ErrorKind::value, what + " overflows int64");
  return r;
}

inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(ErrorKind::value, what + " overflows int64");
  return r;
}

}  // namespace rudnn::core
