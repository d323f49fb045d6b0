"""rudnn.torch: custom ops with fake implementations, autograd, opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import rudnn
import rudnn.torch as rt
from util import DEVICES, DTYPES, assert_close_to_oracle, rand


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_autograd_with_residual(device, dtype):
    x, r = rand((6, 72), dtype, device), rand((6, 72), dtype, device, seed=2)
    w = rand((72,), torch.float32, device, seed=3, offset=1.0)
    b = rand((72,), torch.float32, device, seed=4)
    gy, gh = rand((6, 72), dtype, device, seed=5), rand((6, 72), dtype, device, seed=6)

    xs, rs, ws, bs = _leaves(x, r, w, b)
    y, h = rt.layer_norm(xs, ws, bs, residual=rs)
    torch.autograd.backward([y, h], [gy, gh])

    def oracle(dt):
        xo, ro, wo, bo = _leaves(*(t.cpu().to(dt) for t in (x, r, w, b)))
        ho = (xo + ro) if dt == torch.float64 else (xo + ro)
        yo = F.layer_norm(ho, (72,), wo, bo, 1e-5)
        torch.autograd.backward([yo, ho], [gy.cpu().to(dt), gh.cpu().to(dt)])
        return xo.grad, ro.grad, wo.grad, bo.grad

    g64, gsame = oracle(torch.float64), oracle(dtype)
    for ours, same, exact, name in zip((xs.grad, rs.grad, ws.grad, bs.grad), gsame, g64, "xrwb"):
        assert ours.dtype == (dtype if name in "xr" else torch.float32)
        assert_close_to_oracle(ours, same, exact, f"grad {name}", dtype=dtype)
    assert torch.equal(xs.grad, rs.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_and_softmax_autograd(device):
    x = rand((5, 40), torch.float32, device)
    w = rand((40,), torch.float32, device, seed=1, offset=1.0)
    g = rand((5, 40), torch.float32, device, seed=2)
    xs, ws = _leaves(x, w)
    (rt.rms_norm(xs, ws) * g).sum().backward()
    xo, wo = _leaves(x.cpu().double(), w.cpu().double())
    (F.rms_norm(xo, (40,), wo, 1e-6) * g.cpu().double()).sum().backward()
    torch.testing.assert_close(xs.grad.cpu().double(), xo.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ws.grad.cpu().double(), wo.grad, rtol=1e-5, atol=1e-5)

    xs, = _leaves(x)
    (rt.softmax(xs) * g).sum().backward()
    xo, = _leaves(x.cpu().double())
    (torch.softmax(xo, -1) * g.cpu().double()).sum().backward()
    torch.testing.assert_close(xs.grad.cpu().double(), xo.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_grad_keeps_param_dtype(device):
    x = rand((3, 16), torch.bfloat16, device)
    w = torch.ones(16, dtype=torch.bfloat16, device=device, requires_grad=True)
    rt.rms_norm(x, w).float().sum().backward()
    assert w.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = rand((3, 24), torch.float32, device).requires_grad_()
    w = rand((24,), torch.float32, device, seed=1).requires_grad_()
    b = rand((24,), torch.float32, device, seed=2).requires_grad_()
    r = rand((3, 24), torch.float32, device, seed=3).requires_grad_()
    ops = torch.ops.rudnn
    opcheck(ops.norm_forward.default, (x, w, b, r, 1e-5, 0))
    opcheck(ops.norm_forward.default, (x, w, None, None, 1e-6, 1))
    opcheck(ops.norm_forward.default, (x, None, None, None, 1e-6, 0))
    opcheck(ops.softmax_forward.default, (x,))
    _, mean, rstd = rudnn.layer_norm(x.detach(), return_stats=True)
    opcheck(ops.norm_backward.default, (x.detach(), x.detach(), w.detach(), mean, rstd, 0))
    opcheck(ops.softmax_backward.default, (x.detach(), torch.softmax(x.detach(), -1)))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 8, dtype=torch.bfloat16)
        y, h, mean, rstd = torch.ops.rudnn.norm_forward(x, torch.empty(8), None, torch.empty_like(x), 1e-5, 0)
        assert y.shape == h.shape == (2, 3, 8) and mean.shape == rstd.shape == (2, 3)
        assert y.dtype == torch.bfloat16 and rstd.dtype == torch.float32


def test_torch_compile_cpu():
    def block(x, w, r):
        y, h = rt.rms_norm(x, w, residual=r)
        return rt.softmax(y * 2.0) + h

    compiled = torch.compile(block, fullgraph=True)
    x, r = rand((4, 32), torch.float32), rand((4, 32), torch.float32, seed=1)
    w = rand((32,), torch.float32, seed=2, offset=1.0)
    torch.testing.assert_close(compiled(x, w, r), block(x, w, r))
    xs, = _leaves(x)
    compiled(xs, w, r).sum().backward()
    xe, = _leaves(x)
    block(xe, w, r).sum().backward()
    torch.testing.assert_close(xs.grad, xe.grad)


def test_out_runs_eagerly():
    x = rand((2, 8), torch.float32)
    out = torch.empty(2, 8)
    assert rt.layer_norm(x, out=out) is out
    torch.testing.assert_close(out, F.layer_norm(x, (8,)), rtol=1e-5, atol=1e-6)
