// The validated form of an interpolate call, shared by the CPU and CUDA backends, and the
// coordinate and weight math both run (host and device), so that the two backends read the same
// taps with the same weights. validate.cpp builds a problem after every check has passed.
//
// Every method is separable: output position o along an axis reads a run of input taps
// first, first + 1, ... (first + count - 1), clamped to the input, each with a weight; an output
// element is the nested weighted sum over the three axes (the innermost axis first, as torch's
// CPU kernels evaluate it). 1-D and 2-D problems get leading axes of size 1 (one tap, weight 1).
//
// The arithmetic follows torch's CPU kernels operation by operation, in float32 (nearest-exact's
// half-pixel offset is a double sum, as in torch), so that the taps picked agree with torch's.
#pragma once

#include <cmath>
#include <cstdint>

#include "pooling/problem.hpp"  // Strides, Lanes, RUDNN_HD
#include "rudnn/interpolate.hpp"

namespace rudnn::interp {

using i64 = std::int64_t;
using pooling::Lanes;
using pooling::Strides;
constexpr int kAxes = kMaxInterpolateDims;

enum class Method : std::uint8_t { nearest, nearest_exact, linear, cubic, area, aa_linear, aa_cubic };

// One spatial axis. scale is the input distance between neighbouring outputs (torch's
// area_pixel_compute_scale); support and invscale are the antialias filter's.
struct Axis {
  i64 in = 1, out = 1;
  float scale = 1.0f;
  bool align_corners = false;
  float support = 0.0f, invscale = 1.0f;
  bool unit = false;      // a leading axis added to reach three: one tap, weight 1, whatever the method
  bool shortcut = false;  // this pass's torch kernel copies when out == in (nearest: halves when out == 2 in)
};

// Whether output o reads input o alone with weight 1. torch's kernels take such shortcuts even
// where a given scale_factor says otherwise, some in one pass only (validate.cpp sets which).
RUDNN_HD bool copies(const Axis& a) { return a.unit || (a.shortcut && a.out == a.in); }

struct Problem {
  Method method = Method::nearest;
  i64 batch = 1, channels = 1;
  Axis ax[kAxes];
  Strides src, dst;            // forward: x, y; backward: dy, dx
  bool channels_last = false;  // dst's channels are its densest axis (CUDA threads walk c fastest)
  i64 in_plane() const { return ax[0].in * ax[1].in * ax[2].in; }
  i64 out_plane() const { return ax[0].out * ax[1].out * ax[2].out; }
};

RUDNN_HD i64 min_i64(i64 a, i64 b) { return a < b ? a : b; }
RUDNN_HD i64 max_i64(i64 a, i64 b) { return a > b ? a : b; }
RUDNN_HD float clamp01(float v) { return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v); }

// torch's source coordinate of output o for the linear and cubic methods.
RUDNN_HD float source_coordinate(const Axis& a, i64 o, bool cubic) {
  if (a.align_corners) return a.scale * float(o);
  const float src = a.scale * (float(o) + 0.5f) - 0.5f;
  return (!cubic && src < 0.0f) ? 0.0f : src;
}

// The tap below a source coordinate (kept inside the input) and the fraction past it.
RUDNN_HD i64 floor_tap(const Axis& a, float src, float& frac) {
  const i64 i0 = min_i64(i64(floorf(src)), a.in - 1);
  frac = clamp01(src - float(i0));
  return i0;
}

RUDNN_HD bool antialiased(Method m) { return m == Method::aa_linear || m == Method::aa_cubic; }

// The antialias filter's centre for output o, in input coordinates.
RUDNN_HD float aa_center(const Axis& a, i64 o) { return a.scale * (float(o) + 0.5f); }

// The unclamped taps of output o: first and count (area and antialias: all inside the input).
struct TapRange {
  i64 first, count;
};

RUDNN_HD TapRange tap_range(Method m, const Axis& a, i64 o) {
  if (copies(a)) return {o, 1};
  float frac;
  switch (m) {
    case Method::nearest:
      if (a.shortcut && a.out == 2 * a.in) return {o >> 1, 1};
      return {min_i64(i64(floorf(float(o) * a.scale)), a.in - 1), 1};
    case Method::nearest_exact:
      return {min_i64(i64(floorf(float((double(o) + 0.5) * double(a.scale)))), a.in - 1), 1};
    case Method::linear: return {floor_tap(a, source_coordinate(a, o, false), frac), 2};
    case Method::cubic: return {floor_tap(a, source_coordinate(a, o, true), frac) - 1, 4};
    case Method::area: {
      const i64 first = o * a.in / a.out;
      return {first, ((o + 1) * a.in + a.out - 1) / a.out - first};
    }
    default: {  // antialias: the filter's support around its centre, cut to the input
      const float center = aa_center(a, o);
      const i64 first = max_i64(i64(center - a.support + 0.5f), 0);
      return {first, min_i64(i64(center + a.support + 0.5f), a.in) - first};
    }
  }
}

// Keys' cubic convolution with torch's A = -0.75 (bicubic), or PIL's a = -0.5 (antialiased
// bicubic), at distance |x| from the tap.
RUDNN_HD float cubic_near(float x, float A) { return ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f; }  // |x| <= 1
RUDNN_HD float cubic_far(float x, float A) { return ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A; }  // 1 < |x| < 2

RUDNN_HD float aa_filter(Method m, float x) {
  x = x < 0.0f ? -x : x;
  if (m == Method::aa_linear) return x < 1.0f ? 1.0f - x : 0.0f;
  constexpr float a = -0.5f;
  if (x < 1.0f) return cubic_near(x, a);
  if (x < 2.0f) return (((x - 5.0f) * x + 8.0f) * x - 4.0f) * a;
  return 0.0f;
}

// The taps of output o and their weights (area: weight 1, the caller divides by the counts;
// antialias: computed per tap by tap_weight, divided by their sum `total`, as torch does).
struct Taps {
  i64 first, count;
  float w[4];
  float center, total;
};

RUDNN_HD float aa_raw_weight(Method m, const Axis& a, const Taps& t, i64 k) {
  return aa_filter(m, (float(t.first + k) - t.center + 0.5f) * a.invscale);
}

RUDNN_HD Taps taps_of(Method m, const Axis& a, i64 o) {
  const TapRange r = tap_range(m, a, o);
  Taps t{r.first, r.count, {1.0f, 0.0f, 0.0f, 0.0f}, 0.0f, 1.0f};
  float frac;
  if (copies(a)) return t;
  if (m == Method::linear) {
    floor_tap(a, source_coordinate(a, o, false), frac);
    t.w[0] = 1.0f - frac;
    t.w[1] = frac;
  } else if (m == Method::cubic) {
    constexpr float A = -0.75f;
    floor_tap(a, source_coordinate(a, o, true), frac);
    t.w[0] = cubic_far(frac + 1.0f, A);
    t.w[1] = cubic_near(frac, A);
    t.w[2] = cubic_near(1.0f - frac, A);
    t.w[3] = cubic_far(2.0f - frac, A);
  } else if (antialiased(m)) {
    t.center = aa_center(a, o);
    float total = 0.0f;
    for (i64 k = 0; k < t.count; ++k) total += aa_raw_weight(m, a, t, k);
    t.total = total != 0.0f ? total : 1.0f;
  }
  return t;
}

RUDNN_HD float tap_weight(Method m, const Axis& a, const Taps& t, i64 k) {
  if (copies(a)) return 1.0f;
  if (antialiased(m)) return aa_raw_weight(m, a, t, k) / t.total;
  if (m == Method::area) return 1.0f;
  return t.w[k];
}

// Taps past either end of the input read its border element (bicubic's clamping; linear's second
// tap at the last element).
RUDNN_HD i64 tap_index(const Axis& a, const Taps& t, i64 k) { return min_i64(max_i64(t.first + k, 0), a.in - 1); }

// The weight with which output o's taps read input position i (0 if they do not).
RUDNN_HD float weight_to(Method m, const Axis& a, const Taps& t, i64 i) {
  if (antialiased(m) || m == Method::area) {  // taps inside the input, each read once
    const i64 k = i - t.first;
    return k >= 0 && k < t.count ? tap_weight(m, a, t, k) : 0.0f;
  }
  float w = 0.0f;
  for (i64 k = 0; k < t.count; ++k)
    if (tap_index(a, t, k) == i) w += tap_weight(m, a, t, k);
  return w;
}

// The outputs [lo, hi] along an axis whose taps can read input position i (empty when lo > hi).
// Both ends of an output's clamped tap run are non-decreasing in o for every method (its source
// coordinate is, float rounding included), so the outputs reading i are contiguous: lo is the
// first output whose last tap reaches i, hi the last whose first tap does not pass it. The walk
// starts at the output whose centre maps nearest to i under the nominal ratio out / in (a given
// scale_factor moves the mapping by at most about one output from it) and steps over the same
// tap_range the forward uses until both conditions hold, so the bounds are exact; the steps are
// about as many as the outputs the gather then visits.
RUDNN_HD void covering_outputs(Method m, const Axis& a, i64 i, i64& lo, i64& hi) {
  const double guess = (double(i) + 0.5) * double(a.out) / double(a.in) - 0.5;
  const i64 start = guess <= 0.0 ? 0 : min_i64(i64(guess), a.out - 1);
  const auto last_tap = [&](i64 o) {
    const TapRange t = tap_range(m, a, o);
    return min_i64(t.first + t.count - 1, a.in - 1);
  };
  const auto first_tap = [&](i64 o) { return max_i64(tap_range(m, a, o).first, 0); };
  lo = start;
  while (lo > 0 && last_tap(lo - 1) >= i) --lo;
  while (lo < a.out && last_tap(lo) < i) ++lo;
  hi = start;
  while (hi + 1 < a.out && first_tap(hi + 1) <= i) ++hi;
  while (hi >= 0 && first_tap(hi) > i) --hi;
}

// One output element: the nested weighted sum of its taps (area: their mean). load(offset) reads
// L adjacent channels of the source at an element offset (L > 1 only for CUDA's vector path).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int L, class Load>
RUDNN_HD Lanes<L> resample_point(const Problem& p, i64 n, i64 c, const i64 (&o)[kAxes], const Load& load) {
  const Method m = p.method;
  const Taps t[kAxes] = {taps_of(m, p.ax[0], o[0]), taps_of(m, p.ax[1], o[1]), taps_of(m, p.ax[2], o[2])};
  Lanes<L> acc0;
  for (int l = 0; l < L; ++l) acc0.v[l] = 0.0f;
  for (i64 k0 = 0; k0 < t[0].count; ++k0) {
    Lanes<L> acc1;
    for (int l = 0; l < L; ++l) acc1.v[l] = 0.0f;
    for (i64 k1 = 0; k1 < t[1].count; ++k1) {
      Lanes<L> acc2;
      for (int l = 0; l < L; ++l) acc2.v[l] = 0.0f;
      for (i64 k2 = 0; k2 < t[2].count; ++k2) {
        const i64 pos[kAxes] = {tap_index(p.ax[0], t[0], k0), tap_index(p.ax[1], t[1], k1),
                                tap_index(p.ax[2], t[2], k2)};
        const Lanes<L> v = load(p.src.offset(n, c, pos));
        const float w2 = tap_weight(m, p.ax[2], t[2], k2);
        for (int l = 0; l < L; ++l) acc2.v[l] += m == Method::area ? v.v[l] : v.v[l] * w2;
      }
      const float w1 = tap_weight(m, p.ax[1], t[1], k1);
      for (int l = 0; l < L; ++l) acc1.v[l] += m == Method::area ? acc2.v[l] : acc2.v[l] * w1;
    }
    const float w0 = tap_weight(m, p.ax[0], t[0], k0);
    for (int l = 0; l < L; ++l) acc0.v[l] += m == Method::area ? acc1.v[l] : acc1.v[l] * w0;
  }
  if (m == Method::area)  // adaptive average pooling divides by each window extent in turn
    for (int l = 0; l < L; ++l) acc0.v[l] = acc0.v[l] / float(t[0].count) / float(t[1].count) / float(t[2].count);
  return acc0;
}

// The gradient of input element i: the sum over the outputs that read it (in output order) of
// dy times the product of the axes' weights (area: dy divided by the window extents).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int L, class Load>
RUDNN_HD Lanes<L> gather_point(const Problem& p, i64 n, i64 c, const i64 (&i)[kAxes], const Load& load_dy) {
  const Method m = p.method;
  i64 lo[kAxes], hi[kAxes];
  for (int a = 0; a < kAxes; ++a) covering_outputs(m, p.ax[a], i[a], lo[a], hi[a]);
  Lanes<L> acc;
  for (int l = 0; l < L; ++l) acc.v[l] = 0.0f;
  for (i64 o0 = lo[0]; o0 <= hi[0]; ++o0) {
    const Taps t0 = taps_of(m, p.ax[0], o0);
    const float w0 = weight_to(m, p.ax[0], t0, i[0]);
    for (i64 o1 = lo[1]; o1 <= hi[1]; ++o1) {
      const Taps t1 = taps_of(m, p.ax[1], o1);
      const float w01 = w0 * weight_to(m, p.ax[1], t1, i[1]);
      for (i64 o2 = lo[2]; o2 <= hi[2]; ++o2) {
        const Taps t2 = taps_of(m, p.ax[2], o2);
        const i64 o[kAxes] = {o0, o1, o2};
        const Lanes<L> d = load_dy(p.src.offset(n, c, o));
        if (m == Method::area) {
          for (int l = 0; l < L; ++l)
            acc.v[l] += d.v[l] / float(t0.count) / float(t1.count) / float(t2.count);
        } else {
          const float w = w01 * weight_to(m, p.ax[2], t2, i[2]);
          for (int l = 0; l < L; ++l) acc.v[l] += d.v[l] * w;
        }
      }
    }
  }
  return acc;
}

Problem validate_forward(const InterpolateArgs& args, bool check_outputs = true);
Problem validate_backward(const InterpolateBackwardArgs& args);
// y's shape for a validated forward problem, in x's layout.
InterpolateShape output_shape(const Tensor& x, const Problem& p, PoolLayout layout);

// CPU reference backend (cpu.cpp).
void forward_cpu(const Problem& p, const Tensor& x, const Tensor& y);
void backward_cpu(const Problem& p, const Tensor& dy, const Tensor& dx);

// CUDA backend (interpolate_cuda.cu). The caller has made the tensors' device current.
void forward_cuda(const Problem& p, const Tensor& x, const Tensor& y, Stream stream);
void backward_cuda(const Problem& p, const Tensor& dy, const Tensor& dx, Stream stream);

}  // namespace rudnn::interp
