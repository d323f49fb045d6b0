"""rudnn.jax.grid_sample: XLA FFI custom calls under eager, jit, grad (x and grid) and vmap,
against torch.nn.functional.grid_sample and torch autograd on the CPU (float64 oracle, budget as
in test_grid_sample)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from test_grid_sample import _grid, _torch_grads  # noqa: E402
from util import assert_close_to_oracle, rand  # noqa: E402

pytestmark = pytest.mark.skipif(not getattr(rudnn._C, "has_jax_ffi", False),
                                reason="rudnn was built without the JAX FFI handlers")

_JNP = {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16}


def J(t):
    return jnp.asarray(t.detach().float().numpy()).astype(_JNP[t.dtype])


def T(a):
    return torch.from_numpy(np.array(jnp.asarray(a).astype(jnp.float32)))


CASES = [
    ((2, 3, 5, 7), (2, 4, 6, 2), dict(mode="bilinear", padding_mode="zeros", align_corners=False)),
    ((2, 3, 5, 7), (2, 4, 6, 2), dict(mode="bicubic", padding_mode="reflection", align_corners=True)),
    ((1, 2, 6, 5), (1, 3, 3, 2), dict(mode="nearest", padding_mode="border", align_corners=False)),
    ((2, 3, 4, 5, 3), (2, 3, 2, 5, 3), dict(mode="bilinear", padding_mode="reflection", align_corners=False)),
]
IDS = [f"{len(s) - 2}d-{kw['mode']}-{kw['padding_mode']}" for s, _, kw in CASES]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_grad(case, dtype, layout):
    x_shape, g_shape, kw = case
    x, grid = rand(x_shape, dtype), _grid(g_shape, dtype)
    y64 = F.grid_sample(x.double(), grid.double(), **kw)
    dy = rand(y64.shape, dtype, seed=1)
    to = (lambda t: t.movedim(1, -1)) if layout == "NHWC" else (lambda t: t)
    back = (lambda t: t.movedim(-1, 1)) if layout == "NHWC" else (lambda t: t)

    def f(t, g):
        return rj.grid_sample(t, g, **kw, layout=layout)

    y = back(T(jax.jit(f)(J(to(x)), J(grid))))
    assert_close_to_oracle(y.to(dtype), F.grid_sample(x.float(), grid.float(), **kw).to(dtype), y64, "y")

    def loss(t, g):
        return jnp.sum(f(t, g).astype(jnp.float32) * J(to(dy)).astype(jnp.float32))

    gx, gg = jax.grad(loss, argnums=(0, 1))(J(to(x)), J(grid))
    dx64, dg64 = _torch_grads(x, grid, dy, torch.float64, **kw)
    dx32, dg32 = (t.to(dtype) for t in _torch_grads(x.float(), grid.float(), dy.float(), torch.float32, **kw))
    assert_close_to_oracle(back(T(gx)).to(dtype), dx32, dx64, "dx")
    scale = (dy.double().abs().max() * x.double().abs().max() * max(x_shape[2:])).item() * x_shape[1]
    assert_close_to_oracle(T(gg).to(dtype), dg32, dg64, "dgrid", scale=scale)


def test_explicit_backward_vmap_and_dispatch():
    x, grid = rand((4, 3, 9, 8), torch.float32), _grid((4, 5, 4, 2), torch.float32)
    kw = dict(mode="bilinear", padding_mode="border", align_corners=True)
    y_ref = F.grid_sample(x, grid, **kw)
    dx, dgrid = rj.grid_sample_backward(J(y_ref), J(x), J(grid), **kw, deterministic=True)
    tdx, tdgrid = _torch_grads(x, grid, y_ref, torch.float32, **kw)
    torch.testing.assert_close(T(dx), tdx)
    torch.testing.assert_close(T(dgrid), tdgrid, rtol=1e-5, atol=1e-5)
    assert rj.grid_sample_backward(J(y_ref), J(x), J(grid), **kw, output_mask=(True, False))[1] is None
    y64 = F.grid_sample(x.double(), grid.double(), **kw)
    assert_close_to_oracle(T(rudnn.grid_sample(J(x), J(grid), **kw)), y_ref, y64, "y")
    y = jax.vmap(lambda t, g: rj.grid_sample(t[None], g[None], **kw)[0])(J(x), J(grid))
    assert_close_to_oracle(T(y), y_ref, y64, "y")


def test_errors_at_trace_time():
    with pytest.raises(rudnn.ShapeError, match="grid_sample: mode: 'bicubic' takes 4-D input"):
        jax.jit(lambda t, g: rj.grid_sample(t, g, mode="bicubic"))(jnp.zeros((1, 1, 3, 3, 3)), jnp.zeros((1, 2, 2, 2, 3)))
    with pytest.raises(rudnn.ShapeError, match="grid_sample: grid: expected shape \\[N, H_out, W_out, 2\\]"):
        rj.grid_sample(jnp.zeros((1, 1, 6, 6)), jnp.zeros((1, 2, 2, 3)))
    with pytest.raises(rudnn.DTypeError, match="grid_sample: grid: expected the dtype of x \\(bfloat16\\)"):
        rj.grid_sample(jnp.zeros((1, 1, 6, 6), jnp.bfloat16), jnp.zeros((1, 2, 2, 2)))
    with pytest.raises(rudnn.ArgumentError, match="grid_sample: padding_mode: expected one of"):
        rj.grid_sample(jnp.zeros((1, 1, 6, 6)), jnp.zeros((1, 2, 2, 2)), padding_mode="wrap")
    with pytest.raises(rudnn.ShapeError, match="grid_sample_backward: dy: expected shape \\[1, 1, 2, 2\\]"):
        rj.grid_sample_backward(jnp.zeros((1, 1, 3, 3)), jnp.zeros((1, 1, 6, 6)), jnp.zeros((1, 2, 2, 2)))
