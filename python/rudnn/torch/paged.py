"""rudnn.paged as torch.library custom ops over a plan's metadata tensors, with fake (meta)
implementations, so that the ops trace under torch.compile (the plan's four int32 tensors are
ordinary graph inputs: a compiled function sees a plan rewritten with
``DevicePlan.upload(host, q, into=plan)``).

    rudnn.torch.paged.attention(plan, q, k_cache, v_cache, scale=None, causal=False, splits=1)
    rudnn.torch.paged.mla(plan, q, qp, latent, kp, scale, causal=False, splits=1)
    rudnn.torch.paged.append(plan, k, v, k_cache, v_cache)      # in place, returns the caches

attention and mla are differentiable (torch.autograd): gradients for q, k_cache, v_cache /
q, qp, latent, kp (through out and, with return_lse=True, through lse too) from the paged
backward (plan.attention_backward / plan.mla_backward).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from .. import paged as _paged
from .._args import flag as _flag
from .._args import number as _number
from ..errors import ArgumentError, UnsupportedError

__all__ = ["attention", "mla", "append"]


def _plan(page_size, tables, lengths, sequence_ids, positions):
    return SimpleNamespace(page_size=page_size, tables=tables, lengths=lengths, sequence_ids=sequence_ids,
                           positions=positions)


def _ws(q, splits, heads, value_dim):
    return None if splits == 1 else _paged.SplitWorkspace(q, q.shape[0], heads, value_dim, splits)


@custom_op("rudnn::paged_attention", mutates_args=())
def _attention_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int, q: Tensor,
                  k_cache: Tensor, v_cache: Tensor, scale: float, causal: bool, splits: int) -> tuple[Tensor, Tensor]:
    plan = _plan(page_size, tables, lengths, sequence_ids, positions)
    ws = _ws(q, splits, q.shape[1], v_cache.shape[-1])
    return _paged._attention(plan, q, k_cache, v_cache, scale, causal, ws, True, None, None)


@_attention_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, q, k_cache, v_cache, scale, causal, splits):
    return (q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1])),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


@custom_op("rudnn::paged_mla", mutates_args=())
def _mla_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int, q: Tensor,
            qp: Tensor, latent: Tensor, kp: Tensor, scale: float, causal: bool, splits: int) -> tuple[Tensor, Tensor]:
    plan = _plan(page_size, tables, lengths, sequence_ids, positions)
    ws = _ws(q, splits, q.shape[1], q.shape[-1])
    return _paged._mla(plan, q, qp, latent, kp, scale, causal, ws, True, None, None)


@_mla_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, q, qp, latent, kp, scale, causal, splits):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


@custom_op("rudnn::paged_append", mutates_args=("k_cache", "v_cache"))
def _append_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int, k: Tensor,
               v: Tensor, k_cache: Tensor, v_cache: Tensor) -> None:
    _paged._append(_plan(page_size, tables, lengths, sequence_ids, positions), k, v, k_cache, v_cache, None)


@_append_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, k, v, k_cache, v_cache):
    return None


@custom_op("rudnn::paged_attention_backward", mutates_args=())
def _attention_backward_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int,
                           q: Tensor, k_cache: Tensor, v_cache: Tensor, dout: Tensor, scale: float,
                           causal: bool, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    plan = _plan(page_size, tables, lengths, sequence_ids, positions)
    return _paged._attention_backward(plan, q, k_cache, v_cache, dout, scale, causal, ("dq", "dk", "dv"), None, None,
                                      dlse)


@_attention_backward_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, q, k_cache, v_cache, dout, scale, causal, dlse=None):
    return q.new_empty(q.shape), k_cache.new_empty(k_cache.shape), v_cache.new_empty(v_cache.shape)


@custom_op("rudnn::paged_mla_backward", mutates_args=())
def _mla_backward_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int,
                     q: Tensor, qp: Tensor, latent: Tensor, kp: Tensor, dout: Tensor, scale: float,
                     causal: bool, dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    plan = _plan(page_size, tables, lengths, sequence_ids, positions)
    return _paged._mla_backward(plan, q, qp, latent, kp, dout, scale, causal, ("dq", "dqp", "dlatent", "dkp"), None,
                                None, dlse)


@_mla_backward_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, q, qp, latent, kp, dout, scale, causal, dlse=None):
    return q.new_empty(q.shape), qp.new_empty(qp.shape), latent.new_empty(latent.shape), kp.new_empty(kp.shape)


def _setup(ctx, inputs, output):
    *meta, page_size = inputs[:5]
    ctx.page_size = page_size
    ctx.scale, ctx.causal = inputs[-3], inputs[-2]
    ctx.save_for_backward(*meta, *inputs[5:-3], output[0])
    ctx.set_materialize_grads(False)  # an unused out or lse brings None


def _grads_in(out, dout, dlse):
    """(dout, dlse) for the backward op: dout dense in its last axis (zeros when only lse is used)."""
    if dout is None:
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1:
        dout = dout.contiguous()
    return dout, dlse


def _attention_grad(ctx, dout, dlse):
    tables, lengths, seq, pos, q, k, v, out = ctx.saved_tensors
    if dout is None and dlse is None:
        return (None,) * 11
    dout, dlse = _grads_in(out, dout, dlse)
    dq, dk, dv = _attention_backward_op(tables, lengths, seq, pos, ctx.page_size, q, k, v, dout, ctx.scale,
                                        ctx.causal, dlse)
    return (None,) * 5 + (dq, dk, dv) + (None,) * 3


def _mla_grad(ctx, dout, dlse):
    tables, lengths, seq, pos, q, qp, latent, kp, out = ctx.saved_tensors
    if dout is None and dlse is None:
        return (None,) * 12
    dout, dlse = _grads_in(out, dout, dlse)
    grads = _mla_backward_op(tables, lengths, seq, pos, ctx.page_size, q, qp, latent, kp, dout, ctx.scale, ctx.causal,
                             dlse)
    return (None,) * 5 + tuple(grads) + (None,) * 3


torch.library.register_autograd("rudnn::paged_attention", _attention_grad, setup_context=_setup)
torch.library.register_autograd("rudnn::paged_mla", _mla_grad, setup_context=_setup)


def _meta_tensors(op, plan):
    if not isinstance(plan, _paged.DevicePlan):
        raise ArgumentError(f"{op}: plan: expected a rudnn.paged.DevicePlan, got {type(plan).__name__}")
    if plan.framework != "torch":
        raise ArgumentError(f"{op}: plan: expected a plan of torch tensors (DevicePlan.upload with a torch q), got a "
                            f"{plan.framework} plan")
    if plan.page_size is None:
        raise ArgumentError(f"{op}: plan: this plan was reserved but holds no schedule yet "
                            f"(DevicePlan.upload(host, q, into=plan) first)")
    return plan.tables, plan.lengths, plan.sequence_ids, plan.positions, int(plan.page_size)


def _splits(op, splits):
    if isinstance(splits, bool) or not isinstance(splits, int):
        raise ArgumentError(f"{op}: splits: expected an int (1, or 2..32 for split-KV), got {splits!r}")
    return splits


def attention(plan, q, k_cache, v_cache, scale=None, causal=False, *, splits=1, return_lse=False):
    """plan.attention as a custom op; splits in 2..32 runs split-KV with a workspace allocated by torch."""
    op = "rudnn.torch.paged.attention"
    meta = _meta_tensors(op, plan)
    D = q.shape[-1] if q.dim() else 1
    scale = D ** -0.5 if scale is None else _number(op, "scale", scale, "a finite value > 0")
    out, lse = _attention_op(*meta, q, k_cache, v_cache, scale, _flag(op, "causal", causal), _splits(op, splits))
    return (out, lse) if _flag(op, "return_lse", return_lse) else out


def mla(plan, q, qp, latent, kp, scale, causal=False, *, splits=1, return_lse=False):
    """plan.mla as a custom op."""
    op = "rudnn.torch.paged.mla"
    meta = _meta_tensors(op, plan)
    out, lse = _mla_op(*meta, q, qp, latent, kp, _number(op, "scale", scale, "a finite value > 0"),
                       _flag(op, "causal", causal), _splits(op, splits))
    return (out, lse) if _flag(op, "return_lse", return_lse) else out


def append(plan, k, v, k_cache, v_cache):
    """plan.append as a custom op mutating k_cache and v_cache; returns (k_cache, v_cache)."""
    meta = _meta_tensors("rudnn.torch.paged.append", plan)
    _paged._refuse_duplicate_slots("paged_append", plan, plan.device)
    _append_op(*meta, k, v, k_cache, v_cache)
    return k_cache, v_cache
