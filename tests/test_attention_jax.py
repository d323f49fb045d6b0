"""rudnn.jax.attention: XLA FFI custom calls under eager, jit and grad, against the float64
reference (error budget: twice that of the same-dtype torch computation)."""

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from reference import attention as ref  # noqa: E402
from util import DTYPES, assert_close_to_oracle, rand  # noqa: E402

pytestmark = pytest.mark.skipif(not getattr(rudnn._C, "has_jax_ffi", False),
                                reason="rudnn was built without the JAX FFI handlers")

_JNP = {torch.float32: jnp.float32, torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16}


def J(t):
    if t is None:
        return None
    if t.dtype == torch.bool:
        return jnp.asarray(t.numpy())
    return jnp.asarray(t.detach().cpu().float().numpy()).astype(_JNP[t.dtype])


def T(a):
    dtype = {jnp.dtype(v): k for k, v in _JNP.items()}[jnp.dtype(a.dtype)]
    return torch.from_numpy(np.array(a.astype(jnp.float32))).to(dtype)


def _inputs(dtype, B=2, Hq=4, Hkv=2, Sq=6, Sk=9, D=16):
    return (rand((B, Hq, Sq, D), dtype, seed=1), rand((B, Hkv, Sk, D), dtype, seed=2),
            rand((B, Hkv, Sk, D), dtype, seed=3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_and_grad(dtype):
    q, k, v = _inputs(dtype)
    mask = torch.rand(6, 9, generator=torch.Generator().manual_seed(0)) > 0.3
    bias = rand((4, 1, 9), torch.float32, seed=4)
    opts = dict(causal=True, softcap=3.0, window=(6, None))
    out, lse = rudnn.attention(J(q), J(k), J(v), mask=J(mask), bias=J(bias), return_lse=True, **opts)
    assert isinstance(out, jax.Array) and out.dtype == _JNP[dtype] and lse.dtype == jnp.float32
    o64, l64 = ref.attention(q, k, v, mask=mask, bias=bias, **opts)
    osame, _ = ref.attention(q, k, v, mask=mask, bias=bias, dtype=dtype, **opts)
    assert_close_to_oracle(T(out), osame, o64, "out")
    torch.testing.assert_close(torch.from_numpy(np.array(lse)).double(), l64, rtol=2e-5, atol=2e-5)

    g = rand(out.shape, dtype, seed=5)

    def loss(q_, k_, v_):
        o = rj.attention(q_, k_, v_, mask=J(mask), bias=J(bias), **opts)
        return jnp.sum(o.astype(jnp.float32) * J(g).astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(J(q), J(k), J(v))

    def oracle(dt):
        leaves = [t.detach().clone().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = ref.attention(*leaves, mask=mask, bias=bias, dtype=dt, **opts)
        o.backward(g.to(dt))
        return [t.grad for t in leaves]

    for ours, same, exact, name in zip(grads, oracle(dtype), oracle(torch.float64), ("dq", "dk", "dv")):
        assert_close_to_oracle(T(ours), same, exact, name)


def test_varlen_and_explicit_backward():
    cu = np.array([0, 4, 4, 9], dtype=np.int32)
    q, k, v = (rand((9, h, 16), torch.float32, seed=s) for h, s in ((4, 1), (2, 2), (2, 3)))
    out, lse = rj.attention(J(q), J(k), J(v), cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, return_lse=True)
    o64, l64 = ref.attention_varlen(q, k, v, cu, cu, causal=True)
    torch.testing.assert_close(T(out).double(), o64, rtol=1e-5, atol=1e-6)
    assert lse.shape == (4, 9)
    dout = rand((9, 4, 16), torch.float32, seed=4)
    dq, dk, dv = rj.attention_backward(J(dout), J(q), J(k), J(v), out, lse, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                       causal=True)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o, _ = ref.attention_varlen(*leaves, cu, cu, causal=True)
    o.backward(dout.double())
    for ours, exact in zip((dq, dk, dv), leaves):
        torch.testing.assert_close(T(ours).double(), exact.grad, rtol=1e-5, atol=1e-5)


# GQA 8 with one query row (decode) and MHA with rows that see no key (causal, Sq > Sk): out 0,
# lse -inf and zero dq there; jax.grad through a packed batch with an empty sequence.
@pytest.mark.parametrize("Hq, Hkv, Sq, Sk, opts", [(8, 1, 1, 13, dict(softcap=3.0)), (4, 4, 9, 4, dict(causal=True))],
                         ids=["decode_gqa8", "mha_empty_rows"])
def test_grad_gqa_decode_and_empty_rows(Hq, Hkv, Sq, Sk, opts):
    q, k, v = _inputs(torch.float32, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk)
    out, lse = rj.attention(J(q), J(k), J(v), return_lse=True, **opts)
    o64, l64 = ref.attention(q.double(), k.double(), v.double(), **opts)
    torch.testing.assert_close(T(out).double(), o64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(np.array(lse)).double(), l64, rtol=1e-5, atol=1e-5)
    g = rand(tuple(out.shape), torch.float32, seed=6)
    grads = jax.jit(jax.grad(lambda a, b, c: jnp.sum(rj.attention(a, b, c, **opts) * J(g)), argnums=(0, 1, 2)))(
        J(q), J(k), J(v))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o, _ = ref.attention(*leaves, **opts)
    o.backward(g.double())
    for ours, exact in zip(grads, leaves):
        torch.testing.assert_close(T(ours).double(), exact.grad, rtol=1e-5, atol=1e-5)
    empty = Sq - Sk if opts.get("causal") else 0  # query i sees keys j <= i + Sk - Sq
    assert (np.array(out)[:, :, :empty] == 0).all() and (np.array(lse)[:, :, :empty] == -np.inf).all()
    assert (np.array(grads[0])[:, :, :empty] == 0).all()


def test_grad_varlen_with_empty_sequences():
    cu_q, cu_k = np.array([0, 4, 4, 9, 11], dtype=np.int32), np.array([0, 6, 9, 9, 14], dtype=np.int32)
    q, k, v = (rand((t, h, 16), torch.float32, seed=s) for t, h, s in ((11, 8, 1), (14, 1, 2), (14, 1, 3)))
    g = rand((11, 8, 16), torch.float32, seed=4)

    def loss(a, b, c):
        return jnp.sum(rj.attention(a, b, c, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True) * J(g))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(J(q), J(k), J(v))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o, _ = ref.attention_varlen(*leaves, cu_q, cu_k, causal=True)
    o.backward(g.double())
    for ours, exact in zip(grads, leaves):
        torch.testing.assert_close(T(ours).double(), exact.grad, rtol=1e-5, atol=1e-5)
    # sequence 1 has keys but no queries, sequence 2 queries but no keys: their dk and dq are 0
    assert (np.array(grads[1])[6:9] == 0).all() and (np.array(grads[0])[4:9] == 0).all()


def test_differentiating_mask_or_bias_is_refused():
    """No cotangent is computed for a mask or a bias: asking for one is refused (as rudnn.torch
    refuses one that requires grad) rather than answered with zeros; not differentiating them
    (a constant, or another argnum) works."""
    q, k, v = (J(t) for t in _inputs(torch.float32))
    extra = jnp.asarray(rand((q.shape[2], k.shape[2]), torch.float32, seed=5).numpy())
    for name in ("mask", "bias"):
        def loss(a, m):
            return jnp.sum(rj.attention(a, k, v, **{name: m}))

        with pytest.raises(rudnn.UnsupportedError, match=f"attention: {name}: gradients with respect to {name} are "
                                                         f"not computed; pass jax.lax.stop_gradient"):
            jax.grad(loss, argnums=1)(q, extra)
        with pytest.raises(rudnn.UnsupportedError, match=f"attention: {name}: gradients"):
            jax.jit(jax.grad(loss, argnums=(0, 1)))(q, extra)
        dq = jax.grad(loss)(q, extra)  # the mask or bias is not differentiated
        expected = jax.grad(loss)(q, jax.lax.stop_gradient(extra))
        np.testing.assert_array_equal(np.asarray(dq), np.asarray(expected))
        assert np.isfinite(np.asarray(dq)).all() and np.abs(np.asarray(dq)).max() > 0


def test_errors_at_trace_time():
    q, k, v = _inputs(torch.float32, Hq=3)
    with pytest.raises(rudnn.ShapeError, match="attention: the number of query heads Hq = 3 must be a multiple"):
        jax.jit(lambda a, b, c: rj.attention(a, b, c))(J(q), J(k), J(v))
    q, k, v = _inputs(torch.float32)
    with pytest.raises(rudnn.ArgumentError, match="attention: scale: expected a finite value > 0"):
        rj.attention(J(q), J(k), J(v), scale=0.0)
    with pytest.raises(rudnn.DTypeError, match="attention: k: expected the dtype of q"):
        rj.attention(J(q), J(k).astype(jnp.float16), J(v))
    with pytest.raises(rudnn.UnsupportedError, match="out= is not supported"):
        rj.attention(J(q), J(k), J(v), out=J(q))
    with pytest.raises(rudnn.ArgumentError, match="attention: causal: expected True or False, got 'no'"):
        rj.attention(J(q), J(k), J(v), causal="no")
    with pytest.raises(rudnn.ArgumentError, match="attention: return_lse: expected True or False, got 1"):
        rj.attention(J(q), J(k), J(v), return_lse=1)


def test_errors_of_arguments_and_frameworks():
    q, k, v = _inputs(torch.float32)
    with pytest.raises(rudnn.FrameworkError, match="attention: k: expected a jax.Array, got torch.Tensor"):
        rj.attention(J(q), k, J(v))
    with pytest.raises(rudnn.ArgumentError, match="attention: strategy: expected one of 'auto', 'flash', 'fallback', "
                                                  "'autotune', got 'fast'"):
        rj.attention(J(q), J(k), J(v), strategy="fast")
    with pytest.raises(rudnn.ArgumentError, match=r"attention: scale: expected a Python float \(a static value, not a "
                                                  r"traced array\)"):
        jax.jit(lambda a, b, c, s: rj.attention(a, b, c, scale=s))(J(q), J(k), J(v), 0.5)
    with pytest.raises(rudnn.ArgumentError, match=r"attention: scale: expected a Python float .*, got str"):
        rj.attention(J(q), J(k), J(v), scale="0.5")
    with pytest.raises(rudnn.ArgumentError, match="attention_backward: softcap: expected a Python float"):
        jax.jit(lambda s: rj.attention_backward(J(q), J(q), J(k), J(v), J(q), jnp.zeros((2, 4, 6)), softcap=s))(2.0)


@pytest.mark.usefixtures("jax_on_cpu")  # the CPU handler checks the values (CUDA clamps them)
def test_cu_seqlens_values_are_checked_when_the_call_runs():
    """The offsets' values are data, read by the CPU handler when XLA runs it: an eager call raises
    the rudnn error the handler reported; under jit the failure comes when the compiled function
    runs, as XLA's runtime error carrying the rudnn error's name and message."""
    q, k, v = (rand((7, 4, 8), torch.float32, seed=1), rand((9, 2, 8), torch.float32, seed=2),
               rand((9, 2, 8), torch.float32, seed=3))
    cu_q, cu_k = np.array([0, 5, 3, 7], dtype=np.int32), np.array([0, 3, 6, 9], dtype=np.int32)
    message = "attention: cu_seqlens_q: expected non-decreasing offsets, got 3 after 5 at index 2"
    with pytest.raises(rudnn.ArgumentError) as info:
        rj.attention(J(q), J(k), J(v), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).block_until_ready()
    assert str(info.value) == message
    with pytest.raises(rudnn.ArgumentError, match=message):
        rudnn.attention(J(q), J(k), J(v), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    jitted = jax.jit(lambda a, b, c, cq, ck: rj.attention(a, b, c, cu_seqlens_q=cq, cu_seqlens_k=ck))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"rudnn\.ArgumentError: " + message):
        jitted(J(q), J(k), J(v), jnp.asarray(cu_q), jnp.asarray(cu_k)).block_until_ready()


# With return_lse=True the gradient flows through lse too (d lse_i / d s_ij = softmax_ij), as
# merging partial attentions by their lse needs; a cotangent of lse alone works as well.
@pytest.mark.parametrize("use", ["out_and_lse", "lse_only"])
@pytest.mark.parametrize("Hq, Hkv, Sq, Sk, opts", [(4, 2, 6, 9, dict(softcap=3.0, window=(4, None))),
                                                   (4, 4, 9, 4, dict(causal=True))], ids=["gqa", "empty_rows"])
def test_grad_through_lse(use, Hq, Hkv, Sq, Sk, opts):
    q, k, v = _inputs(torch.float32, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk)
    mask = torch.rand(Sq, Sk, generator=torch.Generator().manual_seed(0)) > 0.2
    g, h = rand((2, Hq, Sq, 16), torch.float32, seed=6), rand((2, Hq, Sq), torch.float32, seed=7)

    def loss(a, b, c):
        o, l = rj.attention(a, b, c, mask=J(mask), return_lse=True, **opts)
        lse_term = jnp.sum(jnp.where(jnp.isfinite(l), l, 0.0) * J(h))
        return lse_term + (jnp.sum(o * J(g)) if use == "out_and_lse" else 0.0)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(J(q), J(k), J(v))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o, l = ref.attention(*leaves, mask=mask, **opts)
    total = (torch.where(torch.isfinite(l), l, torch.zeros_like(l)) * h.double()).sum()
    (total + ((o * g.double()).sum() if use == "out_and_lse" else 0)).backward()
    for ours, exact, name in zip(grads, leaves, ("dq", "dk", "dv")):
        expected = exact.grad if exact.grad is not None else torch.zeros_like(exact)  # lse does not depend on v
        torch.testing.assert_close(T(ours).double(), expected, rtol=1e-5, atol=1e-5, msg=name)


def test_grad_through_lse_varlen():
    cu_q, cu_k = np.array([0, 4, 4, 9, 11], dtype=np.int32), np.array([0, 6, 9, 9, 14], dtype=np.int32)
    q, k, v = (rand((t, h, 16), torch.float32, seed=s) for t, h, s in ((11, 8, 1), (14, 2, 2), (14, 2, 3)))
    h = rand((8, 11), torch.float32, seed=4)

    def loss(a, b, c):
        o, l = rj.attention(a, b, c, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, return_lse=True)
        return jnp.sum(o) + jnp.sum(jnp.where(jnp.isfinite(l), l, 0.0) * J(h))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(J(q), J(k), J(v))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o, l = ref.attention_varlen(*leaves, cu_q, cu_k, causal=True)
    (o.sum() + (torch.where(torch.isfinite(l), l, torch.zeros_like(l)) * h.double()).sum()).backward()
    for ours, exact in zip(grads, leaves):
        torch.testing.assert_close(T(ours).double(), exact.grad, rtol=1e-5, atol=1e-5)
