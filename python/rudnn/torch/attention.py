"""rudnn.attention as torch.library custom ops: a fake (meta) implementation for
torch.compile and autograd through rudnn.attention_backward (gradients of q, k and v,
through out and, with return_lse=True, through lse too; none for mask and bias: a mask or
bias that requires grad is refused rather than left silently untrained).

`rudnn.torch.attention` takes the same arguments as `rudnn.attention`. With `out=` or
`stream=` the call runs eagerly without autograd, like torch's own out= variants.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from ..attention import attention as _attention_eager
from ..attention import attention_backward as _attention_backward_eager
from .._args import flag as _flag
from ..attention import _shapes  # (out shape, lse shape); placeholders for wrong ranks
from ..attention import options as _options
from ..errors import UnsupportedError


def _window(left: int, right: int):
    return (None if left < 0 else left, None if right < 0 else right)


@custom_op("rudnn::attention_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor], scale: Optional[float],
             causal: bool, window_left: int, window_right: int, softcap: Optional[float],
             cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], strategy: str) -> tuple[Tensor, Tensor]:
    """Returns (out, lse); lse is always computed (the backward needs it)."""
    return _attention_eager(q, k, v, mask=mask, bias=bias, scale=scale, causal=causal,
                            window=_window(window_left, window_right), softcap=softcap,
                            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, return_lse=True,
                            strategy=strategy)


@_forward.register_fake
def _(q, k, v, mask, bias, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k, strategy):
    out_shape, lse_shape = _shapes(q, v, cu_seqlens_q is not None)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@custom_op("rudnn::attention_backward", mutates_args=())
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, mask: Optional[Tensor],
              bias: Optional[Tensor], scale: Optional[float], causal: bool, window_left: int, window_right: int,
              softcap: Optional[float], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], strategy: str,
              deterministic: bool, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    return _attention_backward_eager(dout, q, k, v, out, lse, mask=mask, bias=bias, scale=scale, causal=causal,
                                     window=_window(window_left, window_right), softcap=softcap,
                                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                     deterministic=deterministic, strategy=strategy, dlse=dlse)


@_backward.register_fake
def _(dout, q, k, v, out, lse, mask, bias, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
      cu_seqlens_k, strategy, deterministic, dlse=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, bias, scale, causal, wl, wr, softcap, cu_q, cu_k, strategy = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, bias, cu_q, cu_k)
    ctx.options = (scale, causal, wl, wr, softcap, strategy)
    ctx.set_materialize_grads(False)  # an unused out or lse brings None, not a tensor of zeros


def _autograd_backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, bias, cu_q, cu_k = ctx.saved_tensors
    scale, causal, wl, wr, softcap, strategy = ctx.options
    if dout is None and dlse is None:
        return (None,) * 13
    if dout is None:  # only lse is used: out's gradient is zero (dv too)
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1:
        dout = dout.contiguous()
    # The flash backward covers fewer cases than the flash forward: a flash forward is
    # differentiated by the "auto" backward (flash where it supports the case).
    backward_strategy = "auto" if strategy == "flash" else strategy
    dq, dk, dv = _backward(dout, q, k, v, out, lse, mask, bias, scale, causal, wl, wr, softcap, cu_q, cu_k,
                           backward_strategy, torch.are_deterministic_algorithms_enabled(), dlse)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("rudnn::attention_forward", _autograd_backward, setup_context=_setup_context)


def attention(q, k, v, *, mask=None, bias=None, scale=None, causal=False, window=None, softcap=None,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, strategy="auto", out=None, stream=None):
    """rudnn.attention as a differentiable, torch.compile-able custom op (gradients for q, k, v;
    dq/dk/dv are deterministic when torch.use_deterministic_algorithms(True) is on)."""
    if out is not None or stream is not None:
        return _attention_eager(q, k, v, mask=mask, bias=bias, scale=scale, causal=causal, window=window,
                                softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                return_lse=return_lse, strategy=strategy, out=out, stream=stream)
    op = "rudnn.torch.attention"
    opts = _options(op, mask=mask, bias=bias, scale=scale, causal=causal, window=window, softcap=softcap,
                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, strategy=strategy)
    return_lse = _flag(op, "return_lse", return_lse)
    for name, t in (("mask", mask), ("bias", bias)):
        if isinstance(t, Tensor) and t.requires_grad and torch.is_grad_enabled():
            raise UnsupportedError(f"{op}: {name}: gradients with respect to {name} are not computed; pass "
                                   f"{name}.detach() (or build it under torch.no_grad())")
    o, lse = _forward(q, k, v, mask, bias, opts["scale"], opts["causal"], opts["window_left"], opts["window_right"],
                      softcap if softcap is None else float(softcap), cu_seqlens_q, cu_seqlens_k, strategy)
    return (o, lse) if return_lse else o


def attention_backward(dout, q, k, v, out, lse, *, mask=None, bias=None, scale=None, causal=False, window=None,
                       softcap=None, cu_seqlens_q=None, cu_seqlens_k=None, deterministic=False, strategy="auto",
                       dlse=None, stream=None):
    """rudnn.attention_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _attention_backward_eager(dout, q, k, v, out, lse, mask=mask, bias=bias, scale=scale,
                                         causal=causal, window=window, softcap=softcap,
                                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                         deterministic=deterministic, strategy=strategy, dlse=dlse, stream=stream)
    opts = _options("rudnn.torch.attention_backward", mask=mask, bias=bias, scale=scale, causal=causal,
                    window=window, softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                    strategy=strategy)
    return _backward(dout, q, k, v, out, lse, mask, bias, opts["scale"], opts["causal"], opts["window_left"],
                     opts["window_right"], softcap if softcap is None else float(softcap), cu_seqlens_q, cu_seqlens_k,
                     strategy, _flag("rudnn.torch.attention_backward", "deterministic", deterministic), dlse)


__all__ = ["attention", "attention_backward"]
