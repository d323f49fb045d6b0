"""rudnn.torch pooling: custom ops with fake implementations, autograd against torch's,
opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import rudnn.torch as rt
from util import DEVICES, assert_close_to_oracle, rand


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _grads(fn, x, dy, dtype):
    xs = _leaf(x.cpu().to(dtype))
    fn(xs).backward(dy.cpu().to(dtype))
    return xs.grad


# (rudnn.torch call, torch.nn.functional call) pairs over the four ops, ranks and options.
CASES = [
    ("max2d", lambda t: rt.max_pool(t, 3, 2, 1, ceil_mode=True), lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True),
     (2, 3, 9, 8)),
    ("max1d-dilated", lambda t: rt.max_pool(t, 3, 1, 1, dilation=2), lambda t: F.max_pool1d(t, 3, 1, 1, dilation=2),
     (2, 3, 11)),
    ("avg3d", lambda t: rt.avg_pool(t, 2, 1, 1, count_include_pad=False),
     lambda t: F.avg_pool3d(t, 2, 1, 1, count_include_pad=False), (1, 2, 5, 4, 6)),
    ("avg2d-divisor", lambda t: rt.avg_pool(t, (3, 2), divisor_override=4),
     lambda t: F.avg_pool2d(t, (3, 2), divisor_override=4), (2, 2, 7, 6)),
    ("adaptive-avg2d", lambda t: rt.adaptive_avg_pool(t, (3, 5)), lambda t: F.adaptive_avg_pool2d(t, (3, 5)),
     (2, 3, 7, 9)),
    ("adaptive-max3d", lambda t: rt.adaptive_max_pool(t, (2, 3, 2)), lambda t: F.adaptive_max_pool3d(t, (2, 3, 2)),
     (1, 2, 5, 6, 5)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_autograd_matches_torch(device, channels_last, case):
    _, ours, theirs, shape = case
    x = rand(shape, torch.float32)
    if channels_last:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    xs = _leaf(x.to(device))
    y = ours(xs)
    y_ref = theirs(x.double())
    assert_close_to_oracle(y, theirs(x), y_ref, "y")
    dy = rand(y.shape, torch.float32, seed=1)
    y.backward(dy.to(device))
    assert_close_to_oracle(xs.grad, _grads(theirs, x, dy, torch.float32), _grads(theirs, x, dy, torch.float64), "dx")
    if channels_last and x.dim() >= 4:
        assert y.stride(1) == 1 and xs.grad.stride(1) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_indices_and_explicit_backwards(device):
    x = rand((2, 3, 8, 7), torch.float32, device)
    y, i = rt.max_pool(x, 2, return_indices=True)
    y_ref, i_ref = F.max_pool2d(x.cpu(), 2, return_indices=True)
    assert torch.equal(y.cpu(), y_ref) and torch.equal(i.cpu(), i_ref)
    dx = rt.max_pool_backward(y, x, i, kernel=2)
    torch.testing.assert_close(dx.cpu(), _grads(lambda t: F.max_pool2d(t, 2), x, y.cpu(), torch.float32))
    dx = rt.avg_pool_backward(y, x.shape, kernel=2)
    torch.testing.assert_close(dx.cpu(), _grads(lambda t: F.avg_pool2d(t, 2), x, y.cpu(), torch.float32))
    ya, ia = rt.adaptive_max_pool(x, 3, return_indices=True)
    dx = rt.adaptive_max_pool_backward(ya, x, ia)
    torch.testing.assert_close(dx.cpu(), _grads(lambda t: F.adaptive_max_pool2d(t, 3), x, ya.cpu(), torch.float32))
    dx = rt.adaptive_avg_pool_backward(ya, x.shape)
    torch.testing.assert_close(dx.cpu(), _grads(lambda t: F.adaptive_avg_pool2d(t, 3), x, ya.cpu(), torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.rudnn
    x = rand((2, 3, 7, 6), torch.float32, device).requires_grad_()
    cl = rand((2, 3, 7, 6), torch.float32, device).contiguous(memory_format=torch.channels_last).requires_grad_()
    for t in (x, cl):
        opcheck(ops.max_pool_forward.default, (t, [3, 2], [2, 1], [1, 0], [1, 2], True, 0))
        opcheck(ops.avg_pool_forward.default, (t, [3, 3], [2, 2], [1, 1], False, False, None, 0))
        opcheck(ops.adaptive_pool_forward.default, (t, [3, 4], 1, 0))
        opcheck(ops.adaptive_pool_forward.default, (t, [4, 2], 0, 0))
    xd = x.detach()
    y, i = ops.max_pool_forward(xd, [2, 2], [2, 2], [0, 0], [1, 1], False, 0)
    opcheck(ops.max_pool_backward.default, (y, xd, i, [2, 2], [2, 2], [0, 0], [1, 1], False, 0))
    opcheck(ops.avg_pool_backward.default, (y, [2, 3, 7, 6], [2, 2], [2, 2], [0, 0], False, True, None, 0))
    opcheck(ops.adaptive_pool_backward.default, (y, None, None, [2, 3, 7, 6], 0, 2, 0))
    ya, ia = ops.adaptive_pool_forward(xd, [3, 3], 1, 0)
    opcheck(ops.adaptive_pool_backward.default, (ya, xd, ia, [2, 3, 7, 6], 1, 2, 0))
    xn = rand((2, 5, 6, 3), torch.float32, device)  # NHWC
    opcheck(ops.max_pool_forward.default, (xn, [2, 2], [1, 1], [1, 1], [1, 1], False, 1))


def test_torch_compile_cpu():
    def block(x):
        y = rt.max_pool(x, 3, 2, 1)
        y = rt.avg_pool(y, 2, 1, count_include_pad=False) + rt.adaptive_avg_pool(y, (4, 3))
        return rt.adaptive_max_pool(y, 2)

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
    assert rt.max_pool(x, 2, out=out) is out
    torch.testing.assert_close(out, F.max_pool2d(x, 2))
