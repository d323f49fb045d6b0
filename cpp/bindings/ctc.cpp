// Bindings of the CTC family (rudnn._C.ctc_*). reduction: 0 none, 1 mean, 2 sum.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "families.hpp"
#include "rudnn/ctc.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

CtcOptions options(std::int64_t blank, int reduction, bool zero_infinity) {
  CtcOptions o;
  o.blank = blank;
  o.reduction = reduction == 0 ? CtcReduction::none : reduction == 2 ? CtcReduction::sum : CtcReduction::mean;
  o.zero_infinity = zero_infinity;
  return o;
}

// The inputs common to the forward and the backward args.
template <class Args>
void set_inputs(Args& a, const In& log_probs, const In& targets, const In& input_lengths, const In& target_lengths,
                std::int64_t blank, int reduction, bool zero_infinity) {
  a.options = options(blank, reduction, zero_infinity);
  a.log_probs = to_tensor(log_probs, "log_probs");
  a.targets = to_tensor(targets, "targets");
  a.input_lengths = to_tensor(input_lengths, "input_lengths");
  a.target_lengths = to_tensor(target_lengths, "target_lengths");
}

}  // namespace

void register_ctc(nb::module_& m) {
  m.def(
      "ctc_loss_forward",
      [](const In& log_probs, const In& targets, const In& input_lengths, const In& target_lengths, const Out& loss,
         const OptOut& workspace, std::int64_t blank, int reduction, bool zero_infinity, std::uintptr_t stream,
         const nb::object& workspace_alloc) {
        std::optional<Tensor> keep;
        std::optional<Out> held;
        CtcLossArgs a;
        set_inputs(a, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity);
        a.loss = to_tensor(loss, "loss");
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return ctc_loss_workspace_bytes(a); }, held, keep);
        nb::gil_scoped_release release;
        ctc_loss_forward(a, as_stream(stream));
      },
      nb::arg("log_probs"), nb::arg("targets"), nb::arg("input_lengths"), nb::arg("target_lengths"), nb::arg("loss"),
      nb::arg("workspace").none(), nb::arg("blank"), nb::arg("reduction"), nb::arg("zero_infinity"),
      nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "ctc_loss_backward",
      [](const In& dloss, const In& log_probs, const In& targets, const In& input_lengths, const In& target_lengths,
         const Out& dlog_probs, const OptOut& workspace, std::int64_t blank, int reduction, bool zero_infinity,
         std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep;
        std::optional<Out> held;
        CtcLossBackwardArgs a;
        set_inputs(a, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity);
        a.dloss = to_tensor(dloss, "dloss");
        a.dlog_probs = to_tensor(dlog_probs, "dlog_probs");
        a.workspace =
            workspace_from(workspace, workspace_alloc, [&] { return ctc_loss_backward_workspace_bytes(a); }, held, keep);
        nb::gil_scoped_release release;
        ctc_loss_backward(a, as_stream(stream));
      },
      nb::arg("dloss"), nb::arg("log_probs"), nb::arg("targets"), nb::arg("input_lengths"), nb::arg("target_lengths"),
      nb::arg("dlog_probs"), nb::arg("workspace").none(), nb::arg("blank"), nb::arg("reduction"),
      nb::arg("zero_infinity"), nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());
}

}  // namespace rudnn::bindings
