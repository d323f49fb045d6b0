// Bindings of the convolution family (rudnn._C.conv_*). Options arrive as per-axis lists of
// the spatial dims' length; layout 0 is channels-first, 1 channels-last; strategy codes are
// those of conv_args.hpp.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "conv_args.hpp"
#include "families.hpp"
#include "rudnn/conv.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

using Sizes = std::vector<std::int64_t>;

ConvOptions opts(const Sizes& stride, const Sizes& pad_before, const Sizes& pad_after, const Sizes& dilation,
                 std::int64_t groups, int layout, int strategy) {
  return conv_args::options(stride, pad_before, pad_after, dilation, groups, layout, strategy);
}

}  // namespace

void register_conv(nb::module_& m) {
  m.def(
      "conv_output_shape",
      [](const In& x, const In& w, const Sizes& stride, const Sizes& pad_before, const Sizes& pad_after,
         const Sizes& dilation, std::int64_t groups, int layout, int strategy) {
        ConvForwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.x = to_tensor(x, "x");
        a.w = to_tensor(w, "w");
        const ConvShape s = conv_output_shape(a);
        nb::list out;
        for (int d = 0; d < s.rank; ++d) out.append(s.dims[d]);
        return nb::tuple(out);
      },
      nb::arg("x"), nb::arg("w"), nb::arg("stride"), nb::arg("pad_before"), nb::arg("pad_after"),
      nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"));

  m.def(
      "conv_forward",
      [](const In& x, const In& w, const OptIn& bias, const Out& y, const Sizes& stride, const Sizes& pad_before,
         const Sizes& pad_after, const Sizes& dilation, std::int64_t groups, int layout, int strategy,
         std::uintptr_t stream) {
        std::optional<Tensor> keep;
        ConvForwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.x = to_tensor(x, "x");
        a.w = to_tensor(w, "w");
        a.bias = opt_tensor(bias, "bias", keep);
        a.y = to_tensor(y, "y");
        nb::gil_scoped_release release;
        conv_forward(a, nullptr, as_stream(stream));
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias").none(), nb::arg("y"), nb::arg("stride"), nb::arg("pad_before"),
      nb::arg("pad_after"), nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"),
      nb::arg("stream"));

  m.def(
      "conv_data_backward",
      [](const In& dy, const In& w, const Out& dx, const Sizes& stride, const Sizes& pad_before,
         const Sizes& pad_after, const Sizes& dilation, std::int64_t groups, int layout, int strategy,
         std::uintptr_t stream) {
        ConvDataBackwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.dy = to_tensor(dy, "dy");
        a.w = to_tensor(w, "w");
        a.dx = to_tensor(dx, "dx");
        nb::gil_scoped_release release;
        conv_data_backward(a, nullptr, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("w"), nb::arg("dx"), nb::arg("stride"), nb::arg("pad_before"), nb::arg("pad_after"),
      nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"), nb::arg("stream"));

  m.def(
      "conv_weight_backward",
      [](const In& dy, const In& x, const Out& dw, const Sizes& stride, const Sizes& pad_before,
         const Sizes& pad_after, const Sizes& dilation, std::int64_t groups, int layout, int strategy,
         std::uintptr_t stream) {
        ConvWeightBackwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.dy = to_tensor(dy, "dy");
        a.x = to_tensor(x, "x");
        a.dw = to_tensor(dw, "dw");
        nb::gil_scoped_release release;
        conv_weight_backward(a, nullptr, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("dw"), nb::arg("stride"), nb::arg("pad_before"), nb::arg("pad_after"),
      nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"), nb::arg("stream"));

  m.def(
      "conv_bias_backward",
      [](const In& dy, const Out& db, int dims, int layout, std::uintptr_t stream) {
        ConvBiasBackwardArgs a;
        a.dims = dims;
        a.layout = conv_args::layout(layout);
        a.dy = to_tensor(dy, "dy");
        a.db = to_tensor(db, "db");
        nb::gil_scoped_release release;
        conv_bias_backward(a, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("db"), nb::arg("dims"), nb::arg("layout"), nb::arg("stream"));

  m.def("conv_last_algorithm", [] { return std::string(conv_last_algorithm()); },
        "The algorithm of this thread's last conv call: 'cpu', 'direct' or 'none'.");
}

}  // namespace rudnn::bindings
