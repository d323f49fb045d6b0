// Bindings of the pooling family (rudnn._C.*pool*). Windows arrive as per-axis lists of
// one length (the spatial dims); layout 0 is channels-first, 1 channels-last.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "families.hpp"
#include "rudnn/pooling.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

using Sizes = std::vector<std::int64_t>;

PoolLayout as_layout(int layout) { return layout == 1 ? PoolLayout::channels_last : PoolLayout::channels_first; }
AdaptivePoolKind as_adaptive(int kind) { return kind == 1 ? AdaptivePoolKind::max : AdaptivePoolKind::avg; }

// The Python layer gives every list the same length, the spatial dims. A length outside 1..3
// is copied as nothing: libruDNN's validation then reports the dims.
void copy_sizes(const Sizes& from, std::int64_t (&to)[kMaxPoolDims]) {
  if (from.size() > std::size_t(kMaxPoolDims)) return;
  for (std::size_t i = 0; i < from.size(); ++i) to[i] = from[i];
}

PoolWindow window(const Sizes& kernel, const Sizes& stride, const Sizes& padding, const Sizes& dilation,
                  bool ceil_mode) {
  if (stride.size() != kernel.size() || padding.size() != kernel.size() || dilation.size() != kernel.size())
    throw Error(ErrorKind::value, "pooling: internal: kernel, stride, padding and dilation differ in length");
  PoolWindow w;
  w.dims = int(kernel.size());
  copy_sizes(kernel, w.kernel);
  copy_sizes(stride, w.stride);
  copy_sizes(padding, w.padding);
  copy_sizes(dilation, w.dilation);
  w.ceil_mode = ceil_mode;
  return w;
}

AvgPoolDivisor divisor(bool count_include_pad, std::optional<std::int64_t> divisor_override) {
  AvgPoolDivisor d;
  d.count_include_pad = count_include_pad;
  d.has_divisor_override = divisor_override.has_value();
  d.divisor_override = divisor_override.value_or(0);
  return d;
}

nb::tuple shape_tuple(const PoolShape& s) {
  nb::list out;
  for (int d = 0; d < s.rank; ++d) out.append(s.dims[d]);
  return nb::tuple(out);
}

AdaptivePoolArgs adaptive_args(int kind, const Sizes& output_size, int layout) {
  AdaptivePoolArgs a;
  a.kind = as_adaptive(kind);
  a.dims = int(output_size.size());
  copy_sizes(output_size, a.output_size);
  a.layout = as_layout(layout);
  return a;
}

}  // namespace

void register_pooling(nb::module_& m) {
  m.def(
      "max_pool_output_shape",
      [](const In& x, const Sizes& kernel, const Sizes& stride, const Sizes& padding, const Sizes& dilation,
         bool ceil_mode, int layout) {
        MaxPoolArgs a;
        a.window = window(kernel, stride, padding, dilation, ceil_mode);
        a.layout = as_layout(layout);
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
        a.window = window(kernel, stride, padding, dilation, ceil_mode);
        a.layout = as_layout(layout);
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
        a.window = window(kernel, stride, padding, Sizes(kernel.size(), 1), ceil_mode);
        a.divisor = divisor(count_include_pad, divisor_override);
        a.layout = as_layout(layout);
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
        a.window = window(kernel, stride, padding, Sizes(kernel.size(), 1), ceil_mode);
        a.divisor = divisor(count_include_pad, divisor_override);
        a.layout = as_layout(layout);
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
        AdaptivePoolArgs a = adaptive_args(kind, output_size, layout);
        a.x = to_tensor(x, "x");
        return shape_tuple(adaptive_pool_output_shape(a));
      },
      nb::arg("kind"), nb::arg("x"), nb::arg("output_size"), nb::arg("layout"));

  m.def(
      "adaptive_pool_forward",
      [](int kind, const In& x, const Out& y, const OptOut& indices, const Sizes& output_size, int layout,
         std::uintptr_t stream) {
        std::optional<Tensor> keep;
        AdaptivePoolArgs a = adaptive_args(kind, output_size, layout);
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
        a.window = window(kernel, stride, padding, dilation, ceil_mode);
        a.layout = as_layout(layout);
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
        a.window = window(kernel, stride, padding, Sizes(kernel.size(), 1), ceil_mode);
        a.divisor = divisor(count_include_pad, divisor_override);
        a.layout = as_layout(layout);
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
        a.kind = as_adaptive(kind);
        a.dims = dims;
        a.layout = as_layout(layout);
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
