// CPU reference backend of the pooling family: plain loops over planes and positions, sums
// in float32 in a fixed order (torch's order for the forward), values rounded once to the
// output dtype. The windows come from problem.hpp, as on CUDA.
#include <cmath>
#include <limits>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "pooling/problem.hpp"

namespace rudnn::pooling {

namespace {

using host::from_float;
using host::to_float;

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

// Calls f(pos) for every position of a 3-axis grid of the given sizes, last axis fastest.
template <class F>
void for_each_position(const i64 (&size)[kAxes], F&& f) {
  for (i64 a = 0; a < size[0]; ++a)
    for (i64 b = 0; b < size[1]; ++b)
      for (i64 c = 0; c < size[2]; ++c) f(i64{a}, i64{b}, i64{c});
}

template <class T>
void forward_typed(const ForwardProblem& p, const T* x, T* y, i64* indices) {
  const Geometry& g = p.g;
  for (i64 n = 0; n < g.batch; ++n)
    for (i64 c = 0; c < g.channels; ++c)
      for_each_position(g.out, [&](i64 o0, i64 o1, i64 o2) {
        const AxisSpan s[kAxes] = {axis_span(g, 0, o0), axis_span(g, 1, o1), axis_span(g, 2, o2)};
        const i64 o[kAxes] = {o0, o1, o2};
        float result = 0.0f;
        i64 best_at = g.flat_in({s[0].first, s[1].first, s[2].first});
        float best = -std::numeric_limits<float>::infinity();
        float sum = 0.0f;
        bool any = false;
        for (i64 d = s[0].first; d < s[0].end; d += s[0].step)
          for (i64 h = s[1].first; h < s[1].end; h += s[1].step)
            for (i64 w = s[2].first; w < s[2].end; w += s[2].step) {
              const float v = to_float(x[p.x.offset(n, c, {d, h, w})]);
              any = true;
              if (g.max) {
                if (v > best || std::isnan(v)) {  // the first maximum wins; NaN propagates (torch)
                  best = v;
                  best_at = g.flat_in({d, h, w});
                }
              } else {
                sum += v;
              }
            }
        if (g.max) result = best;
        else if (any) result = sum / avg_divisor(g, s);  // an empty window gives 0, as in torch
        y[p.y.offset(n, c, o)] = from_float<T>(result);
        if (p.has_indices) indices[p.indices.offset(n, c, o)] = best_at;
      });
}

// Gather: each input element sums the gradients of the output windows that contain it.
template <class T>
void backward_typed(const BackwardProblem& p, const T* dy, const i64* indices, T* dx) {
  const Geometry& g = p.g;
  for (i64 n = 0; n < g.batch; ++n)
    for (i64 c = 0; c < g.channels; ++c)
      for_each_position(g.in, [&](i64 i0, i64 i1, i64 i2) {
        const i64 pos[kAxes] = {i0, i1, i2};
        const i64 flat = g.flat_in(pos);
        i64 lo[kAxes], hi[kAxes];
        for (int a = 0; a < kAxes; ++a) covering_outputs(g, a, pos[a], lo[a], hi[a]);
        float acc = 0.0f;
        for (i64 o0 = lo[0]; o0 <= hi[0]; ++o0)
          for (i64 o1 = lo[1]; o1 <= hi[1]; ++o1)
            for (i64 o2 = lo[2]; o2 <= hi[2]; ++o2) {
              const i64 o[kAxes] = {o0, o1, o2};
              if (g.max) {
                if (indices[p.indices.offset(n, c, o)] == flat) acc += to_float(dy[p.dy.offset(n, c, o)]);
                continue;
              }
              const AxisSpan s[kAxes] = {axis_span(g, 0, o0), axis_span(g, 1, o1), axis_span(g, 2, o2)};
              if (span_contains(s[0], i0) && span_contains(s[1], i1) && span_contains(s[2], i2))
                acc += to_float(dy[p.dy.offset(n, c, o)]) / avg_divisor(g, s);
            }
        dx[p.dx.offset(n, c, pos)] = from_float<T>(acc);
      });
}

}  // namespace

void forward_cpu(const ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices) {
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_typed<T>(p, x.ptr<T>(), y.ptr<T>(), indices ? indices->ptr<i64>() : nullptr);
  });
}

void backward_cpu(const BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx) {
  dispatch(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_typed<T>(p, dy.ptr<T>(), indices ? indices->ptr<i64>() : nullptr, dx.ptr<T>());
  });
}

}  // namespace rudnn::pooling
