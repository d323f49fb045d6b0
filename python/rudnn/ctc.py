"""Connectionist temporal classification loss and its gradient (SPEC section 7), with
torch.nn.functional.ctc_loss's semantics.

log_probs is (T, N, C) (or (T, C) without a batch): log-probabilities of C classes, blank
included, f32/f16/bf16. targets are padded (N, S) or concatenated (sum(target_lengths),) labels
(a batch-less call takes (S,)); input_lengths and target_lengths are int arrays or sequences of
ints. The alpha/beta recursions run in log space in float32; the loss takes log_probs' dtype.

targets and the lengths are read on the host, as torch reads the lengths: arrays on a GPU are
copied to the host first (a synchronization). Every value is checked before any work: lengths
in range, labels in [0, C) and not blank. A target that no alignment of its input can emit has
an inf loss (0, with a zero gradient, under zero_infinity).
"""

from __future__ import annotations

import operator

import numpy as np

from . import _C
from . import _frameworks as fw
from ._args import flag
from .errors import ArgumentError, DTypeError

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _jax():
    from . import jax as rudnn_jax

    return rudnn_jax


def reduction_code(op, reduction):
    if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
        raise ArgumentError(f"{op}: reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
    return _REDUCTIONS[reduction]


def blank_index(op, blank):
    try:
        if isinstance(blank, (bool, np.bool_)):
            raise TypeError
        return operator.index(blank)
    except TypeError:
        raise ArgumentError(f"{op}: blank: expected an int, got {blank!r}") from None


def host_ints(op, name, v):
    """An array or a sequence of ints as a host NumPy array: int32 and int64 arrays keep their
    dtype, other integer arrays become int64; anything else is a DTypeError."""
    if hasattr(v, "detach"):  # torch (possibly requiring grad, possibly on a GPU)
        v = v.detach().cpu().numpy()
    elif type(v).__module__.startswith("cupy"):
        v = v.get()
    elif isinstance(v, (list, tuple)) and all(np.ndim(e) == 0 for e in v):
        try:
            v = np.array([operator.index(e) for e in v], dtype=np.int64)
        except TypeError:
            raise DTypeError(f"{op}: {name}: expected an int array or a sequence of ints, got {v!r}") from None
    elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        v = np.array(v, dtype=np.int64)
    v = np.asarray(v)
    if v.dtype in (np.int32, np.int64):
        return v
    if np.issubdtype(v.dtype, np.integer):
        return v.astype(np.int64)
    raise DTypeError(f"{op}: {name}: expected int32 or int64 (or another integer dtype), got {v.dtype}")


class Problem:
    """The host arrays and options of one call, in the batched form libruDNN takes."""

    def __init__(self, op, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
        self.batched = len(log_probs.shape) != 2
        self.targets = host_ints(op, "targets", targets)
        self.input_lengths = host_ints(op, "input_lengths", input_lengths)
        self.target_lengths = host_ints(op, "target_lengths", target_lengths)
        if not self.batched:  # torch's batch-less form: one sequence, padded targets
            self.targets = self.targets[None] if self.targets.ndim == 1 else self.targets
            self.input_lengths = self.input_lengths.reshape(-1)
            self.target_lengths = self.target_lengths.reshape(-1)
        self.blank = blank_index(op, blank)
        self.reduction = reduction_code(op, reduction)
        self.zero_infinity = flag(op, "zero_infinity", zero_infinity)

    def batched_view(self, a):
        """(T, N, C) log_probs or dlog_probs: a (T, C) array seen as (T, 1, C)."""
        return a if self.batched else a[:, None, :]

    def args(self):
        return self.targets, self.input_lengths, self.target_lengths

    def options(self):
        return self.blank, self.reduction, self.zero_infinity


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False, *,
             stream=None):
    """The CTC loss (torch.nn.functional.ctc_loss): per sequence -log p(target | log_probs), then
    reduction "none" (shape (N,)), "sum", or "mean" (each loss divided by its target length,
    clamped to >= 1, then averaged over the batch)."""
    if fw.is_jax(log_probs):
        return _jax().ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)
    op = "ctc_loss"
    call = fw.Call(op, {"log_probs": log_probs}, stream)
    p = Problem(op, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)
    lp = p.batched_view(log_probs)
    batch = log_probs.shape[1] if p.batched else 1
    loss = call.empty((batch,) if p.reduction == 0 else (), call.dtype_name(log_probs))
    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.ctc_loss_forward(call.arg(lp), *p.args(), call.arg(loss), None, *p.options(), call.stream,
                        call.workspace_alloc)
    return loss if p.batched or p.reduction != 0 else loss.reshape(())


def ctc_loss_backward(dloss, log_probs, targets, input_lengths, target_lengths, *, blank=0, reduction="mean",
                      zero_infinity=False, stream=None):
    """dlog_probs, what torch's autograd gives for ctc_loss: dloss has the loss's shape ((N,) for
    "none", else a scalar); time steps past a sequence's input length get zero."""
    if fw.is_jax(log_probs):
        return _jax().ctc_loss_backward(dloss, log_probs, targets, input_lengths, target_lengths, blank=blank,
                                        reduction=reduction, zero_infinity=zero_infinity)
    op = "ctc_loss_backward"
    call = fw.Call(op, {"log_probs": log_probs, "dloss": dloss}, stream)
    p = Problem(op, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)
    lp = p.batched_view(log_probs)
    grad = call.empty(tuple(log_probs.shape), call.dtype_name(log_probs))
    if not p.batched and p.reduction == 0 and len(dloss.shape) == 0:
        dloss = dloss.reshape((1,))
    _C.ctc_loss_backward(call.arg(dloss), call.arg(lp), *p.args(), call.arg(p.batched_view(grad)), None,
                         *p.options(), call.stream, call.workspace_alloc)
    return grad


__all__ = ["ctc_loss", "ctc_loss_backward"]
