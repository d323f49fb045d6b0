"""rudnn.torch.ctc_loss: a custom op with a fake implementation, autograd against torch's,
opcheck, torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import rudnn.torch as rt
from util import DEVICES

TOL = 2e-5


def _log_probs(T, N, C, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, N, C, generator=g, dtype=torch.float64) * 2).log_softmax(-1).float().to(device)


TARGETS = torch.tensor([[1, 2, 2, 3], [4, 1, 1, 0], [3, 3, 3, 3]])
IL, TL = torch.tensor([14, 11, 9]), torch.tensor([4, 3, 4])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_autograd_matches_torch(device, reduction, zero_infinity):
    lp = _log_probs(14, 3, 5)
    il = torch.tensor([14, 11, 6])  # the last is impossible: [3, 3, 3, 3] needs 7 steps
    ours_in = lp.clone().to(device).requires_grad_()
    ref_in = lp.detach().double().requires_grad_()
    kw = dict(reduction=reduction, zero_infinity=zero_infinity)
    loss = rt.ctc_loss(ours_in, TARGETS, il, TL, **kw)
    ref = F.ctc_loss(ref_in, TARGETS, il, TL, **kw)
    torch.testing.assert_close(loss.cpu().double(), ref, rtol=TOL, atol=TOL, equal_nan=True)
    dloss = torch.rand(loss.shape, dtype=torch.float64) + 0.5
    loss.backward(dloss.float().to(device))
    ref.backward(dloss)
    torch.testing.assert_close(ours_in.grad.cpu().double(), ref_in.grad, rtol=TOL, atol=TOL, equal_nan=True)


def test_lengths_as_lists_and_explicit_backward():
    lp = _log_probs(14, 3, 5)
    loss = rt.ctc_loss(lp, TARGETS, [14, 11, 9], [4, 3, 4], reduction="sum")
    torch.testing.assert_close(loss.double(), F.ctc_loss(lp.double(), TARGETS, IL, TL, reduction="sum"),
                               rtol=TOL, atol=TOL)
    x = lp.double().requires_grad_()
    F.ctc_loss(x, TARGETS, IL, TL).backward()
    grad = rt.ctc_loss_backward(torch.tensor(1.0), lp, TARGETS, [14, 11, 9], [4, 3, 4])
    torch.testing.assert_close(grad.double(), x.grad, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.rudnn
    lp = _log_probs(14, 3, 5, device).requires_grad_()
    for reduction in ("none", "mean"):
        opcheck(ops.ctc_loss_forward.default, (lp, TARGETS, IL, TL, 0, reduction, False))
    opcheck(ops.ctc_loss_forward.default, (lp[:, 0], TARGETS[0], IL[0], TL[0], 0, "none", True))
    opcheck(ops.ctc_loss_backward.default, (torch.ones(3, device=device), lp.detach(), TARGETS, IL, TL, 0, "none",
                                            False))


def test_torch_compile_cpu():
    def loss_of(log_probs):
        return rt.ctc_loss(log_probs.log_softmax(-1), TARGETS, IL, TL) * 2

    compiled = torch.compile(loss_of, fullgraph=True)
    logits = torch.randn(14, 3, 5)
    torch.testing.assert_close(compiled(logits), loss_of(logits))
    xs, xe = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    compiled(xs).backward()
    loss_of(xe).backward()
    torch.testing.assert_close(xs.grad, xe.grad)
