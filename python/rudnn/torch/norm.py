"""rudnn ops as torch.library custom ops: fake (meta) implementations for
torch.compile and autograd formulas that call the rudnn backward kernels.

`rudnn.torch.<op>` takes the same arguments as `rudnn.<op>`. With `out=` the call
runs eagerly without autograd, like torch's own out= variants.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from .._args import flag, float32_number
from .. import norm as _norm

_LAYER, _RMS = 0, 1


def _none_if_empty(t: Tensor) -> Optional[Tensor]:
    return None if t.numel() == 0 and t.dim() == 1 and t.shape[0] == 0 else t


def _placeholder(like: Tensor) -> Tensor:
    """Stands for an absent output: custom ops cannot return None."""
    return like.new_empty((0,))


# ---- layer_norm / rms_norm ---------------------------------------------------------------

@custom_op("rudnn::norm_forward", mutates_args=())
def _norm_forward(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], residual: Optional[Tensor],
                  eps: float, kind: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (y, h or placeholder, mean or placeholder, rstd)."""
    outs = _norm._forward("rudnn.torch.norm", kind, x, weight, bias, residual, eps, True, None, None)
    y, rest = outs[0], list(outs[1:])
    h = rest.pop(0) if residual is not None else _placeholder(x)
    mean = rest.pop(0) if kind == _LAYER else _placeholder(x).float()
    return y, h, mean, rest.pop(0)


@_norm_forward.register_fake
def _(x, weight, bias, residual, eps, kind):
    stats = x.shape[:-1]
    h = torch.empty_like(x) if residual is not None else _placeholder(x)
    mean = x.new_empty(stats, dtype=torch.float32) if kind == _LAYER else x.new_empty((0,), dtype=torch.float32)
    return torch.empty_like(x), h, mean, x.new_empty(stats, dtype=torch.float32)


@custom_op("rudnn::norm_backward", mutates_args=())
def _norm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], mean: Optional[Tensor], rstd: Tensor,
                   kind: int) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (dx, dweight or placeholder, dbias or placeholder); weight grads float32."""
    dx, dweight, dbias = _norm._backward("rudnn.torch.norm_backward", kind, dy, x, weight, mean, rstd, None)
    ph = _placeholder(x).float()
    return dx, dweight if dweight is not None else ph, dbias if dbias is not None else ph


@_norm_backward.register_fake
def _(dy, x, weight, mean, rstd, kind):
    hidden = x.shape[-1:]
    ph = x.new_empty((0,), dtype=torch.float32)
    dweight = x.new_empty(hidden, dtype=torch.float32) if weight is not None else ph
    dbias = x.new_empty(hidden, dtype=torch.float32) if kind == _LAYER else ph
    return torch.empty_like(x), dweight, dbias


def _norm_setup_context(ctx, inputs, output):
    x, weight, bias, residual, eps, kind = inputs
    y, h, mean, rstd = output
    normalized = h if residual is not None else x
    ctx.save_for_backward(normalized, weight, mean if kind == _LAYER else None, rstd)
    ctx.kind = kind
    ctx.has_bias = bias is not None
    ctx.has_residual = residual is not None
    ctx.param_dtypes = (weight.dtype if weight is not None else None, bias.dtype if bias is not None else None)
    ctx.mark_non_differentiable(mean, rstd)


def _norm_autograd_backward(ctx, dy, dh, dmean, drstd):
    normalized, weight, mean, rstd = ctx.saved_tensors
    dx = dweight = dbias = None
    if dy is not None:
        dx, dweight, dbias = _norm_backward(dy.contiguous() if dy.stride(-1) != 1 else dy, normalized, weight,
                                            mean, rstd, ctx.kind)
        dweight = dweight.to(ctx.param_dtypes[0]) if weight is not None else None
        dbias = dbias.to(ctx.param_dtypes[1]) if ctx.has_bias else None
    if ctx.has_residual and dh is not None:
        dx = dh if dx is None else dx + dh
    dresidual = dx if ctx.has_residual else None
    return dx, dweight, dbias, dresidual, None, None


torch.library.register_autograd("rudnn::norm_forward", _norm_autograd_backward, setup_context=_norm_setup_context)


def _norm_result(kind, y, h, mean, rstd, residual, return_stats):
    out = (y,) + ((h,) if residual is not None else ())
    if return_stats:
        out += ((mean, rstd) if kind == _LAYER else (rstd,))
    return out[0] if len(out) == 1 else out


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, residual=None, return_stats=False, out=None, stream=None):
    """rudnn.layer_norm as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _norm.layer_norm(x, weight, bias, eps, residual=residual, return_stats=return_stats, out=out,
                                stream=stream)
    eps = float32_number("layer_norm", "eps", eps, "a finite value > 0")
    y, h, mean, rstd = _norm_forward(x, weight, bias, residual, eps, _LAYER)
    return _norm_result(_LAYER, y, h, mean, rstd, residual, flag("layer_norm", "return_stats", return_stats))


def rms_norm(x, weight=None, eps=1e-6, *, residual=None, return_stats=False, out=None, stream=None):
    """rudnn.rms_norm as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _norm.rms_norm(x, weight, eps, residual=residual, return_stats=return_stats, out=out, stream=stream)
    eps = float32_number("rms_norm", "eps", eps, "a finite value > 0")
    y, h, mean, rstd = _norm_forward(x, weight, None, residual, eps, _RMS)
    return _norm_result(_RMS, y, h, mean, rstd, residual, flag("rms_norm", "return_stats", return_stats))


def layer_norm_backward(dy, x, weight, mean, rstd, *, stream=None):
    """rudnn.layer_norm_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _norm.layer_norm_backward(dy, x, weight, mean, rstd, stream=stream)
    dx, dweight, dbias = _norm_backward(dy, x, weight, mean, rstd, _LAYER)
    return dx, dweight if weight is not None else None, dbias


def rms_norm_backward(dy, x, weight, rstd, *, stream=None):
    """rudnn.rms_norm_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _norm.rms_norm_backward(dy, x, weight, rstd, stream=stream)
    dx, dweight, _ = _norm_backward(dy, x, weight, None, rstd, _RMS)
    return dx, dweight if weight is not None else None


# ---- softmax ------------------------------------------------------------------------------

@custom_op("rudnn::softmax_forward", mutates_args=())
def _softmax_forward(x: Tensor) -> Tensor:
    return _norm.softmax(x)


@_softmax_forward.register_fake
def _(x):
    return torch.empty_like(x)


@custom_op("rudnn::softmax_backward", mutates_args=())
def _softmax_backward(dy: Tensor, y: Tensor) -> Tensor:
    return _norm.softmax_backward(dy, y)


@_softmax_backward.register_fake
def _(dy, y):
    return torch.empty_like(y)


def _softmax_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_autograd_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _softmax_backward(dy.contiguous() if dy.stride(-1) != 1 else dy, y)


torch.library.register_autograd("rudnn::softmax_forward", _softmax_autograd_backward,
                                setup_context=_softmax_setup_context)


def softmax(x, *, out=None, stream=None):
    """rudnn.softmax as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _norm.softmax(x, out=out, stream=stream)
    return _softmax_forward(x)


def softmax_backward(dy, y, *, stream=None):
    """rudnn.softmax_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _norm.softmax_backward(dy, y, stream=stream)
    return _softmax_backward(dy, y)


__all__ = ["layer_norm", "rms_norm", "softmax", "layer_norm_backward", "rms_norm_backward", "softmax_backward"]
