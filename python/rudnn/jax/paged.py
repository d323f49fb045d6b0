"""rudnn.paged for JAX: paged attention, MLA and append as XLA FFI custom calls (the "cpu" and
CUDA platforms), usable under jax.jit.

    plan = rudnn.jax.paged.upload(host_plan, q)         # or rudnn.paged.DevicePlan.upload(host_plan, q)
    out = rudnn.jax.paged.attention(plan, q, k_cache, v_cache, scale=None, causal=False, splits=1)
    out = rudnn.jax.paged.mla(plan, q, qp, latent, kp, scale, causal=False, splits=1)
    k_cache, v_cache = rudnn.jax.paged.append(plan, k, v, k_cache, v_cache)   # new arrays

The plan's metadata are int32 JAX arrays on q's device, and the plan is a pytree: passed to a
jitted function as an argument, a new schedule of the same sizes runs without retracing. JAX arrays are
immutable, so ``upload(host, q, into=plan)`` puts new arrays into `plan` (of its reserved
capacity) rather than rewriting memory. append's caches alias its results (donate them under
jit to update in place). The checks run as XLA runs a call: an eager call raises them as rudnn
errors, a jitted one as XLA's runtime error with the same message. attention and mla are
differentiable (jax.grad; jax.custom_vjp over the paged backward, through out and lse).
attention_backward / mla_backward take workspace=rudnn.paged.OrderedBackwardWorkspace(plan, q)
(its index travels as an operand of the *_backward_ordered targets). On CUDA a call with splits=1
picks its own split count, for histories as long as the plan's table width allows (its partial
results in XLA's scratch memory), and the atomic backward's float32 accumulators of 16-bit caches
live there too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import paged as _paged
from .._args import number as _number
from .._args import flag as _flag
from ..errors import ArgumentError, DeviceError, UnsupportedError
from . import _ffi

__all__ = ["upload", "reserve", "attention", "mla", "append", "attention_backward", "mla_backward"]

_NP_Q = np.zeros((1,), np.float32)


@jax.tree_util.register_pytree_node_class
class JaxPlan(_paged.DevicePlan):
    """A DevicePlan of JAX arrays: the schedule packed on the host, then put on q's device. It is
    a pytree (its four arrays are the leaves): pass it to a jitted function as an argument, not as
    a closure constant, so that a rewritten plan reaches the compiled code."""

    def __init__(self, host_plan, device):
        self._np = host_plan  # the numpy DevicePlan holding the packed buffers
        self._jax_device = device
        self.framework = "jax"
        self.device = ("cpu", 0) if device.platform == "cpu" else ("cuda", int(device.id))
        self._refresh()

    def _refresh(self):
        n = self._np
        self.page_size, self.capacity, self.host = n.page_size, n.capacity, n.host
        self.queries, self.num_seqs = n.queries, n.num_seqs
        put = functools.partial(jax.device_put, device=self._jax_device)
        self.tables, self.lengths = put(n.tables), put(n.lengths)
        self.sequence_ids, self.positions = put(n.sequence_ids), put(n.positions)


    def tree_flatten(self):
        return ((self.tables, self.lengths, self.sequence_ids, self.positions),
                (self.page_size, self.capacity, self.queries, self.num_seqs, self.device))

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        plan = cls.__new__(cls)
        plan._np, plan._jax_device, plan.host, plan.framework = None, None, None, "jax"
        plan.page_size, plan.capacity, plan.queries, plan.num_seqs, plan.device = aux
        plan.tables, plan.lengths, plan.sequence_ids, plan.positions = leaves
        return plan


def _device_of(op, q):
    q = _ffi.array(q, op, "q", required=True)
    devices = q.devices() if hasattr(q, "devices") else None
    if not devices or len(devices) != 1:
        raise ArgumentError(f"{op}: q: expected a concrete JAX array on one device (plans are made outside jit)")
    device = next(iter(devices))
    if device.platform not in ("cpu", "gpu", "cuda"):
        raise UnsupportedError(f"{op}: the XLA FFI handlers of the paged family are registered for the CPU and "
                               f"CUDA platforms, got a q on {device.platform}")
    return device


def upload(host, q, into=None):
    """rudnn.paged.DevicePlan.upload for a JAX q."""
    op = "DevicePlan.upload"
    device = _device_of(op, q)
    if into is None:
        return JaxPlan(_paged.DevicePlan.upload(host, _NP_Q), device)
    if not isinstance(into, JaxPlan) or into._np is None:
        raise ArgumentError(f"{op}: into: expected a plan of JAX arrays (rudnn.jax.paged.reserve or upload), got "
                            f"{type(into).__name__}")
    _paged.DevicePlan.upload(host, _NP_Q, into=into._np)
    into._jax_device = device
    into._refresh()
    return into


def reserve(q, max_queries, max_seqs, max_pages):
    """rudnn.paged.DevicePlan.reserve for a JAX q."""
    device = _device_of("DevicePlan.reserve", q)
    return JaxPlan(_paged.DevicePlan.reserve(_NP_Q, max_queries, max_seqs, max_pages), device)


def _meta(op, plan):
    if not isinstance(plan, JaxPlan):
        raise ArgumentError(f"{op}: plan: expected a plan of JAX arrays (rudnn.paged.DevicePlan.upload with a JAX q), "
                            f"got {type(plan).__name__}")
    if plan.page_size is None:
        raise ArgumentError(f"{op}: plan: this plan was reserved but holds no schedule yet "
                            f"(DevicePlan.upload(host, q, into=plan) first)")
    return (plan.tables, plan.lengths, plan.sequence_ids, plan.positions), int(plan.page_size)


def _max_length(plan):
    """The bound on any sequence's length that a CUDA call without splits picks its split count
    for: the plan's table width in positions (static, so a rewritten plan does not retrace)."""
    return int(plan.capacity[2]) * int(plan.page_size)


def _splits(op, splits, workspace):
    if workspace is not None:
        if not isinstance(workspace, _paged.SplitWorkspace):
            raise ArgumentError(f"{op}: workspace: expected a rudnn.paged.SplitWorkspace or None, got "
                                f"{type(workspace).__name__}")
        return workspace.splits  # JAX: the handler keeps the partial results in memory of its own
    if isinstance(splits, bool) or not isinstance(splits, int):
        raise ArgumentError(f"{op}: splits: expected an int (1, or 2..32 for split-KV), got {splits!r}")
    return splits


@functools.lru_cache(maxsize=None)
def _attention_op(target, page_size, scale, causal, splits, max_length, out_shape, lse_shape, dtype):
    """The differentiable forward of `target` (rudnn_paged_attention or rudnn_paged_mla) over
    (4 metadata arrays, operands...) -> (out, lse); the metadata get no cotangent."""
    attrs = dict(page_size=np.int64(page_size), scale=np.float64(scale), causal=bool(causal))

    def call(*args):
        return jax.ffi.ffi_call(target, (_ffi.sds(out_shape, dtype), _ffi.sds(lse_shape, jnp.float32)),
                                vmap_method="sequential")(*args, splits=np.int32(splits),
                                                          max_length=np.int64(max_length), **attrs)

    def bwd(saved, cotangents):
        dout, dlse = cotangents
        meta, operands = saved[:4], saved[4:]
        results = tuple(_ffi.sds(a.shape, a.dtype) for a in operands)
        grads = jax.ffi.ffi_call(target + "_backward", results, vmap_method="sequential")(
            *meta, *operands, dout.astype(dtype), dlse.astype(jnp.float32), **attrs)
        return (None,) * 4 + tuple(grads)

    f = jax.custom_vjp(call)
    f.defvjp(lambda *args: (call(*args), args), bwd)
    return jax.jit(f)


def _array(op, name, a):
    return _ffi.array(a, op, name, required=True)


@_ffi.raises_rudnn_errors
def attention(plan, q, k_cache, v_cache, scale=None, causal=False, *, splits=1, workspace=None, return_lse=False):
    """plan.attention for JAX arrays."""
    op = "paged_attention"
    _ffi.ensure_ready(op)
    meta, page_size = _meta(op, plan)
    q, k_cache, v_cache = _array(op, "q", q), _array(op, "k_cache", k_cache), _array(op, "v_cache", v_cache)
    D = q.shape[-1] if q.ndim else 1
    scale = D ** -0.5 if scale is None else _number(op, "scale", scale, "a finite value > 0")
    shape = (q.shape[0], q.shape[1], v_cache.shape[-1]) if q.ndim == 3 and v_cache.ndim == 4 else (0,)
    lse_shape = shape[:2] if len(shape) == 3 else (0,)
    f = _attention_op("rudnn_paged_attention", page_size, float(scale), _flag(op, "causal", causal),
                      _splits(op, splits, workspace), _max_length(plan), shape, lse_shape, q.dtype)
    out, lse = f(*meta, q, k_cache, v_cache)
    return (out, lse) if _flag(op, "return_lse", return_lse) else out


@_ffi.raises_rudnn_errors
def mla(plan, q, qp, latent, kp, scale, causal=False, *, splits=1, workspace=None, return_lse=False):
    """plan.mla for JAX arrays."""
    op = "paged_mla"
    _ffi.ensure_ready(op)
    meta, page_size = _meta(op, plan)
    q, qp = _array(op, "q", q), _array(op, "qp", qp)
    latent, kp = _array(op, "latent", latent), _array(op, "kp", kp)
    shape = tuple(q.shape) if q.ndim == 3 else (0,)
    lse_shape = shape[:2] if len(shape) == 3 else (0,)
    f = _attention_op("rudnn_paged_mla", page_size, _number(op, "scale", scale, "a finite value > 0"),
                      _flag(op, "causal", causal), _splits(op, splits, workspace), _max_length(plan), shape,
                      lse_shape, q.dtype)
    out, lse = f(*meta, q, qp, latent, kp)
    return (out, lse) if _flag(op, "return_lse", return_lse) else out


@functools.lru_cache(maxsize=None)
def _append_op(page_size, k_shape, k_dtype, v_shape, v_dtype):
    def call(*args):
        return jax.ffi.ffi_call("rudnn_paged_append", (_ffi.sds(k_shape, k_dtype), _ffi.sds(v_shape, v_dtype)),
                                vmap_method="sequential", input_output_aliases={6: 0, 7: 1})(
                                    *args, page_size=np.int64(page_size))

    return jax.jit(call)


@_ffi.raises_rudnn_errors
def append(plan, k, v, k_cache, v_cache):
    """plan.append for JAX arrays: returns new (k_cache, v_cache) holding the rows (the inputs are
    aliased to the results, so donated caches are updated in place)."""
    op = "paged_append"
    _ffi.ensure_ready(op)
    meta, page_size = _meta(op, plan)
    k, v = _array(op, "k", k), _array(op, "v", v)
    k_cache, v_cache = _array(op, "k_cache", k_cache), _array(op, "v_cache", v_cache)
    f = _append_op(page_size, tuple(k_cache.shape), k_cache.dtype, tuple(v_cache.shape), v_cache.dtype)
    return f(*meta, k, v, k_cache, v_cache)


def _ordered(op, workspace, plan):
    """The attributes and index operand of an OrderedBackwardWorkspace made for a JAX plan, or None."""
    if workspace is None:
        return None
    if not isinstance(workspace, _paged.OrderedBackwardWorkspace):
        raise ArgumentError(f"{op}: workspace: expected a rudnn.paged.OrderedBackwardWorkspace or None, got "
                            f"{type(workspace).__name__}")
    if workspace.framework != "jax":
        raise DeviceError(f"{op}: workspace: expected a workspace made for a JAX q, got a {workspace.framework} one")
    if plan.host is not None and plan.host is not workspace.host:
        raise ArgumentError(f"{op}: workspace: made for another schedule (the plan was rewritten by "
                            f"DevicePlan.upload(..., into=plan) or is another plan); make the "
                            f"OrderedBackwardWorkspace again")
    (pruning, row_cache, compaction, queries, heads, pages, _, listed, inactive, readers, cached,
     _) = workspace._layout
    attrs = dict(query_pruning=bool(pruning), history_row_cache=bool(row_cache), history_compaction=bool(compaction),
                 queries=np.int64(queries), heads=np.int64(heads), pages=np.int64(pages), listed=np.int64(listed),
                 inactive=np.int64(inactive), readers=np.int64(readers), cached=np.int64(cached))
    return attrs, jnp.asarray(workspace.buffer)


def _backward(op, target, plan, operands, dout, scale, causal, need, names, dlse, workspace=None):
    _ffi.ensure_ready(op)
    meta, page_size = _meta(op, plan)
    ordered = _ordered(op, workspace, plan)
    want = _paged._need(op, need, names)
    operands = [_array(op, n, a) for n, a in zip(("q",) + names[1:], operands)]
    dout = _array(op, "dout", dout)
    q = operands[0]
    lse_shape = tuple(q.shape[:2]) if q.ndim == 3 else (0,)
    dlse = jnp.zeros(lse_shape, jnp.float32) if dlse is None else _array(op, "dlse", dlse)
    results = tuple(_ffi.sds(a.shape, a.dtype) for a in operands)
    attrs = dict(page_size=np.int64(page_size), scale=np.float64(scale), causal=bool(causal))
    extra, aliases = (), {}
    if ordered is not None:  # the index aliases one more result, where the backward writes its scratch
        index = ordered[1]
        target, extra = target + "_ordered", (index,)
        aliases = {4 + len(operands) + 2: len(results)}
        results = results + (_ffi.sds(index.shape, index.dtype),)
        attrs.update(ordered[0])
    grads = jax.ffi.ffi_call(target, results, vmap_method="sequential", input_output_aliases=aliases)(
        *meta, *operands, dout, dlse, *extra, **attrs)
    return tuple(g if want[n] else None for n, g in zip(names, grads[:len(names)]))


@_ffi.raises_rudnn_errors
def attention_backward(plan, q, k_cache, v_cache, dout, scale=None, causal=False, *, need=("dq", "dk", "dv"),
                       workspace=None, dlse=None):
    """plan.attention_backward for JAX arrays: (dq, dk_cache, dv_cache), None where not in need."""
    op = "paged_attention_backward"
    D = q.shape[-1] if q.ndim else 1
    scale = D ** -0.5 if scale is None else _number(op, "scale", scale, "a finite value > 0")
    return _backward(op, "rudnn_paged_attention_backward", plan, (q, k_cache, v_cache), dout, scale,
                     _flag(op, "causal", causal), need, ("dq", "dk", "dv"), dlse, workspace)


@_ffi.raises_rudnn_errors
def mla_backward(plan, q, qp, latent, kp, dout, scale, causal=False, *, need=("dq", "dqp", "dlatent", "dkp"),
                 workspace=None, dlse=None):
    """plan.mla_backward for JAX arrays: (dq, dqp, dlatent, dkp), None where not in need."""
    op = "paged_mla_backward"
    return _backward(op, "rudnn_paged_mla_backward", plan, (q, qp, latent, kp), dout,
                     _number(op, "scale", scale, "a finite value > 0"), _flag(op, "causal", causal), need,
                     ("dq", "dqp", "dlatent", "dkp"), dlse, workspace)
