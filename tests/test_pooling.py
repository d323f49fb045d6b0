"""max/avg/adaptive pooling and their backward functions against torch.nn.functional on the CPU
(max: bitwise equal values and indices; averages and gradients: float64 oracle with an error
budget of twice that of the same-dtype torch computation)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

# (input shape, kernel, stride, padding, dilation, ceil_mode): odd sizes, every option.
WINDOWS = [
    ((2, 3, 11), 3, 2, 1, 1, False),
    ((1, 2, 10), 4, 3, 2, 2, True),
    ((1, 1, 5), 2, 2, 1, 1, True),  # ceil mode drops a last window that would start in the padding
    ((2, 3, 7, 9), 3, 2, 1, 1, False),
    ((1, 2, 8, 5), (2, 3), (1, 2), (1, 1), (2, 1), True),
    ((2, 1, 5, 5), 5, 1, 2, 1, False),
    ((1, 3, 6, 7), 2, (3, 2), 0, 1, True),
    ((1, 2, 5, 6, 7), (2, 3, 2), (2, 1, 2), (1, 1, 0), (1, 2, 1), True),
    ((2, 2, 4, 4, 4), 2, None, 0, 1, False),
]
WINDOW_IDS = [f"{len(w[0]) - 2}d-{i}" for i, w in enumerate(WINDOWS)]
LAYOUTS = ["NCHW", "NHWC", "channels_last"]

ADAPTIVE = [
    ((2, 3, 10), 4), ((1, 2, 7), 7), ((1, 1, 5), 8),
    ((2, 3, 7, 9), (3, 4)), ((1, 2, 5, 5), (None, 2)), ((1, 3, 9, 4), 1),
    ((1, 2, 5, 6, 7), (2, 3, 4)), ((2, 1, 3, 4, 5), (3, None, 7)),
]
ADAPTIVE_IDS = [f"{len(a[0]) - 2}d-{i}" for i, a in enumerate(ADAPTIVE)]


def _dims(shape):
    return len(shape) - 2


def _f(name, dims):
    return getattr(F, f"{name}{dims}d")


def _same_dtype(fn, x, *args, **kw):
    """torch's result in x's dtype; where the CPU build lacks the dtype, float32 rounded to it."""
    try:
        return fn(x, *args, **kw)
    except RuntimeError:
        out = fn(x.float(), *args, **kw)
        return tuple(o.to(x.dtype) if o.is_floating_point() else o for o in out) if isinstance(out, tuple) \
            else out.to(x.dtype)


def _torch_grad(fn, x, dy, dtype):
    """dx of sum(fn(x) * dy) by torch autograd in `dtype` (float32 rounded where unsupported)."""
    def run(dt):
        xs = x.detach().cpu().to(dt).requires_grad_()
        y = fn(xs)
        y = y[0] if isinstance(y, tuple) else y
        y.backward(dy.cpu().to(dt))
        return xs.grad

    try:
        return run(dtype)
    except RuntimeError:
        return run(torch.float32).to(dtype)


def _to_layout(x, layout):
    """x (channels first) in the memory layout under test, and the layout= argument for it."""
    if layout == "NHWC":
        return x.movedim(1, -1).contiguous(), "NHWC"
    if layout == "channels_last":
        return x.movedim(1, -1).contiguous().movedim(-1, 1), "NCHW"  # channels densest, seen as NCHW
    return x, "NCHW"


def _from_layout(y, layout):
    return y.movedim(-1, 1) if layout == "NHWC" else y


def _check_channels_last_result(y, layout):
    if layout == "channels_last" and y.numel() > 1 and y.shape[1] > 1:
        assert y.stride(1) == 1, f"channels_last input should give a channels_last result, got strides {y.stride()}"


def _scatter_oracle(x_shape, indices, dy):
    """dx of max pooling from its indices, by float64 scatter-add over each plane (torch's rule)."""
    n, c = x_shape[0], x_shape[1]
    dx = torch.zeros(n, c, int(np.prod(x_shape[2:])), dtype=torch.float64)
    dx.scatter_add_(2, indices.reshape(n, c, -1), dy.double().reshape(n, c, -1))
    return dx.reshape(x_shape)


# ---- max pooling ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", WINDOWS, ids=WINDOW_IDS)
def test_max_pool(device, layout, dtype, window):
    shape, k, s, p, d, ceil = window
    dims = _dims(shape)
    x = rand(shape, dtype)
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    y_ref, i_ref = _same_dtype(_f("max_pool", dims), x, return_indices=True, **kw)

    xl, lay = _to_layout(x, layout)
    y, i = rudnn.max_pool(xl.to(device), k, s, p, d, ceil, return_indices=True, layout=lay)
    assert y.dtype == dtype and i.dtype == torch.int64 and y.device == xl.to(device).device
    _check_channels_last_result(y, layout)
    y, i = _from_layout(y, layout).cpu(), _from_layout(i, layout).cpu()
    assert torch.equal(y, y_ref), "max values differ from torch"
    assert torch.equal(i, i_ref), "indices differ from torch"
    y_only = rudnn.max_pool(xl.to(device), k, s, p, d, ceil, layout=lay)  # without indices: same values
    assert torch.equal(_from_layout(y_only, layout).cpu(), y)

    # Backward: a gather of dy over the windows whose index names each element.
    dy = rand(y.shape, dtype, seed=1)
    dyl = _to_layout(dy, layout)[0].to(device)
    il = _to_layout(i, layout)[0].to(device)
    dx = rudnn.max_pool_backward(dyl, xl.to(device), il, kernel=k, stride=s, padding=p, dilation=d, ceil_mode=ceil,
                                 layout=lay)
    assert dx.dtype == dtype and dx.shape == xl.shape
    dx = _from_layout(dx, layout).cpu()
    same = _torch_grad(lambda t: _f("max_pool", dims)(t, **kw), x, dy, dtype)
    assert_close_to_oracle(dx, same, _scatter_oracle(shape, i_ref, dy), "dx")
    dx32 = rudnn.max_pool_backward(dyl, xl.to(device), il.int(), kernel=k, stride=s, padding=p, dilation=d,
                                   ceil_mode=ceil, layout=lay)  # int32 indices (JAX's) give the same gather
    assert torch.equal(_from_layout(dx32, layout).cpu(), dx)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_max_pool_batchless_and_numpy(dims):
    shape = (3,) + (7, 6, 5)[:dims]
    x = rand(shape, torch.float32)
    k = (3, 2, 2)[:dims]
    y, i = rudnn.max_pool(x, k, 2, 1, return_indices=True)
    y_ref, i_ref = _f("max_pool", dims)(x, k, 2, 1, return_indices=True)
    assert torch.equal(y, y_ref) and torch.equal(i, i_ref)
    y_np = rudnn.max_pool(x.numpy(), k, 2, 1)
    assert isinstance(y_np, np.ndarray) and np.array_equal(y_np, y_ref.numpy())
    dx = rudnn.max_pool_backward(y.numpy(), x.numpy(), i.numpy(), kernel=k, stride=2, padding=1)
    ref = _scatter_oracle((1,) + shape, i_ref[None], y_ref[None])[0]
    assert isinstance(dx, np.ndarray) and np.allclose(dx, ref.numpy(), rtol=1e-6, atol=1e-6)


def test_max_pool_nan_and_ties():
    x = torch.tensor([[[1.0, float("nan"), 3.0, 3.0, float("-inf"), float("-inf"), 2.0, float("nan")]]])
    y, i = rudnn.max_pool(x, 2, return_indices=True)
    y_ref, i_ref = F.max_pool1d(x, 2, return_indices=True)
    assert torch.equal(i, i_ref) and torch.equal(y.isnan(), y_ref.isnan())
    assert torch.equal(y[~y.isnan()], y_ref[~y_ref.isnan()])


@pytest.mark.parametrize("dims", [1, 2])
def test_window_that_holds_no_input_element(dims):
    # kernel 2, padding 1, dilation 4 on 3 elements: taps at -1 and 3, both outside. torch gives
    # -inf and the index of the first tap after the padding (past the plane); so does rudnn.
    x = rand((1, 1) + (3,) * dims, torch.float32)
    y, i = rudnn.max_pool(x, 2, padding=1, dilation=4, return_indices=True)
    y_ref, i_ref = _f("max_pool", dims)(x, 2, padding=1, dilation=4, return_indices=True)
    assert torch.equal(y, y_ref) and torch.equal(i, i_ref)


def test_strided_input():
    x = rand((2, 3, 9, 14), torch.float16)[:, ::2, 1:, ::2]
    assert not x.is_contiguous()
    torch.testing.assert_close(rudnn.max_pool(x, 3, 2), F.max_pool2d(x, 3, 2), rtol=0, atol=0)
    assert_close_to_oracle(rudnn.avg_pool(x, 2, 1, 1), F.avg_pool2d(x, 2, 1, 1),
                           F.avg_pool2d(x.double(), 2, 1, 1), "y")


# ---- average pooling -----------------------------------------------------------------------

AVG_OPTIONS = [(True, None), (False, None), (True, 5), (False, -3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("divisor", AVG_OPTIONS, ids=["incl", "excl", "div5", "div-3"])
@pytest.mark.parametrize("window", [w for w in WINDOWS if w[4] == 1],
                         ids=[i for i, w in zip(WINDOW_IDS, WINDOWS) if w[4] == 1])
def test_avg_pool(device, layout, dtype, divisor, window):
    shape, k, s, p, _, ceil = window
    count_include_pad, override = divisor
    dims = _dims(shape)
    if dims == 1 and override is not None:
        pytest.skip("torch's avg_pool1d has no divisor_override")
    x = rand(shape, dtype)
    kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=count_include_pad)
    if override is not None:
        kw["divisor_override"] = override

    def fn(t):
        return _f("avg_pool", dims)(t, **kw)

    xl, lay = _to_layout(x, layout)
    y = rudnn.avg_pool(xl.to(device), k, s, p, ceil, count_include_pad, override, layout=lay)
    _check_channels_last_result(y, layout)
    y = _from_layout(y, layout).cpu()
    assert y.dtype == dtype
    assert_close_to_oracle(y, _same_dtype(fn, x), fn(x.double()), "y")

    dy = rand(y.shape, dtype, seed=1)
    dx = rudnn.avg_pool_backward(_to_layout(dy, layout)[0].to(device), xl.shape, kernel=k, stride=s, padding=p,
                                 ceil_mode=ceil, count_include_pad=count_include_pad, divisor_override=override,
                                 layout=lay)
    assert dx.dtype == dtype and dx.shape == xl.shape
    _check_channels_last_result(dx, layout)
    assert_close_to_oracle(_from_layout(dx, layout).cpu(), _torch_grad(fn, x, dy, dtype),
                           _torch_grad(fn, x, dy, torch.float64), "dx")


def test_avg_pool_batchless_and_numpy():
    x = rand((2, 7, 5), torch.float32)
    y = rudnn.avg_pool(x.numpy(), (3, 2), 1, (1, 1), count_include_pad=False)
    ref = F.avg_pool2d(x.double(), (3, 2), 1, (1, 1), count_include_pad=False)
    assert isinstance(y, np.ndarray) and np.allclose(y, ref.numpy(), rtol=1e-6, atol=1e-6)
    dx = rudnn.avg_pool_backward(np.ones(y.shape, np.float32), x.shape, kernel=(3, 2), stride=1, padding=(1, 1),
                                 count_include_pad=False)
    ref_dx = _torch_grad(lambda t: F.avg_pool2d(t, (3, 2), 1, (1, 1), count_include_pad=False), x,
                         torch.ones(y.shape), torch.float64)
    assert np.allclose(dx, ref_dx.numpy(), rtol=1e-6, atol=1e-6)


# ---- adaptive pooling ----------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ADAPTIVE, ids=ADAPTIVE_IDS)
def test_adaptive_avg_pool(device, layout, dtype, case):
    shape, size = case
    dims = _dims(shape)
    x = rand(shape, dtype)

    def fn(t):
        return _f("adaptive_avg_pool", dims)(t, size)

    xl, lay = _to_layout(x, layout)
    y = rudnn.adaptive_avg_pool(xl.to(device), size, layout=lay)
    _check_channels_last_result(y, layout)
    y = _from_layout(y, layout).cpu()
    assert_close_to_oracle(y, _same_dtype(fn, x), fn(x.double()), "y")

    dy = rand(y.shape, dtype, seed=1)
    dx = rudnn.adaptive_avg_pool_backward(_to_layout(dy, layout)[0].to(device), xl.shape, layout=lay)
    assert dx.dtype == dtype and dx.shape == xl.shape
    assert_close_to_oracle(_from_layout(dx, layout).cpu(), _torch_grad(fn, x, dy, dtype),
                           _torch_grad(fn, x, dy, torch.float64), "dx")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ADAPTIVE, ids=ADAPTIVE_IDS)
def test_adaptive_max_pool(device, layout, dtype, case):
    shape, size = case
    dims = _dims(shape)
    x = rand(shape, dtype)
    y_ref, i_ref = _same_dtype(_f("adaptive_max_pool", dims), x, size, return_indices=True)

    xl, lay = _to_layout(x, layout)
    y, i = rudnn.adaptive_max_pool(xl.to(device), size, return_indices=True, layout=lay)
    _check_channels_last_result(y, layout)
    y, i = _from_layout(y, layout).cpu(), _from_layout(i, layout).cpu()
    assert torch.equal(y, y_ref) and torch.equal(i, i_ref)

    dy = rand(y.shape, dtype, seed=1)
    dx = rudnn.adaptive_max_pool_backward(_to_layout(dy, layout)[0].to(device), xl.to(device),
                                          _to_layout(i, layout)[0].to(device), layout=lay)
    same = _torch_grad(lambda t: _f("adaptive_max_pool", dims)(t, size), x, dy, dtype)
    assert_close_to_oracle(_from_layout(dx, layout).cpu(), same, _scatter_oracle(shape, i_ref, dy), "dx")


def test_adaptive_batchless_zero_output_and_numpy():
    x = rand((3, 6, 5), torch.float32)
    y = rudnn.adaptive_avg_pool(x.numpy(), (0, 3))
    assert y.shape == (3, 0, 3)
    dx = rudnn.adaptive_avg_pool_backward(y, x.shape, output_size=(0, 3))
    assert dx.shape == (3, 6, 5) and not dx.any()  # no window covers anything: zeros
    y, i = rudnn.adaptive_max_pool(x, (2, 4), return_indices=True)
    y_ref, i_ref = F.adaptive_max_pool2d(x, (2, 4), return_indices=True)
    assert torch.equal(y, y_ref) and torch.equal(i, i_ref)
    dx = rudnn.adaptive_max_pool_backward(y, x, i, output_size=(2, 4))
    torch.testing.assert_close(dx, _scatter_oracle((1,) + x.shape, i_ref[None], y_ref[None])[0].float())


# ---- empty batch, determinism --------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = torch.randn(0, 3, 6, 6, device=device)
    y, i = rudnn.max_pool(x, 2, return_indices=True)
    assert y.shape == (0, 3, 3, 3) and i.shape == y.shape
    assert rudnn.avg_pool(x, 3, 1, 1).shape == (0, 3, 6, 6)
    assert rudnn.adaptive_avg_pool(x, 4).shape == (0, 3, 4, 4)
    assert rudnn.max_pool_backward(y, x, i, kernel=2).shape == x.shape
    assert rudnn.avg_pool_backward(y, x.shape, kernel=2).shape == x.shape
    assert rudnn.adaptive_max_pool_backward(y, x, i).shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_is_bitwise_deterministic(device, dtype):
    x = rand((2, 8, 17, 19), dtype, device)
    dy_max = rand((2, 8, 9, 10), dtype, device, seed=1)
    _, i = rudnn.max_pool(x, 3, 2, 1, return_indices=True)
    runs = [rudnn.max_pool_backward(dy_max, x, i, kernel=3, stride=2, padding=1) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    dy = rand((2, 8, 17, 19), dtype, device, seed=2)
    runs = [rudnn.avg_pool_backward(dy, x.shape, kernel=3, stride=1, padding=1) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    dy = rand((2, 8, 5, 7), dtype, device, seed=3)
    runs = [rudnn.adaptive_avg_pool_backward(dy, x.shape) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_out_argument():
    x = rand((1, 2, 6, 6), torch.float32)
    out = torch.full((1, 2, 3, 3), 7.0)
    assert rudnn.avg_pool(x, 2, out=out) is out
    torch.testing.assert_close(out, F.avg_pool2d(x, 2))
