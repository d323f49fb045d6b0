"""rudnn.jax.paged (CPU): FFI calls equal to the torch/NumPy CPU results and the float64
reference; under jax.jit with a schedule rewritten into a reserved plan; append returning new
caches; errors surfacing as rudnn errors; jax.grad equal to the CPU backward."""

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import rudnn  # noqa: E402
from rudnn.paged import DevicePlan, HostPlan, SplitWorkspace  # noqa: E402
from reference import paged as ref  # noqa: E402
from test_paged import mla_case, plan_of, ref_sched, schedule  # noqa: E402
from util import assert_close_to_oracle, jax_gpu, rand  # noqa: E402

if not rudnn._C.has_jax_ffi:
    pytest.skip("this build has no JAX FFI handlers", allow_module_level=True)
import rudnn.jax.paged  # noqa: E402


def host_of(sched):
    page_size, pages, tables, lengths, seq_ids, positions = sched
    return HostPlan(page_size, pages, tables, lengths, seq_ids, positions)


def j(t):
    return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16) if t.dtype == torch.bfloat16 else jnp.asarray(t.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_attention_equals_cpu_backend(dtype):
    sched = schedule([37, 5, 20], [1, 2, 20], 16, seed=1)
    q = rand((len(sched[4]), 8, 32), dtype, seed=1)
    k = rand((sched[1], 16, 2, 32), dtype, seed=2)
    v = rand((sched[1], 16, 2, 16), dtype, seed=3)
    want, want_lse = plan_of(sched, q).attention(q, k, v, 0.2, True, return_lse=True)
    plan = DevicePlan.upload(host_of(sched), j(q))
    assert plan.framework == "jax" and plan.tables.dtype == jnp.int32
    out, lse = plan.attention(j(q), j(k), j(v), 0.2, True, return_lse=True)
    assert out.dtype == j(q).dtype
    np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), want.float().numpy())
    np.testing.assert_array_equal(np.asarray(lse), want_lse.numpy())
    split = rudnn.jax.paged.attention(plan, j(q), j(k), j(v), 0.2, True, splits=5)
    tol = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    np.testing.assert_allclose(np.asarray(split.astype(jnp.float32)), want.float().numpy(), rtol=tol, atol=tol)


def test_mla_equals_reference():
    sched, q, qp, latent, kp = mla_case([70, 3], [1, 3], 64, 8, 64, 16, torch.float32, seed=4)
    plan = rudnn.jax.paged.upload(host_of(sched), j(q))
    out = rudnn.jax.paged.mla(plan, j(q), j(qp), j(latent), j(kp), 0.1, True)
    o64, _ = ref.mla(ref_sched(sched), q, qp, latent, kp, scale=0.1, causal=True)
    same = ref.mla(ref_sched(sched), q, qp, latent, kp, scale=0.1, causal=True, dtype=torch.float32)[0]
    assert_close_to_oracle(torch.from_numpy(np.array(out)), same, o64)


def test_jit_with_a_plan_rewritten_into_a_reservation():
    q0 = jnp.zeros((1,), jnp.float32)
    plan = DevicePlan.reserve(q0, 4, 4, 8)
    k = rand((40, 16, 2, 32), torch.float32, seed=1)
    v = rand((40, 16, 2, 32), torch.float32, seed=2)
    traces = []

    @jax.jit
    def step(p, q, k_new, v_new, kc, vc):
        traces.append(1)
        kc, vc = p.append(k_new, v_new, kc, vc)
        return p.attention(q, kc, vc, 0.25, True), kc, vc

    for seed, lengths in [(1, [30, 7, 100, 64]), (2, [5, 120, 3, 17])]:
        sched = schedule(lengths, [1, 1, 1, 1], 16, seed=seed, spare_pages=40 - sum(-(-n // 16) for n in lengths))
        DevicePlan.upload(host_of(sched), q0, into=plan)
        q = rand((4, 8, 32), torch.float32, seed=seed)
        kn, vn = rand((4, 2, 32), torch.float32, seed=seed + 5), rand((4, 2, 32), torch.float32, seed=seed + 6)
        out, kc, vc = step(plan, j(q), j(kn), j(vn), j(k), j(v))
        # the torch CPU path on the same inputs
        tplan = plan_of(sched, q)
        k2, v2 = k.clone(), v.clone()
        tplan.append(kn, vn, k2, v2)
        np.testing.assert_array_equal(np.asarray(kc), k2.numpy())
        np.testing.assert_array_equal(np.asarray(vc), v2.numpy())
        np.testing.assert_array_equal(np.asarray(out), tplan.attention(q, k2, v2, 0.25, True).numpy())
    assert len(traces) == 1  # a new schedule of the same capacity did not retrace


def test_append_returns_new_arrays():
    sched = schedule([3, 6], [1, 2], 4, seed=30)
    plan = rudnn.jax.paged.upload(host_of(sched), jnp.zeros((1,)))
    kc, vc = jnp.zeros((sched[1], 4, 1, 8)), jnp.zeros((sched[1], 4, 1, 2))
    k2, v2 = plan.append(jnp.ones((3, 1, 8)), jnp.ones((3, 1, 2)), kc, vc)
    assert float(kc.sum()) == 0 and float(k2.sum()) == 3 * 8 and float(v2.sum()) == 3 * 2


def test_errors_are_rudnn_errors():
    sched = schedule([3, 6], [1, 2], 4, seed=30)
    plan = rudnn.jax.paged.upload(host_of(sched), jnp.zeros((1,)))
    with pytest.raises(rudnn.ShapeError, match="paged_attention: q: expected 3 query rows"):
        rudnn.jax.paged.attention(plan, jnp.zeros((2, 4, 8)), jnp.zeros((sched[1], 4, 1, 8)),
                                  jnp.zeros((sched[1], 4, 1, 8)))
    dup = rudnn.jax.paged.upload(HostPlan(4, 3, [[0, 1], [0]], [6, 4], [0, 1], [1, 1]), jnp.zeros((1,)))
    with pytest.raises(rudnn.ArgumentError, match="paged_append: rows 0 and 1 both write page 0 slot 1"):
        dup.append(jnp.ones((2, 1, 2)), jnp.ones((2, 1, 2)), jnp.zeros((3, 4, 1, 2)), jnp.zeros((3, 4, 1, 2)))
    torch_plan = plan_of(sched, torch.zeros(1))
    with pytest.raises(rudnn.ArgumentError, match="paged_attention: plan: expected a plan of JAX arrays"):
        rudnn.jax.paged.attention(torch_plan, jnp.zeros((3, 4, 8)), jnp.zeros((9, 4, 1, 8)), jnp.zeros((9, 4, 1, 8)))
    with pytest.raises(rudnn.ArgumentError, match="rudnn.jax.paged.upload|into: expected a plan of JAX arrays"):
        DevicePlan.upload(host_of(sched), jnp.zeros((1,)), into=torch_plan)


def test_grad_equals_the_torch_backward():
    sched = schedule([37, 5, 20], [1, 2, 20], 16, seed=1)
    q = rand((len(sched[4]), 8, 32), torch.float32, seed=1)
    k = rand((sched[1], 16, 2, 32), torch.float32, seed=2)
    v = rand((sched[1], 16, 2, 16), torch.float32, seed=3)
    dout = rand((len(sched[4]), 8, 16), torch.float32, seed=4)
    w = rand((len(sched[4]), 8), torch.float32, seed=5)
    plan = rudnn.jax.paged.upload(host_of(sched), j(q))

    def loss(q, k, v):
        out, lse = rudnn.jax.paged.attention(plan, q, k, v, 0.2, True, return_lse=True)
        return (out * j(dout)).sum() + (lse * j(w)).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(j(q), j(k), j(v))
    want = plan_of(sched, q).attention_backward(q, k, v, dout, 0.2, True, dlse=w)
    for g, t in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), t.numpy(), rtol=1e-6, atol=1e-6)


def test_mla_grad():
    sched, q, qp, latent, kp = mla_case([30, 3], [1, 3], 16, 4, 32, 8, torch.float32, seed=4)
    dout = rand(tuple(q.shape), torch.float32, seed=9)
    plan = rudnn.jax.paged.upload(host_of(sched), j(q))

    def loss(*xs):
        return (rudnn.jax.paged.mla(plan, *xs, 0.1, True) * j(dout)).sum()

    got = jax.grad(loss, argnums=(0, 1, 2, 3))(j(q), j(qp), j(latent), j(kp))
    want = plan_of(sched, q).mla_backward(q, qp, latent, kp, dout, 0.1, True)
    for g, t in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), t.numpy(), rtol=1e-6, atol=1e-6)


def test_plan_backward_methods():
    sched = schedule([37, 5], [1, 2], 16, seed=2)
    q = rand((3, 4, 16), torch.float32, seed=1)
    k = rand((sched[1], 16, 2, 16), torch.float32, seed=2)
    v = rand((sched[1], 16, 2, 8), torch.float32, seed=3)
    dout = rand((3, 4, 8), torch.float32, seed=4)
    want = plan_of(sched, q).attention_backward(q, k, v, dout, 0.3, True)
    plan = DevicePlan.upload(host_of(sched), j(q))
    got = plan.attention_backward(j(q), j(k), j(v), j(dout), 0.3, True)
    for g, t in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), t.numpy())
    only = plan.attention_backward(j(q), j(k), j(v), j(dout), 0.3, True, need=("dv",))
    assert only[0] is None and only[1] is None and only[2] is not None
    sched, q, qp, latent, kp = mla_case([20, 3], [1, 3], 16, 4, 32, 8, torch.float32, seed=4)
    dout = rand(tuple(q.shape), torch.float32, seed=9)
    want = plan_of(sched, q).mla_backward(q, qp, latent, kp, dout, 0.1, False)
    plan = DevicePlan.upload(host_of(sched), j(q))
    got = plan.mla_backward(j(q), j(qp), j(latent), j(kp), j(dout), 0.1, False)
    for g, t in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), t.numpy())


_GPU = jax_gpu()
needs_jax_gpu = pytest.mark.skipif(_GPU is None, reason="needs a JAX CUDA device and a CUDA build of rudnn")


def jg(t):
    return jax.device_put(j(t), _GPU)


@needs_jax_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_attention_forward_and_backward(dtype):
    """JAX on CUDA: the forward (splits=1 lets the handler pick a split count; explicit splits),
    the atomic backward (scratch accumulators for 16-bit caches) and the ordered backward
    (bitwise equal to torch's on CUDA), against the CPU backend and torch CUDA."""
    sched = schedule([1500, 5, 300], [1, 2, 20], 16, seed=1)
    q = rand((len(sched[4]), 8, 64), dtype, seed=1)
    k = rand((sched[1], 16, 2, 64), dtype, seed=2)
    v = rand((sched[1], 16, 2, 32), dtype, seed=3)
    dout = rand((len(sched[4]), 8, 32), dtype, seed=4)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    want = plan_of(sched, q).attention(q, k, v, 0.2, True)
    plan = rudnn.jax.paged.upload(host_of(sched), jg(q))
    assert plan.device == ("cuda", _GPU.id) and next(iter(plan.tables.devices())) == _GPU
    for splits in (1, 4):
        out = rudnn.jax.paged.attention(plan, jg(q), jg(k), jg(v), 0.2, True, splits=splits)
        assert next(iter(out.devices())) == _GPU
        np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want.float().numpy(), rtol=tol, atol=tol)
    grads = plan.attention_backward(jg(q), jg(k), jg(v), jg(dout), 0.2, True)
    want_grads = plan_of(sched, q).attention_backward(q, k, v, dout, 0.2, True)
    for g, t in zip(grads, want_grads):
        np.testing.assert_allclose(np.asarray(g.astype(jnp.float32)), t.float().numpy(), rtol=tol, atol=tol)
    ws = rudnn.paged.OrderedBackwardWorkspace(plan, jg(q))
    ordered = [plan.attention_backward(jg(q), jg(k), jg(v), jg(dout), 0.2, True, workspace=ws) for _ in range(2)]
    tq = q.cuda()
    tplan = plan_of(sched, tq)
    tws = rudnn.paged.OrderedBackwardWorkspace(tplan, tq)
    torch_ordered = tplan.attention_backward(tq, k.cuda(), v.cuda(), dout.cuda(), 0.2, True, workspace=tws)
    for a, b, t in zip(ordered[0], ordered[1], torch_ordered):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), t.float().cpu().numpy())


@needs_jax_gpu
def test_cuda_mla_and_append():
    sched, q, qp, latent, kp = mla_case([700, 3], [1, 3], 64, 8, 64, 16, torch.float32, seed=4)
    plan = rudnn.jax.paged.upload(host_of(sched), jg(q))
    out = rudnn.jax.paged.mla(plan, jg(q), jg(qp), jg(latent), jg(kp), 0.1, True)
    want = plan_of(sched, q).mla(q, qp, latent, kp, 0.1, True)
    np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=2e-5, atol=2e-5)
    dout = rand(tuple(q.shape), torch.float32, seed=9)
    got = plan.mla_backward(jg(q), jg(qp), jg(latent), jg(kp), jg(dout), 0.1, True)
    for g, t in zip(got, plan_of(sched, q).mla_backward(q, qp, latent, kp, dout, 0.1, True)):
        np.testing.assert_allclose(np.asarray(g), t.numpy(), rtol=2e-5, atol=2e-5)
    # append: new rows into the caches, the inputs left as they were
    k_new, v_new = rand((len(sched[4]), 1, 64), torch.float32, seed=11), rand((len(sched[4]), 1, 16),
                                                                              torch.float32, seed=12)
    lat, kpj = jg(latent), jg(kp)
    lat2, kp2 = rudnn.jax.paged.append(plan, jg(k_new), jg(v_new), lat, kpj)
    tl, tk = latent.clone(), kp.clone()
    plan_of(sched, q).append(k_new, v_new, tl, tk)
    np.testing.assert_array_equal(np.asarray(lat2), tl.numpy())
    np.testing.assert_array_equal(np.asarray(kp2), tk.numpy())
    np.testing.assert_array_equal(np.asarray(lat), latent.numpy())
