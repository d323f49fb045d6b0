"""interpolate and interpolate_backward against torch.nn.functional.interpolate and its autograd on
the CPU (nearest modes: bitwise equal to torch; the others and every gradient: float64 oracle with
an error budget of twice that of the same-dtype torch computation)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from test_pooling import _check_channels_last_result, _from_layout, _same_dtype, _to_layout, _torch_grad
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

# (input shape, options): every mode at the ranks torch allows it, up- and down-sampling with
# non-integer factors and odd sizes, size vs scale_factor, recompute_scale_factor, align_corners
# and antialias.
CASES = [
    ((2, 3, 7), dict(size=12, mode="nearest")),
    ((2, 3, 9), dict(scale_factor=0.55, mode="nearest")),
    ((1, 2, 5, 7), dict(scale_factor=(1.7, 2.0), mode="nearest")),
    ((1, 2, 5, 7), dict(scale_factor=(1.7, 0.6), mode="nearest", recompute_scale_factor=True)),
    ((1, 2, 3, 4, 5), dict(size=(5, 3, 8), mode="nearest")),
    ((2, 3, 7), dict(scale_factor=1.45, mode="nearest-exact")),
    ((1, 2, 9, 6), dict(size=(4, 11), mode="nearest-exact")),
    ((1, 2, 4, 5, 3), dict(scale_factor=(0.7, 1.5, 2.3), mode="nearest-exact")),
    ((2, 3, 7), dict(size=12, mode="linear")),
    ((2, 3, 10), dict(scale_factor=0.45, mode="linear", align_corners=True)),
    ((1, 2, 5, 7), dict(scale_factor=(1.7, 2.3), mode="bilinear")),
    ((1, 2, 5, 7), dict(scale_factor=(1.7, 2.3), mode="bilinear", recompute_scale_factor=True)),
    ((1, 2, 9, 8), dict(size=(4, 13), mode="bilinear", align_corners=True)),
    ((1, 2, 9, 8), dict(scale_factor=0.6, mode="bilinear", align_corners=False)),
    ((1, 2, 3, 4, 5), dict(size=(5, 3, 8), mode="trilinear")),
    ((1, 2, 4, 5, 3), dict(scale_factor=(1.5, 0.7, 2.0), mode="trilinear", align_corners=True)),
    ((1, 2, 5, 7), dict(scale_factor=(1.7, 2.3), mode="bicubic")),
    ((1, 2, 9, 8), dict(size=(4, 13), mode="bicubic", align_corners=True)),
    ((1, 2, 9, 8), dict(scale_factor=0.6, mode="bicubic", recompute_scale_factor=True)),
    ((2, 3, 1, 4), dict(size=(3, 1), mode="bicubic")),
    ((2, 3, 7), dict(size=1, mode="linear", align_corners=True)),  # align_corners' scale is 0 for one output
    ((1, 2, 5, 6), dict(size=(1, 3), mode="bicubic", align_corners=True)),
    ((1, 2, 9, 8), dict(size=(1, 3), mode="bilinear", antialias=True, align_corners=True)),
    ((2, 3, 11), dict(size=4, mode="area")),
    ((1, 2, 7, 9), dict(scale_factor=(0.6, 1.5), mode="area")),
    ((1, 2, 5, 6, 7), dict(size=(2, 3, 4), mode="area")),
    ((1, 2, 13, 11), dict(size=(4, 5), mode="bilinear", antialias=True)),
    ((1, 2, 13, 11), dict(scale_factor=(0.3, 1.6), mode="bilinear", antialias=True, align_corners=True)),
    ((1, 2, 13, 11), dict(size=(5, 4), mode="bicubic", antialias=True)),
    ((1, 2, 6, 17), dict(scale_factor=(2.5, 0.35), mode="bicubic", antialias=True)),
]
IDS = [f"{len(s) - 2}d-{kw['mode']}{'-aa' if kw.get('antialias') else ''}-{i}" for i, (s, kw) in enumerate(CASES)]
LAYOUTS = ["NCHW", "NHWC", "channels_last"]
NEAREST = ("nearest", "nearest-exact")


def _options(kw):
    return dict(size=kw.get("size"), scale_factor=kw.get("scale_factor"), mode=kw["mode"],
                align_corners=kw.get("align_corners"), recompute_scale_factor=kw.get("recompute_scale_factor"),
                antialias=kw.get("antialias", False))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_interpolate(device, layout, dtype, case):
    shape, kw = case
    opts = _options(kw)

    def fn(t):
        return F.interpolate(t, **kw)

    x = rand(shape, dtype)
    y_same = _same_dtype(fn, x)
    xl, lay = _to_layout(x, layout)
    y = rudnn.interpolate(xl.to(device), **opts, layout=lay)
    assert y.dtype == dtype and y.device == xl.to(device).device
    _check_channels_last_result(y, layout)
    y = _from_layout(y, layout).cpu()
    if kw["mode"] in NEAREST:
        assert torch.equal(y, y_same), "nearest values differ from torch"
    else:
        assert_close_to_oracle(y, y_same, fn(x.double()), "y")

    dy = rand(y.shape, dtype, seed=1)
    dyl = _to_layout(dy, layout)[0].to(device)
    dx = rudnn.interpolate_backward(dyl, tuple(xl.shape), **opts, layout=lay)
    assert dx.dtype == dtype and dx.shape == xl.shape
    if not dyl.is_contiguous():  # a dy dense in both orders (one output element per plane) tells no layout
        _check_channels_last_result(dx, layout)
    dx = _from_layout(dx, layout).cpu()
    oracle = _torch_grad(fn, x.double(), dy.double(), torch.float64)
    assert_close_to_oracle(dx, _torch_grad(fn, x, dy, dtype), oracle, "dx")
    again = rudnn.interpolate_backward(dyl, tuple(xl.shape), **opts, layout=lay)
    assert torch.equal(_from_layout(again, layout).cpu(), dx), "the gather is not bitwise deterministic"


@pytest.mark.parametrize("mode", ["nearest", "linear", "area"])
def test_numpy_input(mode):
    x = rand((2, 3, 9), torch.float32)
    kw = dict(scale_factor=1.6, mode=mode)
    ref = F.interpolate(x, **kw)
    y = rudnn.interpolate(x.numpy(), **kw)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-6, atol=1e-6)
    dy = rand(ref.shape, torch.float32, seed=1)
    dx = rudnn.interpolate_backward(dy.numpy(), x.shape, **kw)
    assert isinstance(dx, np.ndarray)
    np.testing.assert_allclose(dx, _torch_grad(lambda t: F.interpolate(t, **kw), x, dy, torch.float32).numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic", "area"])
def test_empty_batch(mode):
    x = torch.empty(0, 3, 5, 6)
    y = rudnn.interpolate(x, size=(7, 4), mode=mode)
    assert y.shape == F.interpolate(x, size=(7, 4), mode=mode).shape == (0, 3, 7, 4)
    dx = rudnn.interpolate_backward(y, x.shape, size=(7, 4), mode=mode)
    assert dx.shape == x.shape


def test_strided_input():
    x = rand((2, 4, 9, 14), torch.float32)[:, ::2, 1:, ::2]
    assert not x.is_contiguous()
    kw = dict(scale_factor=1.3, mode="bilinear")
    assert_close_to_oracle(rudnn.interpolate(x, **kw), F.interpolate(x, **kw), F.interpolate(x.double(), **kw), "y")


SAME_SIZE = [((1, 2, 10), "nearest", False), ((1, 2, 4, 10), "nearest", False), ((1, 2, 3, 4, 10), "nearest", False),
             ((1, 2, 10), "nearest-exact", False), ((1, 2, 10), "linear", False), ((1, 2, 4, 10), "bilinear", False),
             ((1, 2, 3, 4, 10), "trilinear", False), ((1, 2, 4, 10), "bicubic", False), ((1, 2, 4, 10), "bilinear", True),
             ((1, 2, 4, 10), "bicubic", True), ((1, 2, 10), "area", False)]


@pytest.mark.parametrize("factor", [1.05, 2.05])
@pytest.mark.parametrize("shape,mode,aa", SAME_SIZE, ids=[f"{len(s) - 2}d-{m}{'-aa' if a else ''}"
                                                          for s, m, a in SAME_SIZE])
def test_scale_factor_that_keeps_or_doubles_the_size(shape, mode, aa, factor):
    # 10 * 1.05 -> 10 outputs (2.05: 20), but the mapping steps by 1 / factor, not in / out
    # (torch's rule; area always recomputes). torch's kernels copy (nearest: halve) in some modes
    # and passes instead, sometimes only in the forward: rudnn gives what torch gives, both ways.
    x = rand(shape, torch.float32)
    for recompute in (None, True):
        kw = dict(scale_factor=(1.0,) * (len(shape) - 3) + (factor,), mode=mode, recompute_scale_factor=recompute,
                  antialias=aa)
        ref = F.interpolate(x, **kw)
        y = rudnn.interpolate(x, **kw)
        if mode in NEAREST:
            assert torch.equal(y, ref)
        else:
            assert_close_to_oracle(y, ref, F.interpolate(x.double(), **kw), "y")
        dy = rand(ref.shape, torch.float32, seed=1)
        dx = rudnn.interpolate_backward(dy, x.shape, **kw)
        fn = lambda t: F.interpolate(t, **kw)  # noqa: E731
        assert_close_to_oracle(dx, _torch_grad(fn, x, dy, torch.float32),
                               _torch_grad(fn, x.double(), dy.double(), torch.float64), "dx")


GATHERS = [("nearest", False, None), ("nearest-exact", False, None), ("linear", False, None), ("linear", False, True),
           ("bicubic", False, None), ("bicubic", False, True), ("bilinear", True, None), ("bilinear", True, True),
           ("bicubic", True, None), ("area", False, None)]


@pytest.mark.parametrize("factor", [0.07, 0.23, 0.5, 1.0, 1.37, 3.0, 7.9, 21.0])
@pytest.mark.parametrize("mode,aa,align_corners", GATHERS,
                         ids=[f"{m}{'-aa' if a else ''}{'-align' if c else ''}" for m, a, c in GATHERS])
def test_gather_bounds(mode, aa, align_corners, factor):
    # Every input element's gradient sums exactly the outputs whose (clamped) taps read it:
    # compared with torch's scatter along one axis at factors from strong down- to strong
    # upsampling, borders included, by size and by the same scale_factor (a mapping off the
    # nominal out / in ratio).
    shape = (1, 1, 3, 19) if mode in ("bicubic", "bilinear") else (1, 1, 19)
    x = rand(shape, torch.float64)
    lead = (1.0,) * (len(shape) - 3)
    for kw in (dict(size=shape[2:-1] + (max(1, int(shape[-1] * factor)),)), dict(scale_factor=lead + (factor,))):
        if kw.get("scale_factor") and int(shape[-1] * factor) < 1:
            continue
        kw.update(mode=mode, antialias=aa, align_corners=align_corners)
        out = F.interpolate(x, **kw).shape
        dy = rand(out, torch.float64, seed=2)
        ref = _torch_grad(lambda t: F.interpolate(t, **kw), x, dy, torch.float64)
        dx = rudnn.interpolate_backward(dy.float(), shape, **kw)
        torch.testing.assert_close(dx.double(), ref, rtol=1e-5, atol=1e-5)
