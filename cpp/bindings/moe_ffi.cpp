// XLA FFI handlers of the MoE family and their trace-time validation.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets):
//   rudnn_moe_route                     (logits) -> (indices u32, weights)  [top_k: i32, renormalize]
//   rudnn_moe_route_sigmoid_grouped     (logits, [bias]) -> (indices, weights)
//                                       [top_k, groups, selected_groups: i32, group_top_two, renormalize,
//                                        has_bias: bool, scale: f32]
//   rudnn_moe_selected_router_weights   (logits, indices) -> weights f32   [scoring: i32, renormalize, scale]
//   rudnn_moe_selected_router_backward  (logits, indices, grad) -> dlogits [scoring, renormalize, scale]
//   rudnn_moe_dispatch                  (x, indices) -> (x_dispatched, offsets, token_of_row, row_of_slot)
//                                       [num_experts: i32]
//   rudnn_moe_combine                   (y, row_of_slot, [weights]) -> out  [has_weights: bool]
//   rudnn_moe_combine_backward          (y, dout, row_of_slot, weights) -> (dy, dweights) [strategy: i32]
//   rudnn_moe_experts_forward           (x, offsets, gate, up, down) -> (y, gate_pre, up_pre) [strategy]
//   rudnn_moe_experts_inference         (x, offsets, gate, up, down, [gate_up]) -> y [strategy, has_gate_up]
//   rudnn_moe_interleave_gate_up        (gate, up) -> gate_up
//   rudnn_moe_experts_backward          (dy, x, offsets, gate, up, down, gate_pre, up_pre)
//                                       -> (dx, dgate, dup, ddown) [strategy]
// CUDA workspaces come from XLA's scratch allocator.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "moe/problem.hpp"
#include "rudnn/moe.hpp"

namespace rudnn::jax_ffi {

namespace {

using B = ffi::AnyBuffer;
using R = ffi::Result<ffi::AnyBuffer>;

ffi::Error route(const Place& place, B logits, R indices, R weights, std::int32_t top_k, bool renormalize) {
  return guarded([&] {
    MoeRouteArgs a;
    a.logits = view(logits, place, "moe.route: logits");
    a.top_k = top_k;
    a.renormalize = renormalize;
    a.expert_indices = view(*indices, place, "moe.route: expert_indices");
    a.weights = view(*weights, place, "moe.route: weights");
    moe_route(a, place.stream);
  });
}

ffi::Error route_sigmoid_grouped(const Place& place, B logits, ffi::RemainingArgs rest, R indices, R weights,
                                 std::int32_t top_k, std::int32_t groups, std::int32_t selected_groups,
                                 bool group_top_two, bool renormalize, bool has_bias, float scale) {
  return guarded([&] {
    const char* op = "moe.route_sigmoid_grouped";
    MoeRouteSigmoidGroupedArgs a;
    a.logits = view(logits, place, std::string(op) + ": logits");
    Tensor bias;
    Inputs in(rest, place, op);
    if (has_bias) a.bias = &(bias = in.next("bias"));
    in.finish();
    a.top_k = top_k;
    a.groups = groups;
    a.selected_groups = selected_groups;
    a.group_top_two = group_top_two;
    a.renormalize = renormalize;
    a.scale = scale;
    a.expert_indices = view(*indices, place, std::string(op) + ": expert_indices");
    a.weights = view(*weights, place, std::string(op) + ": weights");
    moe_route_sigmoid_grouped(a, place.stream);
  });
}

ffi::Error selected_router(const Place& place, B logits, B indices, R weights, std::int32_t scoring, bool renormalize,
                           float scale) {
  return guarded([&] {
    MoeSelectedRouterArgs a;
    a.logits = view(logits, place, "moe.selected_router_weights: logits");
    a.indices = view(indices, place, "moe.selected_router_weights: indices");
    a.scoring = static_cast<MoeScoring>(scoring);
    a.renormalize = renormalize;
    a.scale = scale;
    a.weights = view(*weights, place, "moe.selected_router_weights: weights");
    moe_selected_router_weights(a, place.stream);
  });
}

ffi::Error selected_router_backward(const Place& place, B logits, B indices, B grad, R dlogits, std::int32_t scoring,
                                    bool renormalize, float scale) {
  return guarded([&] {
    MoeSelectedRouterBackwardArgs a;
    a.logits = view(logits, place, "moe.selected_router_backward: logits");
    a.indices = view(indices, place, "moe.selected_router_backward: indices");
    a.grad_weights = view(grad, place, "moe.selected_router_backward: grad_weights");
    a.scoring = static_cast<MoeScoring>(scoring);
    a.renormalize = renormalize;
    a.scale = scale;
    a.dlogits = view(*dlogits, place, "moe.selected_router_backward: dlogits");
    moe_selected_router_backward(a, place.stream);
  });
}

ffi::Error dispatch(const Place& place, B x, B indices, R x_dispatched, R offsets, R token_of_row, R row_of_slot,
                    std::int32_t num_experts) {
  return guarded([&] {
    const std::string op = "moe.dispatch";
    MoeDispatchPlanArgs a;
    a.expert_indices = view(indices, place, op + ": expert_indices");
    a.num_experts = num_experts;
    a.offsets = view(*offsets, place, op + ": offsets");
    a.token_of_row = view(*token_of_row, place, op + ": token_of_row");
    a.row_of_slot = view(*row_of_slot, place, op + ": row_of_slot");
    Tensor ws;
    a.workspace = scratch_workspace(place, moe_dispatch_plan_workspace_bytes(a), ws, op);
    moe_dispatch_plan(a, place.stream);
    moe_gather_rows(view(x, place, op + ": x"), a.token_of_row, view(*x_dispatched, place, op + ": x_dispatched"),
                    place.stream);
  });
}

ffi::Error combine(const Place& place, B y, B row_of_slot, ffi::RemainingArgs rest, R out, bool has_weights) {
  return guarded([&] {
    const char* op = has_weights ? "moe.combine" : "moe.dispatch_backward";
    MoeCombineArgs a;
    a.y = view(y, place, std::string(op) + ": y");
    a.row_of_slot = view(row_of_slot, place, std::string(op) + ": row_of_slot");
    Tensor weights;
    Inputs in(rest, place, op);
    if (has_weights) a.weights = &(weights = in.next("weights"));
    in.finish();
    a.out = view(*out, place, std::string(op) + ": out");
    moe_combine(a, place.stream);
  });
}

ffi::Error combine_backward(const Place& place, B y, B dout, B row_of_slot, B weights, R dy, R dweights,
                            std::int32_t strategy) {
  return guarded([&] {
    const std::string op = "moe.combine_backward";
    MoeCombineBackwardArgs a;
    a.y = view(y, place, op + ": y");
    a.dout = view(dout, place, op + ": dout");
    a.row_of_slot = view(row_of_slot, place, op + ": row_of_slot");
    a.weights = view(weights, place, op + ": weights");
    a.dy = view(*dy, place, op + ": dy");
    a.dweights = view(*dweights, place, op + ": dweights");
    a.strategy = static_cast<MoeCombineBackwardStrategy>(strategy);
    moe_combine_backward(a, place.stream);
  });
}

// The dispatched rows and the weights, which every experts call reads, and its strategy.
template <class Args>
void set_experts_inputs(Args& a, const Place& place, const std::string& op, B x, B offsets, B gate, B up, B down,
                        std::int32_t strategy) {
  a.x = view(x, place, op + ": x");
  a.offsets = view(offsets, place, op + ": offsets");
  a.gate = view(gate, place, op + ": gate");
  a.up = view(up, place, op + ": up");
  a.down = view(down, place, op + ": down");
  a.strategy = static_cast<MoeExpertsStrategy>(strategy);
}

// The arguments both experts forwards share.
MoeExpertsForwardArgs experts_args(const Place& place, const std::string& op, B x, B offsets, B gate, B up, B down,
                                   R y, std::int32_t strategy) {
  MoeExpertsForwardArgs a;
  set_experts_inputs(a, place, op, x, offsets, gate, up, down, strategy);
  a.y = view(*y, place, op + ": y");
  return a;
}

// Runs an experts forward with its workspace from XLA's scratch memory.
void run_experts_forward(MoeExpertsForwardArgs& a, const Place& place, const std::string& op) {
  Tensor ws;
  a.workspace = scratch_workspace(place, moe_experts_forward_workspace_bytes(a), ws, op);
  moe_experts_forward(a, place.stream);
}

ffi::Error experts_forward(const Place& place, B x, B offsets, B gate, B up, B down, R y, R gate_pre, R up_pre,
                           std::int32_t strategy) {
  return guarded([&] {
    const std::string op = "SwiGluExperts.forward_dispatched_training";
    MoeExpertsForwardArgs a = experts_args(place, op, x, offsets, gate, up, down, y, strategy);
    Tensor a_pre = view(*gate_pre, place, op + ": gate_pre"), b_pre = view(*up_pre, place, op + ": up_pre");
    a.gate_pre = &a_pre;
    a.up_pre = &b_pre;
    run_experts_forward(a, place, op);
  });
}

// The forward without the pre-activations (nothing kept for a backward): with gate_up, the sm90
// tensor-core path runs the fused gate/up GEMM.
ffi::Error experts_inference(const Place& place, B x, B offsets, B gate, B up, B down, ffi::RemainingArgs rest, R y,
                             std::int32_t strategy, bool has_gate_up) {
  return guarded([&] {
    const std::string op = "SwiGluExperts.forward_dispatched";
    MoeExpertsForwardArgs a = experts_args(place, op, x, offsets, gate, up, down, y, strategy);
    Tensor gate_up;
    Inputs in(rest, place, op.c_str());
    if (has_gate_up) a.gate_up = &(gate_up = in.next("gate_up"));
    in.finish();
    run_experts_forward(a, place, op);
  });
}

ffi::Error interleave_gate_up(const Place& place, B gate, B up, R gate_up) {
  return guarded([&] {
    const std::string op = "moe.interleave_gate_up";
    moe_interleave_gate_up(view(gate, place, op + ": gate"), view(up, place, op + ": up"),
                           view(*gate_up, place, op + ": gate_up"), place.stream);
  });
}

ffi::Error experts_backward(const Place& place, B dy, B x, B offsets, B gate, B up, B down, B gate_pre, B up_pre,
                            R dx, R dgate, R dup, R ddown, std::int32_t strategy) {
  return guarded([&] {
    const std::string op = "MoeTrainingCache.backward";
    MoeExpertsBackwardArgs a;
    set_experts_inputs(a, place, op, x, offsets, gate, up, down, strategy);
    a.dy = view(dy, place, op + ": dy");
    a.gate_pre = view(gate_pre, place, op + ": gate_pre");
    a.up_pre = view(up_pre, place, op + ": up_pre");
    a.dx = view(*dx, place, op + ": dx");
    a.dgate = view(*dgate, place, op + ": dgate");
    a.dup = view(*dup, place, op + ": dup");
    a.ddown = view(*ddown, place, op + ": ddown");
    Tensor ws;
    a.workspace = scratch_workspace(place, moe_experts_backward_workspace_bytes(a), ws, op);
    moe_experts_backward(a, place.stream);
  });
}

template <class Bd>
auto bind_route(Bd&& b) {
  return std::forward<Bd>(b).template Arg<B>().template Ret<B>().template Ret<B>().template Attr<std::int32_t>(
      "top_k").template Attr<bool>("renormalize");
}
template <class Bd>
auto bind_route_sigmoid_grouped(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .RemainingArgs()
      .template Ret<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("top_k")
      .template Attr<std::int32_t>("groups")
      .template Attr<std::int32_t>("selected_groups")
      .template Attr<bool>("group_top_two")
      .template Attr<bool>("renormalize")
      .template Attr<bool>("has_bias")
      .template Attr<float>("scale");
}
template <class Bd>
auto bind_selected_router(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .template Arg<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("scoring")
      .template Attr<bool>("renormalize")
      .template Attr<float>("scale");
}
template <class Bd>
auto bind_selected_router_backward(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("scoring")
      .template Attr<bool>("renormalize")
      .template Attr<float>("scale");
}
template <class Bd>
auto bind_dispatch(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .template Arg<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("num_experts");
}
template <class Bd>
auto bind_combine(Bd&& b) {
  return std::forward<Bd>(b).template Arg<B>().template Arg<B>().RemainingArgs().template Ret<B>().template Attr<bool>(
      "has_weights");
}
template <class Bd>
auto bind_combine_backward(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("strategy");
}
template <class Bd>
auto bind_experts_forward(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("strategy");
}
template <class Bd>
auto bind_experts_inference(Bd&& b) {
  return buffers<5, 0>(std::forward<Bd>(b))
      .RemainingArgs()
      .template Ret<B>()
      .template Attr<std::int32_t>("strategy")
      .template Attr<bool>("has_gate_up");
}
template <class Bd>
auto bind_interleave_gate_up(Bd&& b) {
  return buffers<2, 1>(std::forward<Bd>(b));
}
template <class Bd>
auto bind_experts_backward(Bd&& b) {
  return std::forward<Bd>(b)
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Arg<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Ret<B>()
      .template Attr<std::int32_t>("strategy");
}

#define RUDNN_MOE_HANDLERS(name)                                                              \
  RUDNN_FFI_HANDLER(moe_##name##_cpu, bind_##name(cpu_binding()), on_cpu, name)              \
  RUDNN_FFI_HANDLER(moe_##name##_cuda, bind_##name(cuda_binding()), on_cuda, name)

RUDNN_MOE_HANDLERS(route)
RUDNN_MOE_HANDLERS(route_sigmoid_grouped)
RUDNN_MOE_HANDLERS(selected_router)
RUDNN_MOE_HANDLERS(selected_router_backward)
RUDNN_MOE_HANDLERS(dispatch)
RUDNN_MOE_HANDLERS(combine)
RUDNN_MOE_HANDLERS(combine_backward)
RUDNN_MOE_HANDLERS(experts_forward)
RUDNN_MOE_HANDLERS(experts_inference)
RUDNN_MOE_HANDLERS(interleave_gate_up)
RUDNN_MOE_HANDLERS(experts_backward)

#undef RUDNN_MOE_HANDLERS

}  // namespace

void add_moe_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
#define RUDNN_MOE_TARGET(target, name)             \
  cpu[target] = capsule(moe_##name##_cpu);         \
  cuda[target] = capsule(moe_##name##_cuda);
  RUDNN_MOE_TARGET("rudnn_moe_route", route)
  RUDNN_MOE_TARGET("rudnn_moe_route_sigmoid_grouped", route_sigmoid_grouped)
  RUDNN_MOE_TARGET("rudnn_moe_selected_router_weights", selected_router)
  RUDNN_MOE_TARGET("rudnn_moe_selected_router_backward", selected_router_backward)
  RUDNN_MOE_TARGET("rudnn_moe_dispatch", dispatch)
  RUDNN_MOE_TARGET("rudnn_moe_combine", combine)
  RUDNN_MOE_TARGET("rudnn_moe_combine_backward", combine_backward)
  RUDNN_MOE_TARGET("rudnn_moe_experts_forward", experts_forward)
  RUDNN_MOE_TARGET("rudnn_moe_experts_inference", experts_inference)
  RUDNN_MOE_TARGET("rudnn_moe_interleave_gate_up", interleave_gate_up)
  RUDNN_MOE_TARGET("rudnn_moe_experts_backward", experts_backward)
#undef RUDNN_MOE_TARGET
}

namespace {

// Trace-time validation: the C++ checks on (shape, dtype name) specs, so that a bad call
// raises the rudnn exception at jax.jit trace time rather than inside XLA.
Tensor spec_or_like(const std::optional<Spec>& s, const std::string& name) {
  return abstract(*s, name);
}

void validate_route(const Spec& logits, int top_k) {
  MoeRouteArgs a;
  a.logits = abstract(logits, "moe.route: logits");
  a.top_k = top_k;
  const std::int64_t shape[2] = {a.logits.rank > 0 ? a.logits.shape[0] : 0, top_k};
  a.expert_indices = Tensor::contiguous(placeholder_data(), DType::u32, a.logits.device, shape, 2);
  a.weights = Tensor::contiguous(placeholder_data(), a.logits.dtype, a.logits.device, shape, 2);
  moe::validate_route(a);
}

void validate_route_sigmoid_grouped(const Spec& logits, const std::optional<Spec>& bias, int top_k, int groups,
                                    int selected_groups, bool group_top_two, double scale) {
  MoeRouteSigmoidGroupedArgs a;
  a.logits = abstract(logits, "moe.route_sigmoid_grouped: logits");
  Tensor b;
  if (bias) a.bias = &(b = spec_or_like(bias, "moe.route_sigmoid_grouped: bias"));
  a.top_k = top_k;
  a.groups = groups;
  a.selected_groups = selected_groups;
  a.group_top_two = group_top_two;
  a.scale = float(scale);
  const std::int64_t shape[2] = {a.logits.rank > 0 ? a.logits.shape[0] : 0, top_k};
  a.expert_indices = Tensor::contiguous(placeholder_data(), DType::u32, a.logits.device, shape, 2);
  a.weights = Tensor::contiguous(placeholder_data(), a.logits.dtype, a.logits.device, shape, 2);
  moe::validate_route_sigmoid_grouped(a);
}

void validate_selected_router(const Spec& logits, const Spec& indices, const std::optional<Spec>& grad, double scale) {
  const Tensor l = abstract(logits, "moe.selected_router_weights: logits");
  const Tensor i = abstract(indices, "moe.selected_router_weights: indices");
  if (!grad) {
    MoeSelectedRouterArgs a;
    a.logits = l;
    a.indices = i;
    a.scale = float(scale);
    const std::int64_t shape[2] = {i.rank == 2 ? i.shape[0] : 0, i.rank == 2 ? i.shape[1] : 0};
    a.weights = Tensor::contiguous(placeholder_data(), DType::f32, l.device, shape, 2);
    moe::validate_selected_router(a);
    return;
  }
  MoeSelectedRouterBackwardArgs a;
  a.logits = l;
  a.indices = i;
  a.grad_weights = abstract(*grad, "moe.selected_router_backward: grad_weights");
  a.scale = float(scale);
  a.dlogits = abstract_like(l);
  moe::validate_selected_router_backward(a);
}

void validate_experts(const Spec& x, const Spec& gate, const Spec& up, const Spec& down,
                      const std::optional<Spec>& gate_up) {
  MoeExpertsForwardArgs a;
  a.x = abstract(x, "SwiGluExperts.forward_dispatched: x");
  a.gate = abstract(gate, "SwiGluExperts.forward_dispatched: gate");
  a.up = abstract(up, "SwiGluExperts.forward_dispatched: up");
  a.down = abstract(down, "SwiGluExperts.forward_dispatched: down");
  Tensor g;
  if (gate_up) a.gate_up = &(g = spec_or_like(gate_up, "SwiGluExperts.forward_dispatched: gate_up"));
  const std::int64_t experts = a.gate.rank == 3 ? a.gate.shape[0] + 1 : 1;
  a.offsets = Tensor::contiguous(placeholder_data(), DType::i32, a.x.device, &experts, 1);
  a.y = abstract_like(a.x);
  moe::validate_experts_forward(a, /*read_offsets=*/false);
}

void validate_interleave_gate_up(const Spec& gate, const Spec& up) {
  const Tensor g = abstract(gate, "moe.interleave_gate_up: gate"), u = abstract(up, "moe.interleave_gate_up: up");
  const std::vector<std::int64_t> shape =
      g.rank == 3 ? std::vector<std::int64_t>{g.shape[0], 2 * g.shape[1], g.shape[2]} : std::vector<std::int64_t>{0};
  const Tensor gate_up = Tensor::contiguous(placeholder_data(), g.dtype, g.device, shape.data(), int(shape.size()));
  moe::validate_interleave_gate_up(g, u, gate_up);
}

}  // namespace

void add_moe_validation(nb::module_& m) {
  m.def("jax_validate_moe_route", &validate_route, nb::arg("logits"), nb::arg("top_k"));
  m.def("jax_validate_moe_route_sigmoid_grouped", &validate_route_sigmoid_grouped, nb::arg("logits"),
        nb::arg("bias").none(), nb::arg("top_k"), nb::arg("groups"), nb::arg("selected_groups"),
        nb::arg("group_top_two"), nb::arg("scale"));
  m.def("jax_validate_moe_selected_router", &validate_selected_router, nb::arg("logits"), nb::arg("indices"),
        nb::arg("grad").none(), nb::arg("scale"));
  m.def("jax_validate_moe_experts", &validate_experts, nb::arg("x"), nb::arg("gate"), nb::arg("up"), nb::arg("down"),
        nb::arg("gate_up").none() = nb::none());
  m.def("jax_validate_moe_interleave_gate_up", &validate_interleave_gate_up, nb::arg("gate"), nb::arg("up"));
}

}  // namespace rudnn::jax_ffi
