"""rudnn.jax.interpolate: XLA FFI custom calls under eager, jit, grad and vmap, against
torch.nn.functional.interpolate and torch autograd on the CPU (float64 oracle, budget as in
test_interpolate)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from util import assert_close_to_oracle, rand  # noqa: E402

pytestmark = pytest.mark.skipif(not getattr(rudnn._C, "has_jax_ffi", False),
                                reason="rudnn was built without the JAX FFI handlers")

_JNP = {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16}


def J(t):
    return jnp.asarray(t.detach().float().numpy()).astype(_JNP[t.dtype])


def T(a):
    return torch.from_numpy(np.array(jnp.asarray(a).astype(jnp.float32)))


def _torch_grad(fn, x, dy, dtype):
    xs = x.detach().to(dtype).requires_grad_()
    fn(xs).backward(dy.to(dtype))
    return xs.grad


CASES = [
    ((2, 3, 9), dict(scale_factor=1.6, mode="linear")),
    ((2, 3, 7, 8), dict(size=(5, 11), mode="bicubic", align_corners=True)),
    ((1, 2, 9, 10), dict(scale_factor=(0.45, 0.3), mode="bicubic", antialias=True)),
    ((1, 2, 4, 5, 6), dict(size=(3, 7, 4), mode="trilinear")),
    ((2, 2, 7, 9), dict(size=(3, 4), mode="area")),
    ((2, 2, 7, 9), dict(scale_factor=1.4, mode="nearest")),
]
IDS = [f"{len(s) - 2}d-{kw['mode']}" for s, kw in CASES]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_grad(case, dtype, layout):
    shape, kw = case

    def theirs(t):
        return F.interpolate(t, **kw)

    x = rand(shape, dtype)
    dy = rand(theirs(x.float()).shape, dtype, seed=1)
    to = (lambda t: t.movedim(1, -1)) if layout == "NHWC" else (lambda t: t)
    back = (lambda t: t.movedim(-1, 1)) if layout == "NHWC" else (lambda t: t)

    def f(t):
        return rj.interpolate(t, **kw, layout=layout)

    y = back(T(jax.jit(f)(J(to(x)))))
    y_same = theirs(x.float()).to(dtype)
    assert_close_to_oracle(y.to(dtype), y_same, theirs(x.double()), "y")

    def loss(t):
        return jnp.sum(f(t).astype(jnp.float32) * J(to(dy)).astype(jnp.float32))

    g = back(T(jax.grad(loss)(J(to(x)))))
    same = _torch_grad(theirs, x.float(), dy.float(), torch.float32).to(dtype)
    assert_close_to_oracle(g.to(dtype), same, _torch_grad(theirs, x, dy, torch.float64), "dx")


def test_explicit_backward_vmap_and_dispatch():
    x = rand((4, 3, 9, 8), torch.float32)
    kw = dict(size=(5, 4), mode="bilinear", align_corners=True)
    y_ref = F.interpolate(x, **kw)
    dx = rj.interpolate_backward(J(y_ref), x.shape, **kw)
    torch.testing.assert_close(T(dx), _torch_grad(lambda t: F.interpolate(t, **kw), x, y_ref, torch.float32))
    assert_close_to_oracle(T(rudnn.interpolate(J(x), **kw)), y_ref, F.interpolate(x.double(), **kw), "y")
    y = jax.vmap(lambda t: rj.interpolate(t[None], **kw)[0])(J(x))
    assert_close_to_oracle(T(y), y_ref, F.interpolate(x.double(), **kw), "y")


def test_errors_at_trace_time():
    with pytest.raises(rudnn.ShapeError, match="interpolate: mode: 'bilinear' takes 4-D input"):
        jax.jit(lambda t: rj.interpolate(t, size=3, mode="bilinear"))(jnp.zeros((1, 1, 3)))
    with pytest.raises(rudnn.ArgumentError, match="interpolate: size, scale_factor: expected exactly one of them"):
        rj.interpolate(jnp.zeros((1, 1, 6, 6)), size=2, scale_factor=2.0)
    with pytest.raises(rudnn.ShapeError, match="interpolate_backward: dy: expected shape \\[1, 1, 3, 3\\]"):
        rj.interpolate_backward(jnp.zeros((1, 1, 2, 2)), (1, 1, 6, 6), size=3)
