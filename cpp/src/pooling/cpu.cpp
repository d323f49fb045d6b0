// CPU reference backend of the pooling family: plain loops over planes and positions, one
// output window (forward) or one input element (backward gather) at a time, with the window
// computations of problem.hpp that the CUDA kernels run too. Sums are float32 in a fixed order
// (torch's order in the forward); values are rounded once to the output dtype.
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

// Calls f(p0, p1, p2) for every position of a 3-axis grid of the given sizes, last axis fastest.
template <class F>
void for_each_position(const i64 (&size)[kAxes], F&& f) {
  for (i64 a = 0; a < size[0]; ++a)
    for (i64 b = 0; b < size[1]; ++b)
      for (i64 c = 0; c < size[2]; ++c) f(i64{a}, i64{b}, i64{c});
}

template <class T, bool Max>
void forward_typed(const ForwardProblem& p, const T* x, T* y, const IndexArray& indices) {
  const Geometry& g = p.g;
  const auto load = [x](i64 offset) { return Lanes<1>{{to_float(x[offset])}}; };
  for (i64 n = 0; n < g.batch; ++n)
    for (i64 c = 0; c < g.channels; ++c)
      for_each_position(g.out, [&](i64 o0, i64 o1, i64 o2) {
        const AxisSpan s[kAxes] = {axis_span(g, 0, o0), axis_span(g, 1, o1), axis_span(g, 2, o2)};
        const i64 o[kAxes] = {o0, o1, o2};
        IndexLanes<1> best_at;
        y[p.y.offset(n, c, o)] = from_float<T>(pool_window<Max, 1>(g, p.x, n, c, s, load, best_at).v[0]);
        if (p.has_indices) indices.store(p.indices.offset(n, c, o), best_at.v[0]);
      });
}

template <class T, bool Max>
void backward_typed(const BackwardProblem& p, const T* dy, const IndexArray& indices, T* dx) {
  const Geometry& g = p.g;
  const auto load_dy = [dy](i64 offset) { return Lanes<1>{{to_float(dy[offset])}}; };
  const auto load_index = [&indices](i64 offset) { return IndexLanes<1>{{indices.load(offset)}}; };
  for (i64 n = 0; n < g.batch; ++n)
    for (i64 c = 0; c < g.channels; ++c)
      for_each_position(g.in, [&](i64 i0, i64 i1, i64 i2) {
        const i64 pos[kAxes] = {i0, i1, i2};
        const Lanes<1> grad = gather_window_grads<Max, 1>(g, p.dy, p.indices, n, c, pos, load_dy, load_index);
        dx[p.dx.offset(n, c, pos)] = from_float<T>(grad.v[0]);
      });
}

}  // namespace

void forward_cpu(const ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices) {
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const IndexArray idx{indices ? indices->data : nullptr, p.indices_i32};
    if (p.g.max) forward_typed<T, true>(p, x.ptr<T>(), y.ptr<T>(), idx);
    else forward_typed<T, false>(p, x.ptr<T>(), y.ptr<T>(), idx);
  });
}

void backward_cpu(const BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx) {
  dispatch(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const IndexArray idx{indices ? indices->data : nullptr, p.indices_i32};
    if (p.g.max) backward_typed<T, true>(p, dy.ptr<T>(), idx, dx.ptr<T>());
    else backward_typed<T, false>(p, dy.ptr<T>(), idx, dx.ptr<T>());
  });
}

}  // namespace rudnn::pooling
