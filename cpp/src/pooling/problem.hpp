// The validated form of a pooling call, shared by the CPU and CUDA backends, and the window
// arithmetic both use (host and device), so that the two backends pool the same elements.
// validate.cpp builds a problem after every check has passed; backends assume it is valid.
//
// Every problem has three spatial axes: a 1-D or 2-D pooling gets leading axes of size 1
// (kernel 1, stride 1, no padding), which changes neither the result nor the flat indices.
#pragma once

#include <cstdint>
#include <limits>

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

// The loops below take the element loads as functors (a host lambda on the CPU, a device lambda
// in a CUDA kernel), so that both backends share one definition of what a window computes.
// A load returns L adjacent channels of one element (L = 1 but for CUDA's channels-last vector
// path). nvcc's host/device call check is off for them: each instantiation runs where its
// functor does.
template <int L>
struct Lanes {
  float v[L];
};
template <int L>
struct IndexLanes {
  i64 v[L];
};

// One output window: the maximum (the first one wins, NaN propagates, as in torch) and the flat
// index of its element, or the average (an empty window gives 0, as in torch). load(offset)
// reads x at an element offset (channels c .. c + L - 1).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <bool Max, int L, class Load>
RUDNN_HD Lanes<L> pool_window(const Geometry& g, const Strides& xs, i64 n, i64 c, const AxisSpan (&s)[kAxes],
                              const Load& load, IndexLanes<L>& best_at) {
  Lanes<L> acc;
  const i64 first = g.flat_in({s[0].first, s[1].first, s[2].first});
  for (int l = 0; l < L; ++l) {
    acc.v[l] = Max ? -std::numeric_limits<float>::infinity() : 0.0f;
    best_at.v[l] = first;
  }
  bool any = false;
  for (i64 d = s[0].first; d < s[0].end; d += s[0].step)
    for (i64 h = s[1].first; h < s[1].end; h += s[1].step)
      for (i64 w = s[2].first; w < s[2].end; w += s[2].step) {
        const Lanes<L> v = load(xs.offset(n, c, {d, h, w}));
        const i64 here = g.flat_in({d, h, w});
        any = true;
        for (int l = 0; l < L; ++l) {
          if constexpr (Max) {
            if (v.v[l] > acc.v[l] || v.v[l] != v.v[l]) {  // v != v: NaN
              acc.v[l] = v.v[l];
              best_at.v[l] = here;
            }
          } else {
            acc.v[l] += v.v[l];
          }
        }
      }
  if constexpr (!Max) {
    const float divisor = avg_divisor(g, s);
    for (int l = 0; l < L; ++l) acc.v[l] = any ? acc.v[l] / divisor : 0.0f;
  }
  return acc;
}

// The gradient of input element pos: the sum, over the output windows that contain it in
// output order, of dy (max: where the window's index names pos; average: dy / divisor).
// load_dy(offset) reads dy, load_index(offset) the indices (channels c .. c + L - 1).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <bool Max, int L, class LoadDy, class LoadIndex>
RUDNN_HD Lanes<L> gather_window_grads(const Geometry& g, const Strides& dys, const Strides& is, i64 n, i64 c,
                                      const i64 (&pos)[kAxes], const LoadDy& load_dy, const LoadIndex& load_index) {
  i64 lo[kAxes], hi[kAxes];
  for (int a = 0; a < kAxes; ++a) covering_outputs(g, a, pos[a], lo[a], hi[a]);
  const i64 flat = g.flat_in(pos);
  Lanes<L> acc;
  for (int l = 0; l < L; ++l) acc.v[l] = 0.0f;
  for (i64 o0 = lo[0]; o0 <= hi[0]; ++o0)
    for (i64 o1 = lo[1]; o1 <= hi[1]; ++o1)
      for (i64 o2 = lo[2]; o2 <= hi[2]; ++o2) {
        const i64 o[kAxes] = {o0, o1, o2};
        if constexpr (Max) {
          const IndexLanes<L> index = load_index(is.offset(n, c, o));
          bool hit = false;
          for (int l = 0; l < L; ++l) hit = hit || index.v[l] == flat;
          if (!hit) continue;  // dy is read only where some channel's maximum is this element
          const Lanes<L> d = load_dy(dys.offset(n, c, o));
          for (int l = 0; l < L; ++l)
            if (index.v[l] == flat) acc.v[l] += d.v[l];
        } else {
          const AxisSpan s[kAxes] = {axis_span(g, 0, o0), axis_span(g, 1, o1), axis_span(g, 2, o2)};
          if (!(span_contains(s[0], pos[0]) && span_contains(s[1], pos[1]) && span_contains(s[2], pos[2]))) continue;
          const float divisor = avg_divisor(g, s);
          const Lanes<L> d = load_dy(dys.offset(n, c, o));
          for (int l = 0; l < L; ++l) acc.v[l] += d.v[l] / divisor;
        }
      }
  return acc;
}

// Indices are int64 (torch's) or int32 (JAX's without x64).
struct IndexArray {
  void* data;
  bool i32;
  RUDNN_HD i64 load(i64 offset) const {
    return i32 ? i64(static_cast<const std::int32_t*>(data)[offset]) : static_cast<const i64*>(data)[offset];
  }
  RUDNN_HD void store(i64 offset, i64 value) const {
    if (i32) static_cast<std::int32_t*>(data)[offset] = std::int32_t(value);
    else static_cast<i64*>(data)[offset] = value;
  }
};

struct ForwardProblem {
  Geometry g;
  Strides x, y, indices;
  bool has_indices = false;
  bool indices_i32 = false;
  bool channels_last = false;  // y's channels are its densest axis (CUDA threads walk c fastest)
  i64 outputs() const { return g.batch * g.channels * g.out_plane(); }
};

struct BackwardProblem {
  Geometry g;
  Strides dy, dx, indices;  // indices: max only
  bool indices_i32 = false;
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
