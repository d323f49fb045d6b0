"""rudnn.paged as torch.library custom ops over a plan's metadata tensors, with fake (meta)
implementations, so that the ops trace under torch.compile (the plan's four int32 tensors are
ordinary graph inputs: a compiled function sees a plan rewritten with
``DevicePlan.upload(host, q, into=plan)``).

    rudnn.torch.paged.attention(plan, q, k_cache, v_cache, scale=None, causal=False, splits=1)
    rudnn.torch.paged.mla(plan, q, qp, latent, kp, scale, causal=False, splits=1)
    rudnn.torch.paged.append(plan, k, v, k_cache, v_cache)      # in place, returns the caches

This release has no paged backward: differentiating through these ops raises UnsupportedError
(instead of silently returning no gradient).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

from .. import paged as _paged
from ..attention import flag as _flag
from ..attention import _number
from ..errors import ArgumentError, UnsupportedError

__all__ = ["attention", "mla", "append"]


def _plan(page_size, tables, lengths, sequence_ids, positions):
    return SimpleNamespace(page_size=page_size, tables=tables, lengths=lengths, sequence_ids=sequence_ids,
                           positions=positions)


def _ws(q, splits, heads, value_dim):
    return None if splits == 1 else _paged.SplitWorkspace(q, q.shape[0], heads, value_dim, splits)


@torch.library.custom_op("rudnn::paged_attention", mutates_args=())
def _attention_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int, q: Tensor,
                  k_cache: Tensor, v_cache: Tensor, scale: float, causal: bool, splits: int) -> tuple[Tensor, Tensor]:
    plan = _plan(page_size, tables, lengths, sequence_ids, positions)
    ws = _ws(q, splits, q.shape[1], v_cache.shape[-1])
    return _paged._attention(plan, q, k_cache, v_cache, scale, causal, ws, True, None, None)


@_attention_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, q, k_cache, v_cache, scale, causal, splits):
    return (q.new_empty((q.shape[0], q.shape[1], v_cache.shape[-1])),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


@torch.library.custom_op("rudnn::paged_mla", mutates_args=())
def _mla_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int, q: Tensor,
            qp: Tensor, latent: Tensor, kp: Tensor, scale: float, causal: bool, splits: int) -> tuple[Tensor, Tensor]:
    plan = _plan(page_size, tables, lengths, sequence_ids, positions)
    ws = _ws(q, splits, q.shape[1], q.shape[-1])
    return _paged._mla(plan, q, qp, latent, kp, scale, causal, ws, True, None, None)


@_mla_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, q, qp, latent, kp, scale, causal, splits):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("rudnn::paged_append", mutates_args=("k_cache", "v_cache"))
def _append_op(tables: Tensor, lengths: Tensor, sequence_ids: Tensor, positions: Tensor, page_size: int, k: Tensor,
               v: Tensor, k_cache: Tensor, v_cache: Tensor) -> None:
    _paged._append(_plan(page_size, tables, lengths, sequence_ids, positions), k, v, k_cache, v_cache, None)


@_append_op.register_fake
def _(tables, lengths, sequence_ids, positions, page_size, k, v, k_cache, v_cache):
    return None


def _no_backward(name):
    def backward(ctx, *grads):
        raise UnsupportedError(f"rudnn.torch.paged.{name}: the paged backward is not built yet; call it under "
                               f"torch.no_grad() or on tensors that do not require grad")
    return backward


def _setup(ctx, inputs, output):
    pass


torch.library.register_autograd("rudnn::paged_attention", _no_backward("attention"), setup_context=_setup)
torch.library.register_autograd("rudnn::paged_mla", _no_backward("mla"), setup_context=_setup)


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
    _append_op(*_meta_tensors("rudnn.torch.paged.append", plan), k, v, k_cache, v_cache)
    return k_cache, v_cache
