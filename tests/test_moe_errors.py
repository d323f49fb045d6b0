"""Every documented error of rudnn.moe: exception type and message."""

import numpy as np
import pytest
import torch

import rudnn
from rudnn import moe
from util import DEVICES

f16, i32 = torch.float16, torch.int32


def _t(shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


def _sg(d, E=16, **kw):
    opts = dict(top_k=2, groups=4, selected_groups=2)
    opts.update(kw)
    bias = opts.pop("bias", None)
    return moe.route_sigmoid_grouped(_t((3, E), device=d), bias, **opts)


def _experts(d, E=4, I=6, H=8, dtype=torch.float32, up_shape=None, down_shape=None, down_dtype=None):
    return moe.SwiGluExperts(_t((E, I, H), dtype, d), _t(up_shape or (E, I, H), dtype, d),
                             _t(down_shape or (E, H, I), down_dtype or dtype, d))


def _dispatched(d, T=3, E=4, k=2, H=8, training=False):
    logits = _t((T, E), device=d)
    plan = moe.route(logits, k)
    if training:
        plan = plan.into_training(logits)
    return plan.dispatch(_t((T, H), device=d))


def _cache(d):
    dd = _dispatched(d, training=True)
    return _experts(d).forward_dispatched_training(dd)[1]


ROUTE_ERRORS = [
    (lambda d: moe.route(_t((3, 8), i32, d), 2), rudnn.DTypeError,
     "moe.route: logits: expected float32, float16 or bfloat16, got int32"),
    (lambda d: moe.route(_t((8,), device=d), 2), rudnn.ShapeError, "moe.route: logits: expected 2 axes, got shape [8]"),
    (lambda d: moe.route(_t((3, 0), device=d), 1), rudnn.ShapeError,
     "moe.route: logits: expected at least one expert (E >= 1), got shape [3, 0]"),
    (lambda d: moe.route(_t((8, 3), device=d).t(), 2), rudnn.ShapeError,
     "moe.route: logits: the last axis must be contiguous (stride 1), got stride 3"),
    (lambda d: moe.route(_t((3, 8), device=d), 0), rudnn.ArgumentError,
     "moe.route: top_k: expected 1 <= top_k <= E (8), got 0"),
    (lambda d: moe.route(_t((3, 8), device=d), 9), rudnn.ArgumentError,
     "moe.route: top_k: expected 1 <= top_k <= E (8), got 9"),
    (lambda d: moe.route(_t((3, 100), device=d), 65), rudnn.UnsupportedError,
     "moe.route: top_k: at most 64 is supported, got 65"),
    (lambda d: moe.route(_t((2, 1025), device=d), 2), rudnn.UnsupportedError,
     "moe.route: at most 1024 experts are supported, got E = 1025"),
    # grouped sigmoid routing
    (lambda d: _sg(d, bias=_t((16,), f16, d)), rudnn.DTypeError,
     "moe.route_sigmoid_grouped: bias: expected float32, got float16"),
    (lambda d: _sg(d, bias=_t((15,), device=d)), rudnn.ShapeError,
     "moe.route_sigmoid_grouped: bias: expected shape [16] (the experts of logits), got [15]"),
    (lambda d: _sg(d, groups=0), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: groups: expected 1 <= groups <= 128, got 0"),
    (lambda d: _sg(d, E=258, groups=129), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: groups: expected 1 <= groups <= 128, got 129"),
    (lambda d: _sg(d, groups=3), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: groups: expected a divisor of the number of experts (16), got 3"),
    (lambda d: _sg(d, selected_groups=0), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: selected_groups: expected 1 <= selected_groups <= groups (4), got 0"),
    (lambda d: _sg(d, selected_groups=5), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: selected_groups: expected 1 <= selected_groups <= groups (4), got 5"),
    (lambda d: _sg(d, groups=16, selected_groups=4), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: group_top_two needs at least 2 experts per group, got 1 (E = 16, groups = 16)"),
    (lambda d: _sg(d, top_k=9), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: top_k: expected 1 <= top_k <= the experts in the kept groups (8), got 9"),
    (lambda d: _sg(d, E=256, groups=2, selected_groups=2, top_k=65), rudnn.UnsupportedError,
     "moe.route_sigmoid_grouped: top_k: at most 64 is supported, got 65"),
    (lambda d: _sg(d, E=1040, groups=8), rudnn.UnsupportedError,
     "moe.route_sigmoid_grouped: at most 1024 experts are supported, got E = 1040"),
    (lambda d: _sg(d, scale=0.0), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: scale: expected a finite value > 0, got 0"),
    (lambda d: _sg(d, scale=float("inf")), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: scale: expected a finite value > 0, got inf"),
    (lambda d: _sg(d, scale=float("nan")), rudnn.ArgumentError,
     "moe.route_sigmoid_grouped: scale: expected a finite value > 0, got nan"),
]

DISPATCH_ERRORS = [
    (lambda d: moe.route(_t((3, 4), device=d), 2).dispatch(_t((4, 8), device=d)), rudnn.ShapeError,
     "moe.dispatch: x: expected shape [3, H] (the tokens of the plan), got [4, 8]"),
    (lambda d: moe.route(_t((3, 4), device=d), 2).dispatch(_t((3, 8), i32, d)), rudnn.DTypeError,
     "moe.dispatch: x: expected float32, float16 or bfloat16, got int32"),
    (lambda d: _dispatched(d).combine(_t((6, 8), i32, d)), rudnn.DTypeError,
     "moe.combine: y: expected float32, float16 or bfloat16, got int32"),
    (lambda d: _dispatched(d).combine(_t((6,), device=d)), rudnn.ShapeError,
     "moe.combine: y: expected 2 axes, got shape [6]"),
    (lambda d: _dispatched(d).combine_backward(_t((6, 8), device=d), _t((3, 7), device=d)), rudnn.ShapeError,
     "moe.combine_backward: dout: expected shape [3, 8] ([T, H]), got [3, 7]"),
    (lambda d: _dispatched(d).combine_backward(_t((6, 8), device=d), _t((3, 8), f16, d)), rudnn.DTypeError,
     "moe.combine_backward: dout: expected the dtype of y (float32), got float16"),
    (lambda d: _dispatched(d).combine_backward(_t((6, 8), device=d), _t((3, 8), device=d), strategy="atomic"),
     rudnn.ArgumentError, "moe.combine_backward: strategy: expected one of 'serial', 'plane', got 'atomic'"),
    (lambda d: _dispatched(d).dispatch_backward(_t((6, 8), i32, d)), rudnn.DTypeError,
     "moe.dispatch_backward: y: expected float32, float16 or bfloat16, got int32"),
]

EXPERT_ERRORS = [
    (lambda d: moe.SwiGluExperts(_t((4, 6), device=d), _t((4, 6), device=d), _t((4, 6), device=d)),
     rudnn.ShapeError, "SwiGluExperts: gate: expected 3 axes [E, I, H], got shape [4, 6]"),
    (lambda d: _experts(d, dtype=i32), rudnn.DTypeError,
     "SwiGluExperts.forward_dispatched: gate: expected float32, float16 or bfloat16, got int32"),
    (lambda d: _experts(d, up_shape=(4, 6, 9)), rudnn.ShapeError,
     "SwiGluExperts.forward_dispatched: up: expected shape [4, 6, 8] ([E, I, H] like gate), got [4, 6, 9]"),
    (lambda d: _experts(d, down_shape=(4, 6, 8)), rudnn.ShapeError,
     "SwiGluExperts.forward_dispatched: down: expected shape [4, 8, 6] ([E, H, I]), got [4, 6, 8]"),
    (lambda d: _experts(d, down_dtype=f16), rudnn.DTypeError,
     "SwiGluExperts.forward_dispatched: down: expected the dtype of x (float32), got float16"),
    (lambda d: _experts(d, E=1025, I=1, H=1), rudnn.UnsupportedError,
     "SwiGluExperts.forward_dispatched: at most 1024 experts are supported, got E = 1025"),
    (lambda d: _experts(d, H=16).forward_dispatched(_dispatched(d, H=8)), rudnn.ShapeError,
     "SwiGluExperts.forward_dispatched: x: expected 16 columns (H of the experts), got shape [6, 8]"),
    (lambda d: _experts(d).forward_dispatched(_dispatched(d, E=5)), rudnn.ShapeError,
     "SwiGluExperts.forward_dispatched: offsets: expected shape [5] ([E + 1]), got [6]"),
    (lambda d: _experts(d).forward_dispatched(_dispatched(d), strategy="fast"), rudnn.ArgumentError,
     "SwiGluExperts.forward_dispatched: strategy: expected one of 'auto', 'tensor_core', 'scalar', got 'fast'"),
    (lambda d: _experts(d).forward_dispatched_training(_dispatched(d), strategy="fast"), rudnn.ArgumentError,
     "SwiGluExperts.forward_dispatched_training: strategy: expected one of"),
    (lambda d: _cache(d).backward(_t((6, 7), device=d)), rudnn.ShapeError,
     "MoeTrainingCache.backward: dy: expected shape [6, 8] ([N, H] like x), got [6, 7]"),
    (lambda d: _cache(d).backward(_t((6, 8), f16, d)), rudnn.DTypeError,
     "MoeTrainingCache.backward: dy: expected the dtype of x (float32), got float16"),
]

def _fused(d, I=128, dtype=torch.float32, gate_up_shape=None, gate_up_dtype=None, gate_up_dense=True):
    """forward_dispatched with a gate_up of the given shape, dtype and layout (E = 4, H = 8)."""
    gate, up, down = _t((4, I, 8), dtype, d), _t((4, I, 8), dtype, d), _t((4, 8, I), dtype, d)
    shape = gate_up_shape or (4, 2 * I, 8)
    gate_up = _t(shape, gate_up_dtype or dtype, d)
    if not gate_up_dense:
        gate_up = _t((shape[0], shape[2], shape[1]), gate_up_dtype or dtype, d).transpose(1, 2)
    dd = _dispatched(d)
    return moe._experts_forward("SwiGluExperts.forward_dispatched", gate, up, down, dd.x, dd.offsets, 0, False, None,
                                gate_up)


FUSED_GATE_UP_ERRORS = [
    (lambda d: moe.interleave_gate_up(_t((2, 96, 8), device=d), _t((2, 96, 8), device=d)), rudnn.UnsupportedError,
     "moe.interleave_gate_up: gate: the interleaved gate/up layout needs I to be a multiple of 64, got I = 96"),
    (lambda d: moe.SwiGluExperts(_t((2, 96, 8), device=d), _t((2, 96, 8), device=d), _t((2, 8, 96), device=d),
                                 fused_gate_up=True), rudnn.UnsupportedError,
     "SwiGluExperts.forward_dispatched: gate_up: the interleaved gate/up layout needs I to be a multiple of 64, "
     "got I = 96"),
    (lambda d: moe.SwiGluExperts(_t((4, 64, 8), device=d), _t((4, 64, 8), device=d), _t((4, 8, 64), device=d),
                                 fused_gate_up="yes"), rudnn.ArgumentError,
     "SwiGluExperts: fused_gate_up: expected True or False, got 'yes'"),
    (lambda d: moe.interleave_gate_up(_t((2, 64, 8), device=d), _t((2, 64, 8), f16, d)), rudnn.DTypeError,
     "moe.interleave_gate_up: up: expected the dtype of gate (float32), got float16"),
    (lambda d: moe.interleave_gate_up(_t((2, 64, 8), device=d), _t((2, 128, 8), device=d)), rudnn.ShapeError,
     "moe.interleave_gate_up: up: expected shape [2, 64, 8] ([E, I, H] like gate), got [2, 128, 8]"),
    (lambda d: moe.interleave_gate_up(_t((2, 64), device=d), _t((2, 64), device=d)), rudnn.ShapeError,
     "moe.interleave_gate_up: gate: expected 3 axes [E, I, H], got shape [2, 64]"),
    (lambda d: moe.interleave_gate_up(_t((2, 64, 8), i32, d), _t((2, 64, 8), i32, d)), rudnn.DTypeError,
     "moe.interleave_gate_up: gate: expected float32, float16 or bfloat16, got int32"),
    (lambda d: moe.interleave_gate_up(_t((2, 8, 64), device=d).transpose(1, 2), _t((2, 64, 8), device=d)),
     rudnn.ShapeError, "moe.interleave_gate_up: gate: expected a dense (contiguous) array"),
    (lambda d: _fused(d, gate_up_shape=(4, 128, 8)), rudnn.ShapeError,
     "SwiGluExperts.forward_dispatched: gate_up: expected shape [4, 256, 8] ([E, 2I, H]), got [4, 128, 8]"),
    (lambda d: _fused(d, gate_up_dtype=f16), rudnn.DTypeError,
     "SwiGluExperts.forward_dispatched: gate_up: expected the dtype of x (float32), got float16"),
    (lambda d: _fused(d, gate_up_dense=False), rudnn.ShapeError,
     "SwiGluExperts.forward_dispatched: gate_up: expected a dense (contiguous) array"),
    (lambda d: _fused(d, I=96), rudnn.UnsupportedError,
     "SwiGluExperts.forward_dispatched: gate_up: the interleaved gate/up layout needs I to be a multiple of 64, "
     "got I = 96"),
]

ROUTER_ERRORS = [
    (lambda d: moe.selected_router_weights(_t((3, 8), i32, d), torch.zeros(3, 2, dtype=i32, device=d)),
     rudnn.DTypeError, "moe.selected_router_weights: logits: expected float32, float16 or bfloat16, got int32"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(3, 2, device=d)), rudnn.DTypeError,
     "moe.selected_router_weights: indices: expected uint32, int32 or int64, got float32"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(4, 2, dtype=i32, device=d)),
     rudnn.ShapeError, "moe.selected_router_weights: indices: expected 3 rows (the tokens of logits), got shape [4, 2]"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(3, 0, dtype=i32, device=d)),
     rudnn.ShapeError, "moe.selected_router_weights: indices: expected at least one slot (k >= 1), got shape [3, 0]"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(3, dtype=i32, device=d)),
     rudnn.ShapeError, "moe.selected_router_weights: indices: expected 2 axes, got shape [3]"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(3, 65, dtype=i32, device=d)),
     rudnn.UnsupportedError, "moe.selected_router_weights: indices: at most 64 slots per token are supported, got 65"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(3, 2, dtype=i32, device=d),
                                           scoring="relu"), rudnn.ArgumentError,
     "moe.selected_router_weights: scoring: expected one of 'softmax', 'sigmoid', got 'relu'"),
    (lambda d: moe.selected_router_weights(_t((3, 8), device=d), torch.zeros(3, 2, dtype=i32, device=d), scale=-1.0),
     rudnn.ArgumentError, "moe.selected_router_weights: scale: expected a finite value > 0, got -1"),
    (lambda d: moe.selected_router_backward(_t((3, 8), device=d), torch.zeros(3, 2, dtype=i32, device=d),
                                            _t((3, 3), device=d)), rudnn.ShapeError,
     "moe.selected_router_backward: grad_weights: expected shape [3, 2] ([T, k] like indices), got [3, 3]"),
    (lambda d: moe.selected_router_backward(_t((3, 8), device=d), torch.zeros(3, 2, dtype=i32, device=d),
                                            torch.zeros(3, 2, dtype=i32, device=d)), rudnn.DTypeError,
     "moe.selected_router_backward: grad_weights: expected float32, float16 or bfloat16, got int32"),
    (lambda d: moe.route(_t((3, 8), device=d), 2).router_backward(_t((3, 2), device=d)), rudnn.ArgumentError,
     "RoutingPlan.router_backward: this plan has no logits; make it with into_training"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call, exc, message",
                         ROUTE_ERRORS + DISPATCH_ERRORS + EXPERT_ERRORS + FUSED_GATE_UP_ERRORS + ROUTER_ERRORS)
def test_errors(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert str(info.value).startswith(message), str(info.value)


def test_tensor_core_strategy_needs_cuda():
    with pytest.raises(rudnn.UnsupportedError, match="strategy 'tensor_core' needs a CUDA device, got cpu"):
        _experts("cpu").forward_dispatched(_dispatched("cpu"), strategy="tensor_core")
    with pytest.raises(rudnn.UnsupportedError, match="strategy 'tensor_core' needs a CUDA device"):
        _cache("cpu").backward(_t((6, 8)), strategy="tensor_core")


def test_errors_are_builtin_exceptions():
    with pytest.raises(ValueError):
        moe.route(_t((3, 8)), 0)
    with pytest.raises(TypeError):
        moe.route(_t((3, 8), i32), 1)
    with pytest.raises(NotImplementedError):
        moe.route(_t((2, 1025)), 1)


def test_mixed_frameworks():
    with pytest.raises(rudnn.FrameworkError, match="one framework per call"):
        moe.route(_t((3, 4)), 2).dispatch(np.zeros((3, 8), np.float32))


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.cuda)])
def test_mixed_devices(device):
    with pytest.raises(rudnn.DeviceError):
        moe.route(_t((3, 4), device=device), 2).dispatch(_t((3, 8)))
    with pytest.raises(rudnn.DeviceError):
        moe.SwiGluExperts(_t((4, 6, 8), device=device), _t((4, 6, 8)), _t((4, 8, 6), device=device))


def test_gate_up_must_not_overlap_what_it_is_made_from_or_written_beside():
    gate_up = torch.zeros(2, 128, 8)
    gate = gate_up.view(-1)[:2 * 64 * 8].view(2, 64, 8)  # dense, inside gate_up
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn._C.moe_interleave_gate_up(gate, torch.zeros(2, 64, 8), gate_up, 0)
    assert str(info.value).startswith("moe.interleave_gate_up: gate_up: shares memory with moe.interleave_gate_up: "
                                      "gate"), str(info.value)
    # the forward reads gate_up: no output may overlap it
    gate, up, down = _t((2, 64, 8)), _t((2, 64, 8)), _t((2, 8, 64))
    x, offsets = _t((3, 8)), torch.tensor([0, 1, 3], dtype=i32)
    y = gate_up.view(-1)[:3 * 8].view(3, 8)
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn._C.moe_experts_forward(x, offsets, gate, up, down, y, None, None, 2, None, 0, gate_up=gate_up)
    assert str(info.value).startswith("SwiGluExperts.forward_dispatched: y: shares memory with "
                                      "SwiGluExperts.forward_dispatched: gate_up"), str(info.value)


def test_fused_gate_up_errors_for_jax():
    """JAX arrays: the checks of the other frameworks, raised when the call is traced (jit too)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if not rudnn._C.has_jax_ffi:
        pytest.skip("rudnn built without the XLA FFI handlers")
    from rudnn.jax import moe as jax_moe

    z = jnp.zeros
    with pytest.raises(rudnn.UnsupportedError, match="^SwiGluExperts.forward_dispatched: gate_up: the interleaved "
                                                     "gate/up layout needs I to be a multiple of 64, got I = 96$"):
        moe.SwiGluExperts(z((2, 96, 8)), z((2, 96, 8)), z((2, 8, 96)), fused_gate_up=True)
    with pytest.raises(rudnn.UnsupportedError, match="^moe.interleave_gate_up: gate: the interleaved gate/up layout "
                                                     "needs I to be a multiple of 64, got I = 96"):
        jax.jit(moe.interleave_gate_up)(z((2, 96, 8)), z((2, 96, 8)))
    with pytest.raises(rudnn.DTypeError, match=r"^moe.interleave_gate_up: up: expected the dtype of gate \(float32\), "
                                               r"got float16$"):
        moe.interleave_gate_up(z((2, 64, 8)), z((2, 64, 8), jnp.float16))
    with pytest.raises(rudnn.ShapeError, match=r"^moe.interleave_gate_up: gate: expected 3 axes \[E, I, H\], got "
                                               r"shape \[2, 64\]$"):
        moe.interleave_gate_up(z((2, 64)), z((2, 64)))
    gate, up, down = z((4, 128, 8)), z((4, 128, 8)), z((4, 8, 128))
    x, offsets = z((6, 8)), jnp.array([0, 1, 2, 4, 6], jnp.int32)
    with pytest.raises(rudnn.ShapeError, match=r"^SwiGluExperts.forward_dispatched: gate_up: expected shape "
                                               r"\[4, 256, 8\] \(\[E, 2I, H\]\), got \[4, 128, 8\]$"):
        jax_moe.swiglu_experts(x, offsets, gate, up, down, gate_up=z((4, 128, 8)))
    with pytest.raises(rudnn.DTypeError, match=r"^SwiGluExperts.forward_dispatched: gate_up: expected the dtype of x "
                                               r"\(float32\), got float16$"):
        jax_moe.swiglu_experts(x, offsets, gate, up, down, gate_up=z((4, 256, 8), jnp.float16))
    assert moe.SwiGluExperts(gate, up, down).gate_up is None
