"""Every documented error of the CTC family: type and message, and nothing written."""

import numpy as np
import pytest
import torch

import rudnn
from util import DEVICES


def _lp(shape=(6, 2, 5), dtype=torch.float32, device="cpu"):
    return torch.randn(shape).log_softmax(-1).to(dtype).to(device)


def _tg(rows=((1, 2, 3), (4, 4, 0)), dtype=torch.int64):
    return torch.tensor(rows, dtype=dtype)


IL, TL = [6, 5], [3, 2]


def _both(d, log_probs=None, targets=None, il=None, tl=None, **kw):
    """The forward's and the backward's call on these arguments (the defaults where None)."""
    lp = _lp(device=d) if log_probs is None else log_probs(d)
    args = (lp, _tg() if targets is None else targets, IL if il is None else il, TL if tl is None else tl)
    reduction = kw.get("reduction", "mean")
    dloss = torch.ones((lp.shape[1],) if reduction == "none" and lp.dim() == 3 else (), device=lp.device)
    return [lambda: rudnn.ctc_loss(*args, **kw), lambda: rudnn.ctc_loss_backward(dloss, *args, **kw)]


CASES = [
    # log_probs
    (dict(log_probs=lambda d: _lp(device=d).to(torch.int32)), rudnn.DTypeError,
     "log_probs: expected float32, float16 or bfloat16, got int32"),
    (dict(log_probs=lambda d: _lp((6, 2, 5, 1), device=d)), rudnn.ShapeError,
     "log_probs: expected 3 axes [T, N, C] (or 2, [T, C], without a batch), got shape [6, 2, 5, 1]"),
    (dict(log_probs=lambda d: _lp((6, 2, 5), device=d)[..., ::2]), rudnn.ShapeError,
     "log_probs: the last axis must be contiguous (stride 1), got stride 2"),
    (dict(log_probs=lambda d: _lp((0, 2, 5), device=d), il=[0, 0], tl=[0, 0]), rudnn.ShapeError,
     "log_probs: expected T, N and C >= 1, got shape [0, 2, 5]"),
    # options
    (dict(blank=5), rudnn.ArgumentError, "blank: expected a class in [0, 5) (C from log_probs), got 5"),
    (dict(blank=-1), rudnn.ArgumentError, "blank: expected a class in [0, 5) (C from log_probs), got -1"),
    (dict(blank=1.0), rudnn.ArgumentError, "blank: expected an int, got 1.0"),
    (dict(reduction="avg"), rudnn.ArgumentError, "reduction: expected 'none', 'mean' or 'sum', got 'avg'"),
    (dict(zero_infinity=1), rudnn.ArgumentError, "zero_infinity: expected True or False, got 1"),
    # targets
    (dict(targets=_tg().float()), rudnn.DTypeError,
     "targets: expected int32 or int64 (or another integer dtype), got float32"),
    (dict(targets=_tg()[None]), rudnn.ShapeError,
     "targets: expected 2 axes [N, S] (padded) or 1 [sum(target_lengths)] (concatenated), got shape [1, 2, 3]"),
    (dict(targets=_tg(((1, 2, 3),))), rudnn.ShapeError,
     "targets: expected 2 rows (N from log_probs) in padded targets [N, S], got shape [1, 3]"),
    (dict(targets=_tg(((1, 2, 5), (4, 4, 0)))), rudnn.ArgumentError,
     "targets: expected labels in [0, 5) other than blank (0), got 5 at position 2 of sequence 0"),
    (dict(targets=_tg(((1, 2, 3), (4, 0, 0)))), rudnn.ArgumentError,
     "targets: expected labels in [0, 5) other than blank (0), got 0 at position 1 of sequence 1"),
    (dict(targets=_tg(((1, -2, 3), (4, 1, 0)), dtype=torch.int32)), rudnn.ArgumentError,
     "targets: expected labels in [0, 5) other than blank (0), got -2 at position 1 of sequence 0"),
    (dict(targets=_tg(((1, 2, 3), (4, 4, 0))), blank=4), rudnn.ArgumentError,
     "targets: expected labels in [0, 5) other than blank (4), got 4 at position 0 of sequence 1"),
    (dict(targets=torch.tensor([1, 2, 3, 4])), rudnn.ArgumentError,
     "target_lengths: expected their sum (5) to be the length of the concatenated targets, got 4 labels"),
    # lengths
    (dict(il=[6, 7]), rudnn.ArgumentError,
     "input_lengths: expected values in [0, 6] (T from log_probs), got 7 for sequence 1"),
    (dict(il=torch.tensor([-1, 5])), rudnn.ArgumentError,
     "input_lengths: expected values in [0, 6] (T from log_probs), got -1 for sequence 0"),
    (dict(tl=[3, -2]), rudnn.ArgumentError, "target_lengths: expected values >= 0, got -2 for sequence 1"),
    (dict(tl=[4, 2]), rudnn.ArgumentError,
     "target_lengths: 4 for sequence 0 is longer than the padded targets (S = 3)"),
    (dict(il=[6, 5, 4]), rudnn.ShapeError,
     "input_lengths: expected shape [2] (one per sequence, N from log_probs), got [3]"),
    (dict(tl=torch.tensor([[3, 2]])), rudnn.ShapeError,
     "target_lengths: expected shape [2] (one per sequence, N from log_probs), got [1, 2]"),
    (dict(il=[6.0, 5.0]), rudnn.DTypeError,
     "input_lengths: expected an int array or a sequence of ints, got [6.0, 5.0]"),
    (dict(tl=np.array([3.0, 2.0])), rudnn.DTypeError,
     "target_lengths: expected int32 or int64 (or another integer dtype), got float64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("case, exc, message", CASES)
def test_errors(device, backward, case, exc, message):
    call = _both(device, **case)[int(backward)]
    op = "ctc_loss_backward" if backward else "ctc_loss"
    with pytest.raises(exc) as info:
        call()
    assert str(info.value).startswith(f"{op}: {message}"), str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_dloss(device):
    lp = _lp(device=device)
    with pytest.raises(rudnn.ShapeError, match=r"ctc_loss_backward: dloss: expected shape \[2\] \(reduction none: "
                                               r"one per sequence\), got \[\]"):
        rudnn.ctc_loss_backward(torch.ones((), device=device), lp, _tg(), IL, TL, reduction="none")
    with pytest.raises(rudnn.ShapeError, match=r"ctc_loss_backward: dloss: expected shape \[\] \(a scalar for "
                                               r"reduction mean or sum\), got \[2\]"):
        rudnn.ctc_loss_backward(torch.ones(2, device=device), lp, _tg(), IL, TL, reduction="sum")
    with pytest.raises(rudnn.DTypeError, match="ctc_loss_backward: dloss: expected float32, float16 or bfloat16, "
                                               "got int32"):
        rudnn.ctc_loss_backward(torch.ones((), dtype=torch.int32, device=device), lp, _tg(), IL, TL)


def test_mixed_frameworks():
    with pytest.raises(rudnn.FrameworkError, match="ctc_loss_backward: dloss: expected a torch.Tensor like "
                                                   "log_probs"):
        rudnn.ctc_loss_backward(np.ones((), np.float32), _lp(), _tg(), IL, TL)


def test_size_overflow():
    """Sizes are computed with overflow checks: huge lengths need no huge arrays (concatenated
    targets fail the sum first; padded targets can be a stride-0 NumPy view)."""
    with pytest.raises(rudnn.ArgumentError, match=r"ctc_loss: 2 \* max\(target_lengths\) \+ 1 overflows int64"):
        rudnn.ctc_loss(_lp((6, 1, 5)), torch.tensor([1]), [6], [2**62])
    with pytest.raises(rudnn.ArgumentError, match=r"ctc_loss: sum\(target_lengths\) overflows int64"):
        rudnn.ctc_loss(_lp((6, 2, 5)), torch.tensor([1]), [6, 6], [2**62, 2**62])
    huge = np.broadcast_to(np.int32(1), (1, 2**59))
    for call in (rudnn.ctc_loss, lambda *a: rudnn.ctc_loss_backward(torch.ones(()), *a)):
        with pytest.raises(rudnn.ArgumentError, match="the workspace size overflows int64"):
            call(_lp((6, 1, 5)), huge, [6], [2**59])


def test_nothing_written_on_error():
    lp = _lp()
    before = lp.clone()
    with pytest.raises(rudnn.ArgumentError):
        rudnn.ctc_loss_backward(torch.ones(()), lp, _tg(((1, 2, 9), (1, 1, 1))), IL, TL)
    assert torch.equal(lp, before)


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_workspace(device, monkeypatch):
    """A C++ caller's workspace must hold the 8-byte sequence records at an aligned address; the
    Python layer allocates it aligned, so a misaligned one is made here by offsetting the
    allocation one byte."""
    from rudnn import _frameworks

    def misaligned(self, nbytes):
        return self.arg(self.empty((nbytes + 1,), "uint8")[1:])

    monkeypatch.setattr(_frameworks.Call, "workspace_alloc", misaligned)
    for op, call in zip(("ctc_loss", "ctc_loss_backward"), _both(device)):
        with pytest.raises(rudnn.ArgumentError, match=f"^{op}: workspace: expected an address aligned to 8 bytes "
                                                      r"\(it holds 8-byte sequence records\)$"):
            call()
