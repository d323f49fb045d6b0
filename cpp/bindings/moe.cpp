// Bindings of the MoE family (rudnn._C.moe_*). Enums travel as ints, in the order of
// their C++ declarations.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "families.hpp"
#include "rudnn/moe.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

MoeExpertsBackwardArgs experts_backward_args(const In& dy, const In& x, const In& offsets, const In& gate,
                                             const In& up, const In& down, const In& gate_pre, const In& up_pre,
                                             const Out& dx, const Out& dgate, const Out& dup, const Out& ddown,
                                             int strategy) {
  MoeExpertsBackwardArgs a;
  a.dy = to_tensor(dy, "dy");
  a.x = to_tensor(x, "x");
  a.offsets = to_tensor(offsets, "offsets");
  a.gate = to_tensor(gate, "gate");
  a.up = to_tensor(up, "up");
  a.down = to_tensor(down, "down");
  a.gate_pre = to_tensor(gate_pre, "gate_pre");
  a.up_pre = to_tensor(up_pre, "up_pre");
  a.dx = to_tensor(dx, "dx");
  a.dgate = to_tensor(dgate, "dgate");
  a.dup = to_tensor(dup, "dup");
  a.ddown = to_tensor(ddown, "ddown");
  a.strategy = static_cast<MoeExpertsStrategy>(strategy);
  return a;
}

MoeExpertsForwardArgs experts_forward_args(const In& x, const In& offsets, const In& gate, const In& up,
                                           const In& down, const Out& y, const OptOut& gate_pre,
                                           const OptOut& up_pre, const OptIn& gate_up, int strategy,
                                           std::optional<Tensor> (&keep)[4]) {
  MoeExpertsForwardArgs a;
  a.x = to_tensor(x, "x");
  a.offsets = to_tensor(offsets, "offsets");
  a.gate = to_tensor(gate, "gate");
  a.up = to_tensor(up, "up");
  a.down = to_tensor(down, "down");
  a.y = to_tensor(y, "y");
  a.gate_pre = opt_tensor(gate_pre, "gate_pre", keep[0]);
  a.up_pre = opt_tensor(up_pre, "up_pre", keep[1]);
  a.gate_up = opt_tensor(gate_up, "gate_up", keep[3]);
  a.strategy = static_cast<MoeExpertsStrategy>(strategy);
  return a;
}

MoeDispatchPlanArgs plan_args(const In& indices, int num_experts, const Out& offsets, const Out& token_of_row,
                              const Out& row_of_slot) {
  MoeDispatchPlanArgs a;
  a.expert_indices = to_tensor(indices, "expert_indices");
  a.num_experts = num_experts;
  a.offsets = to_tensor(offsets, "offsets");
  a.token_of_row = to_tensor(token_of_row, "token_of_row");
  a.row_of_slot = to_tensor(row_of_slot, "row_of_slot");
  return a;
}

}  // namespace

void register_moe(nb::module_& m) {
  m.def("moe_last_algorithm", [] { return std::string(moe_last_algorithm()); },
        "What the last experts forward or backward on this thread ran: cpu, scalar or tensor_core.");

  m.def(
      "moe_route",
      [](const In& logits, int top_k, bool renormalize, const Out& indices, const Out& weights, std::uintptr_t s) {
        MoeRouteArgs a;
        a.logits = to_tensor(logits, "logits");
        a.top_k = top_k;
        a.renormalize = renormalize;
        a.expert_indices = to_tensor(indices, "expert_indices");
        a.weights = to_tensor(weights, "weights");
        nb::gil_scoped_release release;
        moe_route(a, as_stream(s));
      },
      nb::arg("logits"), nb::arg("top_k"), nb::arg("renormalize"), nb::arg("expert_indices"), nb::arg("weights"),
      nb::arg("stream"));

  m.def(
      "moe_route_sigmoid_grouped",
      [](const In& logits, const OptIn& bias, int top_k, int groups, int selected_groups, bool group_top_two,
         bool renormalize, float scale, const Out& indices, const Out& weights, std::uintptr_t s) {
        std::optional<Tensor> keep;
        MoeRouteSigmoidGroupedArgs a;
        a.logits = to_tensor(logits, "logits");
        a.bias = opt_tensor(bias, "bias", keep);
        a.top_k = top_k;
        a.groups = groups;
        a.selected_groups = selected_groups;
        a.group_top_two = group_top_two;
        a.renormalize = renormalize;
        a.scale = scale;
        a.expert_indices = to_tensor(indices, "expert_indices");
        a.weights = to_tensor(weights, "weights");
        nb::gil_scoped_release release;
        moe_route_sigmoid_grouped(a, as_stream(s));
      },
      nb::arg("logits"), nb::arg("bias").none(), nb::arg("top_k"), nb::arg("groups"), nb::arg("selected_groups"),
      nb::arg("group_top_two"), nb::arg("renormalize"), nb::arg("scale"), nb::arg("expert_indices"),
      nb::arg("weights"), nb::arg("stream"));

  m.def(
      "moe_dispatch_plan",
      [](const In& indices, int num_experts, const Out& offsets, const Out& token_of_row, const Out& row_of_slot,
         const OptOut& workspace, std::uintptr_t s, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep;
        std::optional<Out> held;
        MoeDispatchPlanArgs a = plan_args(indices, num_experts, offsets, token_of_row, row_of_slot);
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return moe_dispatch_plan_workspace_bytes(a); },
                                     held, keep);
        nb::gil_scoped_release release;
        moe_dispatch_plan(a, as_stream(s));
      },
      nb::arg("expert_indices"), nb::arg("num_experts"), nb::arg("offsets"), nb::arg("token_of_row"),
      nb::arg("row_of_slot"), nb::arg("workspace").none(), nb::arg("stream"),
      nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "moe_gather_rows",
      [](const In& x, const In& token_of_row, const Out& out, std::uintptr_t s) {
        const Tensor tx = to_tensor(x, "x"), tt = to_tensor(token_of_row, "token_of_row"), to = to_tensor(out, "out");
        nb::gil_scoped_release release;
        moe_gather_rows(tx, tt, to, as_stream(s));
      },
      nb::arg("x"), nb::arg("token_of_row"), nb::arg("out"), nb::arg("stream"));

  m.def(
      "moe_combine",
      [](const In& y, const In& row_of_slot, const OptIn& weights, const Out& out, std::uintptr_t s) {
        std::optional<Tensor> keep;
        MoeCombineArgs a;
        a.y = to_tensor(y, "y");
        a.row_of_slot = to_tensor(row_of_slot, "row_of_slot");
        a.weights = opt_tensor(weights, "weights", keep);
        a.out = to_tensor(out, "out");
        nb::gil_scoped_release release;
        moe_combine(a, as_stream(s));
      },
      nb::arg("y"), nb::arg("row_of_slot"), nb::arg("weights").none(), nb::arg("out"), nb::arg("stream"));

  m.def(
      "moe_combine_backward",
      [](const In& y, const In& dout, const In& row_of_slot, const In& weights, const Out& dy, const Out& dweights,
         int strategy, std::uintptr_t s) {
        MoeCombineBackwardArgs a;
        a.y = to_tensor(y, "y");
        a.dout = to_tensor(dout, "dout");
        a.row_of_slot = to_tensor(row_of_slot, "row_of_slot");
        a.weights = to_tensor(weights, "weights");
        a.dy = to_tensor(dy, "dy");
        a.dweights = to_tensor(dweights, "dweights");
        a.strategy = static_cast<MoeCombineBackwardStrategy>(strategy);
        nb::gil_scoped_release release;
        moe_combine_backward(a, as_stream(s));
      },
      nb::arg("y"), nb::arg("dout"), nb::arg("row_of_slot"), nb::arg("weights"), nb::arg("dy"), nb::arg("dweights"),
      nb::arg("strategy"), nb::arg("stream"));

  m.def(
      "moe_experts_forward",
      [](const In& x, const In& offsets, const In& gate, const In& up, const In& down, const Out& y,
         const OptOut& gate_pre, const OptOut& up_pre, int strategy, const OptOut& workspace, std::uintptr_t s,
         const nb::object& workspace_alloc, const OptIn& gate_up) {
        std::optional<Tensor> keep[4];
        std::optional<Out> held;
        MoeExpertsForwardArgs a =
            experts_forward_args(x, offsets, gate, up, down, y, gate_pre, up_pre, gate_up, strategy, keep);
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return moe_experts_forward_workspace_bytes(a); },
                                     held, keep[2]);
        nb::gil_scoped_release release;
        moe_experts_forward(a, as_stream(s));
      },
      nb::arg("x"), nb::arg("offsets"), nb::arg("gate"), nb::arg("up"), nb::arg("down"), nb::arg("y"),
      nb::arg("gate_pre").none(), nb::arg("up_pre").none(), nb::arg("strategy"), nb::arg("workspace").none(),
      nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none(), nb::arg("gate_up").none() = nb::none());

  m.def(
      "moe_layer_forward",
      [](const In& x, const In& logits, int top_k, bool renormalize, const In& gate, const In& up, const In& down,
         const OptIn& gate_up, int strategy, const Out& out, const OptOut& workspace, std::uintptr_t s,
         const nb::object& workspace_alloc, bool sigmoid_grouped, const OptIn& bias, int groups, int selected_groups,
         bool group_top_two, float scale) {
        std::optional<Tensor> keep[3];
        std::optional<Out> held;
        MoeLayerArgs a;
        a.x = to_tensor(x, "x");
        a.logits = to_tensor(logits, "logits");
        a.top_k = top_k;
        a.renormalize = renormalize;
        a.gate = to_tensor(gate, "gate");
        a.up = to_tensor(up, "up");
        a.down = to_tensor(down, "down");
        a.gate_up = opt_tensor(gate_up, "gate_up", keep[0]);
        a.strategy = static_cast<MoeExpertsStrategy>(strategy);
        a.out = to_tensor(out, "out");
        a.sigmoid_grouped = sigmoid_grouped;
        a.bias = opt_tensor(bias, "bias", keep[2]);
        a.groups = groups;
        a.selected_groups = selected_groups;
        a.group_top_two = group_top_two;
        a.scale = scale;
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return moe_layer_forward_workspace_bytes(a); },
                                     held, keep[1]);
        nb::gil_scoped_release release;
        moe_layer_forward(a, as_stream(s));
      },
      nb::arg("x"), nb::arg("logits"), nb::arg("top_k"), nb::arg("renormalize"), nb::arg("gate"), nb::arg("up"),
      nb::arg("down"), nb::arg("gate_up").none(), nb::arg("strategy"), nb::arg("out"), nb::arg("workspace").none(),
      nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none(), nb::arg("sigmoid_grouped") = false,
      nb::arg("bias").none() = nb::none(), nb::arg("groups") = 1, nb::arg("selected_groups") = 1,
      nb::arg("group_top_two") = true, nb::arg("scale") = 1.0f);

  m.def(
      "moe_interleave_gate_up",
      [](const In& gate, const In& up, const Out& gate_up, std::uintptr_t s) {
        const Tensor tg = to_tensor(gate, "gate"), tu = to_tensor(up, "up"), to = to_tensor(gate_up, "gate_up");
        nb::gil_scoped_release release;
        moe_interleave_gate_up(tg, tu, to, as_stream(s));
      },
      nb::arg("gate"), nb::arg("up"), nb::arg("gate_up"), nb::arg("stream"));
  m.attr("moe_gate_up_block") = kMoeGateUpBlock;  // rows of gate, then of up, per block of gate_up

  m.def(
      "moe_experts_backward",
      [](const In& dy, const In& x, const In& offsets, const In& gate, const In& up, const In& down,
         const In& gate_pre, const In& up_pre, const Out& dx, const Out& dgate, const Out& dup, const Out& ddown,
         int strategy, const OptOut& workspace, std::uintptr_t s, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep;
        std::optional<Out> held;
        MoeExpertsBackwardArgs a =
            experts_backward_args(dy, x, offsets, gate, up, down, gate_pre, up_pre, dx, dgate, dup, ddown, strategy);
        a.workspace = workspace_from(workspace, workspace_alloc,
                                     [&] { return moe_experts_backward_workspace_bytes(a); }, held, keep);
        nb::gil_scoped_release release;
        moe_experts_backward(a, as_stream(s));
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("offsets"), nb::arg("gate"), nb::arg("up"), nb::arg("down"),
      nb::arg("gate_pre"), nb::arg("up_pre"), nb::arg("dx"), nb::arg("dgate"), nb::arg("dup"), nb::arg("ddown"),
      nb::arg("strategy"), nb::arg("workspace").none(), nb::arg("stream"),
      nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "moe_selected_router_weights",
      [](const In& logits, const In& indices, int scoring, bool renormalize, float scale, const Out& weights,
         std::uintptr_t s) {
        MoeSelectedRouterArgs a;
        a.logits = to_tensor(logits, "logits");
        a.indices = to_tensor(indices, "indices");
        a.scoring = static_cast<MoeScoring>(scoring);
        a.renormalize = renormalize;
        a.scale = scale;
        a.weights = to_tensor(weights, "weights");
        nb::gil_scoped_release release;
        moe_selected_router_weights(a, as_stream(s));
      },
      nb::arg("logits"), nb::arg("indices"), nb::arg("scoring"), nb::arg("renormalize"), nb::arg("scale"),
      nb::arg("weights"), nb::arg("stream"));

  m.def(
      "moe_selected_router_backward",
      [](const In& logits, const In& indices, const In& grad_weights, int scoring, bool renormalize, float scale,
         const Out& dlogits, std::uintptr_t s) {
        MoeSelectedRouterBackwardArgs a;
        a.logits = to_tensor(logits, "logits");
        a.indices = to_tensor(indices, "indices");
        a.grad_weights = to_tensor(grad_weights, "grad_weights");
        a.scoring = static_cast<MoeScoring>(scoring);
        a.renormalize = renormalize;
        a.scale = scale;
        a.dlogits = to_tensor(dlogits, "dlogits");
        nb::gil_scoped_release release;
        moe_selected_router_backward(a, as_stream(s));
      },
      nb::arg("logits"), nb::arg("indices"), nb::arg("grad_weights"), nb::arg("scoring"), nb::arg("renormalize"),
      nb::arg("scale"), nb::arg("dlogits"), nb::arg("stream"));
}

}  // namespace rudnn::bindings
