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

#include "conv/implicit_gemm.hpp"
#include "conv/problem.hpp"
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
         std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep, ws_slot;
        std::optional<Out> held;
        ConvForwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.x = to_tensor(x, "x");
        a.w = to_tensor(w, "w");
        a.bias = opt_tensor(bias, "bias", keep);
        a.y = to_tensor(y, "y");
        const Tensor* ws = workspace_from(OptOut{}, workspace_alloc, [&] { return conv_forward_workspace_bytes(a); },
                                          held, ws_slot);
        nb::gil_scoped_release release;
        conv_forward(a, ws, as_stream(stream));
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias").none(), nb::arg("y"), nb::arg("stride"), nb::arg("pad_before"),
      nb::arg("pad_after"), nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"),
      nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "conv_data_backward",
      [](const In& dy, const In& w, const Out& dx, const Sizes& stride, const Sizes& pad_before,
         const Sizes& pad_after, const Sizes& dilation, std::int64_t groups, int layout, int strategy,
         std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> ws_slot;
        std::optional<Out> held;
        ConvDataBackwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.dy = to_tensor(dy, "dy");
        a.w = to_tensor(w, "w");
        a.dx = to_tensor(dx, "dx");
        const Tensor* ws = workspace_from(
            OptOut{}, workspace_alloc, [&] { return conv_data_backward_workspace_bytes(a); }, held, ws_slot);
        nb::gil_scoped_release release;
        conv_data_backward(a, ws, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("w"), nb::arg("dx"), nb::arg("stride"), nb::arg("pad_before"), nb::arg("pad_after"),
      nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"), nb::arg("stream"),
      nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "conv_weight_backward",
      [](const In& dy, const In& x, const Out& dw, const Sizes& stride, const Sizes& pad_before,
         const Sizes& pad_after, const Sizes& dilation, std::int64_t groups, int layout, int strategy,
         std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> ws_slot;
        std::optional<Out> held;
        ConvWeightBackwardArgs a;
        a.options = opts(stride, pad_before, pad_after, dilation, groups, layout, strategy);
        a.dy = to_tensor(dy, "dy");
        a.x = to_tensor(x, "x");
        a.dw = to_tensor(dw, "dw");
        const Tensor* ws = workspace_from(
            OptOut{}, workspace_alloc, [&] { return conv_weight_backward_workspace_bytes(a); }, held, ws_slot);
        nb::gil_scoped_release release;
        conv_weight_backward(a, ws, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("dw"), nb::arg("stride"), nb::arg("pad_before"), nb::arg("pad_after"),
      nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"), nb::arg("strategy"), nb::arg("stream"),
      nb::arg("workspace_alloc").none() = nb::none());

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
        "The algorithm of this thread's last conv call: 'cpu', 'direct', 'direct_packed', 'implicit_gemm_sm80', "
        "'implicit_gemm_sm90' or 'none'.");

  // Debug: the implicit-GEMM plan (conv/implicit_gemm.hpp) of a call as it would be made on a
  // device of compute capability cc_major.cc_minor, for the CPU tests of the dispatch decisions.
  // op 0: (a, b, out, bias) = (x, w, y, bias); 1: (dy, w, dx); 2: (dy, x, dw). Returns (algorithm,
  // why not, workspace bytes, (copy x, copy w, copy y, copy bias)).
  m.def(
      "_conv_plan",
      [](int op, const In& a, const In& b, const Out& out, const OptIn& bias, const Sizes& stride,
         const Sizes& pad_before, const Sizes& pad_after, const Sizes& dilation, std::int64_t groups, int layout,
         int cc_major, int cc_minor) {
        const ConvOptions o = opts(stride, pad_before, pad_after, dilation, groups, layout, 0);
        conv::Problem p;
        conv::ig::Bases bases;
        conv::Op which = conv::Op::forward;
        std::optional<Tensor> keep;
        const Tensor ta = to_tensor(a, "a"), tb = to_tensor(b, "b"), tout = to_tensor(out, "out");
        if (op == 0) {
          ConvForwardArgs f{o, ta, tb, opt_tensor(bias, "bias", keep), tout};
          p = conv::validate_forward(f);
          bases = {ta.data, tout.data, tb.data, f.bias ? f.bias->data : nullptr};
        } else if (op == 1) {
          which = conv::Op::data_backward;
          p = conv::validate_data_backward(ConvDataBackwardArgs{o, ta, tb, tout});
          bases = {tout.data, ta.data, tb.data, nullptr};
        } else {
          which = conv::Op::weight_backward;
          p = conv::validate_weight_backward(ConvWeightBackwardArgs{o, ta, tb, tout});
          bases = {tb.data, ta.data, tout.data, nullptr};
        }
        const conv::ig::Plan plan = conv::ig::plan(p, which, ta.dtype, cc_major, cc_minor, bases);
        return nb::make_tuple(std::string(plan.name()), plan.why, plan.workspace_bytes,
                              nb::make_tuple(plan.copy_x, plan.copy_w, plan.copy_y, plan.copy_bias));
      },
      nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("out"), nb::arg("bias").none(), nb::arg("stride"),
      nb::arg("pad_before"), nb::arg("pad_after"), nb::arg("dilation"), nb::arg("groups"), nb::arg("layout"),
      nb::arg("cc_major"), nb::arg("cc_minor"));
}

}  // namespace rudnn::bindings
