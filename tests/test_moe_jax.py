"""rudnn.jax.moe: XLA FFI custom calls under jax.jit and jax.grad against the naive reference."""

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from reference import moe as ref  # noqa: E402
from util import jax_gpu  # noqa: E402

if not rudnn._C.has_jax_ffi:
    pytest.skip("rudnn built without the XLA FFI handlers", allow_module_level=True)


def _inputs(T, E, H, I, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, H)).astype(np.float32), rng.standard_normal((T, E)).astype(np.float32),
            (rng.standard_normal((E, I, H)) / H ** 0.5).astype(np.float32),
            (rng.standard_normal((E, I, H)) / H ** 0.5).astype(np.float32),
            (rng.standard_normal((E, H, I)) / I ** 0.5).astype(np.float32))


@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_moe_layer_jit_and_grad(routing):
    T, E, k, H, I = 6, 16, 4, 12, 10
    arrays = _inputs(T, E, H, I)
    bias = np.linspace(-0.1, 0.1, E).astype(np.float32)
    dout = np.random.default_rng(1).standard_normal((T, H)).astype(np.float32)
    if routing == "softmax":
        layer = lambda *a: rj.moe.moe_layer(*a, top_k=k)
        indices, _ = rj.moe.route(arrays[1], k)
        opts = {}
    else:
        layer = lambda *a: rj.moe.moe_layer_sigmoid_grouped(*a, bias, top_k=k, groups=4, selected_groups=2, scale=2.0)
        indices, _ = rj.moe.route_sigmoid_grouped(arrays[1], bias, top_k=k, groups=4, selected_groups=2, scale=2.0)
        opts = dict(scoring="sigmoid", scale=2.0)
    out = jax.jit(layer)(*arrays)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(layer(*a) * dout), argnums=(0, 1, 2, 3, 4)))(*arrays)

    leaves = [torch.from_numpy(a).double().requires_grad_() for a in arrays]
    out64 = ref.moe_layer(*leaves, torch.from_numpy(np.asarray(indices).astype(np.int64)), **opts)
    grads64 = torch.autograd.grad(out64, leaves, torch.from_numpy(dout).double())
    np.testing.assert_allclose(np.asarray(out), out64.detach().numpy(), rtol=1e-4, atol=1e-5)
    for name, ours, oracle in zip(("dx", "dlogits", "dgate", "dup", "ddown"), grads, grads64):
        np.testing.assert_allclose(np.asarray(ours), oracle.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.usefixtures("jax_on_cpu")  # bitwise against the NumPy (CPU) path: JAX on the same backend
def test_steps_match_the_eager_api():
    T, E, k, H, I = 5, 8, 2, 6, 4
    x, logits, gate, up, down = _inputs(T, E, H, I, seed=3)
    indices, weights = rj.moe.route(logits, k)
    plan = rudnn.moe.route(logits, k)
    np.testing.assert_array_equal(np.asarray(indices), plan.expert_indices)
    np.testing.assert_array_equal(np.asarray(weights), plan.weights)
    xd, offsets, token_of_row, row_of_slot = rj.moe.dispatch(x, indices, E)
    d = plan.dispatch(x)
    for ours, eager in ((xd, d.x), (offsets, d.offsets), (token_of_row, d.token_of_row), (row_of_slot, d.row_of_slot)):
        np.testing.assert_array_equal(np.asarray(ours), eager)
    yd = rj.moe.swiglu_experts(xd, offsets, gate, up, down)
    np.testing.assert_array_equal(np.asarray(yd), rudnn.moe.SwiGluExperts(gate, up, down).forward_dispatched(d))
    w = rj.moe.selected_router_weights(logits, indices)
    np.testing.assert_array_equal(np.asarray(rj.moe.combine(yd, row_of_slot, w)),
                                  plan.into_training(logits).dispatch(x).combine(np.asarray(yd)))


def test_errors_at_trace_time():
    x, logits, gate, up, down = _inputs(3, 8, 6, 4)
    with pytest.raises(rudnn.ArgumentError, match=r"moe.route: top_k: expected 1 <= top_k <= E \(8\), got 9"):
        jax.jit(lambda l: rj.moe.route(l, 9))(logits)
    with pytest.raises(rudnn.ArgumentError, match="moe.route_sigmoid_grouped: groups: expected a divisor"):
        rj.moe.route_sigmoid_grouped(logits, top_k=2, groups=3, selected_groups=1)
    with pytest.raises(rudnn.ShapeError, match="SwiGluExperts.forward_dispatched: up: expected shape"):
        rj.moe.swiglu_experts(np.zeros((4, 6), np.float32), np.zeros(9, np.int32), gate, up[:, :, :5], down)
    with pytest.raises(rudnn.DTypeError, match="moe.selected_router_weights: indices: expected uint32, int32 or int64"):
        rj.moe.selected_router_weights(logits, np.zeros((3, 2), np.float32))


@pytest.mark.usefixtures("jax_on_cpu")  # bitwise against the NumPy (CPU) path: JAX on the same backend
@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_eager_api_with_jax_arrays(routing):
    """rudnn.moe's plan objects take JAX arrays (through the FFI calls) and give the results
    the NumPy path gives, for the forward and the whole training chain."""
    T, E, k, H, I = 5, 8, 2, 6, 4
    arrays = _inputs(T, E, H, I, seed=5)
    dout = np.random.default_rng(6).standard_normal((T, H)).astype(np.float32)

    def chain(x, logits, gate, up, down, dout):
        if routing == "softmax":
            plan = rudnn.moe.route(logits, k)
        else:
            plan = rudnn.moe.route_sigmoid_grouped(logits, top_k=k, groups=4, selected_groups=2, scale=1.5)
        tplan = plan.into_training(logits)
        d = tplan.dispatch(x)
        experts = rudnn.moe.SwiGluExperts(gate, up, down)
        y, cache = experts.forward_dispatched_training(d)
        out = d.combine(y)
        dy, dweights = d.combine_backward(y, dout, strategy="serial")
        dx_d, dgate, dup, ddown = cache.backward(dy)
        return (plan.expert_indices, plan.weights, d.offsets, experts.forward_dispatched(d), out,
                d.dispatch_backward(dx_d), tplan.router_backward(dweights), dgate, dup, ddown)

    ours = chain(*[jnp.asarray(a) for a in arrays], jnp.asarray(dout))
    eager = chain(*arrays, dout)
    assert all(isinstance(a, jax.Array) for a in ours)
    for a, b in zip(ours, eager):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_route_returns_a_routing_plan_pytree():
    """route gives the RoutingPlan of rudnn.moe, a pytree that leaves jax.jit intact; dispatch takes it."""
    T, E, k, H = 6, 8, 2, 4
    x, logits = (jnp.asarray(a) for a in _inputs(T, E, H, 3)[:2])
    plan = jax.jit(lambda l: rj.moe.route(l, k))(logits)
    assert isinstance(plan, rudnn.moe.RoutingPlan) and (plan.num_experts, plan.top_k, plan.scoring) == (E, k, "softmax")
    eager = rudnn.moe.route(logits, k)
    assert isinstance(eager, rudnn.moe.RoutingPlan)
    indices, weights = plan
    assert np.array_equal(np.asarray(indices), np.asarray(eager.expert_indices))
    assert np.array_equal(np.asarray(weights), np.asarray(eager.weights))
    from_plan = jax.jit(lambda x, p: rj.moe.dispatch(x, p))(x, plan)
    for a, b in zip(from_plan, rj.moe.dispatch(x, indices, E)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    leaves, tree = jax.tree_util.tree_flatten(rj.moe.route_sigmoid_grouped(logits, top_k=k, groups=4, selected_groups=2,
                                                                           scale=2.0))
    rebuilt = jax.tree_util.tree_unflatten(tree, leaves)
    assert (rebuilt.scoring, rebuilt.scale, rebuilt.num_experts, len(leaves)) == ("sigmoid", 2.0, E, 2)


# ---- gate and up interleaved for the fused forward (fused_gate_up) ---------------------------

def _interleaved(gate, up):
    """gate_up written from its definition: per expert, 64-row blocks of gate and of up alternate."""
    E, I, H = gate.shape
    return np.stack((gate.reshape(E, I // 64, 64, H), up.reshape(E, I // 64, 64, H)), axis=2).reshape(E, 2 * I, H)


@pytest.mark.usefixtures("jax_on_cpu")  # bitwise against the NumPy (CPU) path: JAX on the same backend
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_interleave_gate_up(dtype):
    """rudnn.jax.moe.interleave_gate_up (and rudnn.moe.interleave_gate_up with JAX arrays) under
    jit: the layout of the definition and of the NumPy path; its gradient is de-interleaved."""
    E, I, H = 3, 192, 40
    gate, up = (a.astype(dtype) for a in _inputs(1, E, H, I, seed=11)[2:4])
    gate_up = jax.jit(rj.moe.interleave_gate_up)(gate, up)
    assert gate_up.dtype == dtype and gate_up.shape == (E, 2 * I, H)
    np.testing.assert_array_equal(np.asarray(gate_up), _interleaved(gate, up))
    np.testing.assert_array_equal(np.asarray(gate_up), rudnn.moe.interleave_gate_up(gate, up))
    top = rudnn.moe.interleave_gate_up(jnp.asarray(gate), jnp.asarray(up))
    assert isinstance(top, jax.Array)
    np.testing.assert_array_equal(np.asarray(top), np.asarray(gate_up))
    ct = np.random.default_rng(12).standard_normal((E, 2 * I, H)).astype(dtype)
    dgate, dup = jax.grad(lambda g, u: jnp.sum(rj.moe.interleave_gate_up(g, u) * ct), argnums=(0, 1))(
        jnp.asarray(gate), jnp.asarray(up))
    blocks = ct.reshape(E, I // 64, 2, 64, H)
    np.testing.assert_array_equal(np.asarray(dgate), blocks[:, :, 0].reshape(E, I, H))
    np.testing.assert_array_equal(np.asarray(dup), blocks[:, :, 1].reshape(E, I, H))
    assert rj.moe.interleave_gate_up(jnp.zeros((2, 0, 8)), jnp.zeros((2, 0, 8))).shape == (2, 0, 8)


@pytest.mark.usefixtures("jax_on_cpu")  # the CPU backend reads gate and up: fused and unfused give the same bits
def test_fused_gate_up_forward_and_grad():
    """SwiGluExperts(..., fused_gate_up=True) with JAX arrays: gate_up made by the XLA call, the
    forward (which passes it to the experts call) bitwise the unfused one and close to the float64
    reference layer; swiglu_experts(gate_up=) under jit; jax.grad through the fused experts (the
    training forward) bitwise the unfused gradients, gate_up made outside or inside the
    differentiated function."""
    T, E, k, H, I = 9, 4, 2, 16, 128
    x, logits, gate, up, down = (jnp.asarray(a) for a in _inputs(T, E, H, I, seed=7))
    plain = rudnn.moe.SwiGluExperts(gate, up, down)
    fused = rudnn.moe.SwiGluExperts(gate, up, down, fused_gate_up=True)
    assert plain.gate_up is None and isinstance(fused.gate_up, jax.Array)
    np.testing.assert_array_equal(np.asarray(fused.gate_up), _interleaved(np.asarray(gate), np.asarray(up)))
    plan = rudnn.moe.route(logits, k)
    d = plan.dispatch(x)
    y = fused.forward_dispatched(d)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(plain.forward_dispatched(d)))
    out = fused(x, logits, top_k=k)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain(x, logits, top_k=k)))
    leaves = [torch.from_numpy(np.array(a)).double() for a in (x, logits, gate, up, down)]
    out64 = ref.moe_layer(*leaves, torch.from_numpy(np.asarray(plan.expert_indices).astype(np.int64)))
    np.testing.assert_allclose(np.asarray(out), out64.numpy(), rtol=1e-4, atol=1e-5)

    def experts(gate_up):
        return lambda xd, g, u, dn: rj.moe.swiglu_experts(xd, d.offsets, g, u, dn, gate_up=gate_up(g, u))

    fused_fn, plain_fn = experts(lambda g, u: fused.gate_up), experts(lambda g, u: None)
    inside_fn = experts(rj.moe.interleave_gate_up)
    args = (d.x, gate, up, down)
    np.testing.assert_array_equal(np.asarray(jax.jit(fused_fn)(*args)), np.asarray(y))
    # the forward hands gate_up to the experts call (where the sm90 tensor_core path fuses)
    jaxpr = str(jax.make_jaxpr(lambda xd: fused.forward_dispatched(d))(d.x))
    assert "target_name=rudnn_moe_experts_inference" in jaxpr and "('has_gate_up', True)" in jaxpr
    dy = np.random.default_rng(8).standard_normal(y.shape).astype(np.float32)
    grads = [jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * dy), argnums=(0, 1, 2, 3)))(*args)
             for f in (plain_fn, fused_fn, inside_fn)]
    for name, want, *got in zip(("dx", "dgate", "dup", "ddown"), *grads):
        for g in got:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(want), err_msg=name)

    def layer_loss(g, fused_gate_up):
        return jnp.sum(rudnn.moe.SwiGluExperts(g, up, down, fused_gate_up=fused_gate_up)(x, logits, top_k=k))

    np.testing.assert_array_equal(np.asarray(jax.grad(layer_loss)(gate, True)),
                                  np.asarray(jax.grad(layer_loss)(gate, False)))


GPU = jax_gpu()


@pytest.mark.cuda
@pytest.mark.skipif(GPU is None, reason="needs a JAX CUDA device and a CUDA build of rudnn")
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("T, E, k, H, I", [
    (300, 8, 2, 256, 128),  # ~75 rows per expert: partial row tiles, two h tiles
    (300, 4, 1, 40, 192),   # H = 40: a partial, zero-filled K tile
])
def test_cuda_fused_gate_up_is_bitwise_the_unfused_result(dtype, T, E, k, H, I, monkeypatch):
    """JAX arrays on the GPU: gate_up made on the GPU, the fused forward (the sm90 tensor_core
    path reads gate_up) bitwise the unfused one and close to the float64 reference, under jit too;
    jax.grad through the fused experts equals the unfused gradients."""
    monkeypatch.delenv("RUDNN_MOE_SM80_ON_SM90", raising=False)
    f32 = jnp.float32
    x, logits, gate, up, down = (jax.device_put(jnp.asarray(a).astype(dtype), GPU)
                                 for a in _inputs(T, E, H, I, seed=9))
    plain = rudnn.moe.SwiGluExperts(gate, up, down)
    fused = rudnn.moe.SwiGluExperts(gate, up, down, fused_gate_up=True)
    assert fused.gate_up.devices() == {GPU}
    np.testing.assert_array_equal(np.asarray(fused.gate_up.astype(f32)),
                                  _interleaved(np.asarray(gate.astype(f32)), np.asarray(up.astype(f32))))
    plan = rudnn.moe.route(logits, k)
    d = plan.dispatch(x)
    for strategy in ("tensor_core", "auto"):
        y_fused = fused.forward_dispatched(d, strategy)
        assert y_fused.devices() == {GPU}
        np.testing.assert_array_equal(np.asarray(y_fused.astype(f32)),
                                      np.asarray(plain.forward_dispatched(d, strategy).astype(f32)))
    jitted = jax.jit(lambda xd, gu: rj.moe.swiglu_experts(xd, d.offsets, gate, up, down, "tensor_core", gate_up=gu))
    np.testing.assert_array_equal(np.asarray(jitted(d.x, fused.gate_up).astype(f32)),
                                  np.asarray(plain.forward_dispatched(d, "tensor_core").astype(f32)))
    out = fused(x, logits, top_k=k)
    leaves = [torch.from_numpy(np.array(a.astype(f32))).double() for a in (x, logits, gate, up, down)]
    out64 = ref.moe_layer(*leaves, torch.from_numpy(np.asarray(plan.expert_indices).astype(np.int64)))
    np.testing.assert_allclose(np.asarray(out.astype(f32)), out64.numpy(), rtol=5e-2, atol=5e-2)

    def loss(gate_up):
        return lambda xd: jnp.sum(rj.moe.swiglu_experts(xd, d.offsets, gate, up, down, gate_up=gate_up).astype(f32))

    np.testing.assert_array_equal(np.asarray(jax.grad(loss(fused.gate_up))(d.x).astype(f32)),
                                  np.asarray(jax.grad(loss(None))(d.x).astype(f32)))
