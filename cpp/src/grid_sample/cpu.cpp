// CPU reference backend of grid_sample: plain loops with the tap and weight math of problem.hpp
// that the CUDA kernels run too. Sums are float32 in a fixed order; values are rounded once to
// the output dtype. dx accumulates one (n, c) plane at a time in a float32 buffer, walking the
// grid points in order (the order of the CUDA deterministic path); dgrid sums each point over
// the channels in order.
#include <algorithm>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "grid_sample/problem.hpp"

namespace rudnn::gs {

namespace {

using host::from_float;
using host::to_float;

template <class F>
void for_each_point(const Problem& p, F&& f) {
  const i64 plane = p.out_plane();
  for (i64 o = 0; o < plane; ++o) {
    i64 pos[kAxes];
    plane_position(p, o, pos);
    f(pos);
  }
}

template <class T, int K>
void forward_typed(const Problem& p, const T* x, const T* grid, T* y) {
  const auto load_x = [x](i64 off) { return Lanes<1>{{to_float(x[off])}}; };
  const auto load_grid = [grid](i64 off) { return to_float(grid[off]); };
  for (i64 n = 0; n < p.batch; ++n)
    for_each_point(p, [&](const i64 (&pos)[kAxes]) {
      const PointTaps<K> t = point_taps<K>(p, n, pos, false, load_grid);
      for (i64 c = 0; c < p.channels; ++c)
        y[p.y.offset(n, c, pos)] = from_float<T>(sample<K, 1>(p, t, n, c, load_x).v[0]);
    });
}

template <class T, int K>
void dx_typed(const Problem& p, const T* dy, const T* grid, T* dx) {
  const auto load_grid = [grid](i64 off) { return to_float(grid[off]); };
  std::vector<float> acc(std::size_t(p.in_plane()));
  for (i64 n = 0; n < p.batch; ++n)
    for (i64 c = 0; c < p.channels; ++c) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for_each_point(p, [&](const i64 (&pos)[kAxes]) {
        const PointTaps<K> t = point_taps<K>(p, n, pos, false, load_grid);
        const float g = to_float(dy[p.y.offset(n, c, pos)]);
        scatter(t, g, [&](i64 d, i64 h, i64 w, float v) { acc[std::size_t((d * p.in[1] + h) * p.in[2] + w)] += v; });
      });
      for (i64 d = 0; d < p.in[0]; ++d)
        for (i64 h = 0; h < p.in[1]; ++h)
          for (i64 w = 0; w < p.in[2]; ++w) {
            const i64 pos[kAxes] = {d, h, w};
            dx[p.dx.offset(n, c, pos)] = from_float<T>(acc[std::size_t((d * p.in[1] + h) * p.in[2] + w)]);
          }
    }
}

template <class T, int K>
void dgrid_typed(const Problem& p, const T* dy, const T* x, const T* grid, T* dgrid) {
  const auto load_x = [x](i64 off) { return to_float(x[off]); };
  const auto load_grid = [grid](i64 off) { return to_float(grid[off]); };
  for (i64 n = 0; n < p.batch; ++n)
    for_each_point(p, [&](const i64 (&pos)[kAxes]) {
      const PointTaps<K> t = point_taps<K>(p, n, pos, true, load_grid);
      float g[kAxes] = {0.0f, 0.0f, 0.0f};
      for (i64 c = 0; c < p.channels; ++c) grid_grad(p, t, n, c, to_float(dy[p.y.offset(n, c, pos)]), load_x, g);
      const i64 base = p.dgrid.offset(n, pos);
      store_grid_grad(p, t, g, [&](int k, float v) { dgrid[base + k * p.dgrid.k] = from_float<T>(v); });
    });
}

template <class F>
void dispatch(DType dtype, F&& f) {
  core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

}  // namespace

void forward_cpu(const Problem& p, const Tensor& x, const Tensor& grid, const Tensor& y) {
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_taps(p.mode, [&](auto taps) { forward_typed<T, decltype(taps)::value>(p, x.ptr<T>(), grid.ptr<T>(), y.ptr<T>()); });
  });
}

void backward_cpu(const Problem& p, const Tensor& dy, const Tensor& x, const Tensor& grid, const Tensor* dx,
                  const Tensor* dgrid) {
  dispatch(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_taps(p.mode, [&](auto taps) {
      constexpr int K = decltype(taps)::value;
      if (dx) dx_typed<T, K>(p, dy.ptr<T>(), grid.ptr<T>(), dx->ptr<T>());
      if (dgrid) dgrid_typed<T, K>(p, dy.ptr<T>(), x.ptr<T>(), grid.ptr<T>(), dgrid->ptr<T>());
    });
  });
}

}  // namespace rudnn::gs
