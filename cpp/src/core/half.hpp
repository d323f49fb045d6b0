// Host-side float16 / bfloat16 storage types for the CPU reference backend.
// Conversions round to nearest even and keep inf/NaN, matching the hardware.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace rudnn::host {

struct f16 { std::uint16_t bits; };
struct bf16 { std::uint16_t bits; };

inline float bits_to_float(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline std::uint32_t float_to_bits(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { return bits_to_float(std::uint32_t(v.bits) << 16); }
inline float to_float(f16 v) {
  const std::uint32_t sign = std::uint32_t(v.bits & 0x8000u) << 16;
  const std::uint32_t exp = (v.bits >> 10) & 0x1fu;
  std::uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: value = mant * 2^-24.
    float f = float(mant) * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

template <class T> T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }

template <> inline bf16 from_float<bf16>(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{std::uint16_t(u >> 16)};
}

template <> inline f16 from_float<f16>(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{std::uint16_t(sign | 0x7e00u)};   // NaN
  if (a >= 0x477ff000u) return f16{std::uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): scale so that one f16 subnormal ulp (2^-24) is 1.0,
    // then let the float unit round to nearest even.
    const float scaled = bits_to_float(a) * 16777216.0f;
    const std::uint32_t m = std::uint32_t(std::nearbyint(scaled));
    return f16{std::uint16_t(sign | m)};  // m == 0x400 correctly becomes the smallest normal
  }
  // Normal: rebias exponent and round the 13 dropped mantissa bits to nearest even.
  std::uint32_t r = a - 0x38000000u;  // exponent bias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return f16{std::uint16_t(sign | (r >> 13))};
}

}  // namespace rudnn::host
