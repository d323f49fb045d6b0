// Bindings of the pooling family (rudnn._C.*pool*). Windows arrive as per-axis lists of
// one length (the spatial dims); layout 0 is channels-first, 1 channels-last.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "families.hpp"
#include "pooling_args.hpp"
#include "rudnn/pooling.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

using Sizes = std::vector<std::int64_t>;

nb::tuple shape_tuple(const PoolShape& s) {
  nb::list out;
  for (int d = 0; d < s.rank; ++d) out.append(s.dims[d]);
  return nb::tuple(out);
}

}  // namespace

void register_pooling(nb::module_& m) {
  m.def(
      "max_pool_output_shape",
      [](const In& x, const Sizes& kernel, const Sizes& stride, const Sizes& padding, const Sizes& dilation,
         bool ceil_mode, int layout) {
        MaxPoolArgs a;
        pooling_args::set_max_options(a, kernel, stride, padding, dilation, ceil_mode, layout);
        a.x = to_tensor(x, "x");
        return shape_tuple(max_pool_output_shape(a));
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding"), nb::arg("dilation"),
      nb::arg("ceil_mode"), nb::arg("layout"));

  m.def(
      "max_pool_forward",
      [](const In& x, const Out& y, const OptOut& indices, const Sizes& kernel, const Sizes& stride,
         const Sizes& padding, const Sizes& dilation, bool ceil_mode, int layout, std::uintptr_t stream) {
        std::optional<Tensor> keep;
        MaxPoolArgs a;
        pooling_args::set_max_options(a, kernel, stride, padding, dilation, ceil_mode, layout);
        a.x = to_tensor(x, "x");
        a.y = to_tensor(y, "y");
        a.indices = opt_tensor(indices, "indices", keep);
        nb::gil_scoped_release release;
        max_pool_forward(a, as_stream(stream));
      },
      nb::arg("x"), nb::arg("y"), nb::arg("indices").none(), nb::arg("kernel"), nb::arg("stride"),
      nb::arg("padding"), nb::arg("dilation"), nb::arg("ceil_mode"), nb::arg("layout"), nb::arg("stream"));

  m.def(
      "avg_pool_output_shape",
      [](const In& x, const Sizes& kernel, const Sizes& stride, const Sizes& padding, bool ceil_mode,
         bool count_include_pad, std::optional<std::int64_t> divisor_override, int layout) {
        AvgPoolArgs a;
        pooling_args::set_avg_options(a, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                                      layout);
        a.x = to_tensor(x, "x");
        return shape_tuple(avg_pool_output_shape(a));
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding"), nb::arg("ceil_mode"),
      nb::arg("count_include_pad"), nb::arg("divisor_override").none(), nb::arg("layout"));

  m.def(
      "avg_pool_forward",
      [](const In& x, const Out& y, const Sizes& kernel, const Sizes& stride, const Sizes& padding, bool ceil_mode,
         bool count_include_pad, std::optional<std::int64_t> divisor_override, int layout, std::uintptr_t stream) {
        AvgPoolArgs a;
        pooling_args::set_avg_options(a, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                                      layout);
        a.x = to_tensor(x, "x");
        a.y = to_tensor(y, "y");
        nb::gil_scoped_release release;
        avg_pool_forward(a, as_stream(stream));
      },
      nb::arg("x"), nb::arg("y"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding"), nb::arg("ceil_mode"),
      nb::arg("count_include_pad"), nb::arg("divisor_override").none(), nb::arg("layout"), nb::arg("stream"));

  m.def(
      "adaptive_pool_output_shape",
      [](int kind, const In& x, const Sizes& output_size, int layout) {
        AdaptivePoolArgs a = pooling_args::adaptive(kind, output_size, layout);
        a.x = to_tensor(x, "x");
        return shape_tuple(adaptive_pool_output_shape(a));
      },
      nb::arg("kind"), nb::arg("x"), nb::arg("output_size"), nb::arg("layout"));

  m.def(
      "adaptive_pool_forward",
      [](int kind, const In& x, const Out& y, const OptOut& indices, const Sizes& output_size, int layout,
         std::uintptr_t stream) {
        std::optional<Tensor> keep;
        AdaptivePoolArgs a = pooling_args::adaptive(kind, output_size, layout);
        a.x = to_tensor(x, "x");
        a.y = to_tensor(y, "y");
        a.indices = opt_tensor(indices, "indices", keep);
        nb::gil_scoped_release release;
        adaptive_pool_forward(a, as_stream(stream));
      },
      nb::arg("kind"), nb::arg("x"), nb::arg("y"), nb::arg("indices").none(), nb::arg("output_size"),
      nb::arg("layout"), nb::arg("stream"));

  m.def(
      "max_pool_backward",
      [](const In& dy, const In& x, const In& indices, const Out& dx, const Sizes& kernel, const Sizes& stride,
         const Sizes& padding, const Sizes& dilation, bool ceil_mode, int layout, std::uintptr_t stream) {
        MaxPoolBackwardArgs a;
        pooling_args::set_max_options(a, kernel, stride, padding, dilation, ceil_mode, layout);
        a.dy = to_tensor(dy, "dy");
        a.x = to_tensor(x, "x");
        a.indices = to_tensor(indices, "indices");
        a.dx = to_tensor(dx, "dx");
        nb::gil_scoped_release release;
        max_pool_backward(a, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("indices"), nb::arg("dx"), nb::arg("kernel"), nb::arg("stride"),
      nb::arg("padding"), nb::arg("dilation"), nb::arg("ceil_mode"), nb::arg("layout"), nb::arg("stream"));

  m.def(
      "avg_pool_backward",
      [](const In& dy, const Out& dx, const Sizes& kernel, const Sizes& stride, const Sizes& padding, bool ceil_mode,
         bool count_include_pad, std::optional<std::int64_t> divisor_override, int layout, std::uintptr_t stream) {
        AvgPoolBackwardArgs a;
        pooling_args::set_avg_options(a, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                                      layout);
        a.dy = to_tensor(dy, "dy");
        a.dx = to_tensor(dx, "dx");
        nb::gil_scoped_release release;
        avg_pool_backward(a, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("dx"), nb::arg("kernel"), nb::arg("stride"), nb::arg("padding"), nb::arg("ceil_mode"),
      nb::arg("count_include_pad"), nb::arg("divisor_override").none(), nb::arg("layout"), nb::arg("stream"));

  m.def(
      "adaptive_pool_backward",
      [](int kind, const In& dy, const OptIn& x, const OptIn& indices, const Out& dx, int dims, int layout,
         std::uintptr_t stream) {
        std::optional<Tensor> keep[2];
        AdaptivePoolBackwardArgs a;
        a.kind = pooling_args::adaptive_kind(kind);
        a.dims = dims;
        a.layout = pooling_args::layout(layout);
        a.dy = to_tensor(dy, "dy");
        a.x = opt_tensor(x, "x", keep[0]);
        a.indices = opt_tensor(indices, "indices", keep[1]);
        a.dx = to_tensor(dx, "dx");
        nb::gil_scoped_release release;
        adaptive_pool_backward(a, as_stream(stream));
      },
      nb::arg("kind"), nb::arg("dy"), nb::arg("x").none(), nb::arg("indices").none(), nb::arg("dx"), nb::arg("dims"),
      nb::arg("layout"), nb::arg("stream"));
}

}  // namespace rudnn::bindings
