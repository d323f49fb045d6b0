"""The gated delta rule as torch.library custom ops: fake (meta) implementations for
torch.compile, and autograd through the rudnn backward kernels.

`rudnn.torch.chunk_gated_delta_rule` / `gated_delta_rule` take the same arguments as the
rudnn functions; `stream=` runs the plain rudnn function eagerly, without autograd.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from .. import gated_delta as _gd

_CHUNKED, _RECURRENT = _gd._CHUNKED, _gd._RECURRENT


def _state_shape(q, v, cu_seqlens):
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return (N, v.shape[1], q.shape[3], v.shape[3])


@custom_op("rudnn::gated_delta_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor, initial_state: Optional[Tensor],
             cu_seqlens: Optional[Tensor], scale: float, chunk_size: int, algo: int,
             strategy_code: int = 0) -> tuple[Tensor, Tensor]:
    """Returns (out, final_state). strategy_code: 0 auto, 1 chunked, 2 recurrent. (Not `kernel`:
    inductor's FallbackKernel.create takes its own `kernel` argument beside the op's.)"""
    return _gd._forward("rudnn.torch.gated_delta_forward", algo, q, k, v, beta, log_decay, initial_state, scale,
                        chunk_size, cu_seqlens, None, strategy_code)


@_forward.register_fake
def _(q, k, v, beta, log_decay, initial_state, cu_seqlens, scale, chunk_size, algo, strategy_code=0):
    out = q.new_empty((q.shape[0], v.shape[1], q.shape[2], v.shape[3]))
    return out, q.new_empty(_state_shape(q, v, cu_seqlens), dtype=torch.float32)


@custom_op("rudnn::gated_delta_backward", mutates_args=())
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor,
              initial_state: Optional[Tensor], dfinal_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
              scale: float, chunk_size: int, algo: int,
              strategy_code: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv, dbeta, dlog_decay, dinitial_state or an empty placeholder)."""
    grads = _gd._backward("rudnn.torch.gated_delta_backward", algo, dout, q, k, v, beta, log_decay, initial_state,
                          dfinal_state, scale, chunk_size, cu_seqlens, None, strategy_code)
    dinitial = grads[5] if grads[5] is not None else q.new_empty((0,), dtype=torch.float32)
    return (*grads[:5], dinitial)


@_backward.register_fake
def _(dout, q, k, v, beta, log_decay, initial_state, dfinal_state, cu_seqlens, scale, chunk_size, algo,
      strategy_code=0):
    dinitial = (initial_state.new_empty(initial_state.shape) if initial_state is not None
                else q.new_empty((0,), dtype=torch.float32))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta),
            torch.empty_like(log_decay), dinitial)


def _setup_context(ctx, inputs, output):
    q, k, v, beta, log_decay, initial_state, cu_seqlens, scale, chunk_size, algo, strategy_code = inputs
    ctx.save_for_backward(q, k, v, beta, log_decay, initial_state, cu_seqlens)
    ctx.scale, ctx.chunk_size, ctx.algo = scale, chunk_size, algo


def _dense_last(t):
    """Incoming gradients may be expanded (stride 0); the kernels need a dense last axis."""
    return t if t is None or t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _autograd_backward(ctx, dout, dfinal):
    q, k, v, beta, log_decay, initial_state, cu_seqlens = ctx.saved_tensors
    if dout is None:
        dout = q.new_zeros((q.shape[0], v.shape[1], q.shape[2], v.shape[3]))
    dq, dk, dv, dbeta, dlog_decay, dinitial = _backward(_dense_last(dout), q, k, v, beta, log_decay, initial_state,
                                                        _dense_last(dfinal), cu_seqlens, ctx.scale, ctx.chunk_size,
                                                        ctx.algo)
    return dq, dk, dv, dbeta, dlog_decay, dinitial if initial_state is not None else None, None, None, None, None, None


torch.library.register_autograd("rudnn::gated_delta_forward", _autograd_backward, setup_context=_setup_context)


def chunk_gated_delta_rule(q, k, v, beta, log_decay, initial_state=None, *, scale, chunk_size=64, cu_seqlens=None,
                           strategy="auto", out=None, stream=None):
    """rudnn.chunk_gated_delta_rule as a differentiable, torch.compile-able custom op
    (with out= or stream= it runs eagerly, without autograd)."""
    if out is not None or stream is not None:
        return _gd.chunk_gated_delta_rule(q, k, v, beta, log_decay, initial_state, scale=scale, chunk_size=chunk_size,
                                          cu_seqlens=cu_seqlens, strategy=strategy, out=out, stream=stream)
    strategy_code = _gd.kernel_code("chunk_gated_delta_rule", strategy)
    scale, chunk_size = _gd._numbers("chunk_gated_delta_rule", scale, chunk_size)
    return _forward(q, k, v, beta, log_decay, initial_state, cu_seqlens, scale, chunk_size, _CHUNKED, strategy_code)


def gated_delta_rule(q, k, v, beta, log_decay, initial_state=None, *, scale, cu_seqlens=None, out=None, stream=None):
    """rudnn.gated_delta_rule as a differentiable, torch.compile-able custom op
    (with out= or stream= it runs eagerly, without autograd)."""
    if out is not None or stream is not None:
        return _gd.gated_delta_rule(q, k, v, beta, log_decay, initial_state, scale=scale, cu_seqlens=cu_seqlens,
                                    out=out, stream=stream)
    scale, _ = _gd._numbers("gated_delta_rule", scale, 64)
    return _forward(q, k, v, beta, log_decay, initial_state, cu_seqlens, scale, 64, _RECURRENT)


def chunk_gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state=None, dfinal_state=None, *, scale,
                                    chunk_size=64, cu_seqlens=None, strategy="auto", stream=None):
    """rudnn.chunk_gated_delta_rule_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _gd.chunk_gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state, dfinal_state,
                                                   scale=scale, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
                                                   strategy=strategy, stream=stream)
    code = _gd.kernel_code("chunk_gated_delta_rule_backward", strategy)
    scale, chunk_size = _gd._numbers("chunk_gated_delta_rule_backward", scale, chunk_size)
    grads = _backward(dout, q, k, v, beta, log_decay, initial_state, dfinal_state, cu_seqlens, scale, chunk_size,
                      _CHUNKED, code)
    return (*grads[:5], grads[5] if initial_state is not None else None)


def gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state=None, dfinal_state=None, *, scale,
                              cu_seqlens=None, stream=None):
    """rudnn.gated_delta_rule_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _gd.gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state, dfinal_state, scale=scale,
                                             cu_seqlens=cu_seqlens, stream=stream)
    scale, _ = _gd._numbers("gated_delta_rule_backward", scale, 64)
    grads = _backward(dout, q, k, v, beta, log_decay, initial_state, dfinal_state, cu_seqlens, scale, 64, _RECURRENT)
    return (*grads[:5], grads[5] if initial_state is not None else None)


__all__ = ["chunk_gated_delta_rule", "gated_delta_rule", "chunk_gated_delta_rule_backward",
           "gated_delta_rule_backward"]
