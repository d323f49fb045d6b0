"""rudnn.jax.conv: XLA FFI custom calls under eager, jit and grad (x, w, bias), against
torch.nn.functional and torch autograd on the CPU (float64 oracle, budget as in test_conv)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from util import assert_close_to_oracle, rand  # noqa: E402

pytestmark = [pytest.mark.skipif(not getattr(rudnn._C, "has_jax_ffi", False),
                                 reason="rudnn was built without the JAX FFI handlers"),
              pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")]

_JNP = {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16}


def J(t):
    return jnp.asarray(t.detach().float().numpy()).astype(_JNP[t.dtype])


def T(a):
    return torch.from_numpy(np.array(jnp.asarray(a).astype(jnp.float32)))


CASES = [
    ("2d", (2, 4, 9, 8), (6, 4, 3, 3), True, dict(stride=2, padding=1)),
    ("2d-depthwise-same", (2, 4, 7, 7), (8, 1, 4, 3), False, dict(padding="same", groups=4)),
    ("1d", (2, 3, 11), (4, 3, 3), True, dict(padding=2, dilation=2)),
    ("3d", (1, 4, 5, 6, 5), (4, 2, 3, 2, 3), True, dict(stride=(1, 2, 1), padding=(1, 0, 1), groups=2)),
]


def _torch(x, w, b, dy, kw, dtype):
    xs, ws = x.detach().to(dtype).requires_grad_(), w.detach().to(dtype).requires_grad_()
    bs = b.detach().to(dtype).requires_grad_() if b is not None else None
    y = getattr(F, f"conv{x.dim() - 2}d")(xs, ws, bs, **kw)
    y.backward(dy.to(dtype))
    return y.detach(), xs.grad, ws.grad, (bs.grad if bs is not None else None)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_grads(case, dtype, layout):
    _, xs, ws, has_bias, kw = case
    x, w = rand(xs, dtype), rand(ws, dtype, seed=1, scale=0.5)
    b = rand((ws[0],), dtype, seed=2) if has_bias else None
    y64 = getattr(F, f"conv{x.dim() - 2}d")(x.double(), w.double(), b.double() if b is not None else None, **kw)
    dy = rand(y64.shape, dtype, seed=3)
    oracle = _torch(x, w, b, dy, kw, torch.float64)
    same = tuple(t.to(dtype) if t is not None else None for t in _torch(x, w, b, dy, kw, torch.float32))
    to = (lambda t: t.movedim(1, -1)) if layout == "NHWC" else (lambda t: t)
    back = (lambda t: t.movedim(-1, 1)) if layout == "NHWC" else (lambda t: t)

    def f(xa, wa, ba):
        return rj.conv(xa, wa, ba, layout=layout, **kw)

    args = (J(to(x)), J(to(w)), J(b) if b is not None else None)
    y = back(T(jax.jit(f)(*args)))
    assert_close_to_oracle(y.to(dtype), same[0], oracle[0], "y")

    def loss(xa, wa, ba):
        return jnp.sum(f(xa, wa, ba).astype(jnp.float32) * J(to(dy)).astype(jnp.float32))

    argnums = (0, 1, 2) if b is not None else (0, 1)
    grads = jax.jit(jax.grad(loss, argnums=argnums))(*args)
    assert_close_to_oracle(back(T(grads[0])).to(dtype), same[1], oracle[1], "dx")
    assert_close_to_oracle(back(T(grads[1])).to(dtype), same[2], oracle[2], "dw")
    if b is not None:
        assert_close_to_oracle(T(grads[2]).to(dtype), same[3], oracle[3], "db")


@pytest.mark.usefixtures("jax_on_cpu")  # bitwise against rudnn's CPU results: JAX on the same backend
def test_explicit_backwards_and_top_level():
    x, w = rand((1, 3, 6, 7), torch.float32), rand((4, 3, 3, 3), torch.float32, seed=1)
    y = rudnn.conv(x, w, padding=1)
    yj = rudnn.conv(J(x), J(w), padding=1)  # rudnn.conv with JAX arrays takes the FFI path
    assert isinstance(yj, jax.Array) and torch.equal(T(yj), y)
    assert torch.equal(T(rj.conv_data_backward(yj, J(w), x.shape, padding=1)),
                       rudnn.conv_data_backward(y, w, x.shape, padding=1))
    assert torch.equal(T(rj.conv_weight_backward(yj, J(x), w.shape, padding=1)),
                       rudnn.conv_weight_backward(y, x, w.shape, padding=1))
    assert torch.equal(T(rj.conv_bias_backward(yj)), rudnn.conv_bias_backward(y))


def test_errors_at_trace_time():
    with pytest.raises(rudnn.ShapeError, match="conv: w: channel mismatch"):
        jax.jit(lambda a, b: rj.conv(a, b))(jnp.zeros((1, 4, 6, 6)), jnp.zeros((2, 3, 3, 3)))
    with pytest.raises(rudnn.ArgumentError, match="conv: groups: expected a divisor of the input channels"):
        rj.conv(jnp.zeros((1, 4, 6, 6)), jnp.zeros((3, 1, 3, 3)), groups=3)
    with pytest.raises(rudnn.UnsupportedError, match="implicit_gemm"):
        rj.conv(jnp.zeros((1, 4, 6, 6)), jnp.zeros((2, 4, 3, 3)), strategy="implicit_gemm")


def test_vmap():
    x, w = rand((3, 2, 4, 6, 6), torch.float32), rand((5, 4, 3, 3), torch.float32, seed=1)
    y = jax.vmap(lambda t: rj.conv(t, J(w), padding=1))(J(x))  # each element a batch of 2
    ref = torch.stack([F.conv2d(x[i], w, padding=1) for i in range(3)])
    assert_close_to_oracle(T(y), ref, torch.stack([F.conv2d(x[i].double(), w.double(), padding=1) for i in range(3)]),
                           "y")
    g = jax.vmap(jax.grad(lambda t: jnp.sum(rj.conv(t, J(w), padding=1) ** 2)))(J(x))
    grads = []
    for dtype in (torch.float32, torch.float64):
        xs = x.detach().to(dtype).requires_grad_()
        F.conv2d(xs.flatten(0, 1), w.to(dtype), padding=1).square().sum().backward()
        grads.append(xs.grad)
    assert_close_to_oracle(T(g), *grads, "dx")
