// CPU reference backend of the convolution family: plain loops over the written tensor, one
// element at a time, with the per-element computations of problem.hpp that the CUDA kernels
// run too. Sums are float32; values are rounded once to the output dtype.
#include "conv/problem.hpp"
#include "core/dispatch.hpp"
#include "core/half.hpp"

namespace rudnn::conv {

namespace {

using host::from_float;
using host::to_float;

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

template <class T>
auto loader(const Tensor& t) {
  const T* data = t.ptr<T>();
  return [data](i64 offset) { return to_float(data[offset]); };
}

// Calls f(n, c, pos) for every element of a (batch, channels, *size) grid.
template <class F>
void for_each_element(i64 batch, i64 channels, const i64 (&size)[kAxes], F&& f) {
  for (i64 n = 0; n < batch; ++n)
    for (i64 c = 0; c < channels; ++c)
      for (i64 a = 0; a < size[0]; ++a)
        for (i64 b = 0; b < size[1]; ++b)
          for (i64 e = 0; e < size[2]; ++e) {
            const i64 pos[kAxes] = {a, b, e};
            f(n, c, pos);
          }
}

}  // namespace

void forward_cpu(const Problem& p, const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& y) {
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto load_x = loader<T>(x);
    const auto load_w = loader<T>(w);
    const T* b = bias ? bias->ptr<T>() : nullptr;
    T* out = y.ptr<T>();
    for_each_element(p.g.batch, p.g.out_channels, p.g.out, [&](i64 n, i64 co, const i64 (&o)[kAxes]) {
      float v = forward_element(p, n, co, o, load_x, load_w);
      if (b) v += to_float(b[co * p.bias_stride]);
      out[p.y.offset(n, co, o)] = from_float<T>(v);
    });
  });
}

void data_backward_cpu(const Problem& p, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  dispatch(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto load_dy = loader<T>(dy);
    const auto load_w = loader<T>(w);
    T* out = dx.ptr<T>();
    for_each_element(p.g.batch, p.g.in_channels, p.g.in, [&](i64 n, i64 c, const i64 (&i)[kAxes]) {
      out[p.x.offset(n, c, i)] = from_float<T>(data_backward_element(p, n, c, i, load_dy, load_w));
    });
  });
}

void weight_backward_cpu(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& dw) {
  dispatch(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto load_dy = loader<T>(dy);
    const auto load_x = loader<T>(x);
    T* out = dw.ptr<T>();
    for (i64 index = 0; index < p.weights(); ++index) {
      const WeightTerms t = weight_terms(p, index);
      float acc = 0.0f;
      for (i64 l = 0; l < t.count; ++l) acc += weight_term(p, t, l, load_dy, load_x);
      const i64 ci = t.c - t.co / p.g.cout_g * p.g.cin_g;
      out[p.w.offset(t.co, ci, t.k)] = from_float<T>(acc);
    }
  });
}

void bias_backward_cpu(const Problem& p, const Tensor& dy, const Tensor& db) {
  dispatch(dy.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto load_dy = loader<T>(dy);
    T* out = db.ptr<T>();
    const i64 count = p.g.batch * p.g.out_plane();
    for (i64 co = 0; co < p.g.out_channels; ++co) {
      float acc = 0.0f;
      for (i64 l = 0; l < count; ++l) acc += bias_term(p, co, l, load_dy);
      out[co * p.bias_stride] = from_float<T>(acc);
    }
  });
}

}  // namespace rudnn::conv
