"""rudnn.torch.conv: a custom op with a fake implementation, autograd for x, w and bias against
torch's, opcheck, torch.compile on the CPU."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import rudnn
import rudnn.torch as rt
from util import DEVICES, assert_close_to_oracle, rand


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _cl(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


# (name, x shape, w shape, bias, options)
CASES = [
    ("2d", (2, 4, 9, 8), (6, 4, 3, 3), True, dict(stride=2, padding=1)),
    ("2d-depthwise-same", (2, 4, 7, 7), (8, 1, 3, 3), True, dict(padding="same", groups=4)),
    ("1d-dilated", (2, 3, 11), (4, 3, 3), False, dict(padding=2, dilation=2)),
    ("3d-groups", (1, 4, 5, 6, 5), (4, 2, 3, 2, 3), True, dict(stride=(1, 2, 1), padding=(1, 0, 1), groups=2)),
]


def _torch_grads(x, w, b, dy, kw, dtype):
    xs, ws = _leaf(x.to(dtype)), _leaf(w.to(dtype))
    bs = _leaf(b.to(dtype)) if b is not None else None
    getattr(F, f"conv{x.dim() - 2}d")(xs, ws, bs, **kw).backward(dy.to(dtype))
    return xs.grad, ws.grad, (bs.grad if bs is not None else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_autograd_matches_torch(device, channels_last, case):
    _, xs, ws, has_bias, kw = case
    x, w = rand(xs, torch.float32), rand(ws, torch.float32, seed=1, scale=0.5)
    b = rand((ws[0],), torch.float32, seed=2) if has_bias else None
    if channels_last:
        x, w = _cl(x), _cl(w)
    xl, wl = _leaf(x.to(device)), _leaf(w.to(device))
    bl = _leaf(b.to(device)) if b is not None else None
    y = rt.conv(xl, wl, bl, **kw)
    f = getattr(F, f"conv{x.dim() - 2}d")
    assert_close_to_oracle(y, f(x, w, b, **kw), f(x.double(), w.double(), b.double() if b is not None else None, **kw),
                           "y")
    if channels_last and x.dim() >= 4:
        assert y.stride(1) == 1
    dy = rand(y.shape, torch.float32, seed=3)
    y.backward(dy.to(device))
    same = _torch_grads(x, w, b, dy, kw, torch.float32)
    oracle = _torch_grads(x, w, b, dy, kw, torch.float64)
    assert_close_to_oracle(xl.grad, same[0], oracle[0], "dx")
    assert_close_to_oracle(wl.grad, same[1], oracle[1], "dw")
    if b is not None:
        assert_close_to_oracle(bl.grad, same[2], oracle[2], "db")


def test_only_the_needed_gradients():
    x, w = rand((1, 2, 6, 6), torch.float32), _leaf(rand((3, 2, 3, 3), torch.float32, seed=1))
    rt.conv(x, w, padding=1).sum().backward()  # x needs no gradient: only dw is computed
    expected = _torch_grads(x, w.detach(), None, torch.ones(1, 3, 6, 6), dict(padding=1), torch.float32)[1]
    torch.testing.assert_close(w.grad, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.rudnn
    x = rand((2, 4, 7, 6), torch.float32, device).requires_grad_()
    w = rand((6, 2, 3, 2), torch.float32, device, seed=1).requires_grad_()
    b = rand((6,), torch.float32, device, seed=2).requires_grad_()
    opts = ([2, 1], [1, 0], [1, 1], [1, 2], 2, 0, 0)
    for t in (x, _cl(x.detach()).requires_grad_()):
        opcheck(ops.conv_forward.default, (t, w, b) + opts)
        opcheck(ops.conv_forward.default, (t, w, None) + opts)
    y = ops.conv_forward(x.detach(), w.detach(), None, *opts)
    opcheck(ops.conv_data_backward.default, (y, w.detach(), [2, 4, 7, 6]) + opts)
    opcheck(ops.conv_weight_backward.default, (y, x.detach(), [6, 2, 3, 2]) + opts)
    opcheck(ops.conv_bias_backward.default, (y, 0))
    xn, wn = x.detach().movedim(1, -1).contiguous(), w.detach().movedim(1, -1).contiguous()  # NHWC
    opcheck(ops.conv_forward.default, (xn, wn, b.detach(), [1, 1], [1, 1], [1, 1], [1, 1], 2, 1, 1))


def test_torch_compile_cpu():
    w1, b1 = _leaf(rand((8, 3, 3, 3), torch.float32, seed=1, scale=0.3)), _leaf(rand((8,), torch.float32, seed=2))
    w2 = _leaf(rand((8, 1, 3, 3), torch.float32, seed=3, scale=0.3))

    def block(x):
        y = torch.relu(rt.conv(x, w1, b1, stride=2, padding=1))
        return rt.conv(y, w2, None, padding="same", groups=8)

    compiled = torch.compile(block, fullgraph=True)
    x = rand((2, 3, 11, 10), torch.float32)
    torch.testing.assert_close(compiled(x), block(x))
    compiled(x).square().sum().backward()
    grads = [t.grad.clone() for t in (w1, b1, w2)]
    for t in (w1, b1, w2):
        t.grad = None
    block(x).square().sum().backward()
    for g, t in zip(grads, (w1, b1, w2)):
        torch.testing.assert_close(g, t.grad)


def test_explicit_backwards_and_out():
    x, w = rand((1, 3, 6, 7), torch.float32), rand((4, 3, 3, 3), torch.float32, seed=1)
    y = rt.conv(x, w, padding=1)
    assert torch.equal(rt.conv_data_backward(y, w, x.shape, padding=1), rudnn.conv_data_backward(y, w, x.shape,
                                                                                                   padding=1))
    assert torch.equal(rt.conv_weight_backward(y, x, w.shape, padding=1),
                       rudnn.conv_weight_backward(y, x, w.shape, padding=1))
    assert torch.equal(rt.conv_bias_backward(y), rudnn.conv_bias_backward(y))
    out = torch.empty_like(y)
    assert rt.conv(x, w, padding=1, out=out) is out and torch.equal(out, y)
