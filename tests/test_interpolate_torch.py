"""rudnn.torch.interpolate: a custom op with a fake implementation, autograd against torch's,
opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import rudnn.torch as rt
from util import DEVICES, assert_close_to_oracle, rand

CASES = [
    ((2, 3, 9), dict(scale_factor=1.6, mode="linear", align_corners=True)),
    ((2, 3, 7, 8), dict(size=(5, 11), mode="bicubic")),
    ((1, 2, 9, 10), dict(size=(4, 3), mode="bilinear", antialias=True)),
    ((1, 2, 4, 5, 6), dict(scale_factor=(1.5, 0.5, 2.0), mode="nearest-exact")),
    ((2, 2, 7, 9), dict(size=(3, 4), mode="area")),
]
IDS = [f"{len(s) - 2}d-{kw['mode']}" for s, kw in CASES]


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _grads(fn, x, dy, dtype):
    xs = _leaf(x.cpu().to(dtype))
    fn(xs).backward(dy.cpu().to(dtype))
    return xs.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_autograd_matches_torch(device, channels_last, case):
    shape, kw = case

    def theirs(t):
        return F.interpolate(t, **kw)

    x = rand(shape, torch.float32)
    if channels_last:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    xs = _leaf(x.to(device))
    y = rt.interpolate(xs, **kw)
    assert_close_to_oracle(y, theirs(x), theirs(x.double()), "y")
    dy = rand(y.shape, torch.float32, seed=1)
    y.backward(dy.to(device))
    assert_close_to_oracle(xs.grad, _grads(theirs, x, dy, torch.float32), _grads(theirs, x, dy, torch.float64), "dx")
    if channels_last and x.dim() >= 4:
        assert y.stride(1) == 1 and xs.grad.stride(1) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.rudnn
    x = rand((2, 3, 7, 6), torch.float32, device).requires_grad_()
    cl = rand((2, 3, 7, 6), torch.float32, device).contiguous(memory_format=torch.channels_last).requires_grad_()
    for t in (x, cl):
        opcheck(ops.interpolate_forward.default, (t, 3, 0, [5, 9], [], 1, -1, False))  # bilinear, align_corners
        opcheck(ops.interpolate_forward.default, (t, 5, 0, [], [0.6, 1.7], -1, 1, True))  # bicubic aa, recompute
        opcheck(ops.interpolate_forward.default, (t, 1, 0, [], [1.3, 1.3], -1, -1, False))  # nearest-exact
    dy = rand((2, 3, 4, 4), torch.float32, device)
    opcheck(ops.interpolate_backward.default, (dy, [2, 3, 7, 6], 6, 0, [4, 4], [], -1, -1, False))  # area
    opcheck(ops.interpolate_backward.default, (dy, [2, 3, 7, 6], 3, 0, [4, 4], [], 0, -1, True))


def test_explicit_backward():
    x = rand((2, 3, 8, 7), torch.float32)
    kw = dict(scale_factor=0.7, mode="bicubic", align_corners=True)
    dy = rand(F.interpolate(x, **kw).shape, torch.float32, seed=1)
    dx = rt.interpolate_backward(dy, x.shape, **kw)
    torch.testing.assert_close(dx, _grads(lambda t: F.interpolate(t, **kw), x, dy, torch.float32))


def test_torch_compile_cpu():
    def block(x):
        y = rt.interpolate(x, scale_factor=1.5, mode="bilinear")
        return rt.interpolate(y, size=(4, 5), mode="area") + rt.interpolate(y, size=(4, 5), mode="nearest")

    compiled = torch.compile(block, fullgraph=True)
    x = rand((2, 3, 9, 8), torch.float32)
    torch.testing.assert_close(compiled(x), block(x))
    xs, xe = _leaf(x), _leaf(x)
    compiled(xs).sum().backward()
    block(xe).sum().backward()
    torch.testing.assert_close(xs.grad, xe.grad)


def test_out_runs_eagerly():
    x = rand((1, 2, 6, 6), torch.float32)
    out = torch.empty(1, 2, 3, 3)
    assert rt.interpolate(x, size=3, mode="bilinear", out=out) is out
    torch.testing.assert_close(out, F.interpolate(x, size=3, mode="bilinear"))
