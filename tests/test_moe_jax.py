"""rudnn.jax.moe: XLA FFI custom calls under jax.jit and jax.grad against the naive reference."""

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from reference import moe as ref  # noqa: E402

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
