"""The CTC loss as torch.library custom ops: a fake implementation (the loss's shape and dtype)
and autograd through ctc_loss_backward.

`rudnn.torch.ctc_loss` takes the same arguments as `rudnn.ctc_loss`; lengths given as sequences
become int64 CPU tensors (custom ops take tensors). With `stream=` the call runs eagerly
without autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._op import custom_op

from .. import ctc as _ctc


def _as_tensor(op, name, v) -> Tensor:
    return v if isinstance(v, Tensor) else torch.as_tensor(_ctc.host_ints(op, name, v))


def _inputs(op, targets, input_lengths, target_lengths):
    return (_as_tensor(op, "targets", targets), _as_tensor(op, "input_lengths", input_lengths),
            _as_tensor(op, "target_lengths", target_lengths))


def _options(op, blank, reduction, zero_infinity):
    _ctc.reduction_code(op, reduction)  # raises for a bad name
    return _ctc.blank_index(op, blank), reduction, _ctc.flag(op, "zero_infinity", zero_infinity)


def _loss_shape(log_probs: Tensor, reduction: str):
    return (log_probs.shape[1],) if reduction == "none" and log_probs.dim() == 3 else ()


@custom_op("rudnn::ctc_loss_forward", mutates_args=())
def _ctc_loss_forward(log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int,
                      reduction: str, zero_infinity: bool) -> Tensor:
    return _ctc.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)


@_ctc_loss_forward.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    return log_probs.new_empty(_loss_shape(log_probs, reduction))


@custom_op("rudnn::ctc_loss_backward", mutates_args=())
def _ctc_loss_backward(dloss: Tensor, log_probs: Tensor, targets: Tensor, input_lengths: Tensor,
                       target_lengths: Tensor, blank: int, reduction: str, zero_infinity: bool) -> Tensor:
    return _ctc.ctc_loss_backward(dloss, log_probs, targets, input_lengths, target_lengths, blank=blank,
                                  reduction=reduction, zero_infinity=zero_infinity)


@_ctc_loss_backward.register_fake
def _(dloss, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    return torch.empty_like(log_probs)


def _setup_context(ctx, inputs, output):
    log_probs, targets, input_lengths, target_lengths, *ctx.options = inputs
    ctx.save_for_backward(log_probs, targets, input_lengths, target_lengths)


def _autograd_backward(ctx, dloss):
    grad = _ctc_loss_backward(dloss, *ctx.saved_tensors, *ctx.options)
    return (grad,) + (None,) * 6


torch.library.register_autograd("rudnn::ctc_loss_forward", _autograd_backward, setup_context=_setup_context)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False, *,
             stream=None):
    """rudnn.ctc_loss as a differentiable, torch.compile-able custom op."""
    if stream is not None:
        return _ctc.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity,
                             stream=stream)
    op = "rudnn.torch.ctc_loss"
    return _ctc_loss_forward(log_probs, *_inputs(op, targets, input_lengths, target_lengths),
                             *_options(op, blank, reduction, zero_infinity))


def ctc_loss_backward(dloss, log_probs, targets, input_lengths, target_lengths, *, blank=0, reduction="mean",
                      zero_infinity=False, stream=None):
    """rudnn.ctc_loss_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _ctc.ctc_loss_backward(dloss, log_probs, targets, input_lengths, target_lengths, blank=blank,
                                      reduction=reduction, zero_infinity=zero_infinity, stream=stream)
    op = "rudnn.torch.ctc_loss_backward"
    return _ctc_loss_backward(dloss, log_probs, *_inputs(op, targets, input_lengths, target_lengths),
                              *_options(op, blank, reduction, zero_infinity))


__all__ = ["ctc_loss", "ctc_loss_backward"]
