"""rudnn.torch.moe: custom ops with fake implementations (opcheck) and autograd of the whole
layer against torch autograd through the naive reference."""

import pytest
import torch
from torch.library import opcheck

import rudnn
import rudnn.torch as rt
from reference import moe as ref
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

ops = torch.ops.rudnn


def _layer_inputs(T, E, H, I, dtype, device):
    return (rand((T, H), dtype, device, seed=1), rand((T, E), dtype, device, seed=2),
            rand((E, I, H), dtype, device, seed=3, scale=H ** -0.5), rand((E, I, H), dtype, device, seed=4, scale=H ** -0.5),
            rand((E, H, I), dtype, device, seed=5, scale=I ** -0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_moe_layer_autograd(device, dtype, routing):
    T, E, k, H, I = 6, 16, 4, 12, 10
    inputs = [t.requires_grad_() for t in _layer_inputs(T, E, H, I, dtype, device)]
    x, logits, gate, up, down = inputs
    if routing == "softmax":
        out = rt.moe.moe_layer(x, logits, gate, up, down, top_k=k)
        indices, _ = rt.moe.route(logits.detach(), k)
        opts = {}
    else:
        bias = rand((E,), torch.float32, device, seed=6, scale=0.1)
        out = rt.moe.moe_layer_sigmoid_grouped(x, logits, gate, up, down, bias, top_k=k, groups=4, selected_groups=2,
                                               scale=2.0)
        indices, _ = rt.moe.route_sigmoid_grouped(logits.detach(), bias, top_k=k, groups=4, selected_groups=2,
                                                  scale=2.0)
        opts = dict(scoring="sigmoid", scale=2.0)
    dout = rand((T, H), dtype, device, seed=7)
    grads = torch.autograd.grad(out, inputs, dout)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    idx = indices.cpu().long()
    leaves64 = [t.detach().cpu().double().requires_grad_() for t in inputs]
    out64 = ref.moe_layer(*leaves64, idx, **opts)
    grads64 = torch.autograd.grad(out64, leaves64, dout.cpu().double())
    leaves = [t.detach().cpu().clone().requires_grad_() for t in inputs]
    out_same = ref.moe_layer(*leaves, idx, dtype=dtype, **opts)
    grads_same = torch.autograd.grad(out_same, leaves, dout.cpu())
    assert_close_to_oracle(out, out_same, out64.detach(), "out")
    for name, ours, same, oracle in zip(("dx", "dlogits", "dgate", "dup", "ddown"), grads, grads_same, grads64):
        # weight gradients are float32 inside and rounded once to the weights' dtype
        assert_close_to_oracle(ours, same, oracle, name)


def test_opcheck():
    T, E, k, H, I = 5, 8, 2, 6, 4
    x, logits, gate, up, down = _layer_inputs(T, E, H, I, torch.float32, "cpu")
    opcheck(ops.moe_route.default, (logits, k, True))
    opcheck(ops.moe_route_sigmoid_grouped.default, (logits, torch.zeros(E), k, 4, 2, True, True, 1.5))
    indices, _ = rt.moe.route(logits, k)
    opcheck(ops.moe_selected_router_weights.default, (logits.requires_grad_(), indices, 0, True, 1.0))
    opcheck(ops.moe_selected_router_backward.default, (logits.detach(), indices, torch.randn(T, k), 1, False, 2.0))
    offsets, token_of_row, row_of_slot = ops.moe_dispatch_plan(indices, E)
    opcheck(ops.moe_dispatch_plan.default, (indices, E))
    opcheck(ops.moe_gather_rows.default, (x.requires_grad_(), token_of_row, row_of_slot))
    xd = ops.moe_gather_rows(x.detach(), token_of_row, row_of_slot)
    opcheck(ops.moe_dispatch_backward.default, (xd, row_of_slot))
    w = torch.rand(T, k)
    opcheck(ops.moe_combine.default, (xd.requires_grad_(), row_of_slot, w.requires_grad_()))
    opcheck(ops.moe_combine_backward.default, (xd.detach(), torch.randn(T, H), row_of_slot, w.detach(), 0))
    args = (xd.detach().requires_grad_(), offsets, gate.requires_grad_(), up.requires_grad_(), down.requires_grad_(), 2)
    opcheck(ops.moe_experts.default, args)
    y, a, b = ops.moe_experts(*(t.detach() if isinstance(t, torch.Tensor) else t for t in args))
    opcheck(ops.moe_experts_backward.default,
            (torch.randn_like(y), xd.detach(), offsets, gate.detach(), up.detach(), down.detach(), a, b, 0))


def test_opcheck_inference_forward():
    T, E, k, H, I = 5, 4, 2, 8, 64  # I: whole 64-row blocks for gate_up
    x, logits, gate, up, down = _layer_inputs(T, E, H, I, torch.float32, "cpu")
    indices, _ = rt.moe.route(logits, k)
    xd, offsets, _, _ = rt.moe.dispatch(x, indices, E)
    gate_up = rudnn.moe.interleave_gate_up(gate, up)
    opcheck(ops.moe_experts_inference.default, (xd, offsets, gate, up, down, None, 2))
    opcheck(ops.moe_experts_inference.default, (xd, offsets, gate, up, down, gate_up, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_experts_without_gradients_runs_the_inference_forward(device, dtype):
    """No gradient needed: the inference op (nothing kept for a backward; gate_up used), the same y
    as the differentiable op; with gradients gate_up changes nothing and they still flow."""
    T, E, k, H, I = 7, 4, 2, 16, 128
    x, logits, gate, up, down = _layer_inputs(T, E, H, I, dtype, device)
    gate_up = rudnn.moe.interleave_gate_up(gate, up)
    leaves = [t.detach().clone().requires_grad_() for t in (x, gate, up, down)]
    with_grad = rt.moe.moe_layer(leaves[0], logits, *leaves[1:], top_k=k, gate_up=gate_up)
    grads = torch.autograd.grad(with_grad, leaves, torch.ones_like(with_grad))
    plain_grads = torch.autograd.grad(rt.moe.moe_layer(leaves[0], logits, *leaves[1:], top_k=k), leaves,
                                      torch.ones_like(with_grad))
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    with torch.no_grad():
        inference = rt.moe.moe_layer(x, logits, gate, up, down, top_k=k)
        fused = rt.moe.moe_layer(x, logits, gate, up, down, top_k=k, gate_up=gate_up)
    assert torch.equal(inference, with_grad.detach()) and torch.equal(fused, inference)
    if device == "cuda":
        cc = torch.cuda.get_device_capability()
        fused_here = cc == (9, 0) and dtype != torch.float32
        assert rudnn.moe.last_algorithm() == ("tensor_core_fused" if fused_here else
                                              "tensor_core" if cc[0] in (8, 9) and dtype != torch.float32 else
                                              "scalar")


def test_torch_compile_cpu_inference_with_gate_up():
    T, E, k, H, I = 4, 4, 2, 8, 64
    x, logits, gate, up, down = _layer_inputs(T, E, H, I, torch.float32, "cpu")
    gate_up = rudnn.moe.interleave_gate_up(gate, up)
    f = torch.compile(lambda *a: rt.moe.moe_layer(*a, top_k=k, gate_up=gate_up), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(f(x, logits, gate, up, down), rt.moe.moe_layer(x, logits, gate, up, down, top_k=k),
                                   rtol=0, atol=0)


def test_torch_compile_cpu():
    T, E, k, H, I = 4, 8, 2, 6, 4
    x, logits, gate, up, down = _layer_inputs(T, E, H, I, torch.float32, "cpu")
    f = torch.compile(lambda *a: rt.moe.moe_layer(*a, top_k=k), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(f(x, logits, gate, up, down), rt.moe.moe_layer(x, logits, gate, up, down, top_k=k))


@pytest.mark.parametrize("device", DEVICES)
def test_route_returns_the_routing_plan_of_rudnn_moe(device):
    """One shape of API across rudnn.moe and rudnn.torch.moe: route gives a RoutingPlan (which still
    unpacks as (indices, weights)), and dispatch takes it in place of (indices, num_experts)."""
    import rudnn

    T, E, k, H = 6, 8, 2, 4
    logits, x = rand((T, E), torch.float32, device, seed=3), rand((T, H), torch.float32, device, seed=4)
    plan = rt.moe.route(logits, k)
    assert isinstance(plan, rudnn.moe.RoutingPlan) and (plan.num_experts, plan.top_k, plan.scoring) == (E, k, "softmax")
    eager = rudnn.moe.route(logits, k)
    indices, weights = plan
    assert torch.equal(indices, eager.expert_indices) and torch.equal(weights, eager.weights)
    from_plan, from_arrays = rt.moe.dispatch(x, plan), rt.moe.dispatch(x, indices, E)
    for a, b in zip(from_plan, from_arrays):
        assert torch.equal(a, b)
    grouped = rt.moe.route_sigmoid_grouped(logits, top_k=k, groups=4, selected_groups=2, scale=2.0)
    assert (grouped.scoring, grouped.scale, grouped.num_experts) == ("sigmoid", 2.0, E)
    with pytest.raises(rudnn.ArgumentError, match="moe.dispatch: num_experts: the plan routes to 8 experts, got num_experts=4"):
        rt.moe.dispatch(x, plan, 4)
    with pytest.raises(rudnn.ArgumentError, match="moe.dispatch: num_experts: required when expert_indices is an array"):
        rt.moe.dispatch(x, indices)
