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
