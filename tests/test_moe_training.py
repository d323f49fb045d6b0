"""rudnn.moe training chain: selected_router_weights / selected_router_backward and the
gradients of route -> into_training -> dispatch -> experts -> combine, against torch autograd
run through the naive reference (float64 oracle; budget: twice the error of the same autograd
computation in the input dtype, plus a few ulps)."""

import numpy as np
import pytest
import torch

from rudnn import moe
from reference import moe as ref
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

INDEX_DTYPES = [torch.uint32, torch.int32, torch.int64]


def _ref_router(logits, indices, scoring, renorm, scale, dtype=torch.float64):
    rows = [ref.selected_weights(logits[t].to(dtype), [int(e) for e in indices[t]], scoring, renorm, scale)
            for t in range(logits.shape[0])]
    return torch.stack(rows) if rows else torch.zeros(0, indices.shape[1], dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("scoring, renorm, scale", [("softmax", True, 1.0), ("softmax", False, 1.0),
                                                    ("sigmoid", True, 2.5), ("sigmoid", False, 0.5)])
def test_selected_router_weights_and_backward(device, dtype, index_dtype, scoring, renorm, scale):
    T, E, k = 5, 12, 3
    logits = rand((T, E), dtype, device, seed=1, scale=2.0)
    idx = torch.tensor([[0, 5, 11], [3, 3, 7], [2, 1, 0], [11, 10, 9], [4, 6, 4]])  # repeated indices gather
    indices = idx.to(index_dtype).to(device)
    w = moe.selected_router_weights(logits, indices, scoring=scoring, renormalize=renorm, scale=scale)
    assert w.dtype == torch.float32 and tuple(w.shape) == (T, k)
    l64 = logits.cpu().double().requires_grad_()
    w64 = _ref_router(l64, idx, scoring, renorm, scale)
    torch.testing.assert_close(w.cpu().double(), w64.detach(), rtol=2e-6, atol=1e-7)

    g = rand((T, k), torch.float32, device, seed=2)
    dlogits = moe.selected_router_backward(logits, indices, g, scoring=scoring, renormalize=renorm, scale=scale)
    assert dlogits.dtype == dtype and tuple(dlogits.shape) == (T, E)
    (oracle,) = torch.autograd.grad(w64, l64, g.cpu().double())
    ld = logits.cpu().clone().requires_grad_()
    (same,) = torch.autograd.grad(_ref_router(ld, idx, scoring, renorm, scale, dtype), ld, g.cpu().to(dtype))
    assert_close_to_oracle(dlogits, same, oracle, "dlogits", scale=g.abs().max().item() * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_selected_router_invalid_index_gives_nan_row(device, scoring):
    logits = rand((3, 4), torch.float32, device)
    for bad in (4, -1, 2 ** 31 + 5):
        idx = torch.tensor([[0, 1], [2, bad], [3, 3]], dtype=torch.int64, device=device)
        w = moe.selected_router_weights(logits, idx, scoring=scoring).cpu()
        assert torch.isnan(w[1]).all() and not torch.isnan(w[[0, 2]]).any()
        dl = moe.selected_router_backward(logits, idx, torch.ones(3, 2, device=device), scoring=scoring).cpu()
        assert torch.isnan(dl[1]).all() and not torch.isnan(dl[[0, 2]]).any()
    idx = torch.tensor([[0, 1], [2, 7], [3, 3]], dtype=torch.int32, device=device).to(torch.uint32)
    assert torch.isnan(moe.selected_router_weights(logits, idx, scoring=scoring).cpu()[1]).all()


CHAIN_CASES = {  # name: (T, E, k, H, I, routing)
    "mixtral": (10, 8, 2, 24, 40, dict(kind="softmax", renormalize=True)),
    "qwen3": (4, 128, 8, 16, 8, dict(kind="softmax", renormalize=True)),
    "softmax_plain": (6, 5, 3, 9, 7, dict(kind="softmax", renormalize=False)),
    "deepseek_v3": (3, 256, 8, 8, 8, dict(kind="sigmoid", groups=8, selected_groups=4, scale=2.5)),
}


def _route(logits, k, opts, device):
    if opts["kind"] == "softmax":
        return moe.route(logits, k, renormalize=opts["renormalize"]), dict(renormalize=opts["renormalize"])
    bias = rand((logits.shape[1],), torch.float32, device, seed=11, scale=0.1)
    plan = moe.route_sigmoid_grouped(logits, bias, top_k=k, groups=opts["groups"],
                                     selected_groups=opts["selected_groups"], scale=opts["scale"])
    return plan, dict(scoring="sigmoid", scale=opts["scale"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("combine_strategy", ["serial", "plane"])
@pytest.mark.parametrize("case", list(CHAIN_CASES))
def test_training_chain_gradients(device, dtype, combine_strategy, case):
    _check_chain(device, dtype, combine_strategy, CHAIN_CASES[case], "auto")


TC_CHAIN_CASES = {  # H, I multiples of 8 (TMA); some experts without rows
    "mixtral": (10, 8, 2, 64, 128, dict(kind="softmax", renormalize=True)),
    "qwen3": (4, 128, 8, 32, 16, dict(kind="softmax", renormalize=True)),
    "deepseek_v3": (3, 256, 8, 16, 8, dict(kind="sigmoid", groups=8, selected_groups=4, scale=2.5)),
    "long_segments": (300, 4, 1, 64, 32, dict(kind="softmax", renormalize=False)),
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", list(TC_CHAIN_CASES))
def test_training_chain_tensor_core(dtype, case):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the tensor_core strategy needs sm_90 in this build")
    _check_chain("cuda", dtype, "plane", TC_CHAIN_CASES[case], "tensor_core")


def _check_chain(device, dtype, combine_strategy, case, strategy):
    T, E, k, H, I, opts = case
    x = rand((T, H), dtype, device, seed=1)
    logits = rand((T, E), dtype, device, seed=2)
    gate = rand((E, I, H), dtype, device, seed=3, scale=H ** -0.5)
    up = rand((E, I, H), dtype, device, seed=4, scale=H ** -0.5)
    down = rand((E, H, I), dtype, device, seed=5, scale=I ** -0.5)
    dout = rand((T, H), dtype, device, seed=6)

    plan, ref_opts = _route(logits, k, opts, device)
    tplan = plan.into_training(logits)
    assert tplan.weights.dtype == torch.float32 and tplan.is_training
    assert torch.equal(tplan.expert_indices, plan.expert_indices)
    d = tplan.dispatch(x)
    experts = moe.SwiGluExperts(gate, up, down)
    y, cache = experts.forward_dispatched_training(d, strategy=strategy)
    out = d.combine(y)
    dy, dweights = d.combine_backward(y, dout, strategy=combine_strategy)
    assert dweights.dtype == torch.float32
    dx_d, dgate, dup, ddown = cache.backward(dy, strategy=strategy)
    assert dgate.dtype == dup.dtype == ddown.dtype == torch.float32 and dx_d.dtype == dtype
    dx = d.dispatch_backward(dx_d)
    dlogits = tplan.router_backward(dweights)

    idx = plan.expert_indices.cpu().long()
    leaves64 = [t.cpu().double().requires_grad_() for t in (x, logits, gate, up, down)]
    out64 = ref.moe_layer(*leaves64, idx, **ref_opts)
    grads64 = torch.autograd.grad(out64, leaves64, dout.cpu().double())
    leaves = [t.cpu().clone().requires_grad_() for t in (x, logits, gate, up, down)]
    out_same = ref.moe_layer(*leaves, idx, dtype=dtype, **ref_opts)
    grads_same = torch.autograd.grad(out_same, leaves, dout.cpu())

    assert_close_to_oracle(out, out_same, out64.detach(), "out")
    for name, ours, same, oracle in zip(("dx", "dlogits", "dgate", "dup", "ddown"), (dx, dlogits, dgate, dup, ddown),
                                        grads_same, grads64):
        assert_close_to_oracle(ours, same, oracle, name, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_combine_backward_strategies_agree_and_are_deterministic(device):
    T, E, k, H = 50, 8, 3, 200
    plan = moe.route(rand((T, E), torch.float32, device, seed=1), k)
    d = plan.dispatch(rand((T, H), torch.float32, device, seed=2))
    y, dout = rand((T * k, H), torch.float32, device, seed=3), rand((T, H), torch.float32, device, seed=4)
    dy_s, dw_s = d.combine_backward(y, dout, strategy="serial")
    dy_p, dw_p = d.combine_backward(y, dout, strategy="plane")
    dy_p2, dw_p2 = d.combine_backward(y, dout, strategy="plane")
    assert torch.equal(dy_s, dy_p) and torch.equal(dy_p, dy_p2) and torch.equal(dw_p, dw_p2)
    oracle = torch.stack([torch.stack([dout[t].cpu().double() @ y[int(d.row_of_slot[t, j])].cpu().double()
                                       for j in range(k)]) for t in range(T)])
    torch.testing.assert_close(dw_s.cpu().double(), oracle, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw_p.cpu().double(), oracle, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_training_without_tokens_and_with_idle_experts(device):
    E, H, I = 5, 8, 4
    gate, up = (rand((E, I, H), torch.float32, device, seed=s) for s in (1, 2))
    down = rand((E, H, I), torch.float32, device, seed=3)
    experts = moe.SwiGluExperts(gate, up, down)
    for T in (0, 1):
        logits = rand((T, E), torch.float32, device, seed=4)
        tplan = moe.route(logits, 2).into_training(logits)
        d = tplan.dispatch(rand((T, H), torch.float32, device, seed=5))
        y, cache = experts.forward_dispatched_training(d)
        dy, dw = d.combine_backward(y, rand((T, H), torch.float32, device, seed=6))
        dx_d, dgate, dup, ddown = cache.backward(dy)
        dx = d.dispatch_backward(dx_d)
        dl = tplan.router_backward(dw)
        assert tuple(dx.shape) == (T, H) and tuple(dl.shape) == (T, E)
        used = set(int(e) for e in tplan.expert_indices.cpu().long().flatten())
        for e in range(E):  # experts without tokens get exactly zero gradients
            if e not in used:
                assert not dgate[e].any() and not dup[e].any() and not ddown[e].any()
        if T == 0:
            assert not dgate.any() and not ddown.any()


def test_training_chain_numpy():
    rng = np.random.default_rng(1)
    T, E, k, H, I = 4, 6, 2, 5, 3
    x = rng.standard_normal((T, H)).astype(np.float32)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    gate, up = (rng.standard_normal((E, I, H)).astype(np.float32) for _ in range(2))
    down = rng.standard_normal((E, H, I)).astype(np.float32)
    tplan = moe.route(logits, k).into_training(logits)
    d = tplan.dispatch(x)
    y, cache = moe.SwiGluExperts(gate, up, down).forward_dispatched_training(d)
    dout = np.ones((T, H), np.float32)
    dy, dw = d.combine_backward(y, dout)
    dx_d, dgate, dup, ddown = cache.backward(dy)
    dx = d.dispatch_backward(dx_d)
    dl = tplan.router_backward(dw)
    assert all(isinstance(a, np.ndarray) for a in (dx, dl, dgate, dup, ddown))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).double().requires_grad_()
    leaves = [t(a) for a in (x, logits, gate, up, down)]
    out = ref.moe_layer(*leaves, torch.from_numpy(tplan.expert_indices.astype(np.int64)))
    grads = torch.autograd.grad(out, leaves, torch.ones(T, H, dtype=torch.float64))
    for ours, oracle in zip((dx, dl, dgate, dup, ddown), grads):
        torch.testing.assert_close(torch.from_numpy(ours).double(), oracle, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index", [0, 1])
def test_selected_router_backward_one_renormalized_slot_is_exactly_zero(device, index):
    # With top_k = 1 and renormalization the weight is scale * p / p = scale whatever the logits, so
    # the gradient is 0. The fuzzer found 8e4 at scale 2**40 (g * p / S rounded before subtracting
    # from g left one ulp of g, times the scale); q = p / S formed as the forward forms it is 1
    # exactly.
    logits = torch.tensor([[1.3227, 0.5338]], device=device)
    indices = torch.tensor([[index]], dtype=torch.int32, device=device)
    grad = torch.tensor([[3.0820]], device=device)
    dl = moe.selected_router_backward(logits, indices, grad, scoring="softmax", renormalize=True, scale=float(2**40))
    l64 = logits.cpu().double().requires_grad_()
    (oracle,) = torch.autograd.grad(_ref_router(l64, torch.tensor([[index]]), "softmax", True, float(2**40)), l64,
                                    grad.cpu().double())
    assert oracle.abs().max().item() < 1e-3  # float64 leaves at most a rounding of the scale
    assert torch.equal(dl.cpu(), torch.zeros_like(dl.cpu())), dl
