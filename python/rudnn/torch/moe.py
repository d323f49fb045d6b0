"""rudnn.moe as torch.library custom ops: fake (meta) implementations for torch.compile and
autograd through the rudnn backward kernels.

The eager API of rudnn.moe passes plan objects around; here route returns the same RoutingPlan
(it unpacks as (expert_indices, weights)) and the other steps are functions of tensors so that
autograd can see them:

    plan = route(logits, top_k)                               # a RoutingPlan (no gradient)
    weights = selected_router_weights(logits, plan.expert_indices)    # differentiable in logits
    xd, offsets, token_of_row, row_of_slot = dispatch(x, plan)  # differentiable in x
    yd = swiglu_experts(xd, offsets, gate, up, down)          # differentiable in all four
                                                              # (no_grad + gate_up=: fused on Hopper)
    out = combine(yd, row_of_slot, weights)                   # differentiable in yd, weights

`moe_layer` / `moe_layer_sigmoid_grouped` run the whole chain.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from .._args import flag, float32_number, integer
from .. import moe as _moe

_SCORING = _moe._SCORINGS
_STRATEGY = _moe._EXPERTS_STRATEGIES
_PLANE = _moe._COMBINE_STRATEGIES["plane"]


# ---- routing ----------------------------------------------------------------------------------

@custom_op("rudnn::moe_route", mutates_args=())
def _route(logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    plan = _moe.route(logits, top_k, renormalize)
    return plan.expert_indices, plan.weights


@_route.register_fake
def _(logits, top_k, renormalize):
    T = logits.shape[0]
    return logits.new_empty((T, top_k), dtype=torch.uint32), logits.new_empty((T, top_k))


@custom_op("rudnn::moe_route_sigmoid_grouped", mutates_args=())
def _route_sigmoid_grouped(logits: Tensor, bias: Optional[Tensor], top_k: int, groups: int, selected_groups: int,
                           group_top_two: bool, renormalize: bool, scale: float) -> tuple[Tensor, Tensor]:
    plan = _moe.route_sigmoid_grouped(logits, bias, top_k=top_k, groups=groups, selected_groups=selected_groups,
                                      group_top_two=group_top_two, renormalize=renormalize, scale=scale)
    return plan.expert_indices, plan.weights


@_route_sigmoid_grouped.register_fake
def _(logits, bias, top_k, groups, selected_groups, group_top_two, renormalize, scale):
    T = logits.shape[0]
    return logits.new_empty((T, top_k), dtype=torch.uint32), logits.new_empty((T, top_k))


def route(logits, top_k, renormalize=True):
    """Softmax top-k routing: a rudnn.moe.RoutingPlan (it unpacks as (expert_indices uint32 [T, k],
    weights [T, k])); no gradient (selected_router_weights gives differentiable weights)."""
    k, renormalize = integer("moe.route", "top_k", top_k), flag("moe.route", "renormalize", renormalize)
    indices, weights = _route(logits, k, renormalize)
    return _moe.RoutingPlan(indices, weights, logits.shape[1], scoring="softmax", renormalize=renormalize, scale=1.0)


def route_sigmoid_grouped(logits, bias=None, *, top_k, groups, selected_groups, group_top_two=True, renormalize=True,
                          scale=1.0):
    """DeepSeek-V3 grouped sigmoid routing: a rudnn.moe.RoutingPlan (it unpacks as
    (expert_indices, weights)); no gradient."""
    op = "moe.route_sigmoid_grouped"
    renormalize, scale = flag(op, "renormalize", renormalize), float32_number(op, "scale", scale, "a finite value > 0")
    indices, weights = _route_sigmoid_grouped(logits, bias, integer(op, "top_k", top_k), integer(op, "groups", groups),
                                              integer(op, "selected_groups", selected_groups),
                                              flag(op, "group_top_two", group_top_two), renormalize, scale)
    return _moe.RoutingPlan(indices, weights, logits.shape[1], scoring="sigmoid", renormalize=renormalize, scale=scale)


# ---- differentiable router weights --------------------------------------------------------------

@custom_op("rudnn::moe_selected_router_weights", mutates_args=())
def _selected_router_weights(logits: Tensor, indices: Tensor, scoring: int, renormalize: bool,
                             scale: float) -> Tensor:
    name = {v: k for k, v in _SCORING.items()}[scoring]
    return _moe.selected_router_weights(logits, indices, name, renormalize, scale)


@_selected_router_weights.register_fake
def _(logits, indices, scoring, renormalize, scale):
    return logits.new_empty(tuple(indices.shape), dtype=torch.float32)


@custom_op("rudnn::moe_selected_router_backward", mutates_args=())
def _selected_router_backward(logits: Tensor, indices: Tensor, grad_weights: Tensor, scoring: int, renormalize: bool,
                              scale: float) -> Tensor:
    name = {v: k for k, v in _SCORING.items()}[scoring]
    return _moe.selected_router_backward(logits, indices, grad_weights, name, renormalize, scale)


@_selected_router_backward.register_fake
def _(logits, indices, grad_weights, scoring, renormalize, scale):
    return torch.empty_like(logits)


def _srw_setup(ctx, inputs, output):
    logits, indices, scoring, renormalize, scale = inputs
    ctx.save_for_backward(logits, indices)
    ctx.options = (scoring, renormalize, scale)


def _srw_backward(ctx, grad):
    logits, indices = ctx.saved_tensors
    return _selected_router_backward(logits, indices, grad.contiguous(), *ctx.options), None, None, None, None


torch.library.register_autograd("rudnn::moe_selected_router_weights", _srw_backward, setup_context=_srw_setup)


def selected_router_weights(logits, indices, scoring="softmax", renormalize=True, scale=1.0):
    """float32 [T, k] weights of the chosen experts, differentiable in logits."""
    code = _moe._choice(_SCORING, scoring, "moe.selected_router_weights", "scoring")
    op = "moe.selected_router_weights"
    return _selected_router_weights(logits, indices, code, flag(op, "renormalize", renormalize),
                                    float32_number(op, "scale", scale, "a finite value > 0"))


def selected_router_backward(logits, indices, grad_weights, scoring="softmax", renormalize=True, scale=1.0):
    """rudnn.moe.selected_router_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    code = _moe._choice(_SCORING, scoring, "moe.selected_router_backward", "scoring")
    op = "moe.selected_router_backward"
    return _selected_router_backward(logits, indices, grad_weights, code, flag(op, "renormalize", renormalize),
                                     float32_number(op, "scale", scale, "a finite value > 0"))


# ---- dispatch and combine ---------------------------------------------------------------------

@custom_op("rudnn::moe_dispatch_plan", mutates_args=())
def _dispatch_plan(indices: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    from .. import _frameworks as fw

    return _moe._dispatch_plan(fw.Call("moe.dispatch", {"expert_indices": indices}), indices, num_experts)


@_dispatch_plan.register_fake
def _(indices, num_experts):
    T, k = indices.shape
    i32 = torch.int32
    return (indices.new_empty((num_experts + 1,), dtype=i32), indices.new_empty((T * k,), dtype=i32),
            indices.new_empty((T, k), dtype=i32))


@custom_op("rudnn::moe_gather_rows", mutates_args=())
def _gather_rows(x: Tensor, token_of_row: Tensor, row_of_slot: Tensor) -> Tensor:
    from .. import _frameworks as fw

    return _moe._gather(fw.Call("moe.dispatch", {"x": x, "token_of_row": token_of_row}), x, token_of_row)


@_gather_rows.register_fake
def _(x, token_of_row, row_of_slot):
    return x.new_empty((token_of_row.shape[0], x.shape[1]))


@custom_op("rudnn::moe_dispatch_backward", mutates_args=())
def _dispatch_backward(dx_dispatched: Tensor, row_of_slot: Tensor) -> Tensor:
    return _moe._combine("moe.dispatch_backward", dx_dispatched, row_of_slot, None, int(row_of_slot.shape[0]), None)


@_dispatch_backward.register_fake
def _(dx_dispatched, row_of_slot):
    return dx_dispatched.new_empty((row_of_slot.shape[0], dx_dispatched.shape[1]))


def _gather_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _gather_backward(ctx, grad):
    (row_of_slot,) = ctx.saved_tensors
    return _dispatch_backward(grad.contiguous(), row_of_slot), None, None


torch.library.register_autograd("rudnn::moe_gather_rows", _gather_backward, setup_context=_gather_setup)


def dispatch(x, expert_indices, num_experts=None):
    """(x_dispatched [T*k, H], offsets [E+1], token_of_row [T*k], row_of_slot [T, k]);
    x_dispatched is differentiable in x. `expert_indices` may be a RoutingPlan (route's result),
    which brings num_experts. Expert ids outside [0, E): as rudnn.moe.RoutingPlan.dispatch says
    (an ArgumentError for host ids; for device ids no row, a NaN token)."""
    expert_indices, num_experts = _moe._indices_and_experts("moe.dispatch", expert_indices, num_experts)
    offsets, token_of_row, row_of_slot = _dispatch_plan(expert_indices, num_experts)
    return _gather_rows(x, token_of_row, row_of_slot), offsets, token_of_row, row_of_slot


@custom_op("rudnn::moe_combine", mutates_args=())
def _combine(y: Tensor, row_of_slot: Tensor, weights: Tensor) -> Tensor:
    return _moe._combine("moe.combine", y, row_of_slot, weights, int(row_of_slot.shape[0]), None)


@_combine.register_fake
def _(y, row_of_slot, weights):
    return y.new_empty((row_of_slot.shape[0], y.shape[1]))


@custom_op("rudnn::moe_combine_backward", mutates_args=())
def _combine_backward(y: Tensor, dout: Tensor, row_of_slot: Tensor, weights: Tensor,
                      strategy: int) -> tuple[Tensor, Tensor]:
    return _moe._combine_backward(y, dout, row_of_slot, weights, strategy, None)


@_combine_backward.register_fake
def _(y, dout, row_of_slot, weights, strategy):
    return torch.empty_like(y), y.new_empty(tuple(row_of_slot.shape), dtype=torch.float32)


def _combine_setup(ctx, inputs, output):
    y, row_of_slot, weights = inputs
    ctx.save_for_backward(y, row_of_slot, weights)


def _combine_autograd(ctx, dout):
    y, row_of_slot, weights = ctx.saved_tensors
    dy, dweights = _combine_backward(y, dout.contiguous(), row_of_slot, weights, _PLANE)
    return dy, None, dweights.to(weights.dtype)


torch.library.register_autograd("rudnn::moe_combine", _combine_autograd, setup_context=_combine_setup)


def combine(y, row_of_slot, weights):
    """out[t] = sum_j weights[t, j] * y[row_of_slot[t, j]]; differentiable in y and weights (as
    rudnn.moe.DispatchedTokens.combine: a slot of no row makes its token NaN; its backward takes
    each row named by one slot at most)."""
    return _combine(y, row_of_slot, weights)


# ---- SwiGLU experts ---------------------------------------------------------------------------

@custom_op("rudnn::moe_experts", mutates_args=())
def _experts(x: Tensor, offsets: Tensor, gate: Tensor, up: Tensor, down: Tensor,
             strategy: int) -> tuple[Tensor, Tensor, Tensor]:
    """(y, a, b): the outputs and the gate/up pre-activations kept for the backward."""
    return _moe._experts_forward("SwiGluExperts.forward_dispatched_training", gate, up, down, x, offsets, strategy,
                                 True, None)


@_experts.register_fake
def _(x, offsets, gate, up, down, strategy):
    inter = (x.shape[0], gate.shape[1])
    return torch.empty_like(x), x.new_empty(inter), x.new_empty(inter)


@custom_op("rudnn::moe_experts_backward", mutates_args=())
def _experts_backward(dy: Tensor, x: Tensor, offsets: Tensor, gate: Tensor, up: Tensor, down: Tensor,
                      gate_pre: Tensor, up_pre: Tensor, strategy: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _moe._experts_backward(gate, up, down, dy, x, offsets, gate_pre, up_pre, strategy, None)


@_experts_backward.register_fake
def _(dy, x, offsets, gate, up, down, gate_pre, up_pre, strategy):
    f32 = torch.float32
    return (torch.empty_like(x), gate.new_empty(gate.shape, dtype=f32), up.new_empty(up.shape, dtype=f32),
            down.new_empty(down.shape, dtype=f32))


def _experts_setup(ctx, inputs, output):
    x, offsets, gate, up, down, strategy = inputs
    _, gate_pre, up_pre = output
    ctx.save_for_backward(x, offsets, gate, up, down, gate_pre, up_pre)
    ctx.strategy = strategy
    ctx.mark_non_differentiable(gate_pre, up_pre)


def _experts_autograd(ctx, dy, dgate_pre, dup_pre):
    x, offsets, gate, up, down, gate_pre, up_pre = ctx.saved_tensors
    dx, dgate, dup, ddown = _experts_backward(dy.contiguous(), x, offsets, gate, up, down, gate_pre, up_pre,
                                              ctx.strategy)
    return dx, None, dgate.to(gate.dtype), dup.to(up.dtype), ddown.to(down.dtype), None


torch.library.register_autograd("rudnn::moe_experts", _experts_autograd, setup_context=_experts_setup)


@custom_op("rudnn::moe_experts_inference", mutates_args=())
def _experts_inference(x: Tensor, offsets: Tensor, gate: Tensor, up: Tensor, down: Tensor,
                       gate_up: Optional[Tensor], strategy: int) -> Tensor:
    """y alone (no a, b kept for a backward); Hopper's tensor_core forward runs gate/up as one GEMM
    with SwiGLU in its epilogue where gate_up (rudnn.moe.interleave_gate_up(gate, up)) is given."""
    return _moe._experts_forward("SwiGluExperts.forward_dispatched", gate, up, down, x, offsets, strategy, False, None,
                                 gate_up)


@_experts_inference.register_fake
def _(x, offsets, gate, up, down, gate_up, strategy):
    return torch.empty_like(x)


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def swiglu_experts(x_dispatched, offsets, gate, up, down, strategy="auto", *, gate_up=None):
    """Expert outputs [N, H] of the dispatched rows; differentiable in x_dispatched and the
    weights (weight gradients are computed in float32 and returned in the weights' dtype).
    Where no gradient is needed (no_grad, or no input requires one) the inference forward runs:
    nothing is kept for a backward, and gate_up (rudnn.moe.interleave_gate_up(gate, up), made once)
    lets Hopper's tensor_core forward fuse the SwiGLU into the gate/up GEMM. With gradients gate_up
    is not used (the backward needs the pre-activations)."""
    code = _moe._choice(_STRATEGY, strategy, "SwiGluExperts.forward_dispatched", "strategy")
    if not _needs_grad(x_dispatched, gate, up, down):
        return _experts_inference(x_dispatched, offsets, gate, up, down, gate_up, code)
    return _experts(x_dispatched, offsets, gate, up, down, code)[0]


# ---- whole layers -----------------------------------------------------------------------------

def _layer(x, logits, gate, up, down, indices, scoring, renormalize, scale, strategy, gate_up):
    weights = selected_router_weights(logits, indices, scoring, renormalize, scale)
    xd, offsets, _, row_of_slot = dispatch(x, indices, gate.shape[0])
    yd = swiglu_experts(xd, offsets, gate, up, down, strategy, gate_up=gate_up)
    return combine(yd, row_of_slot, weights)


def moe_layer(x, logits, gate, up, down, *, top_k, renormalize=True, strategy="auto", gate_up=None):
    """route -> dispatch -> SwiGLU experts -> combine, differentiable in x, logits (through the
    selected experts' weights), gate, up and down. Output [T, H] in x's dtype. gate_up: see
    swiglu_experts (used where no gradient is needed)."""
    indices, _ = route(logits, top_k, renormalize)
    return _layer(x, logits, gate, up, down, indices, "softmax", renormalize, 1.0, strategy, gate_up)


def moe_layer_sigmoid_grouped(x, logits, gate, up, down, bias=None, *, top_k, groups, selected_groups,
                              group_top_two=True, renormalize=True, scale=1.0, strategy="auto", gate_up=None):
    """Like moe_layer with DeepSeek-V3 grouped sigmoid routing (the bias gets no gradient)."""
    indices, _ = route_sigmoid_grouped(logits, bias, top_k=top_k, groups=groups, selected_groups=selected_groups,
                                       group_top_two=group_top_two, renormalize=renormalize, scale=scale)
    return _layer(x, logits, gate, up, down, indices, "sigmoid", renormalize, scale, strategy, gate_up)


# ---- the backward steps as functions, as rudnn.jax.moe has them (one API shape across the three) --

def dispatch_backward(dx_dispatched, row_of_slot):
    """Gradient of dispatch: dx[t] = sum_j dx_dispatched[row_of_slot[t, j]], [T, H]."""
    return _dispatch_backward(dx_dispatched, row_of_slot)


def combine_backward(y, dout, row_of_slot, weights, strategy="plane"):
    """Gradients of combine: (dy [N, H] in y's dtype, dweights float32 [T, k]); see
    rudnn.moe.DispatchedTokens.combine_backward (a host row_of_slot naming a row twice is an
    ArgumentError)."""
    code = _moe._choice(_moe._COMBINE_STRATEGIES, strategy, "moe.combine_backward", "strategy")
    return _combine_backward(y, dout, row_of_slot, weights, code)


def swiglu_experts_training(x_dispatched, offsets, gate, up, down, strategy="auto"):
    """(y, a, b): the expert outputs and the gate/up pre-activations swiglu_experts_backward needs."""
    code = _moe._choice(_STRATEGY, strategy, "SwiGluExperts.forward_dispatched_training", "strategy")
    return _experts(x_dispatched, offsets, gate, up, down, code)


def swiglu_experts_backward(dy, x_dispatched, offsets, gate, up, down, gate_pre, up_pre, strategy="auto"):
    """(dx_dispatched, dgate, dup, ddown) of the SwiGLU experts; weight gradients float32."""
    code = _moe._choice(_STRATEGY, strategy, "MoeTrainingCache.backward", "strategy")
    return _experts_backward(dy, x_dispatched, offsets, gate, up, down, gate_pre, up_pre, code)


__all__ = ["route", "route_sigmoid_grouped", "selected_router_weights", "selected_router_backward", "dispatch",
           "dispatch_backward", "combine", "combine_backward", "swiglu_experts", "swiglu_experts_training",
           "swiglu_experts_backward", "moe_layer", "moe_layer_sigmoid_grouped"]
