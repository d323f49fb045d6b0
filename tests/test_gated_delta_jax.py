"""rudnn.jax gated delta ops: XLA FFI custom calls eager, under jit and grad, against the
float64 reference recurrence (and torch autograd through it)."""

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from test_gated_delta import check_forward, make_inputs, oracle_grads  # noqa: E402
from test_jax import DEVICES, HAS_FFI, J, T, device  # noqa: E402,F401
from util import DTYPES, assert_close_to_oracle  # noqa: E402

pytestmark = pytest.mark.skipif(not HAS_FFI, reason="rudnn was built without the JAX FFI handlers")


def _int(t):
    return None if t is None else jnp.asarray(t.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ["chunk", "recurrent"])
def test_forward(device, dtype, entry):
    args = make_inputs(1, 2, 4, 19, 8, 12, dtype, seed=61)
    jargs = [J(t) for t in args]
    if entry == "chunk":
        out, final = rj.chunk_gated_delta_rule(*jargs, scale=0.4, chunk_size=16)
    else:
        out, final = rudnn.gated_delta_rule(*jargs, scale=0.4)  # the rudnn entry point forwards JAX arrays
    assert isinstance(out, jax.Array) and out.dtype == jargs[0].dtype and final.dtype == jnp.float32
    check_forward(T(out), T(final), *args, 0.4, tensor_cores=entry == "chunk" and device == "cuda")


def test_varlen_and_jit(device):
    cu = torch.tensor([0, 3, 3, 4, 20], dtype=torch.int32)
    args = make_inputs(1, 1, 2, 20, 8, 8, torch.float32, seed=67, cu_seqlens=cu)
    f = jax.jit(lambda *a: rj.chunk_gated_delta_rule(*a[:6], scale=0.5, chunk_size=8, cu_seqlens=a[6]))
    out, final = f(*[J(t) for t in args], _int(cu))
    check_forward(T(out), T(final), *args, 0.5, cu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grad(device, dtype):
    args = make_inputs(1, 1, 2, 17, 8, 8, dtype, seed=71)
    gen = torch.Generator().manual_seed(6)
    dout = torch.randn(args[2].shape, generator=gen).to(dtype)
    dfinal = torch.randn(args[5].shape, generator=gen)

    def loss(*a):
        out, final = rj.chunk_gated_delta_rule(*a, scale=0.3, chunk_size=16)
        return (out.astype(jnp.float32) * J(dout).astype(jnp.float32)).sum() + (final * J(dfinal)).sum()

    grads = jax.grad(loss, argnums=tuple(range(6)))(*[J(t) for t in args])
    g64 = oracle_grads(*args, dout, dfinal, 0.3, None, torch.float64)
    g32 = oracle_grads(*args, dout, dfinal, 0.3, None, torch.float32)
    for name, g, x, o64, o32 in zip(["q", "k", "v", "beta", "log_decay", "initial_state"], grads, args, g64, g32):
        assert_close_to_oracle(T(g), o32.to(x.dtype), o64, name)


def test_explicit_backward_matches_torch_path(device):
    # The same backend on both paths (the JAX default device's): bitwise equal results. (On the
    # H200 the torch side first ran on the CPU while JAX ran the CUDA kernel: last-bit differences.)
    args = make_inputs(1, 1, 1, 9, 8, 4, torch.float32, seed=73)
    dout = torch.randn(args[2].shape, generator=torch.Generator().manual_seed(7))
    want = rudnn.gated_delta_rule_backward(dout.to(device), *[t.to(device) for t in args], scale=0.5)
    got = rj.gated_delta_rule_backward(J(dout), *[J(t) for t in args], scale=0.5)
    for w, g in zip(want, got):
        assert torch.equal(T(g), w.cpu())


def test_trace_time_errors(device):
    args = [J(t) for t in make_inputs(1, 2, 2, 8, 8, 4, torch.float32)]
    with pytest.raises(rudnn.DTypeError, match="chunk_gated_delta_rule: log_decay: expected float32, got bfloat16"):
        rj.chunk_gated_delta_rule(*args[:4], args[4].astype(jnp.bfloat16), args[5], scale=0.5)
    with pytest.raises(rudnn.ArgumentError, match="chunk_gated_delta_rule: chunk_size: expected a value > 0, got 0"):
        rj.chunk_gated_delta_rule(*args, scale=0.5, chunk_size=0)
    with pytest.raises(rudnn.ShapeError, match="gated_delta_rule_backward: dout: expected shape"):
        rj.gated_delta_rule_backward(args[0], *args, scale=0.5)
    with pytest.raises(rudnn.UnsupportedError, match="out= is not supported for JAX arrays"):
        rj.gated_delta_rule(*args, scale=0.5, out=args[2])
    with pytest.raises(rudnn.ArgumentError, match="scale: expected a Python float"):
        jax.jit(lambda s: rj.gated_delta_rule(*args, scale=s))(0.5)


@pytest.mark.usefixtures("jax_on_cpu")  # the CPU algorithms, bitwise against the torch CPU path
def test_strategy_reaches_the_kernel():
    """On the CPU the two strategies are different algorithms: each matches the torch path bitwise."""
    args = make_inputs(1, 1, 2, 40, 8, 8, torch.float32, seed=79)
    for strategy in ("chunked", "recurrent"):
        want = rudnn.chunk_gated_delta_rule(*args, scale=0.5, chunk_size=16, strategy=strategy)
        got = rj.chunk_gated_delta_rule(*[J(t) for t in args], scale=0.5, chunk_size=16, strategy=strategy)
        assert torch.equal(T(got[0]), want[0]) and torch.equal(T(got[1]), want[1])
    chunked = rudnn.chunk_gated_delta_rule(*args, scale=0.5, chunk_size=16, strategy="chunked")
    assert not torch.equal(chunked[0], want[0])  # really two algorithms (rounding differs)
