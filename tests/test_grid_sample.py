"""grid_sample and grid_sample_backward against torch.nn.functional.grid_sample and its autograd
on the CPU (a float64 oracle with an error budget of twice that of the same-dtype torch
computation; nearest values bitwise equal to torch's), over every mode, padding mode and
align_corners on 4-D and 5-D input, odd sizes, grid points outside [-1, 1], f32/f16/bf16 and
the three layouts; repeated backward passes are bitwise equal (deterministic=True on CUDA)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from test_pooling import _check_channels_last_result, _from_layout, _to_layout
from util import DEVICES, DTYPES, assert_close_to_oracle, rand

MODES = ["bilinear", "nearest", "bicubic"]
PADDINGS = ["zeros", "border", "reflection"]
LAYOUTS = ["NCHW", "NHWC", "channels_last"]
CASES = [(dims, mode, pad, ac) for dims in (2, 3) for mode in MODES for pad in PADDINGS for ac in (False, True)
         if not (dims == 3 and mode == "bicubic")]
IDS = [f"{d}d-{m}-{p}{'-align' if a else ''}" for d, m, p, a in CASES]


def _grid(shape, dtype, seed=3, spread=1.3):
    """Grid values uniform in [-spread, spread]: points inside and outside [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * spread).to(dtype)


def _shapes(dims):
    return ((2, 3, 5, 7), (2, 4, 6, 2)) if dims == 2 else ((2, 3, 4, 5, 3), (2, 3, 2, 5, 3))


def _torch_grads(x, grid, dy, dtype, **kw):
    """(dx, dgrid) by torch autograd in `dtype`."""
    xs = x.detach().to(dtype).requires_grad_()
    gs = grid.detach().to(dtype).requires_grad_()
    F.grid_sample(xs, gs, **kw).backward(dy.to(dtype))
    return xs.grad, gs.grad


def _check(x, grid, device="cpu", layout="NCHW", deterministic=False, **kw):
    """Forward and backward of rudnn (x, grid: channels-first CPU tensors) against torch."""
    dtype = x.dtype
    xl, lay = _to_layout(x, layout)
    xd, gd = xl.to(device), grid.to(device)
    y = rudnn.grid_sample(xd, gd, **kw, layout=lay)
    assert y.dtype == dtype and y.device == xd.device
    _check_channels_last_result(y, layout)
    y = _from_layout(y, layout).cpu()
    ref = F.grid_sample(x, grid, **kw)
    if kw["mode"] == "nearest":  # float32 coordinates (torch's CPU takes f16/bf16 ones in that dtype)
        assert torch.equal(y, F.grid_sample(x.float(), grid.float(), **kw).to(dtype)), "nearest values differ"
    else:
        assert_close_to_oracle(y, ref, F.grid_sample(x.double(), grid.double(), **kw), "y")

    dy = rand(y.shape, dtype, seed=1)
    dyl = _to_layout(dy, layout)[0].to(device)
    dx, dgrid = rudnn.grid_sample_backward(dyl, xd, gd, **kw, layout=lay, deterministic=deterministic)
    assert dx.dtype == dtype and dx.shape == xl.shape and dgrid.dtype == dtype and dgrid.shape == grid.shape
    _check_channels_last_result(dx, layout)
    dx = _from_layout(dx, layout).cpu()
    dx64, dgrid64 = _torch_grads(x, grid, dy, torch.float64, **kw)
    dx_same, dgrid_same = _torch_grads(x, grid, dy, dtype, **kw)
    assert_close_to_oracle(dx, dx_same, dx64, "dx")
    # dgrid sums x * dweight over taps and channels: its terms, not its value, set the scale
    scale = (dy.double().abs().max() * x.double().abs().max() * max(x.shape[2:])).item() * x.shape[1]
    assert_close_to_oracle(dgrid.cpu(), dgrid_same, dgrid64, "dgrid", scale=scale)
    if device == "cpu" or deterministic:
        dx2, dgrid2 = rudnn.grid_sample_backward(dyl, xd, gd, **kw, layout=lay, deterministic=deterministic)
        assert torch.equal(_from_layout(dx2, layout).cpu(), dx), "dx is not bitwise deterministic"
        assert torch.equal(dgrid2.cpu(), dgrid.cpu()), "dgrid is not bitwise deterministic"
    return dx, dgrid


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grid_sample(device, layout, dtype, case):
    dims, mode, pad, ac = case
    x_shape, g_shape = _shapes(dims)
    _check(rand(x_shape, dtype), _grid(g_shape, dtype), device, layout, mode=mode, padding_mode=pad,
           align_corners=ac)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", [(2, "bilinear"), (2, "bicubic"), (3, "bilinear"), (2, "nearest")])
def test_many_channels_and_far_points(device, deterministic, case):
    # 37 channels (a channel count past every CUDA channel group), points far outside the input
    # (reflection folds them many times), points sharing input taps (dx sums several).
    dims, mode = case
    x_shape = (2, 37, 6, 5) if dims == 2 else (2, 37, 3, 4, 5)
    g_shape = (2, 9, 11, 2) if dims == 2 else (2, 3, 4, 7, 3)
    for pad in PADDINGS:
        for layout in ("NCHW", "channels_last"):
            _check(rand(x_shape, torch.float32), _grid(g_shape, torch.float32, spread=6.0), device, layout,
                   deterministic, mode=mode, padding_mode=pad, align_corners=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_exact_grid_values(mode, align_corners):
    # Grid values on a 1/8 lattice put points exactly on pixel centres, edges and half-way
    # points: nearest's round-half-to-even, floor at integers and the clip / reflection borders.
    x = rand((1, 2, 4, 6), torch.float32)
    v = torch.arange(-12, 13, dtype=torch.float32) / 8
    gx, gy = torch.meshgrid(v, v[::2], indexing="xy")
    grid = torch.stack([gx, gy], -1)[None]
    for pad in PADDINGS:
        _check(x, grid, mode=mode, padding_mode=pad, align_corners=align_corners)


@pytest.mark.parametrize("mode", MODES)
def test_unit_axes(mode):
    # A size-1 axis: align_corners maps every point to its one pixel, reflection folds onto it.
    x = rand((2, 3, 1, 5), torch.float32)
    for ac in (False, True):
        for pad in PADDINGS:
            _check(x, _grid((2, 3, 4, 2), torch.float32), mode=mode, padding_mode=pad, align_corners=ac)


@pytest.mark.parametrize("dims", [2, 3])
def test_empty(dims):
    kw = dict(mode="bilinear", padding_mode="zeros", align_corners=False)
    sp = (5, 6) if dims == 2 else (3, 5, 6)
    for x_shape, g_shape in [((0, 3) + sp, (0,) + sp[:-1] + (4, dims)),  # empty batch
                             ((2, 3) + sp, (2,) + (0,) * (dims - 1) + (4, dims)),  # no grid points
                             ((2, 0) + sp, (2,) + sp[:-1] + (4, dims))]:  # no channels
        x, grid = torch.randn(x_shape), torch.rand(g_shape) * 2 - 1
        y = rudnn.grid_sample(x, grid, **kw)
        ref = F.grid_sample(x, grid, **kw)
        assert y.shape == ref.shape
        dx, dgrid = rudnn.grid_sample_backward(torch.randn(ref.shape), x, grid, **kw)
        assert dx.shape == x.shape and dgrid.shape == grid.shape
        assert not dx.any() and not dgrid.any()


def test_strided_inputs():
    x = rand((2, 6, 9, 14), torch.float32)[:, ::2, 1:, ::2]
    grid = _grid((2, 5, 8, 4), torch.float32)[..., 1:3]  # a strided last axis
    assert not x.is_contiguous() and not grid.is_contiguous()
    for mode in MODES:
        _check(x, grid, mode=mode, padding_mode="border", align_corners=False)


def test_output_mask():
    x, grid = rand((2, 3, 5, 7), torch.float32), _grid((2, 4, 6, 2), torch.float32)
    dy = rand((2, 3, 4, 6), torch.float32, seed=1)
    kw = dict(mode="bicubic", padding_mode="reflection", align_corners=True)
    dx, dgrid = rudnn.grid_sample_backward(dy, x, grid, **kw)
    only_dx = rudnn.grid_sample_backward(dy, x, grid, **kw, output_mask=(True, False))
    only_dgrid = rudnn.grid_sample_backward(dy, x, grid, **kw, output_mask=(False, True))
    assert only_dx[1] is None and only_dgrid[0] is None
    assert torch.equal(only_dx[0], dx) and torch.equal(only_dgrid[1], dgrid)
    assert rudnn.grid_sample_backward(dy, x, grid, **kw, output_mask=(False, False)) == (None, None)


def test_nearest_gradient_of_grid_is_zero():
    x, grid = rand((1, 2, 5, 7), torch.float32), _grid((1, 4, 6, 2), torch.float32)
    _, dgrid = rudnn.grid_sample_backward(torch.ones(1, 2, 4, 6), x, grid, mode="nearest")
    assert not dgrid.any()


def test_defaults_and_out():
    x, grid = rand((2, 3, 5, 7), torch.float32), _grid((2, 4, 6, 2), torch.float32)
    ref = F.grid_sample(x, grid, align_corners=False)
    torch.testing.assert_close(rudnn.grid_sample(x, grid), ref, rtol=1e-6, atol=1e-6)
    out = torch.full_like(ref, 7.0)
    assert rudnn.grid_sample(x, grid, out=out) is out
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_numpy_input(mode):
    x, grid = rand((2, 3, 5, 7), torch.float32), _grid((2, 4, 6, 2), torch.float32)
    kw = dict(mode=mode, padding_mode="border", align_corners=False)
    ref = F.grid_sample(x, grid, **kw)
    y = rudnn.grid_sample(x.numpy(), grid.numpy(), **kw)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-5)
    dy = rand(ref.shape, torch.float32, seed=1)
    dx, dgrid = rudnn.grid_sample_backward(dy.numpy(), x.numpy(), grid.numpy(), **kw)
    tdx, tdgrid = _torch_grads(x, grid, dy, torch.float32, **kw)
    assert isinstance(dx, np.ndarray) and isinstance(dgrid, np.ndarray)
    np.testing.assert_allclose(dx, tdx.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dgrid, tdgrid.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_huge_grid_values(device, mode, align_corners):
    # Coordinates far past any integer range: reflection folds them with fmod, border clips them,
    # zeros reads nothing; bitwise what torch's shared (CUDA and 5-D CPU) code gives. A 4-D x is
    # compared with torch's 5-D kernel on a depth-1 view (z = 0 maps to its one plane with weight
    # 1): torch's vectorized 4-D CPU kernel reflects by truncated division instead, which loses
    # the fold at these magnitudes.
    x = rand((1, 3, 5, 6), torch.float32)
    big = torch.tensor([1e30, -1e30, 3e9, -7.3e6, 2.5e4, float("inf"), -float("inf")])
    gx, gy = torch.meshgrid(torch.cat([big, torch.tensor([0.3, -0.8])]), torch.tensor([0.2, 4e12, -1e20]),
                            indexing="xy")
    grid = torch.stack([gx, gy], -1)[None]
    for pad in PADDINGS:
        if pad == "reflection":
            grid = grid.clamp(-1e30, 1e30)  # inf (and what unnormalizes to it) cannot be folded: fmod(inf) is NaN
        kw = dict(mode=mode, padding_mode=pad, align_corners=align_corners)
        y = rudnn.grid_sample(x.to(device), grid.to(device), **kw).cpu()
        grid3 = torch.cat([grid, torch.zeros(grid.shape[:-1] + (1,))], -1)[:, None]
        ref = F.grid_sample(x[:, :, None], grid3, **kw)[:, :, 0]
        assert torch.equal(y, ref), pad
        x5 = rand((1, 2, 3, 5, 6), torch.float32)
        y5 = rudnn.grid_sample(x5.to(device), grid3.expand(1, 2, *grid3.shape[2:]).contiguous().to(device), **kw)
        assert torch.equal(y5.cpu(), F.grid_sample(x5, grid3.expand(1, 2, *grid3.shape[2:]), **kw)), pad


def test_nan_grid_values_read_nothing():
    # Documented: under bilinear and nearest a NaN coordinate samples nothing (0) whatever the
    # padding (torch's CPU and CUDA kernels disagree there); bicubic's weights are NaN, and so is
    # its value (as in torch). The other points are unaffected.
    x = rand((1, 2, 5, 6), torch.float32)
    grid = torch.tensor([[[[float("nan"), 0.3], [0.2, -0.4]]]])
    for mode in MODES:
        for pad in PADDINGS:
            y = rudnn.grid_sample(x, grid, mode=mode, padding_mode=pad)
            if mode == "bicubic":
                assert torch.isnan(y[..., 0]).all()
            else:
                assert torch.equal(y[..., 0], torch.zeros(1, 2, 1)), (mode, pad)
            ref = F.grid_sample(x, grid[:, :, 1:], mode=mode, padding_mode=pad, align_corners=False)
            torch.testing.assert_close(y[..., 1:], ref, rtol=1e-6, atol=1e-6)
            dx, dgrid = rudnn.grid_sample_backward(torch.ones_like(y), x, grid, mode=mode, padding_mode=pad)
            assert torch.isfinite(dgrid[:, :, 1]).all()
            if mode != "bicubic":
                assert torch.isfinite(dx).all()
