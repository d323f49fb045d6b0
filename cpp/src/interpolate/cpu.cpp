// CPU reference backend of interpolate: plain loops, one output element (forward) or one input
// element (backward gather) at a time, with the tap and weight math of problem.hpp that the CUDA
// kernels run too. Sums are float32 in a fixed order; values are rounded once to the output dtype.
#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "interpolate/problem.hpp"

namespace rudnn::interp {

namespace {

using host::from_float;
using host::to_float;

// Calls f(pos) for every position of a 3-axis grid (the inputs or the outputs), last axis fastest.
template <class F>
void for_each_position(const Problem& p, bool outputs, F&& f) {
  const i64 n0 = outputs ? p.ax[0].out : p.ax[0].in, n1 = outputs ? p.ax[1].out : p.ax[1].in,
            n2 = outputs ? p.ax[2].out : p.ax[2].in;
  for (i64 a = 0; a < n0; ++a)
    for (i64 b = 0; b < n1; ++b)
      for (i64 c = 0; c < n2; ++c) {
        const i64 pos[kAxes] = {a, b, c};
        f(pos);
      }
}

template <class T>
void forward_typed(const Problem& p, const T* x, T* y) {
  const auto load = [x](i64 offset) { return Lanes<1>{{to_float(x[offset])}}; };
  for (i64 n = 0; n < p.batch; ++n)
    for (i64 c = 0; c < p.channels; ++c)
      for_each_position(p, true, [&](const i64 (&o)[kAxes]) {
        y[p.dst.offset(n, c, o)] = from_float<T>(resample_point<1>(p, n, c, o, load).v[0]);
      });
}

template <class T>
void backward_typed(const Problem& p, const T* dy, T* dx) {
  const auto load = [dy](i64 offset) { return Lanes<1>{{to_float(dy[offset])}}; };
  for (i64 n = 0; n < p.batch; ++n)
    for (i64 c = 0; c < p.channels; ++c)
      for_each_position(p, false, [&](const i64 (&i)[kAxes]) {
        dx[p.dst.offset(n, c, i)] = from_float<T>(gather_point<1>(p, n, c, i, load).v[0]);
      });
}

template <class F>
void dispatch(DType dtype, F&& f) {
  core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

}  // namespace

void forward_cpu(const Problem& p, const Tensor& x, const Tensor& y) {
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_typed<T>(p, x.ptr<T>(), y.ptr<T>());
  });
}

void backward_cpu(const Problem& p, const Tensor& dy, const Tensor& dx) {
  dispatch(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_typed<T>(p, dy.ptr<T>(), dx.ptr<T>());
  });
}

}  // namespace rudnn::interp
