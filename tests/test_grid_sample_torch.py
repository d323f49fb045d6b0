"""rudnn.torch.grid_sample: a custom op with a fake implementation, autograd (x and grid) against
torch's, opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import rudnn.torch as rt
from test_grid_sample import _grid
from util import DEVICES, assert_close_to_oracle, rand

CASES = [
    ((2, 3, 5, 7), (2, 4, 6, 2), dict(mode="bilinear", padding_mode="zeros", align_corners=False)),
    ((2, 3, 5, 7), (2, 4, 6, 2), dict(mode="bicubic", padding_mode="reflection", align_corners=True)),
    ((1, 2, 6, 5), (1, 3, 3, 2), dict(mode="nearest", padding_mode="border", align_corners=False)),
    ((2, 3, 4, 5, 3), (2, 3, 2, 5, 3), dict(mode="bilinear", padding_mode="border", align_corners=True)),
]
IDS = [f"{len(s) - 2}d-{kw['mode']}-{kw['padding_mode']}" for s, _, kw in CASES]


def _leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def _grads(x, grid, dy, dtype, kw):
    xs, gs = _leaves(x.cpu().to(dtype), grid.cpu().to(dtype))
    F.grid_sample(xs, gs, **kw).backward(dy.cpu().to(dtype))
    return xs.grad, gs.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_autograd_matches_torch(device, deterministic, channels_last, case):
    x_shape, g_shape, kw = case
    x, grid = rand(x_shape, torch.float32), _grid(g_shape, torch.float32)
    if channels_last:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    xs, gs = _leaves(x.to(device), grid.to(device))
    y = rt.grid_sample(xs, gs, **kw, deterministic=deterministic)
    assert_close_to_oracle(y, F.grid_sample(x, grid, **kw), F.grid_sample(x.double(), grid.double(), **kw), "y")
    dy = rand(y.shape, torch.float32, seed=1)
    y.backward(dy.to(device))
    dx32, dg32 = _grads(x, grid, dy, torch.float32, kw)
    dx64, dg64 = _grads(x, grid, dy, torch.float64, kw)
    assert_close_to_oracle(xs.grad, dx32, dx64, "dx")
    scale = (dy.abs().max() * x.abs().max() * max(x_shape[2:])).item() * x_shape[1]
    assert_close_to_oracle(gs.grad, dg32, dg64, "dgrid", scale=scale)
    if channels_last:
        assert y.stride(1) == 1 and xs.grad.stride(1) == 1


def test_grad_of_one_input_only():
    x, grid = rand((2, 3, 5, 7), torch.float32), _grid((2, 4, 6, 2), torch.float32)
    kw = dict(mode="bilinear", padding_mode="zeros", align_corners=False)
    (xs,) = _leaves(x)
    rt.grid_sample(xs, grid, **kw).sum().backward()
    torch.testing.assert_close(xs.grad, _grads(x, grid, torch.ones(2, 3, 4, 6), torch.float32, kw)[0])
    (gs,) = _leaves(grid)
    rt.grid_sample(x, gs, **kw).sum().backward()
    torch.testing.assert_close(gs.grad, _grads(x, grid, torch.ones(2, 3, 4, 6), torch.float32, kw)[1],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.rudnn
    x = rand((2, 3, 7, 6), torch.float32, device).requires_grad_()
    cl = rand((2, 3, 7, 6), torch.float32, device).contiguous(memory_format=torch.channels_last).requires_grad_()
    grid = _grid((2, 4, 5, 2), torch.float32).to(device).requires_grad_()
    for t in (x, cl):
        opcheck(ops.grid_sample_forward.default, (t, grid, 0, 0, False, 0, False))  # bilinear, zeros
        opcheck(ops.grid_sample_forward.default, (t, grid, 2, 2, True, 0, True))  # bicubic, reflection
        opcheck(ops.grid_sample_forward.default, (t, grid, 1, 1, False, 0, False))  # nearest, border
    dy = rand((2, 3, 4, 5), torch.float32, device)
    opcheck(ops.grid_sample_backward.default, (dy, x.detach(), grid.detach(), 0, 1, False, 0, False, True, True))
    opcheck(ops.grid_sample_backward.default, (dy, x.detach(), grid.detach(), 2, 0, True, 0, True, False, True))


def test_explicit_backward():
    x, grid = rand((2, 3, 8, 7), torch.float32), _grid((2, 5, 4, 2), torch.float32)
    kw = dict(mode="bicubic", padding_mode="border", align_corners=True)
    dy = rand((2, 3, 5, 4), torch.float32, seed=1)
    dx, dgrid = rt.grid_sample_backward(dy, x, grid, **kw)
    tdx, tdgrid = _grads(x, grid, dy, torch.float32, kw)
    torch.testing.assert_close(dx, tdx)
    torch.testing.assert_close(dgrid, tdgrid, rtol=1e-5, atol=1e-5)
    only = rt.grid_sample_backward(dy, x, grid, **kw, output_mask=(False, True))
    assert only[0] is None and torch.equal(only[1], dgrid)


def test_torch_compile_cpu():
    def block(x, grid):
        y = rt.grid_sample(x, grid, mode="bilinear", padding_mode="border")
        return y * 2 + rt.grid_sample(x, grid, mode="nearest")

    compiled = torch.compile(block, fullgraph=True)
    x, grid = rand((2, 3, 9, 8), torch.float32), _grid((2, 4, 5, 2), torch.float32)
    torch.testing.assert_close(compiled(x, grid), block(x, grid))
    xs, gs = _leaves(x, grid)
    xe, ge = _leaves(x, grid)
    compiled(xs, gs).sum().backward()
    block(xe, ge).sum().backward()
    torch.testing.assert_close(xs.grad, xe.grad)
    torch.testing.assert_close(gs.grad, ge.grad)


def test_out_runs_eagerly():
    x, grid = rand((1, 2, 6, 6), torch.float32), _grid((1, 3, 3, 2), torch.float32)
    out = torch.empty(1, 2, 3, 3)
    assert rt.grid_sample(x, grid, out=out) is out
    torch.testing.assert_close(out, F.grid_sample(x, grid, align_corners=False))
