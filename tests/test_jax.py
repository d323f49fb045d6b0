"""rudnn.jax: XLA FFI custom calls under eager, jit, grad and vmap, against torch.nn.functional
(float64 oracle on the CPU; error budget: twice that of the same-dtype torch computation)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import rudnn  # noqa: E402
import rudnn.jax as rj  # noqa: E402
from reference import norm as ref  # noqa: E402
from util import DTYPES, assert_close_to_oracle, jax_gpu, rand  # noqa: E402

HAS_FFI = bool(getattr(rudnn._C, "has_jax_ffi", False))
needs_ffi = pytest.mark.skipif(not HAS_FFI, reason="rudnn was built without the JAX FFI handlers")


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    jax_gpu() is None, reason="needs a JAX CUDA device and a CUDA build of rudnn")])]


@pytest.fixture(params=DEVICES)
def device(request):
    """Runs the test with JAX's default device on the CPU (or the GPU)."""
    dev = jax.devices("cpu")[0] if request.param == "cpu" else jax_gpu()
    with jax.default_device(dev):
        yield request.param


_JNP = {torch.float32: jnp.float32, torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16}


def J(t):
    """torch (CPU) -> jax, exactly (bfloat16 through float32)."""
    if t is None:
        return None
    return jnp.asarray(t.detach().cpu().float().numpy()).astype(_JNP[t.dtype])


def T(a):
    """jax -> torch (CPU), exactly."""
    dtype = {jnp.dtype(v): k for k, v in _JNP.items()}[jnp.dtype(a.dtype)]
    return torch.from_numpy(np.array(a.astype(jnp.float32))).to(dtype)


def _params(H, dtype, param_dtype, bias=True, seed=1):
    pdt = dtype if param_dtype == "x" else torch.float32
    w = rand((H,), pdt, seed=seed, scale=0.5, offset=1.0)
    b = rand((H,), pdt, seed=seed + 1) if bias else None
    return w, b


def _opt(t, dtype):
    return None if t is None else t.to(dtype)


def _layer_norm(h, w, b, eps, dtype):
    return F.layer_norm(h.to(dtype), (h.shape[-1],), _opt(w, dtype), _opt(b, dtype), eps)


def _rms_norm(h, w, eps, dtype):
    return F.rms_norm(h.to(dtype), (h.shape[-1],), _opt(w, dtype), eps)


def _autograd(fn, dtype, cotangents, *inputs):
    """torch autograd of fn (one output or a tuple) on copies of `inputs` in dtype."""
    leaves = [None if t is None else t.detach().to(dtype).requires_grad_() for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(list(outs), [c.to(dtype) for c in cotangents])
    return [None if t is None else t.grad for t in leaves]


def _term_scale(dy, w, rstd):
    """Size of the terms of dx that cancel (see test_norm.py)."""
    w = torch.ones(dy.shape[-1]) if w is None else w
    return (dy.double() * w.double() * rstd.double().unsqueeze(-1)).abs().max().item()


SHAPES = [(1, 1), (5, 7), (4, 65), (2, 3, 96), (3, 1000), (2, 4097)]


# ---- forward -----------------------------------------------------------------------------------

@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("param_dtype", ["f32", "x"])
def test_layer_norm_forward(device, dtype, shape, param_dtype):
    x = rand(shape, dtype, scale=2.0, offset=0.5)
    w, b = _params(shape[-1], dtype, param_dtype)
    y, mean, rstd = rj.layer_norm(J(x), J(w), J(b), eps=1e-5, return_stats=True)
    assert isinstance(y, jax.Array) and y.dtype == _JNP[dtype] and y.shape == shape
    assert mean.dtype == rstd.dtype == jnp.float32 and mean.shape == rstd.shape == shape[:-1]
    assert_close_to_oracle(T(y), _layer_norm(x, w, b, 1e-5, dtype), _layer_norm(x, w, b, 1e-5, torch.float64), "y")
    m64, r64 = ref.layer_norm_stats(x, 1e-5)
    torch.testing.assert_close(T(mean).double(), m64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(T(rstd).double(), r64, rtol=1e-5, atol=1e-6)


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("param_dtype", ["f32", "x"])
def test_rms_norm_forward(device, dtype, shape, param_dtype):
    x = rand(shape, dtype, scale=2.0, offset=0.5)
    w, _ = _params(shape[-1], dtype, param_dtype, bias=False)
    y, rstd = rj.rms_norm(J(x), J(w), eps=1e-6, return_stats=True)
    assert y.dtype == _JNP[dtype] and rstd.dtype == jnp.float32 and rstd.shape == shape[:-1]
    assert_close_to_oracle(T(y), _rms_norm(x, w, 1e-6, dtype), _rms_norm(x, w, 1e-6, torch.float64), "y")
    torch.testing.assert_close(T(rstd).double(), ref.rms_norm_rstd(x, 1e-6), rtol=1e-5, atol=1e-6)


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_forward(device, dtype, shape):
    x = rand(shape, dtype, scale=3.0)
    y = rj.softmax(J(x))
    assert y.dtype == _JNP[dtype] and y.shape == shape
    assert_close_to_oracle(T(y), torch.softmax(x, -1), ref.softmax(x), "y")


@needs_ffi
def test_without_weight_and_bias(device):
    x = rand((6, 33), torch.float32)
    assert_close_to_oracle(T(rj.layer_norm(J(x))), _layer_norm(x, None, None, 1e-5, torch.float32),
                           _layer_norm(x, None, None, 1e-5, torch.float64))
    assert_close_to_oracle(T(rj.rms_norm(J(x))), _rms_norm(x, None, 1e-6, torch.float32),
                           _rms_norm(x, None, 1e-6, torch.float64))
    b = rand((33,), torch.float32, seed=3)  # bias without weight
    assert_close_to_oracle(T(rj.layer_norm(J(x), None, J(b))), _layer_norm(x, None, b, 1e-5, torch.float32),
                           _layer_norm(x, None, b, 1e-5, torch.float64))


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_residual_fusion(device, dtype, kind):
    x, r = rand((7, 130), dtype, seed=3), rand((7, 130), dtype, seed=4)
    w, b = _params(130, dtype, "f32", bias=kind == "layer")
    h_expected = x + r  # torch adds in x's dtype, as rudnn does
    if kind == "layer":
        y, h = rj.layer_norm(J(x), J(w), J(b), residual=J(r))
        same, oracle = _layer_norm(h_expected, w, b, 1e-5, dtype), _layer_norm(h_expected, w, b, 1e-5, torch.float64)
    else:
        y, h = rj.rms_norm(J(x), J(w), residual=J(r))
        same, oracle = _rms_norm(h_expected, w, 1e-6, dtype), _rms_norm(h_expected, w, 1e-6, torch.float64)
    assert torch.equal(T(h), h_expected), "h must be x + residual rounded to x's dtype"
    assert_close_to_oracle(T(y), same, oracle, "y")


@needs_ffi
def test_result_order_with_residual_and_stats(device):
    x, r = J(rand((3, 8), torch.float32)), J(rand((3, 8), torch.float32, seed=9))
    outs = rj.layer_norm(x, residual=r, return_stats=True)
    assert isinstance(outs, tuple) and len(outs) == 4
    assert [o.shape for o in outs] == [(3, 8), (3, 8), (3,), (3,)]
    m64, r64 = ref.layer_norm_stats(T(outs[1]), 1e-5)
    torch.testing.assert_close(T(outs[2]).double(), m64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(T(outs[3]).double(), r64, rtol=1e-5, atol=1e-6)
    outs = rj.rms_norm(x, residual=r, return_stats=True)
    assert len(outs) == 3 and outs[1].shape == (3, 8) and outs[2].dtype == jnp.float32
    assert not isinstance(rj.layer_norm(x), tuple)


@needs_ffi
def test_rank_one_and_empty(device):
    y, rstd = rj.rms_norm(J(rand((17,), torch.float32)), return_stats=True)
    assert y.shape == (17,) and rstd.shape == ()
    for shape in [(0, 16), (2, 0, 8)]:
        x, w = jnp.zeros(shape, jnp.float16), jnp.ones(shape[-1])
        y, mean, rstd = rj.layer_norm(x, w, return_stats=True)
        assert y.shape == shape and mean.shape == rstd.shape == shape[:-1]
        assert rj.rms_norm(x, w).shape == shape and rj.softmax(x).shape == shape
        dx, dw, db = rj.layer_norm_backward(x, x, w, mean, rstd)
        assert dx.shape == shape and np.array_equal(dw, np.zeros(shape[-1])) and np.array_equal(db, dw)
        g = jax.grad(lambda w_: rj.layer_norm(x, w_).astype(jnp.float32).sum())(w)
        assert np.array_equal(g, np.zeros(shape[-1]))


@needs_ffi
def test_rudnn_functions_take_jax_arrays(device):
    x = rand((4, 24), torch.bfloat16, scale=2.0)
    w, b = _params(24, torch.bfloat16, "f32")
    y = rudnn.layer_norm(J(x), J(w), J(b))
    assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
    assert jnp.array_equal(y, rj.layer_norm(J(x), J(w), J(b)))
    y, h, rstd = rudnn.rms_norm(J(x), J(w), residual=J(x), return_stats=True)
    assert isinstance(h, jax.Array) and rstd.dtype == jnp.float32
    s = rudnn.softmax(J(x))
    dx = rudnn.softmax_backward(J(x), s)
    assert isinstance(dx, jax.Array) and jnp.array_equal(dx, rj.softmax_backward(J(x), s))
    _, mean, rstd = rudnn.layer_norm(J(x), return_stats=True)
    assert len(rudnn.layer_norm_backward(J(x), J(x), J(w), mean, rstd)) == 3
    _, rstd = rudnn.rms_norm(J(x), return_stats=True)
    assert len(rudnn.rms_norm_backward(J(x), J(x), None, rstd)) == 2


@needs_ffi
def test_numpy_arguments_become_jax(device):
    x = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32)
    y = rj.layer_norm(x, np.ones(10, np.float32))
    assert isinstance(y, jax.Array)
    assert jnp.array_equal(y, rj.layer_norm(jnp.asarray(x), jnp.ones(10)))


# ---- explicit backward functions ----------------------------------------------------------------

@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (33, 1000), (2, 3, 96)])
def test_layer_norm_backward(device, dtype, shape):
    H = shape[-1]
    x, dy = rand(shape, dtype, scale=2.0, offset=0.3), rand(shape, dtype, seed=5)
    w, b = _params(H, dtype, "f32")
    _, mean, rstd = rj.layer_norm(J(x), J(w), J(b), return_stats=True)
    dx, dw, db = rj.layer_norm_backward(J(dy), J(x), J(w), mean, rstd)
    assert dx.dtype == _JNP[dtype] and dw.dtype == db.dtype == jnp.float32 and dw.shape == db.shape == (H,)
    fn = lambda x_, w_, b_: F.layer_norm(x_, (H,), w_, b_, 1e-5)
    g64, gsame = _autograd(fn, torch.float64, [dy], x, w, b), _autograd(fn, dtype, [dy], x, w, b)
    assert_close_to_oracle(T(dx), gsame[0], g64[0], "dx", scale=_term_scale(dy, w, T(rstd)))
    assert_close_to_oracle(T(dw), gsame[1], g64[1], "dweight", dtype=dtype)
    assert_close_to_oracle(T(db), gsame[2], g64[2], "dbias", dtype=dtype)
    dx2, dw2, db2 = rj.layer_norm_backward(J(dy), J(x), None, mean, rstd)
    assert dw2 is None and db2.shape == (H,)


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (33, 1000)])
def test_rms_norm_backward(device, dtype, shape):
    H = shape[-1]
    x, dy = rand(shape, dtype, scale=2.0, offset=0.3), rand(shape, dtype, seed=5)
    w, _ = _params(H, dtype, "x", bias=False)
    _, rstd = rj.rms_norm(J(x), J(w), return_stats=True)
    dx, dw = rj.rms_norm_backward(J(dy), J(x), J(w), rstd)
    assert dx.dtype == _JNP[dtype] and dw.dtype == jnp.float32
    fn = lambda x_, w_: F.rms_norm(x_, (H,), w_, 1e-6)
    g64, gsame = _autograd(fn, torch.float64, [dy], x, w), _autograd(fn, dtype, [dy], x, w)
    assert_close_to_oracle(T(dx), gsame[0], g64[0], "dx", scale=_term_scale(dy, w, T(rstd)))
    assert_close_to_oracle(T(dw), gsame[1], g64[1], "dweight", dtype=dtype)
    assert rj.rms_norm_backward(J(dy), J(x), None, rstd)[1] is None


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_backward(device, dtype):
    x, dy = rand((9, 300), dtype, scale=2.0), rand((9, 300), dtype, seed=6)
    y = rj.softmax(J(x))
    dx = rj.softmax_backward(J(dy), y)
    assert dx.dtype == _JNP[dtype]
    fn = lambda x_: torch.softmax(x_, -1)
    assert_close_to_oracle(T(dx), _autograd(fn, dtype, [dy], x)[0], _autograd(fn, torch.float64, [dy], x)[0], "dx")


# ---- jax.grad (custom_vjp) ----------------------------------------------------------------------

def _vjp(f, primals, cotangents):
    """Pullback of f at primals applied to cotangents (a tuple matching f's outputs)."""
    out, pullback = jax.vjp(f, *primals)
    return out, pullback(cotangents if isinstance(out, tuple) else cotangents[0])


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("param_dtype", ["f32", "x"])
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_grad(device, dtype, param_dtype, residual):
    shape, H = (6, 72), 72
    x, r = rand(shape, dtype, seed=1, scale=2.0), rand(shape, dtype, seed=2)
    w, b = _params(H, dtype, param_dtype, seed=3)
    gy, gh = rand(shape, dtype, seed=5), rand(shape, dtype, seed=6)
    if residual:
        f = lambda x_, w_, b_, r_: rj.layer_norm(x_, w_, b_, residual=r_)
        primals, cts = (x, w, b, r), (gy, gh)
        torch_fn = lambda x_, w_, b_, r_: (F.layer_norm(x_ + r_, (H,), w_, b_, 1e-5), x_ + r_)
    else:
        f = lambda x_, w_, b_: rj.layer_norm(x_, w_, b_)
        primals, cts = (x, w, b), (gy,)
        torch_fn = lambda x_, w_, b_: F.layer_norm(x_, (H,), w_, b_, 1e-5)
    _, grads = _vjp(f, [J(p) for p in primals], tuple(J(c) for c in cts))
    g64 = _autograd(torch_fn, torch.float64, cts, *primals)
    gsame = _autograd(torch_fn, dtype, cts, *primals)
    for ours, primal, same, exact, name in zip(grads, primals, gsame, g64, "xwbr"):
        assert ours.dtype == _JNP[primal.dtype] and ours.shape == primal.shape, name
        assert_close_to_oracle(T(ours).to(dtype if name in "xr" else torch.float32), same, exact, f"grad {name}",
                               dtype=dtype, scale=max(exact.abs().max().item(), 1.0))
    if residual:
        assert jnp.array_equal(grads[0], grads[3]), "x and residual get the same gradient"


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_grad(device, dtype, residual):
    shape, H = (5, 3, 40), 40
    x, r = rand(shape, dtype, seed=1, scale=2.0), rand(shape, dtype, seed=2)
    w, _ = _params(H, dtype, "f32", bias=False, seed=3)
    gy, gh = rand(shape, dtype, seed=5), rand(shape, dtype, seed=6)
    if residual:
        f = lambda x_, w_, r_: rj.rms_norm(x_, w_, residual=r_)
        primals, cts = (x, w, r), (gy, gh)
        torch_fn = lambda x_, w_, r_: (F.rms_norm(x_ + r_, (H,), w_, 1e-6), x_ + r_)
    else:
        f = lambda x_, w_: rj.rms_norm(x_, w_)
        primals, cts = (x, w), (gy,)
        torch_fn = lambda x_, w_: F.rms_norm(x_, (H,), w_, 1e-6)
    _, grads = _vjp(f, [J(p) for p in primals], tuple(J(c) for c in cts))
    g64 = _autograd(torch_fn, torch.float64, cts, *primals)
    gsame = _autograd(torch_fn, dtype, cts, *primals)
    for ours, primal, same, exact, name in zip(grads, primals, gsame, g64, "xwr"):
        assert ours.dtype == _JNP[primal.dtype] and ours.shape == primal.shape, name
        assert_close_to_oracle(T(ours), same, exact, f"grad {name}", dtype=dtype,
                               scale=max(exact.abs().max().item(), 1.0))


@needs_ffi
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_grad(device, dtype):
    x, gy = rand((4, 3, 50), dtype, scale=2.0), rand((4, 3, 50), dtype, seed=4)
    _, (dx,) = _vjp(rj.softmax, [J(x)], (J(gy),))
    fn = lambda x_: torch.softmax(x_, -1)
    assert dx.dtype == _JNP[dtype]
    assert_close_to_oracle(T(dx), _autograd(fn, dtype, [gy], x)[0], _autograd(fn, torch.float64, [gy], x)[0], "dx")


def _layer_norm_jnp(x, w, b, eps):
    """Plain jax.numpy layer norm with its statistics (for autodiff through the stats)."""
    mean = x.mean(-1)
    rstd = jax.lax.rsqrt(((x - mean[..., None]) ** 2).mean(-1) + eps)
    return (x - mean[..., None]) * rstd[..., None] * w + b, mean, rstd


@needs_ffi
def test_grad_through_statistics(device):
    """Losses that use mean/rstd get their gradient too (not just y's)."""
    x = J(rand((5, 24), torch.float32, scale=2.0, offset=0.7))
    w, b = J(rand((24,), torch.float32, seed=2, offset=1.0)), J(rand((24,), torch.float32, seed=3))
    loss = lambda outs: (outs[0] ** 2).sum() + 3.0 * outs[1].sum() + (outs[2] ** 2).sum()
    ours = jax.grad(lambda *a: loss(rj.layer_norm(*a, return_stats=True)), argnums=(0, 1, 2))(x, w, b)
    expect = jax.grad(lambda *a: loss(_layer_norm_jnp(*a, 1e-5)), argnums=(0, 1, 2))(x, w, b)
    for o, e in zip(ours, expect):
        np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-5)

    def rms_jnp(x, w, eps=1e-6):
        rstd = jax.lax.rsqrt((x * x).mean(-1) + eps)
        return x * rstd[..., None] * w, rstd

    rloss = lambda outs: (outs[0] ** 2).sum() + (outs[1] ** 2).sum()
    ours = jax.grad(lambda *a: rloss(rj.rms_norm(*a, return_stats=True)), argnums=(0, 1))(x, w)
    expect = jax.grad(lambda *a: rloss(rms_jnp(*a)), argnums=(0, 1))(x, w)
    for o, e in zip(ours, expect):
        np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-5)


# ---- jit and vmap -------------------------------------------------------------------------------

@needs_ffi
def test_jit_matches_eager(device):
    x = J(rand((8, 4, 64), torch.bfloat16, scale=2.0))
    r = J(rand((8, 4, 64), torch.bfloat16, seed=2))
    w, b = J(rand((64,), torch.float32, seed=3, offset=1.0)), J(rand((64,), torch.float32, seed=4))

    def f(x, r, w, b):
        y, h, mean, rstd = rj.layer_norm(x, w, b, residual=r, return_stats=True)
        z = rj.rms_norm(y, w, eps=1e-5)
        return rj.softmax(z), h, mean, rstd

    eager, jitted = f(x, r, w, b), jax.jit(f)(x, r, w, b)
    for e, j in zip(eager, jitted):
        assert jnp.array_equal(e, j)
    loss = lambda *a: f(*a)[0].astype(jnp.float32).sum() + f(*a)[2].sum()
    ge = jax.grad(loss, argnums=(0, 1, 2, 3))(x, r, w, b)
    gj = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(x, r, w, b)
    for e, j in zip(ge, gj):
        np.testing.assert_allclose(np.asarray(e, np.float32), np.asarray(j, np.float32), rtol=1e-2, atol=1e-3)
    assert "rudnn_norm_forward" in jax.jit(f).lower(x, r, w, b).as_text()


@needs_ffi
def test_vmap(device):
    x = J(rand((3, 4, 32), torch.float32, scale=2.0))
    r = J(rand((3, 4, 32), torch.float32, seed=2))
    w, b = J(rand((32,), torch.float32, seed=3, offset=1.0)), J(rand((32,), torch.float32, seed=4))
    W = jnp.stack([w, 2 * w, -w])

    # shared weights: one call on the stacked rows
    f = lambda x_, r_: rj.layer_norm(x_, w, b, residual=r_, return_stats=True)
    for a, e in zip(jax.vmap(f)(x, r), f(x, r)):
        assert jnp.array_equal(a, e)
    f = lambda x_: rj.layer_norm(x_, w, b, residual=r[0])  # residual not batched
    for a, e in zip(jax.vmap(f)(x), rj.layer_norm(x, w, b, residual=jnp.broadcast_to(r[0], x.shape))):
        assert jnp.array_equal(a, e)
    # batched weights: one call per batch element
    g = lambda x_, w_: rj.rms_norm(x_, w_)
    assert jnp.array_equal(jax.vmap(g)(x, W), jnp.stack([g(x[i], W[i]) for i in range(3)]))
    assert jnp.array_equal(jax.vmap(rj.softmax)(x), rj.softmax(x))
    # per-example weight gradients (backward reduces over each example's rows only)
    loss = lambda w_, b_, x_: (rj.layer_norm(x_, w_, b_) ** 2).sum()
    per_example = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, None, 0)))(w, b, x)
    for i in range(3):
        for a, e in zip(per_example, jax.grad(loss, argnums=(0, 1))(w, b, x[i])):
            np.testing.assert_allclose(a[i], e, rtol=1e-6, atol=1e-6)
    sloss = lambda x_: (rj.softmax(x_) ** 2).sum()
    np.testing.assert_allclose(jax.vmap(jax.grad(sloss))(x), jax.grad(sloss)(x), rtol=1e-6, atol=1e-7)


# ---- errors -------------------------------------------------------------------------------------

def _raises_at_trace(exc, match, fn, *args):
    """fn raises exc when traced abstractly (jax.eval_shape: no computation runs) and eagerly."""
    with pytest.raises(exc, match=match):
        jax.eval_shape(fn, *args)
    with pytest.raises(exc, match=match):
        jax.jit(fn)(*args)


@needs_ffi
def test_errors_are_rudnn_exceptions_at_trace_time(device):
    x = jnp.ones((4, 16))
    _raises_at_trace(rudnn.ShapeError, r"layer_norm: weight: expected shape \[16\].*got \[15\]",
                     lambda x: rj.layer_norm(x, jnp.ones(15)), x)
    _raises_at_trace(rudnn.DTypeError, r"rms_norm: weight: expected float32 or the dtype of x.*int32",
                     lambda x: rj.rms_norm(x, jnp.ones(16, jnp.int32)), x)
    _raises_at_trace(rudnn.DTypeError, r"layer_norm: x: expected float32, float16 or bfloat16, got int32",
                     lambda x: rj.layer_norm(x.astype(jnp.int32)), x)
    _raises_at_trace(rudnn.ShapeError, r"layer_norm: residual: expected the shape of x \[4, 16\], got \[4, 8\]",
                     lambda x: rj.layer_norm(x, residual=jnp.ones((4, 8))), x)
    _raises_at_trace(rudnn.DTypeError, r"layer_norm: residual: expected the dtype of x \(float32\), got bfloat16",
                     lambda x: rj.layer_norm(x, residual=jnp.ones((4, 16), jnp.bfloat16)), x)
    _raises_at_trace(rudnn.DTypeError, r"weight and bias must have the same dtype",
                     lambda x: rj.layer_norm(x.astype(jnp.bfloat16), jnp.ones(16), jnp.ones(16, jnp.bfloat16)), x)
    _raises_at_trace(rudnn.ArgumentError, r"layer_norm: eps: expected a finite value > 0",
                     lambda x: rj.layer_norm(x, eps=0.0), x)
    _raises_at_trace(rudnn.ArgumentError, r"rms_norm: eps: expected a finite value > 0",
                     lambda x: rj.rms_norm(x, eps=float("nan")), x)
    _raises_at_trace(rudnn.ShapeError, r"softmax: x: the last axis must have size >= 1",
                     lambda x: rj.softmax(x[:, :0]), x)
    _raises_at_trace(rudnn.ShapeError, r"softmax: x: expected at least one axis",
                     lambda x: rj.softmax(x[0, 0]), x)
    _raises_at_trace(rudnn.ShapeError, r"rank 9 exceeds the maximum of 8",
                     lambda x: rj.layer_norm(jnp.ones((1,) * 8 + (16,))), x)
    _raises_at_trace(rudnn.DTypeError, r"layer_norm_backward: mean: expected float32, got bfloat16",
                     lambda x: rj.layer_norm_backward(x, x, None, jnp.ones(4, jnp.bfloat16), jnp.ones(4)), x)
    _raises_at_trace(rudnn.ShapeError, r"rms_norm_backward: rstd: expected shape \[4\] \(x.shape\[:-1\]\), got \[5\]",
                     lambda x: rj.rms_norm_backward(x, x, None, jnp.ones(5)), x)
    _raises_at_trace(rudnn.ShapeError, r"softmax_backward: dy: expected the shape of y",
                     lambda x: rj.softmax_backward(x, x[:, :3]), x)
    _raises_at_trace(rudnn.ArgumentError, r"layer_norm_backward: mean is required",
                     lambda x: rj.layer_norm_backward(x, x, None, None, jnp.ones(4)), x)
    # the rudnn exceptions are also the builtin ones
    with pytest.raises(ValueError):
        rj.layer_norm(x, jnp.ones(3))
    with pytest.raises(TypeError):
        rj.softmax(x.astype(jnp.int32))


@needs_ffi
def test_argument_errors(device):
    x = jnp.ones((4, 16))
    with pytest.raises(rudnn.ArgumentError, match="eps: expected a Python float"):
        jax.jit(lambda x, e: rj.layer_norm(x, eps=e))(x, 1e-5)
    for call in (lambda: rj.layer_norm(x, out=x), lambda: rj.rms_norm(x, out=x), lambda: rj.softmax(x, out=x)):
        with pytest.raises(rudnn.UnsupportedError, match="out= is not supported"):
            call()
    with pytest.raises(rudnn.FrameworkError, match=r"softmax: x: expected a jax.Array, got torch.Tensor"):
        rj.softmax(torch.ones(3, 4))
    with pytest.raises(rudnn.FrameworkError, match="weight"):
        rj.layer_norm(x, [1.0] * 16)
    y = rj.softmax(x, stream=12345)  # ignored: XLA provides the stream
    assert y.shape == x.shape


@needs_ffi
def test_handler_errors_do_not_crash(device):
    """A call the handler rejects at run time becomes an XLA error naming the rudnn exception."""
    call = jax.ffi.ffi_call("rudnn_norm_forward", jax.ShapeDtypeStruct((4, 16), jnp.float32))
    attrs = dict(kind=np.int32(0), has_bias=False, has_residual=False, has_mean=False, has_rstd=False)
    from rudnn.jax import _ffi

    _ffi.ensure_ready("test")
    with pytest.raises(Exception, match=r"rudnn.ArgumentError: layer_norm: eps: expected a finite value > 0"):
        jax.block_until_ready(call(jnp.ones((4, 16)), eps=np.float32(-1.0), has_weight=False, **attrs))
    with pytest.raises(Exception, match=r"rudnn.ArgumentError: layer_norm: internal: .*missing input 'weight'"):
        jax.block_until_ready(call(jnp.ones((4, 16)), eps=np.float32(1e-5), has_weight=True, **attrs))


def test_build_without_jax_support(monkeypatch):
    """Without the FFI handlers every op says so (and how to fix it)."""
    from rudnn.jax import _ffi

    monkeypatch.setattr(_ffi, "_registered", False)
    monkeypatch.setattr(rudnn._C, "has_jax_ffi", False, raising=False)
    x = jnp.ones((2, 8))
    calls = [lambda: rj.layer_norm(x), lambda: rj.rms_norm(x), lambda: rj.softmax(x),
             lambda: rj.layer_norm_backward(x, x, None, jnp.ones(2), jnp.ones(2)),
             lambda: rj.rms_norm_backward(x, x, None, jnp.ones(2)), lambda: rj.softmax_backward(x, x),
             lambda: rudnn.layer_norm(x)]
    for call in calls:
        with pytest.raises(rudnn.UnsupportedError, match="no JAX support.*--no-build-isolation"):
            call()
