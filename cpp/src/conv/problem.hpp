// The validated form of a convolution call, shared by the CPU and CUDA backends, and the
// per-element computations both run (host and device), so that the two backends sum the same
// terms in the same order. validate.cpp builds a problem after every check has passed.
//
// Every problem has three spatial axes: a 1-D or 2-D convolution gets leading axes of size 1
// (kernel 1, stride 1, no padding), which changes nothing.
#pragma once

#include <cstdint>

#include "pooling/problem.hpp"  // Strides, RUDNN_HD
#include "rudnn/conv.hpp"

namespace rudnn::conv {

using i64 = std::int64_t;
constexpr int kAxes = kMaxConvDims;

// Element strides of an activation (x, y, dy, dx) in the canonical order (n, c, d, h, w), or of
// a weight in the order (out channel, in channel, kd, kh, kw), whatever the layout: the spatial
// families' one strides struct (pooling/problem.hpp).
static_assert(kAxes == pooling::kAxes, "conv and pooling share their three spatial axes");
using pooling::Strides;

struct Geometry {
  i64 batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  i64 cin_g = 1, cout_g = 1;  // channels per group
  i64 in[kAxes] = {1, 1, 1}, out[kAxes] = {1, 1, 1}, kernel[kAxes] = {1, 1, 1};
  i64 stride[kAxes] = {1, 1, 1}, pad[kAxes] = {0, 0, 0}, dilation[kAxes] = {1, 1, 1};  // pad: before

  RUDNN_HD i64 out_plane() const { return out[0] * out[1] * out[2]; }
  RUDNN_HD i64 in_plane() const { return in[0] * in[1] * in[2]; }
  RUDNN_HD i64 kernel_volume() const { return kernel[0] * kernel[1] * kernel[2]; }
};

struct Problem {
  Geometry g;
  Strides x, y, w;  // x: x or dx; y: y or dy; w: w or dw
  i64 bias_stride = 0;
  bool has_bias = false;
  RUDNN_HD i64 outputs() const { return g.batch * g.out_channels * g.out_plane(); }
  RUDNN_HD i64 inputs() const { return g.batch * g.in_channels * g.in_plane(); }
  RUDNN_HD i64 weights() const { return g.out_channels * g.cin_g * g.kernel_volume(); }
};

// a / b rounded toward -inf and +inf, b > 0.
RUDNN_HD i64 floor_div(i64 a, i64 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
RUDNN_HD i64 ceil_div(i64 a, i64 b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// The kernel taps [lo, hi) along axis a that land inside the input for output position o
// (input position o * stride - pad + k * dilation).
RUDNN_HD void tap_range(const Geometry& g, int a, i64 o, i64& lo, i64& hi) {
  const i64 start = o * g.stride[a] - g.pad[a];
  lo = start >= 0 ? 0 : ceil_div(-start, g.dilation[a]);
  hi = floor_div(g.in[a] - 1 - start, g.dilation[a]) + 1;
  if (hi > g.kernel[a]) hi = g.kernel[a];
  if (hi < lo) hi = lo;
}

// The output positions [lo, hi) along axis a whose tap k lands inside the input.
RUDNN_HD void output_range(const Geometry& g, int a, i64 k, i64& lo, i64& hi) {
  const i64 shift = g.pad[a] - k * g.dilation[a];  // o * stride = i + shift
  lo = shift <= 0 ? 0 : ceil_div(shift, g.stride[a]);
  hi = floor_div(g.in[a] - 1 + shift, g.stride[a]) + 1;
  if (hi > g.out[a]) hi = g.out[a];
  if (hi < lo) hi = lo;
}

// An element (n, c, pos) of a (batch, channels, *size) grid from its linear index in memory
// order: (n, c, d, h, w), or (n, d, h, w, c) when channels_last (the CUDA kernels' thread order).
struct Decoded {
  i64 n, c;
  i64 pos[kAxes];
};

RUDNN_HD Decoded decode(i64 t, i64 channels, const i64 (&size)[kAxes], bool channels_last) {
  Decoded e;
  if (channels_last) {
    e.c = t % channels;
    t /= channels;
  }
  for (int a = kAxes - 1; a >= 0; --a) {
    e.pos[a] = t % size[a];
    t /= size[a];
  }
  if (!channels_last) {
    e.c = t % channels;
    t /= channels;
  }
  e.n = t;
  return e;
}

// The loops below take the element loads as functors (host lambdas on the CPU, device lambdas
// in CUDA kernels). load_x(offset), load_w(offset), load_dy(offset) return floats. nvcc's
// host/device call check is off for them: each instantiation runs where its functor does.

// y[n, co, o] before the bias: the sum over the group's input channels, then the kernel taps
// (d, h, w order) inside the input.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class LoadX, class LoadW>
RUDNN_HD float forward_element(const Problem& p, i64 n, i64 co, const i64 (&o)[kAxes], const LoadX& load_x,
                               const LoadW& load_w) {
  const Geometry& g = p.g;
  i64 lo[kAxes], hi[kAxes];
  for (int a = 0; a < kAxes; ++a) tap_range(g, a, o[a], lo[a], hi[a]);
  const i64 c0 = co / g.cout_g * g.cin_g;
  float acc = 0.0f;
  for (i64 ci = 0; ci < g.cin_g; ++ci)
    for (i64 k0 = lo[0]; k0 < hi[0]; ++k0)
      for (i64 k1 = lo[1]; k1 < hi[1]; ++k1)
        for (i64 k2 = lo[2]; k2 < hi[2]; ++k2) {
          const i64 pos[kAxes] = {o[0] * g.stride[0] - g.pad[0] + k0 * g.dilation[0],
                                  o[1] * g.stride[1] - g.pad[1] + k1 * g.dilation[1],
                                  o[2] * g.stride[2] - g.pad[2] + k2 * g.dilation[2]};
          const i64 k[kAxes] = {k0, k1, k2};
          acc += load_x(p.x.offset(n, c0 + ci, pos)) * load_w(p.w.offset(co, ci, k));
        }
  return acc;
}

// dx[n, c, i]: a gather over the kernel taps (d, h, w order) whose output position is whole and
// inside the output, then the group's output channels.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class LoadDy, class LoadW>
RUDNN_HD float data_backward_element(const Problem& p, i64 n, i64 c, const i64 (&i)[kAxes], const LoadDy& load_dy,
                                     const LoadW& load_w) {
  const Geometry& g = p.g;
  const i64 co0 = c / g.cin_g * g.cout_g, ci = c % g.cin_g;
  float acc = 0.0f;
  i64 o[kAxes], k[kAxes];
  for (k[0] = 0; k[0] < g.kernel[0]; ++k[0]) {
    const i64 t0 = i[0] + g.pad[0] - k[0] * g.dilation[0];
    if (t0 < 0) break;  // t falls as k grows
    if (t0 % g.stride[0] != 0 || (o[0] = t0 / g.stride[0]) >= g.out[0]) continue;
    for (k[1] = 0; k[1] < g.kernel[1]; ++k[1]) {
      const i64 t1 = i[1] + g.pad[1] - k[1] * g.dilation[1];
      if (t1 < 0) break;
      if (t1 % g.stride[1] != 0 || (o[1] = t1 / g.stride[1]) >= g.out[1]) continue;
      for (k[2] = 0; k[2] < g.kernel[2]; ++k[2]) {
        const i64 t2 = i[2] + g.pad[2] - k[2] * g.dilation[2];
        if (t2 < 0) break;
        if (t2 % g.stride[2] != 0 || (o[2] = t2 / g.stride[2]) >= g.out[2]) continue;
        for (i64 co = co0; co < co0 + g.cout_g; ++co)
          acc += load_dy(p.y.offset(n, co, o)) * load_w(p.w.offset(co, ci, k));
      }
    }
  }
  return acc;
}

// The terms of one weight gradient element dw[co, ci, k]: the products dy[n, co, o] *
// x[n, c, o * stride - pad + k * dilation] over the box of (n, o) whose input position is inside
// the input, numbered in [0, count) (n, then o0, o1, o2; o2 fastest).
struct WeightTerms {
  i64 co = 0, c = 0;
  i64 k[kAxes] = {0, 0, 0};
  i64 lo[kAxes] = {0, 0, 0}, size[kAxes] = {0, 0, 0};
  i64 count = 0;
};

RUDNN_HD WeightTerms weight_terms(const Problem& p, i64 index) {
  const Geometry& g = p.g;
  WeightTerms t;
  // index enumerates (co, ci, k0, k1, k2), k2 fastest.
  i64 rest = index;
  t.k[2] = rest % g.kernel[2];
  rest /= g.kernel[2];
  t.k[1] = rest % g.kernel[1];
  rest /= g.kernel[1];
  t.k[0] = rest % g.kernel[0];
  rest /= g.kernel[0];
  const i64 ci = rest % g.cin_g;
  t.co = rest / g.cin_g;
  t.c = t.co / g.cout_g * g.cin_g + ci;
  t.count = g.batch;
  for (int a = 0; a < kAxes; ++a) {
    i64 hi;
    output_range(g, a, t.k[a], t.lo[a], hi);
    t.size[a] = hi - t.lo[a];
    t.count *= t.size[a];
  }
  return t;
}

// The sum, in order, of the terms [begin, end) of a weight gradient element: the first term's
// position is decoded once, the others follow by stepping the offsets of dy and x (no division).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class LoadDy, class LoadX>
RUDNN_HD float weight_terms_sum(const Problem& p, const WeightTerms& t, i64 begin, i64 end, const LoadDy& load_dy,
                                const LoadX& load_x) {
  if (begin >= end) return 0.0f;
  const Geometry& g = p.g;
  i64 o[kAxes], dy_step[kAxes], x_step[kAxes];
  i64 rest = begin;
  for (int a = kAxes - 1; a >= 0; --a) {
    o[a] = rest % t.size[a];
    rest /= t.size[a];
  }
  i64 dy_at = rest * p.y.n + t.co * p.y.c, x_at = rest * p.x.n + t.c * p.x.c;
  for (int a = 0; a < kAxes; ++a) {
    const i64 out = t.lo[a] + o[a];
    dy_at += out * p.y.sp[a];
    x_at += (out * g.stride[a] - g.pad[a] + t.k[a] * g.dilation[a]) * p.x.sp[a];
    dy_step[a] = p.y.sp[a];
    x_step[a] = g.stride[a] * p.x.sp[a];
  }
  float acc = 0.0f;
  for (i64 l = begin; l < end; ++l) {
    acc += load_dy(dy_at) * load_x(x_at);
    // The next term: o2 + 1, carrying into o1, o0 and the batch.
    int a = kAxes - 1;
    for (; a >= 0; --a) {
      if (++o[a] < t.size[a]) {
        dy_at += dy_step[a];
        x_at += x_step[a];
        break;
      }
      o[a] = 0;
      dy_at -= (t.size[a] - 1) * dy_step[a];
      x_at -= (t.size[a] - 1) * x_step[a];
    }
    if (a < 0) {
      dy_at += p.y.n;
      x_at += p.x.n;
    }
  }
  return acc;
}

// The sum, in order, of the terms [begin, end) of db[co]: dy[n, co, o] over (n, o), o2 fastest,
// stepping the offset as weight_terms_sum does.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class LoadDy>
RUDNN_HD float bias_terms_sum(const Problem& p, i64 co, i64 begin, i64 end, const LoadDy& load_dy) {
  if (begin >= end) return 0.0f;
  const Geometry& g = p.g;
  i64 o[kAxes], rest = begin;
  for (int a = kAxes - 1; a >= 0; --a) {
    o[a] = rest % g.out[a];
    rest /= g.out[a];
  }
  i64 at = rest * p.y.n + co * p.y.c + o[0] * p.y.sp[0] + o[1] * p.y.sp[1] + o[2] * p.y.sp[2];
  float acc = 0.0f;
  for (i64 l = begin; l < end; ++l) {
    acc += load_dy(at);
    int a = kAxes - 1;
    for (; a >= 0; --a) {
      if (++o[a] < g.out[a]) {
        at += p.y.sp[a];
        break;
      }
      o[a] = 0;
      at -= (g.out[a] - 1) * p.y.sp[a];
    }
    if (a < 0) at += p.y.n;
  }
  return acc;
}

enum class Op { forward, data_backward, weight_backward, bias_backward };

Problem validate_forward(const ConvForwardArgs& args, bool check_outputs = true);
Problem validate_data_backward(const ConvDataBackwardArgs& args);
Problem validate_weight_backward(const ConvWeightBackwardArgs& args);
Problem validate_bias_backward(const ConvBiasBackwardArgs& args);
// y's shape for a validated forward problem, in x's layout.
ConvShape output_shape(const Geometry& g, int dims, ConvLayout layout);

// CPU reference backend (cpu.cpp). The tensors are those the problem was built from.
void forward_cpu(const Problem& p, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y);
void data_backward_cpu(const Problem& p, const Tensor& dy, const Tensor& w, const Tensor& dx);
void weight_backward_cpu(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& dw);
void bias_backward_cpu(const Problem& p, const Tensor& dy, const Tensor& db);

// CUDA direct backend (conv_direct_cuda.cu). The caller has made the tensors' device current.
// forward_cuda returns the algorithm it ran: "direct" or "direct_packed" (16-byte channel packs).
const char* forward_cuda(const Problem& p, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y,
                  Stream stream);
void data_backward_cuda(const Problem& p, const Tensor& dy, const Tensor& w, const Tensor& dx, Stream stream);
void weight_backward_cuda(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& dw, Stream stream);
void bias_backward_cuda(const Problem& p, const Tensor& dy, const Tensor& db, Stream stream);

}  // namespace rudnn::conv
