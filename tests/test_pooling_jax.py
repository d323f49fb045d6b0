"""rudnn.jax pooling: XLA FFI custom calls under eager, jit, grad and vmap, against
torch.nn.functional and torch autograd on the CPU (float64 oracle, budget as in test_pooling)."""

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


# (rudnn.jax call, torch.nn.functional call, input shape)
CASES = [
    ("max2d", lambda t, **k: rj.max_pool(t, 3, 2, 1, ceil_mode=True, **k),
     lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), (2, 3, 9, 8)),
    ("max1d-dilated", lambda t, **k: rj.max_pool(t, 3, 1, 1, dilation=2, **k),
     lambda t: F.max_pool1d(t, 3, 1, 1, dilation=2), (2, 3, 11)),
    ("avg2d", lambda t, **k: rj.avg_pool(t, (3, 2), 1, (1, 0), count_include_pad=False, **k),
     lambda t: F.avg_pool2d(t, (3, 2), 1, (1, 0), count_include_pad=False), (2, 2, 7, 6)),
    ("avg3d-divisor", lambda t, **k: rj.avg_pool(t, 2, divisor_override=3, **k),
     lambda t: F.avg_pool3d(t, 2, divisor_override=3), (1, 2, 4, 5, 6)),
    ("adaptive-avg2d", lambda t, **k: rj.adaptive_avg_pool(t, (3, 5), **k),
     lambda t: F.adaptive_avg_pool2d(t, (3, 5)), (2, 3, 7, 9)),
    ("adaptive-max3d", lambda t, **k: rj.adaptive_max_pool(t, (2, 3, 2), **k),
     lambda t: F.adaptive_max_pool3d(t, (2, 3, 2)), (1, 2, 5, 6, 5)),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_grad(case, dtype, layout):
    _, ours, theirs, shape = case
    x = rand(shape, dtype)
    dy = rand(theirs(x.float()).shape, dtype, seed=1)
    to = (lambda t: t.movedim(1, -1)) if layout == "NHWC" else (lambda t: t)
    back = (lambda t: t.movedim(-1, 1)) if layout == "NHWC" else (lambda t: t)

    def f(t):
        return ours(t, layout=layout)

    y = back(T(jax.jit(f)(J(to(x)))))
    y_same = theirs(x.float()).to(dtype) if dtype == torch.bfloat16 else theirs(x)
    assert_close_to_oracle(y.to(dtype), y_same, theirs(x.double()), "y")

    def loss(t):
        return jnp.sum(f(t).astype(jnp.float32) * J(to(dy)).astype(jnp.float32))

    g = back(T(jax.grad(loss)(J(to(x)))))
    same = _torch_grad(theirs, x.float(), dy.float(), torch.float32).to(dtype)
    assert_close_to_oracle(g.to(dtype), same, _torch_grad(theirs, x, dy, torch.float64), "dx")


def test_indices_and_explicit_backwards():
    x = rand((2, 3, 8, 7), torch.float32)
    y, i = rj.max_pool(J(x), 2, return_indices=True)
    y_ref, i_ref = F.max_pool2d(x, 2, return_indices=True)
    assert jnp.issubdtype(i.dtype, jnp.integer)
    assert torch.equal(T(y), y_ref) and np.array_equal(np.asarray(i), i_ref.numpy())
    dx = rj.max_pool_backward(y, J(x), i, kernel=2)
    torch.testing.assert_close(T(dx), _torch_grad(lambda t: F.max_pool2d(t, 2), x, y_ref, torch.float32))
    dx = rj.avg_pool_backward(y, x.shape, kernel=2)
    torch.testing.assert_close(T(dx), _torch_grad(lambda t: F.avg_pool2d(t, 2), x, y_ref, torch.float32))
    ya, ia = rj.adaptive_max_pool(J(x), 3, return_indices=True)
    torch.testing.assert_close(T(rj.adaptive_max_pool_backward(ya, J(x), ia)),
                               _torch_grad(lambda t: F.adaptive_max_pool2d(t, 3), x, T(ya), torch.float32))
    torch.testing.assert_close(T(rj.adaptive_avg_pool_backward(ya, x.shape)),
                               _torch_grad(lambda t: F.adaptive_avg_pool2d(t, 3), x, T(ya), torch.float32))
    # rudnn.<op> with JAX arrays takes this path too
    assert torch.equal(T(rudnn.max_pool(J(x), 2)), y_ref)


def test_int64_indices_with_x64():
    x = rand((1, 2, 6, 5), torch.float32)
    with jax.enable_x64(True):
        y, i = rj.adaptive_max_pool(J(x), (2, 3), return_indices=True)
        assert i.dtype == jnp.int64
        _, i_ref = F.adaptive_max_pool2d(x, (2, 3), return_indices=True)
        assert np.array_equal(np.asarray(i), i_ref.numpy())


def test_batchless_and_vmap():
    x = rand((4, 3, 9, 8), torch.float32)
    y = jax.vmap(lambda t: rj.max_pool(t, (3, 3), 2))(J(x))  # each element batch-less [C, H, W]
    torch.testing.assert_close(T(y), F.max_pool2d(x, 3, 2), rtol=0, atol=0)
    g = jax.vmap(jax.grad(lambda t: jnp.sum(rj.adaptive_avg_pool(t, (2, 3)) ** 2)))(J(x))
    torch.testing.assert_close(T(g), _torch_grad(lambda t: F.adaptive_avg_pool2d(t, (2, 3)) ** 2, x,
                                                 torch.ones(4, 3, 2, 3), torch.float32))


def test_errors_at_trace_time():
    with pytest.raises(rudnn.ShapeError, match="max_pool: kernel: the window .* is larger than the padded input"):
        jax.jit(lambda t: rj.max_pool(t, 5))(jnp.zeros((1, 1, 3, 3)))
    with pytest.raises(rudnn.ArgumentError, match="avg_pool: padding: expected at most half the kernel"):
        rj.avg_pool(jnp.zeros((1, 1, 6, 6)), 2, padding=2)
    with pytest.raises(rudnn.DTypeError, match="adaptive_avg_pool: x: expected float32, float16 or bfloat16"):
        rj.adaptive_avg_pool(jnp.zeros((1, 1, 6, 6), jnp.int32), 2)
    with pytest.raises(rudnn.UnsupportedError, match="out= is not supported"):
        rj.max_pool(jnp.zeros((1, 1, 4, 4)), 2, out=jnp.zeros((1, 1, 2, 2)))
    with pytest.raises(rudnn.ShapeError, match="max_pool_backward: dy: expected shape \\[1, 1, 2, 2\\]"):
        rj.max_pool_backward(jnp.zeros((1, 1, 3, 3)), jnp.zeros((1, 1, 4, 4)), jnp.zeros((1, 1, 3, 3), jnp.int32),
                             kernel=2)
