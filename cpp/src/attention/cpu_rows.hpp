// The row arithmetic of the CPU reference attention, shared by the dense family (cpu.cpp)
// and the paged family (paged/cpu.cpp): a query row loaded to float, dot products in double,
// and the softmax-weighted sum of value rows given a row of float32 logits. Each result is
// rounded once; a row without a visible key (every logit -inf) gives out 0 and lse -inf.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.hpp"

namespace rudnn::attention::cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class T>
void load_row(const T* src, std::int64_t n, std::vector<float>& dst) {
  dst.resize(n);
  for (std::int64_t d = 0; d < n; ++d) dst[d] = host::to_float(src[d]);
}

template <class T>
double dot(const std::vector<float>& a, const T* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t d = 0; d < n; ++d) s += double(a[d]) * double(host::to_float(b[d]));
  return s;
}

// out[0..dv) = sum_j softmax(scores)_j * value(j)[0..dv), with value(j) a pointer to the j-th
// value row of any element type (read only where scores[j] > -inf). Returns the natural-log lse (-inf for a row
// without visible keys, whose output is 0). `acc` is scratch.
template <class T, class ValueRow>
float softmax_weighted_sum(const std::vector<float>& scores, ValueRow&& value, std::int64_t dv, T* out,
                           std::vector<double>& acc) {
  float m = kNegInf;
  for (float s : scores) m = std::fmax(m, s);
  if (m == kNegInf) {
    for (std::int64_t d = 0; d < dv; ++d) out[d] = host::from_float<T>(0.0f);
    return kNegInf;
  }
  acc.assign(dv, 0.0);
  double sum = 0.0;
  for (std::int64_t j = 0; j < std::int64_t(scores.size()); ++j) {
    if (scores[j] == kNegInf) continue;
    const double e = std::exp(double(scores[j]) - double(m));
    sum += e;
    const auto* vj = value(j);
    for (std::int64_t d = 0; d < dv; ++d) acc[d] += e * double(host::to_float(vj[d]));
  }
  for (std::int64_t d = 0; d < dv; ++d) out[d] = host::from_float<T>(float(acc[d] / sum));
  return float(double(m) + std::log(sum));
}

}  // namespace rudnn::attention::cpu
