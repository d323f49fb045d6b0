"""rudnn.conv and its three backward functions against torch.nn.functional.conv1d/2d/3d and
torch autograd on the CPU: a float64 oracle with an error budget of twice that of the same-dtype
torch computation; every padding form, stride, dilation, groups incl. depthwise, odd sizes,
1x1 and 7x7 kernels, bias and none, f32/f16/bf16, NCHW, NHWC and torch channels_last."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

# (x shape, w shape (torch layout), stride, padding, dilation, groups, bias)
CASES = [
    ((2, 4, 11), (6, 4, 3), 2, 1, 1, 1, True),
    ((1, 6, 10), (6, 2, 4), 1, "same", 2, 3, False),        # an even kernel: "same" pads one more after
    ((2, 3, 9), (4, 3, 5), 1, "valid", 1, 1, True),
    ((2, 3, 7, 9), (4, 3, 3, 3), 1, 1, 1, 1, True),
    ((1, 4, 8, 5), (6, 2, 2, 3), (1, 2), (1, 0), (2, 1), 2, True),
    ((2, 5, 9, 7), (5, 1, 3, 3), 2, 1, 1, 5, True),         # depthwise
    ((1, 3, 6, 6), (6, 1, 3, 3), 1, "same", 1, 3, False),   # depthwise, channel multiplier 2
    ((2, 8, 5, 5), (4, 8, 1, 1), 1, 0, 1, 1, True),         # 1x1
    ((1, 3, 15, 13), (4, 3, 7, 7), 2, 3, 1, 1, False),      # 7x7 stem
    ((1, 2, 6, 7), (3, 2, 4, 2), 1, "same", (1, 2), 1, True),
    ((1, 3, 5, 4), (2, 3, 3, 3), 3, 0, 1, 1, True),         # stride > kernel: inputs no output reads
    ((1, 4, 5, 6, 7), (4, 2, 3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 1), 2, True),
    ((2, 2, 4, 5, 4), (3, 2, 1, 3, 3), 1, "same", 1, 1, False),
]
# torch warns that its own "same" padding of an even kernel copies the input (the oracle's business).
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")

CASE_IDS = [f"{len(c[0]) - 2}d-{i}" for i, c in enumerate(CASES)]
LAYOUTS = ["NCHW", "NHWC", "channels_last"]


def _f(dims):
    return getattr(F, f"conv{dims}d")


def _to_layout(t, layout):
    """t (channels first: an activation or a torch-layout weight) in the layout under test."""
    if layout == "NHWC":
        return t.movedim(1, -1).contiguous()
    if layout == "channels_last":
        return t.movedim(1, -1).contiguous().movedim(-1, 1)  # channels densest, seen as NCHW
    return t


def _from_layout(t, layout):
    return t.movedim(-1, 1) if layout == "NHWC" else t


def _lay(layout):
    return "NHWC" if layout == "NHWC" else "NCHW"


def _same_dtype(fn, dtype, *tensors):
    """torch's result in `dtype`; where the CPU build lacks the dtype, float32 rounded to it."""
    try:
        return fn(*(t.to(dtype) if t is not None else None for t in tensors))
    except RuntimeError:
        out = fn(*(t.float() if t is not None else None for t in tensors))
        return tuple(o.to(dtype) for o in out) if isinstance(out, tuple) else out.to(dtype)


def _grads(x, w, b, dy, kw, dims):
    """(dx, dw, db) of sum(conv(x, w, b) * dy) by torch autograd, in the tensors' dtype."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = b.detach().requires_grad_() if b is not None else None
    y = _f(dims)(x, w, b, **kw)
    y.backward(dy.to(y.dtype))
    return x.grad, w.grad, (b.grad if b is not None else None)


def _setup(case, dtype, seed=0):
    xs, ws, s, p, d, g, has_bias = case
    x = rand(xs, dtype, seed=seed)
    w = rand(ws, dtype, seed=seed + 1, scale=0.5)
    b = rand((ws[0],), dtype, seed=seed + 2) if has_bias else None
    kw = dict(stride=s, padding=p, dilation=d, groups=g)
    return x, w, b, kw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_conv_forward(device, layout, dtype, case):
    x, w, b, kw = _setup(case, dtype)
    dims = x.dim() - 2
    oracle = _f(dims)(x.double(), w.double(), b.double() if b is not None else None, **kw)
    same = _same_dtype(lambda *t: _f(dims)(*t, **kw), dtype, x, w, b)

    xl, wl = _to_layout(x, layout).to(device), _to_layout(w, layout).to(device)
    y = rudnn.conv(xl, wl, b.to(device) if b is not None else None, layout=_lay(layout), **kw)
    assert y.dtype == dtype and y.device == xl.device
    if layout == "channels_last" and y.shape[1] > 1:
        assert y.stride(1) == 1, f"channels_last input should give a channels_last result, got {y.stride()}"
    assert rudnn.conv_last_algorithm() in (("cpu",) if device == "cpu" else ("direct", "direct_packed"))
    assert_close_to_oracle(_from_layout(y, layout).cpu(), same, oracle, "y")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_conv_backward(device, layout, dtype, case):
    x, w, b, kw = _setup(case, dtype)
    dims = x.dim() - 2
    y_shape = _f(dims)(x.double(), w.double(), **kw).shape
    dy = rand(y_shape, dtype, seed=7)
    oracle = _grads(x.double(), w.double(), b.double() if b is not None else None, dy.double(), kw, dims)
    same = _same_dtype(lambda *t: _grads(*t, kw, dims), dtype, x, w, b, dy)

    xl, wl, dyl = (_to_layout(t, layout).to(device) for t in (x, w, dy))
    lay = _lay(layout)
    dx = rudnn.conv_data_backward(dyl, wl, tuple(xl.shape), layout=lay, **kw)
    dw = rudnn.conv_weight_backward(dyl, xl, tuple(wl.shape), layout=lay, **kw)
    db = rudnn.conv_bias_backward(dyl, layout=lay)
    assert dx.dtype == dw.dtype == db.dtype == dtype
    assert dx.shape == xl.shape and dw.shape == wl.shape and db.shape == (w.shape[0],)
    assert_close_to_oracle(_from_layout(dx, layout).cpu(), same[0], oracle[0], "dx")
    assert_close_to_oracle(_from_layout(dw, layout).cpu(), same[1], oracle[1], "dw")
    assert_close_to_oracle(db.cpu(), dy.sum(dim=[0] + list(range(2, dy.dim()))), dy.double().sum(
        dim=[0] + list(range(2, dy.dim()))), "db")


@pytest.mark.parametrize("strategy", ["auto", "direct", "autotune"])
def test_strategies_run_direct(strategy):
    x, w, b, kw = _setup(CASES[3], torch.float32)
    y = rudnn.conv(x, w, b, strategy=strategy, **kw)
    assert torch.equal(y, rudnn.conv(x, w, b, strategy="direct", **kw))
    dx = rudnn.conv_data_backward(y, w, x.shape, strategy=strategy, **kw)
    dw = rudnn.conv_weight_backward(y, x, w.shape, strategy=strategy, **kw)
    assert dx.shape == x.shape and dw.shape == w.shape


def test_numpy_and_out():
    x, w, b, kw = _setup(CASES[4], torch.float32)
    ref = rudnn.conv(x, w, b, **kw)
    y = rudnn.conv(x.numpy(), w.numpy(), b.numpy(), **kw)
    assert isinstance(y, np.ndarray) and np.array_equal(y, ref.numpy())
    out = torch.full_like(ref, float("nan"))
    assert rudnn.conv(x, w, b, out=out, **kw) is out
    assert torch.equal(out, ref)
    dx = rudnn.conv_data_backward(ref.numpy(), w.numpy(), x.shape, **kw)
    assert isinstance(dx, np.ndarray) and dx.shape == tuple(x.shape)


def test_strided_views_without_copies():
    """Non-dense views (a slice of the channels, a spatial crop) are read through their strides."""
    big = rand((2, 8, 11, 12), torch.float32)
    x = big[:, 2:5, 1:10, ::2]
    w = rand((4, 3, 3, 3), torch.float32, seed=1)
    y = rudnn.conv(x, w, None, 1, 1)
    assert_close_to_oracle(y, F.conv2d(x, w, None, 1, 1), F.conv2d(x.double(), w.double(), None, 1, 1), "y")
    # a strided bias, a channels_last weight beside a plain x, and a strided (transposed) dy
    b = rand((8,), torch.float32, seed=2)[::2]
    wc = w.movedim(1, -1).contiguous().movedim(-1, 1)
    y = rudnn.conv(x, wc, b, 1, 1)
    assert_close_to_oracle(y, F.conv2d(x, w, b, 1, 1), F.conv2d(x.double(), w.double(), b.double(), 1, 1), "y")
    dy = rand((2, 4, 6, 9), torch.float32, seed=3).transpose(2, 3)
    dx = rudnn.conv_data_backward(dy, wc, x.shape, padding=1)
    xs = x.double().requires_grad_()
    F.conv2d(xs, w.double(), None, 1, 1).backward(dy.double())
    xf = x.clone().requires_grad_()
    F.conv2d(xf, w, None, 1, 1).backward(dy)
    assert_close_to_oracle(dx, xf.grad, xs.grad, "dx")


def test_empty_batch():
    x = torch.zeros((0, 3, 5, 5))
    w = rand((4, 3, 3, 3), torch.float32)
    assert rudnn.conv(x, w, padding=1).shape == (0, 4, 5, 5)
    dy = torch.zeros((0, 4, 5, 5))
    assert torch.equal(rudnn.conv_weight_backward(dy, x, w.shape, padding=1), torch.zeros_like(w))
    assert torch.equal(rudnn.conv_bias_backward(dy), torch.zeros(4))


@pytest.mark.cuda
def test_cuda_gradients_deterministic():
    x, w, b, kw = _setup(CASES[3], torch.bfloat16)
    x, w = x.cuda(), w.cuda()
    y = rudnn.conv(x, w, None, **kw)
    dy = torch.randn_like(y)
    dws = [rudnn.conv_weight_backward(dy, x, w.shape, **kw) for _ in range(3)]
    dbs = [rudnn.conv_bias_backward(dy) for _ in range(3)]
    assert all(torch.equal(dws[0], d) for d in dws) and all(torch.equal(dbs[0], d) for d in dbs)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_packed_forward(dtype):
    """x and w dense along the input channels with whole 16-byte packs: the packed forward of the
    direct strategy (asked for: "auto" gives 16-bit cases with channels in 8s to implicit GEMM)."""
    x, w = rand((2, 16, 7, 6), dtype), rand((8, 16, 3, 3), dtype, seed=1, scale=0.5)
    b = rand((8,), dtype, seed=2)
    for layout in ("NHWC", "channels_last"):
        xl, wl = _to_layout(x, layout).cuda(), _to_layout(w, layout).cuda()
        y = rudnn.conv(xl, wl, b.cuda(), padding=1, layout=_lay(layout), strategy="direct")
        assert rudnn.conv_last_algorithm() == "direct_packed"
        same = _same_dtype(lambda *t: F.conv2d(*t, padding=1), dtype, x, w, b)
        assert_close_to_oracle(_from_layout(y, layout).cpu(), same, F.conv2d(x.double(), w.double(), b.double(),
                                                                             padding=1), "y")
    rudnn.conv(x.cuda(), w.cuda(), b.cuda(), padding=1, strategy="direct")
    assert rudnn.conv_last_algorithm() == "direct"
