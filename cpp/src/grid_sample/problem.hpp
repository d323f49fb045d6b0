// The validated form of a grid_sample call, shared by the CPU and CUDA backends, and the
// coordinate, tap and weight math both run (host and device), so that the two backends read the
// same taps with the same weights. validate.cpp builds a problem after every check has passed.
//
// Every problem has three spatial axes in the canonical order (d, h, w); a 4-D problem has a
// leading unit axis (one tap at 0, weight 1, no gradient). Grid component k maps axis 2 - k
// (x -> w, y -> h, z -> d). A point's taps are separable: along each axis a run of up to 4 input
// positions (bilinear 2, nearest 1, bicubic 4), each with a weight and its derivative with
// respect to the source coordinate; positions outside the input (zeros padding) are -1.
//
// The arithmetic follows torch's shared grid sampler code (ATen/native/GridSampler.h and the CUDA
// kernels) operation by operation in float32, so that the taps picked agree with torch's.
// Float-to-integer conversions are kept inside [-2, size + 1] (NaN below), which changes no
// in-range result and keeps huge or non-finite grid values from overflowing an integer.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "pooling/problem.hpp"  // Strides, RUDNN_HD
#include "rudnn/grid_sample.hpp"

namespace rudnn::gs {

using i64 = std::int64_t;
using pooling::Lanes;
using pooling::Strides;
constexpr int kAxes = 3;
constexpr int kMaxTaps = 4;  // taps per axis (bicubic)

// Element strides of a grid (or dgrid): batch, the three output axes (canonical), the component axis.
struct GridStrides {
  i64 n = 0;
  i64 sp[kAxes] = {0, 0, 0};
  i64 k = 0;
  RUDNN_HD i64 offset(i64 n_, const i64 (&pos)[kAxes]) const { return n_ * n + pos[0] * sp[0] + pos[1] * sp[1] + pos[2] * sp[2]; }
};

struct Problem {
  GridSampleMode mode = GridSampleMode::bilinear;
  GridSamplePadding padding = GridSamplePadding::zeros;
  bool align_corners = false;
  int dims = 2;  // spatial axes of x: 2 or 3
  i64 batch = 1, channels = 1;
  i64 in[kAxes] = {1, 1, 1}, out[kAxes] = {1, 1, 1};
  Strides x;             // the sampled input
  Strides y;             // forward: y; backward: dy
  Strides dx;            // backward: dx
  Strides ws;            // backward on CUDA: the float32 workspace dx accumulates in, (n, d, h, w, c) dense
  GridStrides grid, dgrid;
  bool channels_last = false;  // x's channels are its densest axis (CUDA threads walk c fastest)
  RUDNN_HD i64 in_plane() const { return in[0] * in[1] * in[2]; }
  RUDNN_HD i64 out_plane() const { return out[0] * out[1] * out[2]; }
  RUDNN_HD int first_axis() const { return kAxes - dims; }
};

// ---- coordinates (torch's grid_sampler_compute_source_index and its _set_grad form) ---------

// [-1, 1] to [0, size - 1] (align_corners) or [-0.5, size - 0.5]; mult = d result / d coord.
RUDNN_HD float unnormalize(float coord, i64 size, bool align_corners, float& mult) {
  if (align_corners) {
    mult = float(size - 1) / 2;
    return ((coord + 1) / 2) * float(size - 1);
  }
  mult = float(size) / 2;
  return ((coord + 1) * float(size) - 1) / 2;
}

// Clip to [0, size - 1]; the borders count as outside for the gradient (grad 0), as in torch.
RUDNN_HD float clip_coordinate(float in, i64 size, float& grad) {
  if (in <= 0.0f) {
    grad = 0.0f;
    return 0.0f;
  }
  const float max = float(size - 1);
  if (in >= max) {
    grad = 0.0f;
    return max;
  }
  grad = 1.0f;
  return in;
}

// Reflect about twice_low / 2 and twice_high / 2 until inside; grad = +-1.
RUDNN_HD float reflect_coordinate(float in, i64 twice_low, i64 twice_high, float& grad) {
  if (twice_low == twice_high) {
    grad = 0.0f;
    return 0.0f;
  }
  const float min = float(twice_low) / 2;
  const float span = float(twice_high - twice_low) / 2;
  in = in - min;
  float sign = 1.0f;
  if (in < 0.0f) {
    sign = -1.0f;
    in = -in;
  }
  const float extra = fmodf(in, span);
  // torch takes int(floor(in / span)) % 2; the parity of the float quotient is the same for every
  // quotient an int holds, and avoids the overflow beyond.
  const bool odd = fmodf(floorf(in / span), 2.0f) == 1.0f;
  grad = odd ? -sign : sign;
  return odd ? span - extra + min : extra + min;
}

// Border or reflection padding of a coordinate already in input units.
RUDNN_HD float pad_coordinate(const Problem& p, float coord, i64 size, float& grad) {
  grad = 1.0f;
  if (p.padding == GridSamplePadding::border) return clip_coordinate(coord, size, grad);
  if (p.padding == GridSamplePadding::reflection) {
    float refl, clip;
    coord = p.align_corners ? reflect_coordinate(coord, 0, 2 * (size - 1), refl)
                            : reflect_coordinate(coord, -1, 2 * size - 1, refl);
    coord = clip_coordinate(coord, size, clip);
    grad = refl * clip;
  }
  return coord;
}

// ---- float-to-index conversions, bounded ------------------------------------------------------

RUDNN_HD i64 floor_index(float v, i64 size) {  // bilinear's lower corner
  if (!(v >= -2.0f)) return -2;
  if (v > float(size)) return size;
  return i64(floorf(v));
}

RUDNN_HD i64 nearest_index(float v, i64 size) {  // round half to even, as nearbyint
  if (!(v >= -1.0f)) return -1;
  if (v > float(size)) return size;
  return i64(nearbyintf(v));
}

RUDNN_HD i64 truncate_index(float v, i64 size) {  // bicubic's padded tap position, truncated as torch's cast
  if (!(v > -1.0f)) return -1;
  if (v >= float(size)) return size;
  return i64(v);
}

RUDNN_HD i64 inside(i64 i, i64 size) { return i >= 0 && i < size ? i : -1; }

// ---- Keys' cubic convolution, A = -0.75 (torch's get_cubic_upsample_coefficients and its grad) --

RUDNN_HD float cubic_near(float x) {  // |x| <= 1
  constexpr float A = -0.75f;
  return ((A + 2) * x - (A + 3)) * x * x + 1;
}
RUDNN_HD float cubic_far(float x) {  // 1 < |x| < 2
  constexpr float A = -0.75f;
  return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
}

RUDNN_HD void cubic_weights(float t, float (&w)[kMaxTaps]) {
  w[0] = cubic_far(t + 1.0f);
  w[1] = cubic_near(t);
  const float u = 1.0f - t;
  w[2] = cubic_near(u);
  w[3] = cubic_far(u + 1.0f);
}

// d w / d t up to sign as torch writes it (its grid gradient subtracts these).
RUDNN_HD void cubic_weight_grads(float t, float (&g)[kMaxTaps]) {
  constexpr float A = -0.75f;
  float x = -1 - t;
  g[0] = (-3 * A * x - 10 * A) * x - 8 * A;
  x = -t;
  g[1] = (-3 * (A + 2) * x - 2 * (A + 3)) * x;
  x = 1 - t;
  g[2] = (3 * (A + 2) * x - 2 * (A + 3)) * x;
  x = 2 - t;
  g[3] = (3 * A * x - 10 * A) * x + 8 * A;
}

// ---- the taps of one grid point ----------------------------------------------------------------
//
// K taps per axis, a compile-time constant of the mode (nearest 1, bilinear 2, bicubic 4), so
// that the CUDA kernels keep a point's taps in registers. A unit axis has one tap at 0 (weight
// 1) and K - 1 outside.

template <int K>
struct AxisTaps {
  i64 idx[K];   // input positions, -1 outside
  float w[K];
  float dw[K];  // bilinear: d w / d coordinate; bicubic: cubic_weight_grads
  float mult;   // d coordinate / d grid value
};

template <int K>
RUDNN_HD AxisTaps<K> unit_axis() {
  AxisTaps<K> t;
  for (int k = 0; k < K; ++k) {
    t.idx[k] = k == 0 ? 0 : -1;
    t.w[k] = k == 0 ? 1.0f : 0.0f;
    t.dw[k] = 0.0f;
  }
  t.mult = 0.0f;
  return t;
}

template <int K>
constexpr GridSampleMode mode_of() {
  return K == 1 ? GridSampleMode::nearest : K == 2 ? GridSampleMode::bilinear : GridSampleMode::bicubic;
}

// Calls f(std::integral_constant<int, K>) for the mode's K.
template <class F>
inline void with_taps(GridSampleMode m, F&& f) {
  if (m == GridSampleMode::nearest) f(std::integral_constant<int, 1>{});
  else if (m == GridSampleMode::bilinear) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, 4>{});
}

// The taps along axis a of grid value g; `grads` also fills dw.
template <int K>
RUDNN_HD AxisTaps<K> axis_taps(const Problem& p, int a, float g, bool grads) {
  const i64 size = p.in[a];
  AxisTaps<K> t = unit_axis<K>();
  if constexpr (K == 4) {  // bicubic: padding applies to each tap's position
    const float coord = unnormalize(g, size, p.align_corners, t.mult);
    const float base = floorf(coord);
    const float frac = coord - base;
    cubic_weights(frac, t.w);
    if (grads) cubic_weight_grads(frac, t.dw);
    for (int k = 0; k < 4; ++k) {
      float unused;
      const float pos = pad_coordinate(p, base - 1 + float(k), size, unused);
      t.idx[k] = inside(truncate_index(pos, size), size);
    }
  } else {
    float unnorm, pad_grad;
    const float coord = pad_coordinate(p, unnormalize(g, size, p.align_corners, unnorm), size, pad_grad);
    t.mult = unnorm * pad_grad;
    if constexpr (K == 1) {
      t.idx[0] = inside(nearest_index(coord, size), size);
    } else {
      const i64 i0 = floor_index(coord, size);
      t.idx[0] = inside(i0, size);
      t.idx[1] = inside(i0 + 1, size);
      t.w[0] = float(i0 + 1) - coord;
      t.w[1] = coord - float(i0);
      t.dw[0] = -1.0f;
      t.dw[1] = 1.0f;
    }
  }
  return t;
}

template <int K>
struct PointTaps {
  AxisTaps<K> ax[kAxes];
};

// The taps of grid point (n, pos); load_grid(offset) reads one grid value as float.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, class LoadGrid>
RUDNN_HD PointTaps<K> point_taps(const Problem& p, i64 n, const i64 (&pos)[kAxes], bool grads,
                                 const LoadGrid& load_grid) {
  PointTaps<K> t;
  const i64 base = p.grid.offset(n, pos);
  t.ax[0] = p.dims == 3 ? axis_taps<K>(p, 0, load_grid(base + 2 * p.grid.k), grads) : unit_axis<K>();
  t.ax[1] = axis_taps<K>(p, 1, load_grid(base + p.grid.k), grads);
  t.ax[2] = axis_taps<K>(p, 2, load_grid(base), grads);
  return t;
}

RUDNN_HD i64 spatial_offset(const Strides& s, i64 d, i64 h, i64 w) { return d * s.sp[0] + h * s.sp[1] + w * s.sp[2]; }

// The sampled values of channels c .. c + L - 1 at a point. load_x(offset) reads L adjacent
// channels of x as floats (L > 1 only for CUDA's vector path); offsets are full element offsets.
// bilinear / nearest: the corners in torch's order (w fastest), each weight the product of the
// axes' in (w, h, d) order; bicubic: torch's nested 1-D interpolations, rows first.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, int L, class LoadX>
RUDNN_HD Lanes<L> sample(const Problem& p, const PointTaps<K>& t, i64 n, i64 c, const LoadX& load_x) {
  const i64 base = n * p.x.n + c * p.x.c;
  const AxisTaps<K>&td = t.ax[0], &th = t.ax[1], &tw = t.ax[2];
  Lanes<L> acc;
  for (int l = 0; l < L; ++l) acc.v[l] = 0.0f;
  if constexpr (K == 4) {
    for (int j = 0; j < 4; ++j) {
      Lanes<L> row;
      for (int l = 0; l < L; ++l) row.v[l] = 0.0f;
      for (int i = 0; i < 4; ++i) {
        Lanes<L> v;
        if (th.idx[j] >= 0 && tw.idx[i] >= 0) {
          v = load_x(base + spatial_offset(p.x, 0, th.idx[j], tw.idx[i]));
        } else {
          for (int l = 0; l < L; ++l) v.v[l] = 0.0f;
        }
        for (int l = 0; l < L; ++l) row.v[l] += v.v[l] * tw.w[i];
      }
      for (int l = 0; l < L; ++l) acc.v[l] += row.v[l] * th.w[j];
    }
  } else {
    for (int kd = 0; kd < K; ++kd)
      for (int kh = 0; kh < K; ++kh)
        for (int kw = 0; kw < K; ++kw) {
          if (td.idx[kd] < 0 || th.idx[kh] < 0 || tw.idx[kw] < 0) continue;
          const Lanes<L> v = load_x(base + spatial_offset(p.x, td.idx[kd], th.idx[kh], tw.idx[kw]));
          const float w = tw.w[kw] * th.w[kh] * td.w[kd];
          for (int l = 0; l < L; ++l) acc.v[l] += v.v[l] * w;
        }
  }
  return acc;
}

// Calls add(d, h, w, value) for every input position the point's channel reads, with
// dy * weight (torch's order of the corners; bicubic: w tap outer, h tap inner).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, class Add>
RUDNN_HD void scatter(const PointTaps<K>& t, float dy, const Add& add) {
  const AxisTaps<K>&td = t.ax[0], &th = t.ax[1], &tw = t.ax[2];
  if constexpr (K == 4) {
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (th.idx[j] >= 0 && tw.idx[i] >= 0) add(i64(0), th.idx[j], tw.idx[i], dy * tw.w[i] * th.w[j]);
  } else {
    for (int kd = 0; kd < K; ++kd)
      for (int kh = 0; kh < K; ++kh)
        for (int kw = 0; kw < K; ++kw) {
          if (td.idx[kd] < 0 || th.idx[kh] < 0 || tw.idx[kw] < 0) continue;
          add(td.idx[kd], th.idx[kh], tw.idx[kw], (tw.w[kw] * th.w[kh] * td.w[kd]) * dy);
        }
  }
}

// Adds channel c's contribution to the point's coordinate gradients g[a] (before the
// d coordinate / d grid factor), as torch accumulates them. nearest's gradient is zero.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, class LoadX>
RUDNN_HD void grid_grad(const Problem& p, const PointTaps<K>& t, i64 n, i64 c, float dy, const LoadX& load_x,
                        float (&g)[kAxes]) {
  if constexpr (K == 1) {
    return;
  } else {
    const i64 base = n * p.x.n + c * p.x.c;
    const AxisTaps<K>&td = t.ax[0], &th = t.ax[1], &tw = t.ax[2];
    if constexpr (K == 4) {
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const float v =
              th.idx[j] >= 0 && tw.idx[i] >= 0 ? load_x(base + spatial_offset(p.x, 0, th.idx[j], tw.idx[i])) : 0.0f;
          g[2] -= v * tw.dw[i] * th.w[j] * dy;
          g[1] -= v * th.dw[j] * tw.w[i] * dy;
        }
    } else {
      const bool three = p.dims == 3;
      for (int kd = 0; kd < K; ++kd)
        for (int kh = 0; kh < K; ++kh)
          for (int kw = 0; kw < K; ++kw) {
            if (td.idx[kd] < 0 || th.idx[kh] < 0 || tw.idx[kw] < 0) continue;
            const float v = load_x(base + spatial_offset(p.x, td.idx[kd], th.idx[kh], tw.idx[kw]));
            g[2] += tw.dw[kw] * (v * th.w[kh] * td.w[kd] * dy);
            g[1] += th.dw[kh] * (v * tw.w[kw] * td.w[kd] * dy);
            if (three) g[0] += td.dw[kd] * (v * tw.w[kw] * th.w[kh] * dy);
          }
    }
  }
}

// Stores a point's grid gradient from its accumulated g: store(k, value) for component k (axis
// 2 - k), each the coordinate gradient times d coordinate / d grid. (Constant indices only, so
// that the CUDA kernels keep g and the taps in registers.)
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int K, class Store>
RUDNN_HD void store_grid_grad(const Problem& p, const PointTaps<K>& t, const float (&g)[kAxes], const Store& store) {
  store(0, t.ax[2].mult * g[2]);
  store(1, t.ax[1].mult * g[1]);
  if (p.dims == 3) store(2, t.ax[0].mult * g[0]);
}

// Output position of flat index o of the output plane (w fastest).
RUDNN_HD void plane_position(const Problem& p, i64 o, i64 (&pos)[kAxes]) {
  pos[2] = o % p.out[2];
  o /= p.out[2];
  pos[1] = o % p.out[1];
  pos[0] = o / p.out[1];
}

Problem validate_forward(const GridSampleArgs& args, bool check_outputs = true);
Problem validate_backward(const GridSampleBackwardArgs& args, bool check_outputs = true);
GridSampleShape output_shape(const Tensor& x, const Problem& p, PoolLayout layout);
// The float32 workspace's elements (CUDA backward with dx), dense in dx's layout order.
i64 workspace_elements(const Problem& p, bool want_dx, bool on_cuda);

// CPU reference backend (cpu.cpp).
void forward_cpu(const Problem& p, const Tensor& x, const Tensor& grid, const Tensor& y);
void backward_cpu(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& grid, const Tensor* dx,
                  const Tensor* dgrid);

// CUDA backend (grid_sample_cuda.cu). The caller has made the tensors' device current.
void forward_cuda(const Problem& p, const Tensor& x, const Tensor& grid, const Tensor& y, Stream stream);
void backward_cuda(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& grid, const Tensor* dx,
                   const Tensor* dgrid, const Tensor* workspace, bool deterministic, Stream stream);

}  // namespace rudnn::gs
