// CPU reference backend of the norm/softmax family: plain loops, sums in double,
// results rounded once to float32 statistics and to the output dtype. It defines
// the semantics the CUDA kernels must reproduce and serves NumPy users.
#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "norm/problem.hpp"

namespace rudnn::norm {

namespace {

using host::from_float;
using host::to_float;

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

// A [H] parameter as float32 (ones or zeros when absent).
std::vector<float> load_param(const Tensor* t, std::int64_t hidden, float missing) {
  std::vector<float> out(hidden, missing);
  if (!t) return out;
  dispatch(t->dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    const P* p = t->ptr<P>();
    for (std::int64_t j = 0; j < hidden; ++j) out[j] = to_float(p[j]);
  });
  return out;
}

float* stat_ptr(const Tensor* t, const core::RowIndexer& idx, std::int64_t row) {
  return t ? t->ptr<float>() + idx.offset(row) : nullptr;
}

}  // namespace

void forward_cpu(const NormForwardArgs& a, const ForwardProblem& p) {
  const std::int64_t H = p.hidden;
  const std::vector<float> w = load_param(a.weight, H, 1.0f);
  const std::vector<float> b = load_param(a.bias, H, 0.0f);
  std::vector<float> h(H);
  dispatch(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const T* x = a.x.ptr<T>() + p.x.offset(r);
      if (a.residual) {
        const T* res = a.residual->ptr<T>() + p.residual.offset(r);
        T* h_out = a.residual_out->ptr<T>() + p.residual_out.offset(r);
        for (std::int64_t j = 0; j < H; ++j) {
          const T sum = from_float<T>(to_float(x[j]) + to_float(res[j]));
          h[j] = to_float(sum);
          h_out[j] = sum;
        }
      } else {
        for (std::int64_t j = 0; j < H; ++j) h[j] = to_float(x[j]);
      }

      float mean = 0.0f;
      double sq = 0.0;
      if (a.kind == NormKind::layer) {
        double s = 0.0;
        for (std::int64_t j = 0; j < H; ++j) s += h[j];
        mean = float(s / double(H));
        for (std::int64_t j = 0; j < H; ++j) sq += double(h[j] - mean) * double(h[j] - mean);
      } else {
        for (std::int64_t j = 0; j < H; ++j) sq += double(h[j]) * double(h[j]);
      }
      const float rstd = float(1.0 / std::sqrt(sq / double(H) + double(a.eps)));

      T* y = a.y.ptr<T>() + p.y.offset(r);
      for (std::int64_t j = 0; j < H; ++j) y[j] = from_float<T>((h[j] - mean) * rstd * w[j] + b[j]);
      if (float* m = stat_ptr(a.mean, p.mean, r)) *m = mean;
      if (float* s = stat_ptr(a.rstd, p.rstd, r)) *s = rstd;
    }
  });
}

void backward_cpu(const NormBackwardArgs& a, const BackwardProblem& p) {
  const std::int64_t H = p.hidden;
  const std::vector<float> w = load_param(a.weight, H, 1.0f);
  // Weight gradients accumulate row by row in a fixed order (deterministic).
  std::vector<double> dw(H, 0.0), db(H, 0.0);
  std::vector<float> xhat(H), g(H);
  dispatch(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const T* x = a.x.ptr<T>() + p.x.offset(r);
      const T* dy = a.dy.ptr<T>() + p.dy.offset(r);
      const float mean = a.mean ? a.mean->ptr<float>()[p.mean.offset(r)] : 0.0f;
      const float rstd = a.rstd.ptr<float>()[p.rstd.offset(r)];
      double sum_g = 0.0, sum_gx = 0.0;
      for (std::int64_t j = 0; j < H; ++j) {
        const float dyj = to_float(dy[j]);
        xhat[j] = (to_float(x[j]) - mean) * rstd;
        g[j] = dyj * w[j];
        sum_g += g[j];
        sum_gx += double(g[j]) * xhat[j];
        dw[j] += double(dyj) * xhat[j];
        db[j] += dyj;
      }
      const float mean_g = a.kind == NormKind::layer ? float(sum_g / double(H)) : 0.0f;
      const float mean_gx = float(sum_gx / double(H));
      T* dx = a.dx.ptr<T>() + p.dx.offset(r);
      for (std::int64_t j = 0; j < H; ++j) dx[j] = from_float<T>(rstd * (g[j] - mean_g - xhat[j] * mean_gx));
    }
  });
  if (a.dweight)
    for (std::int64_t j = 0; j < H; ++j) a.dweight->ptr<float>()[j] = float(dw[j]);
  if (a.dbias)
    for (std::int64_t j = 0; j < H; ++j) a.dbias->ptr<float>()[j] = float(db[j]);
}

void softmax_forward_cpu(const Tensor& x_t, const Tensor& y_t, const SoftmaxProblem& p) {
  const std::int64_t H = p.hidden;
  std::vector<float> e(H);
  dispatch(x_t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const T* x = x_t.ptr<T>() + p.a.offset(r);
      float max = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < H; ++j) max = std::fmax(max, to_float(x[j]));
      // A row of only -inf has no finite maximum: exp(-inf - -inf) is NaN, as in torch.
      double sum = 0.0;
      for (std::int64_t j = 0; j < H; ++j) sum += (e[j] = std::exp(to_float(x[j]) - max));
      const float inv = float(1.0 / sum);
      T* y = y_t.ptr<T>() + p.out.offset(r);
      for (std::int64_t j = 0; j < H; ++j) y[j] = from_float<T>(e[j] * inv);
    }
  });
}

void softmax_backward_cpu(const Tensor& dy_t, const Tensor& y_t, const Tensor& dx_t, const SoftmaxProblem& p) {
  const std::int64_t H = p.hidden;
  std::vector<float> yv(H), dyv(H);
  dispatch(y_t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::int64_t r = 0; r < p.rows; ++r) {
      const T* dy = dy_t.ptr<T>() + p.a.offset(r);
      const T* y = y_t.ptr<T>() + p.b.offset(r);
      double dot = 0.0;
      for (std::int64_t j = 0; j < H; ++j) {
        yv[j] = to_float(y[j]);
        dyv[j] = to_float(dy[j]);
        dot += double(yv[j]) * dyv[j];
      }
      T* dx = dx_t.ptr<T>() + p.out.offset(r);
      for (std::int64_t j = 0; j < H; ++j) dx[j] = from_float<T>(yv[j] * (dyv[j] - float(dot)));
    }
  });
}

}  // namespace rudnn::norm
