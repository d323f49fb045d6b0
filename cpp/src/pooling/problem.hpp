// The validated form of a pooling call, shared by the CPU and CUDA backends, and the window
// arithmetic both use (host and device), so that the two backends pool the same elements.
// validate.cpp builds a problem after every check has passed; backends assume it is valid.
//
// Every problem has three spatial axes: a 1-D or 2-D pooling gets leading axes of size 1
// (kernel 1, stride 1, no padding), which changes neither the result nor the flat indices.
#pragma once

#include <cstdint>

#include "rudnn/pooling.hpp"

#if !defined(RUDNN_HD)
#if defined(__CUDACC__)
#define RUDNN_HD __host__ __device__ __forceinline__
#else
#define RUDNN_HD inline
#endif
#endif

namespace rudnn::pooling {

using i64 = std::int64_t;
constexpr int kAxes = kMaxPoolDims;

// Element strides of one tensor in the canonical order (n, c, d, h, w).
struct Strides {
  i64 n = 0, c = 0;
  i64 sp[kAxes] = {0, 0, 0};
  RUDNN_HD i64 offset(i64 n_, i64 c_, const i64 (&pos)[kAxes]) const {
    return n_ * n + c_ * c + pos[0] * sp[0] + pos[1] * sp[1] + pos[2] * sp[2];
  }
};

enum class WindowRule : std::uint8_t { fixed, adaptive };

struct Geometry {
  WindowRule rule = WindowRule::fixed;
  bool max = true;  // max pooling (else average)
  i64 batch = 1, channels = 1;
  i64 in[kAxes] = {1, 1, 1}, out[kAxes] = {1, 1, 1};
  i64 kernel[kAxes] = {1, 1, 1}, stride[kAxes] = {1, 1, 1}, pad[kAxes] = {0, 0, 0}, dilation[kAxes] = {1, 1, 1};
  bool count_include_pad = true;
  i64 divisor_override = 0;

  RUDNN_HD i64 in_plane() const { return in[0] * in[1] * in[2]; }
  RUDNN_HD i64 out_plane() const { return out[0] * out[1] * out[2]; }
  RUDNN_HD i64 flat_in(const i64 (&pos)[kAxes]) const { return (pos[0] * in[1] + pos[1]) * in[2] + pos[2]; }
};

// The input taps of output position o along one axis: first, first + step, ... < end.
// `padded` is the window's extent counting padding (the count_include_pad divisor).
struct AxisSpan {
  i64 first, end, step, padded;
};

RUDNN_HD AxisSpan axis_span(const Geometry& g, int a, i64 o) {
  if (g.rule == WindowRule::adaptive) {
    const i64 first = o * g.in[a] / g.out[a];
    const i64 end = ((o + 1) * g.in[a] + g.out[a] - 1) / g.out[a];
    return {first, end, 1, end - first};
  }
  const i64 start = o * g.stride[a] - g.pad[a];
  const i64 dil = g.dilation[a];
  // The first tap at or after 0 (torch skips leading padding taps the same way).
  const i64 first = start < 0 ? start + (-start + dil - 1) / dil * dil : start;
  const i64 last_plus_one = start + (g.kernel[a] - 1) * dil + 1;
  const i64 end = last_plus_one < g.in[a] ? last_plus_one : g.in[a];
  // Average pooling (dilation 1): the window clipped to the padded input, as torch counts it.
  const i64 padded_end = start + g.kernel[a] < g.in[a] + g.pad[a] ? start + g.kernel[a] : g.in[a] + g.pad[a];
  return {first, end, dil, padded_end - start};
}

// The output positions [lo, hi] along axis a whose windows can contain input position p
// (a superset for dilated windows; callers test membership with axis_span).
RUDNN_HD void covering_outputs(const Geometry& g, int a, i64 p, i64& lo, i64& hi) {
  if (g.rule == WindowRule::adaptive) {
    lo = p * g.out[a] / g.in[a];
    hi = ((p + 1) * g.out[a] + g.in[a] - 1) / g.in[a] - 1;
  } else {
    const i64 reach = p + g.pad[a] - (g.kernel[a] - 1) * g.dilation[a];  // start of the last window ending at p
    lo = reach <= 0 ? 0 : (reach + g.stride[a] - 1) / g.stride[a];
    hi = (p + g.pad[a]) / g.stride[a];
  }
  if (hi > g.out[a] - 1) hi = g.out[a] - 1;
}

RUDNN_HD bool span_contains(const AxisSpan& s, i64 p) {
  return p >= s.first && p < s.end && (p - s.first) % s.step == 0;
}

// What average pooling divides a window's sum by.
RUDNN_HD float avg_divisor(const Geometry& g, const AxisSpan (&s)[kAxes]) {
  if (g.divisor_override != 0) return float(g.divisor_override);
  if (g.count_include_pad) return float(s[0].padded * s[1].padded * s[2].padded);
  return float((s[0].end - s[0].first) * (s[1].end - s[1].first) * (s[2].end - s[2].first));
}

struct ForwardProblem {
  Geometry g;
  Strides x, y, indices;
  bool has_indices = false;
  bool channels_last = false;  // y's channels are its densest axis (CUDA threads walk c fastest)
  i64 outputs() const { return g.batch * g.channels * g.out_plane(); }
};

struct BackwardProblem {
  Geometry g;
  Strides dy, dx, indices;  // indices: max only
  bool channels_last = false;  // dx's channels are its densest axis
  i64 inputs() const { return g.batch * g.channels * g.in_plane(); }
};

ForwardProblem validate_max_pool(const MaxPoolArgs& args, bool check_outputs = true);
ForwardProblem validate_avg_pool(const AvgPoolArgs& args, bool check_outputs = true);
ForwardProblem validate_adaptive_pool(const AdaptivePoolArgs& args, bool check_outputs = true);
BackwardProblem validate_max_pool_backward(const MaxPoolBackwardArgs& args);
BackwardProblem validate_avg_pool_backward(const AvgPoolBackwardArgs& args);
BackwardProblem validate_adaptive_pool_backward(const AdaptivePoolBackwardArgs& args);
// y's shape for a validated forward problem, in the layout and batch-ness of x.
PoolShape output_shape(const Tensor& x, const Geometry& g, int dims, PoolLayout layout);

// CPU reference backend (cpu.cpp). Tensor arguments are those the problem was built from.
void forward_cpu(const ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices);
void backward_cpu(const BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx);

// CUDA backend (pooling_cuda.cu). The caller has made the tensors' device current.
void forward_cuda(const ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices, Stream stream);
void backward_cuda(const BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx,
                   Stream stream);

}  // namespace rudnn::pooling
