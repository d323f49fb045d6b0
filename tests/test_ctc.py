"""rudnn.ctc_loss and rudnn.ctc_loss_backward against torch.nn.functional.ctc_loss and its
autograd, computed in float64 on the log_probs rounded to the dtype under test (torch's CPU
kernel takes float32 and float64 only)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from util import DEVICES, DTYPES, assert_close_to_oracle

REDUCTIONS = ["none", "sum", "mean"]
TOL = 2e-5  # float32 results (rtol) where no torch comparison is made


def _log_probs(T, N, C, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, N, C, generator=g, dtype=torch.float64) * 2).log_softmax(-1).to(dtype)


def _labels(N, S, C, blank, seed=1):
    """Random labels in [0, C) other than blank, (N, S) int64."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, C - 1, (N, S), generator=g)
    return t + (t >= blank).long()  # skip the blank


def _torch(log_probs, targets, il, tl, dloss, dt, **kw):
    """torch's loss and gradient (given dloss) computed in dt on log_probs' values."""
    x = log_probs.detach().cpu().to(dt).requires_grad_()
    loss = F.ctc_loss(x, targets, il, tl, **kw)
    if dloss is None:
        return loss.detach(), None
    loss.backward(dloss.to(dt))
    return loss.detach(), x.grad


def _oracle(log_probs, targets, il, tl, dloss=None, **kw):
    return _torch(log_probs, targets, il, tl, dloss, torch.float64, **kw)


def _check(ours, torch32, oracle, dtype, what):
    """Non-finite values (inf losses, NaN gradients) where torch has them; elsewhere the error
    budget of tests/util.py against torch computing in float32 (its CPU kernel's lowest precision)
    rounded to dtype."""
    assert ours.dtype == dtype and ours.shape == oracle.shape, what
    ours = ours.detach().cpu()
    finite = torch.isfinite(oracle)
    assert torch.equal(torch.isnan(ours), torch.isnan(oracle)), f"{what}: NaN where torch's differ"
    assert torch.equal(ours[torch.isinf(oracle)].double(), oracle[torch.isinf(oracle)]), f"{what}: inf differs"
    assert_close_to_oracle(ours[finite], torch32.to(dtype)[finite], oracle[finite], what, dtype=dtype)


def _run(device, dtype, log_probs, targets, il, tl, reduction, seed=2, **kw):
    """Loss and gradient by rudnn on `device` against the oracle."""
    kw = dict(reduction=reduction, **kw)
    loss = rudnn.ctc_loss(log_probs.to(device), targets, il, tl, **kw)
    g = torch.Generator().manual_seed(seed)
    dloss = torch.randn(loss.shape, generator=g, dtype=torch.float64).to(dtype)
    ref_loss, ref_grad = _oracle(log_probs, targets, il, tl, dloss, **kw)
    loss32, grad32 = _torch(log_probs, targets, il, tl, dloss, torch.float32, **kw)
    _check(loss, loss32, ref_loss, dtype, "loss")
    grad = rudnn.ctc_loss_backward(dloss.to(device), log_probs.to(device), targets, il, tl, **kw)
    _check(grad, grad32, ref_grad, dtype, "dlog_probs")
    return loss, grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("concatenated", [False, True], ids=["padded", "concatenated"])
@pytest.mark.parametrize("blank", ["first", "middle", "last"])
def test_matches_torch(device, dtype, reduction, concatenated, blank):
    T, N, C, S = 20, 4, 7, 6
    blank = {"first": 0, "middle": C // 2, "last": C - 1}[blank]
    log_probs = _log_probs(T, N, C, dtype)
    padded = _labels(N, S, C, blank)
    il = torch.tensor([20, 17, 12, 9])
    tl = torch.tensor([6, 5, 0, 3])  # an empty target too
    targets = torch.cat([padded[n, :tl[n]] for n in range(N)]) if concatenated else padded
    _run(device, dtype, log_probs, targets, il, tl, reduction, blank=blank)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_impossible_alignments(device, zero_infinity):
    """Repeated labels need a blank between them: [1, 1, 1] needs 5 steps, [1, 2, 3] only 3. Too
    short an input gives inf (torch's gradient is then NaN), or 0 and a zero gradient."""
    log_probs = _log_probs(6, 5, 4, torch.float32)
    targets = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 2, 3], [1, 2, 3], [2, 2, 0]])
    il = torch.tensor([5, 4, 3, 2, 0])
    tl = torch.tensor([3, 3, 3, 3, 2])
    loss, grad = _run(device, torch.float32, log_probs, targets, il, tl, "none", zero_infinity=zero_infinity)
    impossible = torch.tensor([False, True, False, True, True])
    assert torch.isfinite(loss[~impossible].cpu()).all()
    if zero_infinity:
        assert (loss[impossible].cpu() == 0).all() and (grad[:, impossible].cpu() == 0).all()
    else:
        assert torch.isinf(loss[impossible].cpu()).all()
    for reduction in ("sum", "mean"):
        _run(device, torch.float32, log_probs, targets, il, tl, reduction, zero_infinity=zero_infinity)


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_labels_and_empty_targets(device):
    log_probs = _log_probs(9, 4, 5, torch.float32)
    targets = torch.tensor([[3, 3, 3, 3], [2, 2, 4, 4], [0, 0, 0, 0], [1, 2, 1, 2]])
    _run(device, torch.float32, log_probs, targets, torch.tensor([9, 8, 1, 0]), torch.tensor([4, 4, 0, 0]), "none",
         blank=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_many_classes(device, dtype):
    """No 256-label limit: labels above 255 and a blank at the end of 300 classes."""
    C = 300
    log_probs = _log_probs(30, 2, C, dtype)
    targets = torch.tensor([[299 - 1, 256, 257, 3, 255, 298], [0, 1, 2, 280, 290, 298]])
    _run(device, dtype, log_probs, targets, [30, 25], [6, 5], "mean", blank=C - 1)


@pytest.mark.parametrize("device", DEVICES)
def test_long_targets(device):
    """2S + 1 = 801 states per sequence."""
    S, T = 400, 900
    log_probs = _log_probs(T, 2, 8, torch.float32)
    targets = _labels(2, S, 8, 0)
    _run(device, torch.float32, log_probs, targets, [T, T - 100], [S, S - 50], "sum")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_batch_less(device, reduction):
    log_probs = _log_probs(10, 1, 5, torch.float32)[:, 0]
    targets = torch.tensor([1, 2, 2, 4])
    loss, grad = _run(device, torch.float32, log_probs, targets, torch.tensor(10), torch.tensor(4), reduction)
    assert loss.shape == () and grad.shape == (10, 5)
    _run(device, torch.float32, log_probs, targets, [9], [4], reduction)  # lengths as lists


@pytest.mark.parametrize("device", DEVICES)
def test_strided_log_probs(device):
    """(N, T, C) memory seen as (T, N, C): strided time and batch axes, no copy."""
    dense = _log_probs(12, 3, 6, torch.float32).transpose(0, 1).contiguous()  # (N, T, C)
    log_probs = dense.transpose(0, 1)
    assert not log_probs.is_contiguous()
    _run(device, torch.float32, log_probs, _labels(3, 4, 6, 0), [12, 11, 10], [4, 4, 2], "mean")


def test_numpy_and_sequences():
    log_probs = _log_probs(8, 2, 5, torch.float32)
    targets = torch.tensor([[1, 2, 3], [4, 4, 1]])
    ref, _ = _oracle(log_probs, targets, [8, 7], [3, 2], reduction="none")
    loss = rudnn.ctc_loss(log_probs.numpy(), targets.numpy().astype(np.int32), np.array([8, 7], np.int16), (3, 2),
                          reduction="none")
    assert isinstance(loss, np.ndarray) and loss.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(loss).double(), ref, rtol=TOL, atol=0)


def test_expanded_dloss():
    """The gradient of loss.sum() arrives as an expanded (stride 0) dloss."""
    log_probs = _log_probs(8, 3, 5, torch.float32)
    targets, il, tl = _labels(3, 3, 5, 0), [8, 8, 6], [3, 2, 3]
    dloss = torch.ones(()).expand(3)
    grad = rudnn.ctc_loss_backward(dloss, log_probs, targets, il, tl, reduction="none")
    _, ref = _oracle(log_probs, targets, il, tl, torch.ones(3), reduction="none")
    torch.testing.assert_close(grad.double(), ref, rtol=TOL, atol=TOL)


def test_deterministic():
    log_probs = _log_probs(16, 3, 6, torch.float32)
    args = (log_probs, _labels(3, 5, 6, 0), [16, 12, 9], [5, 3, 4])
    first = rudnn.ctc_loss(*args), rudnn.ctc_loss_backward(torch.tensor(1.0), *args)
    second = rudnn.ctc_loss(*args), rudnn.ctc_loss_backward(torch.tensor(1.0), *args)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("device", DEVICES)
def test_targets_beyond_shared_memory(device):
    """2S + 1 = 4201 states: the CUDA kernels keep the labels and rows in the workspace."""
    S, T = 2100, 2300
    log_probs = _log_probs(T, 1, 5, torch.float32)
    _run(device, torch.float32, log_probs, _labels(1, S, 5, 0), [T], [S], "none")
