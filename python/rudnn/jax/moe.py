"""rudnn.moe for JAX: the MoE steps as XLA FFI custom calls (cpu and CUDA), differentiable with
custom_vjp, usable under jax.jit and jax.grad (vmap runs sequentially).

The eager rudnn.moe API passes plan objects around; here, as in rudnn.torch.moe, route returns
the same RoutingPlan (a pytree; it unpacks as (expert_indices, weights)) and the other steps are
functions of arrays:

    plan = route(logits, top_k)                                # a RoutingPlan (no gradient)
    weights = selected_router_weights(logits, plan.expert_indices)     # differentiable in logits
    xd, offsets, token_of_row, row_of_slot = dispatch(x, plan)  # differentiable in x
    yd = swiglu_experts(xd, offsets, gate, up, down)           # differentiable in all four
    # gate_up=rudnn.moe.interleave_gate_up(gate, up): the sm90 fused gate/up forward where no gradient is taken
    out = combine(yd, row_of_slot, weights)                    # differentiable in yd, weights
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._args import flag, integer
from .. import _C
from ..moe import _COMBINE_STRATEGIES, _EXPERTS_STRATEGIES, _SCORINGS, RoutingPlan, _choice, _indices_and_experts
from . import _ffi


# A RoutingPlan of JAX arrays crosses jax.jit boundaries: its arrays are the leaves, its options static.
jax.tree_util.register_pytree_node(
    RoutingPlan,
    lambda p: ((p.expert_indices, p.weights, p.logits), (p.num_experts, p.scoring, p.renormalize, p.scale)),
    lambda aux, leaves: RoutingPlan(leaves[0], leaves[1], aux[0], scoring=aux[1], renormalize=aux[2], scale=aux[3],
                                    logits=leaves[2]))

__all__ = ["route", "route_sigmoid_grouped", "selected_router_weights", "selected_router_backward", "dispatch",
           "dispatch_backward", "combine", "combine_backward", "swiglu_experts", "swiglu_experts_training",
           "swiglu_experts_backward", "moe_layer", "moe_layer_sigmoid_grouped"]

_SEQ = "sequential"  # vmap: one call per batch element


def _ready(op, **arrays):
    _ffi.ensure_ready(op)
    return [_ffi.array(a, op, name, required=True) for name, a in arrays.items()]


# ---- routing ----------------------------------------------------------------------------------

@_ffi.raises_rudnn_errors
def route(logits, top_k, renormalize=True):
    """Softmax top-k routing: (expert_indices uint32 [T, k], weights [T, k]); no gradient."""
    (logits,) = _ready("moe.route", logits=logits)
    k, renormalize = integer("moe.route", "top_k", top_k), flag("moe.route", "renormalize", renormalize)
    _C.jax_validate_moe_route(_ffi.spec(logits), k)
    shape = (logits.shape[0], k)
    logits = jax.lax.stop_gradient(logits)  # the selection gets no gradient
    indices, weights = jax.ffi.ffi_call("rudnn_moe_route", (_ffi.sds(shape, jnp.uint32), _ffi.sds(shape, logits.dtype)),
                                        vmap_method=_SEQ)(logits, top_k=np.int32(k), renormalize=bool(renormalize))
    return RoutingPlan(indices, weights, logits.shape[1], scoring="softmax", renormalize=renormalize, scale=1.0)


@_ffi.raises_rudnn_errors
def route_sigmoid_grouped(logits, bias=None, *, top_k, groups, selected_groups, group_top_two=True, renormalize=True,
                          scale=1.0):
    """DeepSeek-V3 grouped sigmoid routing: (expert_indices, weights); no gradient."""
    op = "moe.route_sigmoid_grouped"
    (logits,) = _ready(op, logits=logits)
    bias = _ffi.array(bias, op, "bias")
    k, scale = integer(op, "top_k", top_k), _ffi.static_float(scale, op, "scale")
    groups, selected_groups = integer(op, "groups", groups), integer(op, "selected_groups", selected_groups)
    group_top_two, renormalize = flag(op, "group_top_two", group_top_two), flag(op, "renormalize", renormalize)
    _C.jax_validate_moe_route_sigmoid_grouped(_ffi.spec(logits), _ffi.spec(bias), k, int(groups), int(selected_groups),
                                              bool(group_top_two), scale)
    shape = (logits.shape[0], k)
    logits = jax.lax.stop_gradient(logits)  # neither the selection nor the bias gets a gradient
    bias = None if bias is None else jax.lax.stop_gradient(bias)
    call = jax.ffi.ffi_call("rudnn_moe_route_sigmoid_grouped",
                            (_ffi.sds(shape, jnp.uint32), _ffi.sds(shape, logits.dtype)), vmap_method=_SEQ)
    indices, weights = call(logits, *_ffi.present(bias), top_k=np.int32(k), groups=np.int32(groups),
                            selected_groups=np.int32(selected_groups), group_top_two=bool(group_top_two),
                            renormalize=bool(renormalize), has_bias=bias is not None, scale=np.float32(scale))
    return RoutingPlan(indices, weights, logits.shape[1], scoring="sigmoid", renormalize=renormalize, scale=scale)


# ---- differentiable router weights --------------------------------------------------------------

def _srw_call(logits, indices, scoring, renormalize, scale):
    return jax.ffi.ffi_call("rudnn_moe_selected_router_weights", _ffi.sds(indices.shape, jnp.float32),
                            vmap_method=_SEQ)(logits, indices, scoring=np.int32(scoring),
                                              renormalize=bool(renormalize), scale=np.float32(scale))


def _srb_call(logits, indices, grad, scoring, renormalize, scale):
    return jax.ffi.ffi_call("rudnn_moe_selected_router_backward", _ffi.sds(logits.shape, logits.dtype),
                            vmap_method=_SEQ)(logits, indices, grad, scoring=np.int32(scoring),
                                              renormalize=bool(renormalize), scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _selected_router_weights(logits, indices, scoring, renormalize, scale):
    return _srw_call(logits, indices, scoring, renormalize, scale)


def _srw_fwd(logits, indices, scoring, renormalize, scale):
    return _srw_call(logits, indices, scoring, renormalize, scale), (logits, indices)


def _srw_bwd(scoring, renormalize, scale, res, grad):
    logits, indices = res
    return _srb_call(logits, indices, grad, scoring, renormalize, scale), None


_selected_router_weights.defvjp(_srw_fwd, _srw_bwd)


@_ffi.raises_rudnn_errors
def selected_router_weights(logits, indices, scoring="softmax", renormalize=True, scale=1.0):
    """float32 [T, k] weights of the chosen experts, differentiable in logits."""
    op = "moe.selected_router_weights"
    code = _choice(_SCORINGS, scoring, op, "scoring")
    logits, indices = _ready(op, logits=logits, indices=indices)
    scale = _ffi.static_float(scale, op, "scale")
    _C.jax_validate_moe_selected_router(_ffi.spec(logits), _ffi.spec(indices), None, scale)
    return _selected_router_weights(logits, indices, code, bool(renormalize), scale)


@_ffi.raises_rudnn_errors
def selected_router_backward(logits, indices, grad_weights, scoring="softmax", renormalize=True, scale=1.0):
    """rudnn.moe.selected_router_backward for JAX arrays (jit-able): d loss / d logits [T, E]
    in the logits dtype, given d loss / d weights [T, k] of selected_router_weights."""
    op = "moe.selected_router_backward"
    code = _choice(_SCORINGS, scoring, op, "scoring")
    logits, indices, grad_weights = _ready(op, logits=logits, indices=indices, grad_weights=grad_weights)
    scale = _ffi.static_float(scale, op, "scale")
    _C.jax_validate_moe_selected_router(_ffi.spec(logits), _ffi.spec(indices), _ffi.spec(grad_weights), scale)
    return _srb_call(logits, indices, grad_weights, code, bool(renormalize), scale)


# ---- dispatch and combine ---------------------------------------------------------------------

def _dispatch_call(x, indices, num_experts):
    T, k = indices.shape
    i32 = jnp.int32
    results = (_ffi.sds((T * k, x.shape[1]), x.dtype), _ffi.sds((num_experts + 1,), i32), _ffi.sds((T * k,), i32),
               _ffi.sds((T, k), i32))
    return jax.ffi.ffi_call("rudnn_moe_dispatch", results, vmap_method=_SEQ)(x, indices,
                                                                             num_experts=np.int32(num_experts))


def _combine_call(y, row_of_slot, weights):
    out = _ffi.sds((row_of_slot.shape[0], y.shape[1]), y.dtype)
    return jax.ffi.ffi_call("rudnn_moe_combine", out, vmap_method=_SEQ)(
        y, row_of_slot, *_ffi.present(weights), has_weights=weights is not None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dispatch(x, indices, num_experts):
    return _dispatch_call(x, indices, num_experts)


def _dispatch_fwd(x, indices, num_experts):
    outs = _dispatch_call(x, indices, num_experts)
    return outs, outs[3]


def _dispatch_bwd(num_experts, row_of_slot, cotangents):
    return _combine_call(cotangents[0], row_of_slot, None), None


_dispatch.defvjp(_dispatch_fwd, _dispatch_bwd)


@_ffi.raises_rudnn_errors
def dispatch(x, expert_indices, num_experts=None):
    """(x_dispatched [T*k, H], offsets [E+1], token_of_row [T*k], row_of_slot [T, k]);
    x_dispatched is differentiable in x. `expert_indices` may be a RoutingPlan (route's result),
    which brings num_experts. Expert ids outside [0, E): as rudnn.moe.RoutingPlan.dispatch says
    (an ArgumentError for host ids; for device ids no row, a NaN token)."""
    expert_indices, num_experts = _indices_and_experts("moe.dispatch", expert_indices, num_experts)
    x, expert_indices = _ready("moe.dispatch", x=x, expert_indices=expert_indices)
    return _dispatch(x, expert_indices, int(num_experts))


@jax.custom_vjp
def _combine(y, row_of_slot, weights):
    return _combine_call(y, row_of_slot, weights)


def _combine_fwd(y, row_of_slot, weights):
    return _combine_call(y, row_of_slot, weights), (y, row_of_slot, weights)


def _combine_bwd(res, dout):
    y, row_of_slot, weights = res
    dy, dweights = _combine_backward_call(y, dout, row_of_slot, weights, _COMBINE_STRATEGIES["plane"])
    return dy, None, dweights.astype(weights.dtype)


_combine.defvjp(_combine_fwd, _combine_bwd)


@_ffi.raises_rudnn_errors
def combine(y, row_of_slot, weights):
    """out[t] = sum_j weights[t, j] * y[row_of_slot[t, j]]; differentiable in y and weights."""
    y, row_of_slot, weights = _ready("moe.combine", y=y, row_of_slot=row_of_slot, weights=weights)
    return _combine(y, row_of_slot, weights)


def _combine_backward_call(y, dout, row_of_slot, weights, strategy):
    return jax.ffi.ffi_call(
        "rudnn_moe_combine_backward", (_ffi.sds(y.shape, y.dtype), _ffi.sds(row_of_slot.shape, jnp.float32)),
        vmap_method=_SEQ)(y, dout, row_of_slot, weights, strategy=np.int32(strategy))


@_ffi.raises_rudnn_errors
def combine_backward(y, dout, row_of_slot, weights, strategy="plane"):
    """Gradients of combine: (dy in y's dtype, dweights float32 [T, k])."""
    op = "moe.combine_backward"
    code = _choice(_COMBINE_STRATEGIES, strategy, op, "strategy")
    y, dout, row_of_slot, weights = _ready(op, y=y, dout=dout, row_of_slot=row_of_slot, weights=weights)
    return _combine_backward_call(y, dout, row_of_slot, weights, code)


@_ffi.raises_rudnn_errors
def dispatch_backward(dx_dispatched, row_of_slot):
    """Gradient of dispatch: dx[t] = sum_j dx_dispatched[row_of_slot[t, j]]."""
    dx_dispatched, row_of_slot = _ready("moe.dispatch_backward", dx_dispatched=dx_dispatched, row_of_slot=row_of_slot)
    return _combine_call(dx_dispatched, row_of_slot, None)


# ---- SwiGLU experts ---------------------------------------------------------------------------

def _experts_call(x, offsets, gate, up, down, strategy):
    inter = (x.shape[0], gate.shape[1])
    results = (_ffi.sds(x.shape, x.dtype), _ffi.sds(inter, x.dtype), _ffi.sds(inter, x.dtype))
    return jax.ffi.ffi_call("rudnn_moe_experts_forward", results, vmap_method=_SEQ)(
        x, offsets, gate, up, down, strategy=np.int32(strategy))


def _experts_inference_call(x, offsets, gate, up, down, gate_up, strategy):
    operands = (x, offsets, gate, up, down) + _ffi.present(gate_up)
    return jax.ffi.ffi_call("rudnn_moe_experts_inference", _ffi.sds(x.shape, x.dtype), vmap_method=_SEQ)(
        *operands, strategy=np.int32(strategy), has_gate_up=gate_up is not None)


# Without differentiation the forward keeps nothing (and reads gate_up when given); under jax.grad
# it is the training forward, which keeps the pre-activations and reads gate and up.
@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _experts(x, offsets, gate, up, down, gate_up, strategy):
    return _experts_inference_call(x, offsets, gate, up, down, gate_up, strategy)


def _experts_fwd(x, offsets, gate, up, down, gate_up, strategy):
    y, a, b = _experts_call(x, offsets, gate, up, down, strategy)
    return y, (x, offsets, gate, up, down, a, b)


def _experts_backward_call(dy, x, offsets, gate, up, down, a, b, strategy):
    f32 = jnp.float32
    results = (_ffi.sds(x.shape, x.dtype), _ffi.sds(gate.shape, f32), _ffi.sds(up.shape, f32),
               _ffi.sds(down.shape, f32))
    return jax.ffi.ffi_call("rudnn_moe_experts_backward", results, vmap_method=_SEQ)(
        dy, x, offsets, gate, up, down, a, b, strategy=np.int32(strategy))


def _experts_bwd(strategy, res, dy):
    x, offsets, gate, up, down, a, b = res
    dx, dgate, dup, ddown = _experts_backward_call(dy, x, offsets, gate, up, down, a, b, strategy)
    # gate_up is gate and up once more: their gradients go to gate and up
    return dx, None, dgate.astype(gate.dtype), dup.astype(up.dtype), ddown.astype(down.dtype), None


_experts.defvjp(_experts_fwd, _experts_bwd)


@_ffi.raises_rudnn_errors
def swiglu_experts(x_dispatched, offsets, gate, up, down, strategy="auto", *, gate_up=None):
    """Expert outputs [N, H] of the dispatched rows; differentiable in x_dispatched and the weights.
    gate_up (optional): interleave_gate_up(gate, up), for the fused forward (rudnn.moe.SwiGluExperts
    says when it runs); the gradients do not go through it."""
    op = "SwiGluExperts.forward_dispatched"
    code = _choice(_EXPERTS_STRATEGIES, strategy, op, "strategy")
    x, offsets, gate, up, down = _ready(op, x=x_dispatched, offsets=offsets, gate=gate, up=up, down=down)
    gate_up = _ffi.array(gate_up, op, "gate_up")
    _C.jax_validate_moe_experts(_ffi.spec(x), _ffi.spec(gate), _ffi.spec(up), _ffi.spec(down), _ffi.spec(gate_up))
    return _experts(x, offsets, gate, up, down, gate_up, code)


@_ffi.raises_rudnn_errors
def swiglu_experts_training(x_dispatched, offsets, gate, up, down, strategy="auto"):
    """(y, a, b): the expert outputs and the gate/up pre-activations the backward needs."""
    op = "SwiGluExperts.forward_dispatched_training"
    code = _choice(_EXPERTS_STRATEGIES, strategy, op, "strategy")
    x, offsets, gate, up, down = _ready(op, x=x_dispatched, offsets=offsets, gate=gate, up=up, down=down)
    _C.jax_validate_moe_experts(_ffi.spec(x), _ffi.spec(gate), _ffi.spec(up), _ffi.spec(down))
    return _experts_call(x, offsets, gate, up, down, code)


@_ffi.raises_rudnn_errors
def swiglu_experts_backward(dy, x_dispatched, offsets, gate, up, down, gate_pre, up_pre, strategy="auto"):
    """(dx_dispatched, dgate, dup, ddown), weight gradients float32."""
    op = "MoeTrainingCache.backward"
    code = _choice(_EXPERTS_STRATEGIES, strategy, op, "strategy")
    arrays = _ready(op, dy=dy, x=x_dispatched, offsets=offsets, gate=gate, up=up, down=down, gate_pre=gate_pre,
                    up_pre=up_pre)
    return _experts_backward_call(*arrays, code)


def _interleave_call(gate, up):
    E, I, H = gate.shape
    return jax.ffi.ffi_call("rudnn_moe_interleave_gate_up", _ffi.sds((E, 2 * I, H), gate.dtype),
                            vmap_method=_SEQ)(gate, up)


def _deinterleave(gate_up):
    """(gate, up) [E, I, H] of an interleaved [E, 2I, H] array: the inverse of the interleaving."""
    E, I, H = gate_up.shape[0], gate_up.shape[1] // 2, gate_up.shape[2]
    block = _C.moe_gate_up_block
    blocks = gate_up.reshape(E, I // block, 2, block, H)
    return blocks[:, :, 0].reshape(E, I, H), blocks[:, :, 1].reshape(E, I, H)


@jax.custom_vjp
def _interleave(gate, up):
    return _interleave_call(gate, up)


_interleave.defvjp(lambda gate, up: (_interleave_call(gate, up), None), lambda _, dgate_up: _deinterleave(dgate_up))


@_ffi.raises_rudnn_errors
def interleave_gate_up(gate, up):
    """rudnn.moe.interleave_gate_up for JAX arrays (which comes here; like rudnn.torch.moe, this
    module exports no function of its own for it): gate and up [E, I, H] interleaved into
    [E, 2I, H] in blocks of 64 rows (the layout of SwiGluExperts' gate_up); differentiable."""
    op = "moe.interleave_gate_up"
    gate, up = _ready(op, gate=gate, up=up)
    _C.jax_validate_moe_interleave_gate_up(_ffi.spec(gate), _ffi.spec(up))
    return _interleave(gate, up)


# ---- whole layers -----------------------------------------------------------------------------

def _layer(x, logits, gate, up, down, indices, scoring, renormalize, scale, strategy):
    weights = selected_router_weights(logits, indices, scoring, renormalize, scale)
    xd, offsets, _, row_of_slot = dispatch(x, indices, gate.shape[0])
    return combine(swiglu_experts(xd, offsets, gate, up, down, strategy), row_of_slot, weights)


@_ffi.raises_rudnn_errors
def moe_layer(x, logits, gate, up, down, *, top_k, renormalize=True, strategy="auto"):
    """route -> dispatch -> SwiGLU experts -> combine; differentiable in x, logits, gate, up, down."""
    indices, _ = route(logits, top_k, renormalize)
    return _layer(x, logits, gate, up, down, indices, "softmax", renormalize, 1.0, strategy)


@_ffi.raises_rudnn_errors
def moe_layer_sigmoid_grouped(x, logits, gate, up, down, bias=None, *, top_k, groups, selected_groups,
                              group_top_two=True, renormalize=True, scale=1.0, strategy="auto"):
    """route_sigmoid_grouped (DeepSeek-V3 routing) -> dispatch -> SwiGLU experts -> combine;
    differentiable in x, logits (through the selected experts' weights), gate, up and down."""
    indices, _ = route_sigmoid_grouped(logits, bias, top_k=top_k, groups=groups, selected_groups=selected_groups,
                                       group_top_two=group_top_two, renormalize=renormalize, scale=scale)
    return _layer(x, logits, gate, up, down, indices, "sigmoid", renormalize, scale, strategy)
