"""Paged KV-cache attention and MLA (SPEC section 3).

Inference servers keep K/V in fixed-size physical pages; a schedule maps sequences to pages.

- ``HostPlan(page_size, pages, tables, lengths, sequence_ids, positions)`` validates a schedule on
  the host (in libruDNN, the one validation both backends share). ``tables[s]`` lists the physical
  pages of sequence s in order (a list of per-sequence lists or 1-D integer arrays, or a 2-D
  integer array ``[num_seqs, max_pages]`` such as vLLM's block table, whose entries past a
  sequence's ``ceil(length / page_size)`` pages are ignored); ``lengths[s]`` is its KV length;
  packed query row r belongs to sequence ``sequence_ids[r]`` at absolute position
  ``positions[r] < lengths[sequence_ids[r]]``. Integer lists or host arrays (NumPy, CPU torch).
  A failure names the argument and the row (``tables[3][7] = 912 >= pages = 900``). A page may
  appear in several tables (shared prefixes).
- ``DevicePlan.upload(host_plan, q)`` packs the schedule into int32 arrays of q's framework on
  q's device (the only place host metadata is copied to a device). ``DevicePlan.reserve(q,
  max_queries, max_seqs, max_pages)`` makes an empty plan of that capacity and
  ``DevicePlan.upload(host_plan, q, into=plan)`` rewrites its arrays in place (same memory), so
  that code captured over ``plan.attention`` sees the new schedule.
- ``plan.attention``, ``plan.mla``, ``plan.append``; ``SplitWorkspace`` for split-KV.
- ``plan.attention_backward``, ``plan.mla_backward``; ``OrderedBackwardWorkspace`` for the ordered
  (bitwise run-to-run deterministic) backward.

A JAX q gives a plan of JAX arrays (rudnn.jax.paged), whose calls run through XLA FFI.

Every op runs on the CPU (the reference backend) and on CUDA (cpp/src/paged/forward_cuda.cu for
the forward and append, backward_cuda.cu for the backward; compiled and checked by host
emulation, not yet run on a GPU).
"""

from __future__ import annotations

import math
import operator

import numpy as np

from . import _C
from . import _frameworks as fw
from ._args import flag
from ._args import number as _number
from .errors import ArgumentError, DeviceError, DTypeError, ShapeError, UnsupportedError

__all__ = ["HostPlan", "DevicePlan", "SplitWorkspace", "OrderedBackwardWorkspace", "last_algorithm"]


def _int(op, name, value, low):
    """A Python/NumPy integer >= low (not a bool or a float)."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ArgumentError(f"{op}: {name}: expected an integer >= {low}, got {value!r}") from None
    if v < low:
        raise ArgumentError(f"{op}: {name}: expected an integer >= {low}, got {v}")
    return v


_CARRIED = ("int32", "int64", "uint32", "uint8")


def _host_array(op, name, value):
    """A host NumPy view of a list, a NumPy array or a CPU torch tensor. libruDNN checks the
    dtype; integer dtypes it has no type for (int8, int16, uint16, uint64) are widened to int64
    here, and the non-integer ones it cannot receive (float64, complex, ...) raise the same
    DTypeError here."""
    a = _as_numpy(op, name, value)
    if a.dtype.name in _CARRIED or a.dtype.name in fw.DTYPES:
        return a
    if a.dtype.kind in "iu" and (a.dtype.kind == "i" or a.size == 0 or a.max() <= np.iinfo(np.int64).max):
        return a.astype(np.int64)
    raise DTypeError(f"{op}: {name}: expected an integer dtype (int32, int64, uint32 or uint8), got {a.dtype.name}")


def _as_numpy(op, name, value):
    if isinstance(value, np.ndarray):
        return value
    kind = fw._module_of(value)
    if kind == "torch":
        if value.device.type != "cpu":
            raise DeviceError(f"{op}: {name}: expected a host (CPU) array or a list, got a torch tensor on "
                              f"{value.device}")
        return value.detach().numpy()
    if kind in ("cupy", "jax"):
        if kind == "jax" and all(d.platform == "cpu" for d in value.devices()):
            return np.asarray(value)
        raise DeviceError(f"{op}: {name}: expected a host (CPU) array or a list, got a {kind} device array")
    if isinstance(value, (list, tuple)):
        if len(value) == 0:
            return np.zeros((0,), np.int64)
        try:
            return np.asarray(value)
        except ValueError:
            raise ShapeError(f"{op}: {name}: expected a 1-D list of integers, got a ragged or nested list") from None
    raise ArgumentError(f"{op}: {name}: expected a list of integers or a host integer array, got "
                        f"{type(value).__module__}.{type(value).__name__}")


def _tables(op, tables):
    """(tables [num_seqs, width], table_sizes [num_seqs] or None) from a 2-D array or a list of
    per-sequence lists / 1-D arrays (padded with 0 past each row's size)."""
    if isinstance(tables, (list, tuple)):
        rows = []
        for s, row in enumerate(tables):
            a = _host_array(op, f"tables[{s}]", row)
            if a.ndim != 1:
                raise ShapeError(f"{op}: tables[{s}]: expected a 1-D list of page ids, got shape {tuple(a.shape)}")
            rows.append(a)
        width = max((len(r) for r in rows), default=0)
        dtype = np.result_type(*[r.dtype for r in rows if len(r)]) if any(len(r) for r in rows) else np.int64
        padded = np.zeros((len(rows), width), dtype=dtype)
        for s, r in enumerate(rows):
            padded[s, :len(r)] = r
        return padded, np.array([len(r) for r in rows], dtype=np.int64)
    a = _host_array(op, "tables", tables)
    if a.ndim != 2:
        raise ShapeError(f"{op}: tables: expected a list of per-sequence page lists or a 2-D array "
                         f"[num_seqs, max_pages], got shape {tuple(a.shape)}")
    return a, None


class HostPlan:
    """A validated schedule on the host (see the module docstring)."""

    def __init__(self, page_size, pages, tables, lengths, sequence_ids, positions):
        op = "HostPlan"
        self.page_size = _int(op, "page_size", page_size, 1)
        self.pages = _int(op, "pages", pages, 0)
        self._tables, self._table_sizes = _tables(op, tables)
        self._lengths = _host_array(op, "lengths", lengths)
        self._sequence_ids = _host_array(op, "sequence_ids", sequence_ids)
        self._positions = _host_array(op, "positions", positions)
        info = _C.paged_schedule_info(**self._args())
        (self.num_seqs, self.queries, self.max_pages, self.max_length, dup_row, dup_of, self._duplicate) = info
        self.duplicate_rows = None if dup_row < 0 else (dup_of, dup_row)

    def _args(self):
        return dict(page_size=self.page_size, pages=self.pages, tables=self._tables, table_sizes=self._table_sizes,
                    lengths=self._lengths, sequence_ids=self._sequence_ids, positions=self._positions)

    def __repr__(self):
        return (f"HostPlan(page_size={self.page_size}, pages={self.pages}, num_seqs={self.num_seqs}, "
                f"queries={self.queries}, max_pages={self.max_pages})")


class DevicePlan:
    """A schedule's int32 metadata on one device: ``tables [num_seqs, width]``, ``lengths
    [num_seqs]``, ``sequence_ids [queries]``, ``positions [queries]``, arrays of the framework of
    the q it was made for. Reuse it only while the schedule is unchanged (or rewrite it with
    ``upload(..., into=plan)``)."""

    def __init__(self, call, page_size, capacity):
        self._call = call
        self.device = call.device
        self.framework = call.fw.name
        self.page_size = page_size
        self.capacity = capacity  # (max_queries, max_seqs, width)
        q_cap, s_cap, width = capacity
        self._buffers = (call.zeros((s_cap, width), "int32"), call.zeros((s_cap,), "int32"),
                         call.zeros((q_cap,), "int32"), call.zeros((q_cap,), "int32"))
        self._set_views(0, 0)
        self.host = None

    def _set_views(self, queries, num_seqs):
        t, ln, sq, ps = self._buffers
        self.queries, self.num_seqs = queries, num_seqs
        self.tables, self.lengths = t[:num_seqs], ln[:num_seqs]
        self.sequence_ids, self.positions = sq[:queries], ps[:queries]

    @classmethod
    def reserve(cls, q, max_queries, max_seqs, max_pages):
        """An empty plan on q's device able to hold schedules of up to max_queries query rows,
        max_seqs sequences and max_pages pages per sequence (fill it with upload(..., into=))."""
        op = "DevicePlan.reserve"
        if fw.is_jax(q):
            from .jax import paged as jpaged

            return jpaged.reserve(q, max_queries, max_seqs, max_pages)
        cap = (_int(op, "max_queries", max_queries, 0), _int(op, "max_seqs", max_seqs, 0),
               _int(op, "max_pages", max_pages, 0))
        call = _plan_call(op, q)
        return cls(call, None, cap)

    @classmethod
    def upload(cls, host, q, into=None):
        """The plan of `host` on q's device; with into=plan, `plan` rewritten in place and returned."""
        op = "DevicePlan.upload"
        if not isinstance(host, HostPlan):
            raise ArgumentError(f"{op}: host: expected a rudnn.paged.HostPlan, got {type(host).__name__}")
        if fw.is_jax(q):
            from .jax import paged as jpaged

            return jpaged.upload(host, q, into)
        call = _plan_call(op, q)
        need = (host.queries, host.num_seqs, host.max_pages)
        if into is None:
            plan = cls(call, host.page_size, need)
        else:
            if not isinstance(into, DevicePlan):
                raise ArgumentError(f"{op}: into: expected a rudnn.paged.DevicePlan, got {type(into).__name__}")
            if into.framework != call.fw.name or into.device != call.device:
                raise DeviceError(f"{op}: into: expected a plan of q's framework and device "
                                  f"({call.fw.name} {fw._fmt(call.device)}), got {into.framework} "
                                  f"{fw._fmt(into.device)}")
            names = ("query rows (max_queries)", "sequences (max_seqs)", "pages per sequence (max_pages)")
            for n, have, what in zip(need, into.capacity, names):
                if n > have:
                    raise ShapeError(f"{op}: into: the schedule needs {n} {what}, the plan holds {have} "
                                     f"(make it with DevicePlan.reserve of a larger capacity)")
            plan = into
            plan.page_size = host.page_size
        t, ln, sq, ps = plan._buffers
        if call.device[0] == "cpu":
            _C.paged_pack_schedule(**host._args(), out_tables=call.arg(t), out_lengths=call.arg(ln),
                                   out_sequence_ids=call.arg(sq), out_positions=call.arg(ps))
        else:
            # Packed on the host, then copied into the device buffers on q's stream (no
            # synchronization: a captured CUDA graph reads these buffers in place).
            staged = [np.zeros(tuple(b.shape), np.int32) for b in plan._buffers]
            _C.paged_pack_schedule(**host._args(), out_tables=staged[0], out_lengths=staged[1],
                                   out_sequence_ids=staged[2], out_positions=staged[3])
            for dst, src in zip(plan._buffers, staged):
                call.copy_from_host(dst, src)
        plan._set_views(host.queries, host.num_seqs)
        plan.host = host
        return plan

    # ---- ops ------------------------------------------------------------------------------

    def _meta(self, call, op):
        return _meta(self, call, op)

    def attention(self, q, k_cache, v_cache, scale=None, causal=False, *, workspace=None, return_lse=False,
                  out=None, stream=None):
        """Paged attention: q [queries, Hq, D], k_cache [pages, page_size, Hkv, D], v_cache
        [pages, page_size, Hkv, Dv] -> out [queries, Hq, Dv] in q's dtype (Hq % Hkv == 0: MHA,
        GQA, MQA; D, Dv in 1..1024). Query row r attends the KV positions of its sequence, with
        causal=True only those <= positions[r]. scale: default 1/sqrt(D). workspace: a
        SplitWorkspace (split-KV). return_lse=True also returns the float32 natural-log lse
        [queries, Hq]."""
        if fw.is_jax(q):
            from .jax import paged as jpaged

            return jpaged.attention(self, q, k_cache, v_cache, scale=scale, causal=causal, workspace=workspace,
                                    return_lse=return_lse)
        return _attention(self, q, k_cache, v_cache, scale, causal, workspace, return_lse, out, stream)

    def mla(self, q, qp, latent, kp, scale, causal=False, *, workspace=None, return_lse=False, out=None,
            stream=None):
        """Paged MLA (DeepSeek's absorbed attention): q [queries, H, R] (absorbed queries), qp
        [queries, H, P] (rotary queries), latent [pages, page_size, 1, R] (the shared latent
        cache, key and value), kp [pages, page_size, 1, P] (rotary keys) -> out [queries, H, R]
        (the compressed context). score = scale * (q . latent + qp . kp); R in 1..1024, P in
        1..256. scale is the model's original QK scale (no default). The caller applies the
        rotary embedding before and the value/output projections after."""
        if fw.is_jax(q):
            from .jax import paged as jpaged

            return jpaged.mla(self, q, qp, latent, kp, scale=scale, causal=causal, workspace=workspace,
                              return_lse=return_lse)
        return _mla(self, q, qp, latent, kp, scale, causal, workspace, return_lse, out, stream)

    def attention_backward(self, q, k_cache, v_cache, dout, scale=None, causal=False, *, need=("dq", "dk", "dv"),
                           workspace=None, dlse=None, stream=None):
        """Gradients (dq, dk_cache, dv_cache) of plan.attention for the output gradient dout
        [queries, Hq, Dv], the probabilities recomputed. need= names the gradients to compute (the
        others come back as None). Cache gradients have the caches' shapes: zero in slots no row
        sees, the sum over every sequence reading a slot (shared pages). By default the CUDA backend
        adds the history gradients with float32 atomics (the CPU backend sums in a fixed order);
        workspace=OrderedBackwardWorkspace(plan, q) runs the ordered algorithm on either backend
        (bitwise run-to-run deterministic). dlse (float32 [queries, Hq]), the gradient with respect
        to lse, adds the path through lse."""
        if fw.is_jax(q):
            from .jax import paged as jpaged

            return jpaged.attention_backward(self, q, k_cache, v_cache, dout, scale, causal, need=need,
                                             workspace=workspace, dlse=dlse)
        return _attention_backward(self, q, k_cache, v_cache, dout, scale, causal, need, workspace, stream, dlse)

    def mla_backward(self, q, qp, latent, kp, dout, scale, causal=False, *, need=("dq", "dqp", "dlatent", "dkp"),
                     workspace=None, dlse=None, stream=None):
        """Gradients (dq, dqp, dlatent, dkp) of plan.mla; dlatent holds both the key and the
        value contributions. need= as in attention_backward."""
        if fw.is_jax(q):
            from .jax import paged as jpaged

            return jpaged.mla_backward(self, q, qp, latent, kp, dout, scale, causal, need=need, workspace=workspace,
                                       dlse=dlse)
        return _mla_backward(self, q, qp, latent, kp, dout, scale, causal, need, workspace, stream, dlse)

    def append(self, k, v, k_cache, v_cache, *, stream=None):
        """Writes row r of k [queries, Hkv, D] and v [queries, Hkv, Dv] into the slot of position
        positions[r] of sequence sequence_ids[r] of k_cache / v_cache, in place, and returns
        (k_cache, v_cache). For MLA pass the latent rows as k ([queries, 1, R]) and the rotary
        key rows as v ([queries, 1, P]). Two rows naming the same physical slot are an
        ArgumentError raised before anything is written."""
        if fw.is_jax(k):
            from .jax import paged as jpaged

            return jpaged.append(self, k, v, k_cache, v_cache)
        return _append(self, k, v, k_cache, v_cache, stream)

    def __repr__(self):
        return (f"DevicePlan({self.framework} {fw._fmt(self.device)}, page_size={self.page_size}, "
                f"queries={self.queries}, num_seqs={self.num_seqs}, capacity={self.capacity})")


def _meta(plan, call, op):
    """The _C arguments of a plan's metadata (a DevicePlan, or any object with page_size, tables,
    lengths, sequence_ids, positions of the call's framework)."""
    if isinstance(plan, DevicePlan):
        self = plan
        if self.page_size is None:
            raise ArgumentError(f"{op}: plan: this plan was reserved but holds no schedule yet "
                                f"(DevicePlan.upload(host, q, into=plan) first)")
        if call.fw.name != self.framework or call.device != self.device:
            raise DeviceError(f"{op}: plan: expected the framework and device of the plan ({self.framework} "
                              f"{fw._fmt(self.device)}), got {call.fw.name} {fw._fmt(call.device)}")
    return dict(page_size=plan.page_size, tables=call.arg(plan.tables), lengths=call.arg(plan.lengths),
                sequence_ids=call.arg(plan.sequence_ids), positions=call.arg(plan.positions))


def _attention(plan, q, k_cache, v_cache, scale, causal, workspace, return_lse, out, stream):
    op = "paged_attention"
    call = fw.Call(op, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "out": out}, stream)
    meta = _meta(plan, call, op)
    return_lse = flag(op, "return_lse", return_lse)
    causal = flag(op, "causal", causal)
    D = q.shape[-1] if len(q.shape) else 1
    scale = 1.0 / math.sqrt(max(D, 1)) if scale is None else _number(op, "scale", scale, "a finite value > 0")
    qs, vs = tuple(q.shape), tuple(v_cache.shape)
    shape = (qs[0], qs[1], vs[3]) if len(qs) == 3 and len(vs) == 4 else (0,)
    o = out if out is not None else call.empty(shape, call.dtype_name(q))
    lse = call.empty(shape[:2] if len(shape) == 3 else (0,), "float32") if return_lse else None
    splits, ws = _workspace(op, workspace, call, shape)
    _C.paged_attention(**meta, q=call.arg(q), k_cache=call.arg(k_cache), v_cache=call.arg(v_cache), scale=scale,
                       causal=causal, out=call.arg(o), lse=call.arg(lse), splits=splits, workspace=call.arg(ws),
                       stream=call.stream, **_auto_split(plan, call, ws))
    return (o, lse) if return_lse else o


def _mla(plan, q, qp, latent, kp, scale, causal, workspace, return_lse, out, stream):
    op = "paged_mla"
    call = fw.Call(op, {"q": q, "qp": qp, "latent": latent, "kp": kp, "out": out}, stream)
    meta = _meta(plan, call, op)
    return_lse = flag(op, "return_lse", return_lse)
    causal = flag(op, "causal", causal)
    scale = _number(op, "scale", scale, "a finite value > 0")
    qs = tuple(q.shape)
    shape = qs if len(qs) == 3 else (0,)
    o = out if out is not None else call.empty(shape, call.dtype_name(q))
    lse = call.empty(shape[:2] if len(shape) == 3 else (0,), "float32") if return_lse else None
    splits, ws = _workspace(op, workspace, call, shape)
    _C.paged_mla(**meta, q=call.arg(q), qp=call.arg(qp), latent=call.arg(latent), kp=call.arg(kp), scale=scale,
                 causal=causal, out=call.arg(o), lse=call.arg(lse), splits=splits, workspace=call.arg(ws),
                 stream=call.stream, **_auto_split(plan, call, ws))
    return (o, lse) if return_lse else o


def _auto_split(plan, call, ws):
    """Without a SplitWorkspace, a CUDA call lets the core pick a split count from the host plan's
    longest history and the device's SM count; the bindings then allocate its workspace with q's
    framework (workspace_alloc). Any count gives the same results to rounding."""
    host = getattr(plan, "host", None)
    if ws is not None or call.device[0] == "cpu" or host is None:
        return {}
    return dict(max_length=host.max_length, workspace_alloc=call.workspace_alloc)


def _need(op, need, names):
    if isinstance(need, str) or not all(isinstance(n, str) for n in (need or ())):
        raise ArgumentError(f"{op}: need: expected a tuple of gradient names from {names}, got {need!r}")
    unknown = [n for n in need if n not in names]
    if unknown:
        raise ArgumentError(f"{op}: need: unknown gradient {unknown[0]!r}; expected names from {names}")
    return {n: n in need for n in names}


def _check_workspace(op, workspace, cls, call):
    """A workspace argument is a `cls` made for this call's framework, device and stream."""
    if not isinstance(workspace, cls):
        raise ArgumentError(f"{op}: workspace: expected a rudnn.paged.{cls.__name__} or None, got "
                            f"{type(workspace).__name__}")
    if workspace.framework != call.fw.name or workspace.device != call.device:
        raise DeviceError(f"{op}: workspace: expected a workspace of q's framework and device ({call.fw.name} "
                          f"{fw._fmt(call.device)}), got {workspace.framework} {fw._fmt(workspace.device)}")
    if workspace.stream != call.stream:
        raise ArgumentError(f"{op}: workspace: made for stream {workspace.stream:#x}, used on stream "
                            f"{call.stream:#x} (a workspace serves one stream)")


def _ordered(op, workspace, plan, call, q):
    """(layout, buffer capsule) of an OrderedBackwardWorkspace argument, or (None, None)."""
    if workspace is None:
        return None, None
    _check_workspace(op, workspace, OrderedBackwardWorkspace, call)
    host = getattr(plan, "host", None)
    if isinstance(plan, DevicePlan) and host is not workspace.host:
        raise ArgumentError(f"{op}: workspace: made for another schedule (the plan was rewritten by "
                            f"DevicePlan.upload(..., into=plan) or is another plan); make the "
                            f"OrderedBackwardWorkspace again")
    return workspace._layout, call.arg(workspace.buffer)


def _attention_backward(plan, q, k_cache, v_cache, dout, scale, causal, need, workspace, stream, dlse=None):
    op = "paged_attention_backward"
    call = fw.Call(op, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "dout": dout, "dlse": dlse}, stream)
    meta = _meta(plan, call, op)
    want = _need(op, need, ("dq", "dk", "dv"))
    layout, buffer = _ordered(op, workspace, plan, call, q)
    causal = flag(op, "causal", causal)
    D = q.shape[-1] if len(q.shape) else 1
    scale = 1.0 / math.sqrt(max(D, 1)) if scale is None else _number(op, "scale", scale, "a finite value > 0")
    dq = call.empty(tuple(q.shape), call.dtype_name(q)) if want["dq"] else None
    dk = call.empty(tuple(k_cache.shape), call.dtype_name(k_cache)) if want["dk"] else None
    dv = call.empty(tuple(v_cache.shape), call.dtype_name(v_cache)) if want["dv"] else None
    _C.paged_attention_backward(**meta, q=call.arg(q), k_cache=call.arg(k_cache), v_cache=call.arg(v_cache),
                                dout=call.arg(dout), scale=scale, causal=causal, dq=call.arg(dq), dk_cache=call.arg(dk),
                                dv_cache=call.arg(dv), dlse=call.arg(dlse), ordered_layout=layout,
                                ordered_buffer=buffer, stream=call.stream, workspace_alloc=call.workspace_alloc)
    return dq, dk, dv


def _mla_backward(plan, q, qp, latent, kp, dout, scale, causal, need, workspace, stream, dlse=None):
    op = "paged_mla_backward"
    call = fw.Call(op, {"q": q, "qp": qp, "latent": latent, "kp": kp, "dout": dout, "dlse": dlse}, stream)
    meta = _meta(plan, call, op)
    want = _need(op, need, ("dq", "dqp", "dlatent", "dkp"))
    layout, buffer = _ordered(op, workspace, plan, call, q)
    causal = flag(op, "causal", causal)
    scale = _number(op, "scale", scale, "a finite value > 0")
    grads = {n: call.empty(tuple(a.shape), call.dtype_name(a)) if want[n] else None
             for n, a in (("dq", q), ("dqp", qp), ("dlatent", latent), ("dkp", kp))}
    _C.paged_mla_backward(**meta, q=call.arg(q), qp=call.arg(qp), latent=call.arg(latent), kp=call.arg(kp),
                          dout=call.arg(dout), scale=scale, causal=causal,
                          **{n: call.arg(g) for n, g in grads.items()}, dlse=call.arg(dlse), ordered_layout=layout,
                          ordered_buffer=buffer, stream=call.stream, workspace_alloc=call.workspace_alloc)
    return grads["dq"], grads["dqp"], grads["dlatent"], grads["dkp"]


def _append(plan, k, v, k_cache, v_cache, stream):
    op = "paged_append"
    call = fw.Call(op, {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache}, stream,
                   outputs=("k_cache", "v_cache"))
    meta = _meta(plan, call, op)
    _refuse_duplicate_slots(op, plan, call.device)
    _C.paged_append(**meta, k=call.arg(k), v=call.arg(v), k_cache=call.arg(k_cache), v_cache=call.arg(v_cache),
                    stream=call.stream)
    return k_cache, v_cache

def _refuse_duplicate_slots(op, plan, device):
    """The CPU backend finds duplicate slots in the metadata itself; for a device plan the host
    plan found them when it was validated (the same check, first_duplicate in validate.cpp), and
    the append is refused here, before anything is written."""
    host = getattr(plan, "host", None)
    if device[0] != "cpu" and host is not None and host._duplicate:
        raise ArgumentError(f"{op}: {host._duplicate}; nothing was written")


def _shape_only(q):
    """q when only its framework, device and stream matter: a torch tensor detached, so that one
    that requires grad is not reported as an eager op's input that records no autograd."""
    return q.detach() if fw._module_of(q) == "torch" else q


def _plan_call(op, q):
    return fw.Call(op, {"q": _shape_only(q)})


class SplitWorkspace:
    """Float32 scratch for split-KV: partial out and lse of `splits` (2..32) chunks of each
    row's history for `queries` rows of `heads` heads of `value_dim` values, allocated with q's
    framework on q's device, at most 64 MiB. Reuse it only for the same shape on the same stream."""

    def __init__(self, q, queries, heads, value_dim, splits, *, stream=None):
        op = "SplitWorkspace"
        self.queries = _int(op, "queries", queries, 0)
        self.heads = _int(op, "heads", heads, 1)
        self.value_dim = _int(op, "value_dim", value_dim, 1)
        self.splits = _int(op, "splits", splits, 0)
        self.nbytes = _C.paged_split_workspace_bytes(self.queries, self.heads, self.value_dim, self.splits)
        call = fw.Call(op, {"q": _shape_only(q)}, stream)
        self.device, self.framework, self.stream = call.device, call.fw.name, call.stream
        self.buffer = call.empty((self.nbytes,), "uint8")

    def __repr__(self):
        return (f"SplitWorkspace(queries={self.queries}, heads={self.heads}, value_dim={self.value_dim}, "
                f"splits={self.splits}, nbytes={self.nbytes})")


def _workspace(op, workspace, call, out_shape):
    """(splits, buffer) of a SplitWorkspace argument."""
    if workspace is None:
        return 1, None
    _check_workspace(op, workspace, SplitWorkspace, call)
    shape = (workspace.queries, workspace.heads, workspace.value_dim)
    if len(out_shape) == 3 and tuple(out_shape) != shape:
        raise ShapeError(f"{op}: workspace: made for [queries, heads, value_dim] = {list(shape)}, the output is "
                         f"{list(out_shape)} (a workspace serves one shape)")
    return workspace.splits, workspace.buffer


def _env_switches():
    """(history_row_cache, history_compaction) from the environment (libruDNN reads and checks it)."""
    return _C.paged_ordered_env()


class OrderedBackwardWorkspace:
    """The ordered (fixed summation order, bitwise run-to-run deterministic) paged backward, for
    one plan's schedule and q's head count: pass it as ``workspace=`` to ``plan.attention_backward``
    / ``plan.mla_backward``. It holds (allocated with q's framework on q's device, at most 64 MiB,
    ``bytes()`` its size) an index of the schedule built on the host when it is made, and scratch
    each backward overwrites (so one call at a time, on the stream it was made for). The
    algorithm: a row pass computes every (row, head)'s lse and delta = dout . out - dlse and dq
    (one writer per row); a history pass gives each page slot its gradient by walking the page's
    readers (query rows, ascending; under causal masking those that see the page first) in that
    fixed order, one writer per slot, no atomics. The options:

    - ``query_pruning`` (default True): a causal call visits only the readers whose position
      reaches the page, and (row, head) pairs with a zero dout row and zero dlse are skipped in
      both passes (their terms are exactly zero). Off, every reader and pair is computed and
      masked. Same bits either way; only the work differs.
    - ``history_row_cache`` (default False, or RUDNN_PAGED_ORDERED_CACHE_ROWS=1): the row pass
      keeps P and dS of every (row, KV position, head) in the workspace (8 bytes each, over the
      full length of each row's sequence) and the history pass reads them instead of recomputing
      the two dot products per slot and head. Same bits; a bigger workspace.
    - ``history_compaction`` (default False, or RUDNN_PAGED_ORDERED_COMPACT_HISTORY=1): history
      gradients are computed only for pages reachable from sequences that have query rows;
      the other pages get zeros without being visited. ``compaction_pages()`` gives
      ``(active, inactive)``: int64 arrays of the physical page ids of each kind.

    A JAX q gives a workspace whose index is a host array that each JAX backward passes to its
    FFI handler as an operand aliased to one more result (XLA copies it there, and the backward
    writes its scratch into that copy); under jax.jit the workspace is a constant of the traced
    function.

    The environment switches (unset or 0: off, 1: on, anything else ArgumentError) are read when
    the workspace is made and give the defaults of the two options an explicit argument overrides.
    ``configure(...)`` changes options in place; one that does not fit the 64 MiB budget raises
    ArgumentError and leaves the previous mode (options and buffer) as it was. A plan rewritten by
    ``DevicePlan.upload(..., into=plan)`` needs a new workspace."""

    def __init__(self, plan, q, query_pruning=True, history_row_cache=None, history_compaction=None, *,
                 stream=None):
        op = "OrderedBackwardWorkspace"
        if not isinstance(plan, DevicePlan):
            raise ArgumentError(f"{op}: plan: expected a rudnn.paged.DevicePlan, got {type(plan).__name__}")
        if plan.host is None:
            raise ArgumentError(f"{op}: plan: this plan was reserved but holds no schedule yet "
                                f"(DevicePlan.upload(host, q, into=plan) first)")
        if fw.is_jax(q):
            # JAX: the index stays a host array; each backward hands it to the FFI handler
            # (aliased to a result the backward writes its scratch into).
            from .jax import paged as jpaged

            jpaged._device_of(op, q)
            call, name, device, stream_handle = None, "jax", plan.device, 0
        else:
            call = fw.Call(op, {"q": _shape_only(q)}, stream)
            name, device, stream_handle = call.fw.name, call.device, call.stream
        if name != plan.framework or device != plan.device:
            raise DeviceError(f"{op}: q: expected the framework and device of the plan ({plan.framework} "
                              f"{fw._fmt(plan.device)}), got {name} {fw._fmt(device)}")
        if len(q.shape) != 3:
            raise ShapeError(f"{op}: q: expected rank 3 [queries, heads, dim], got shape {tuple(q.shape)}")
        self.host, self.heads = plan.host, int(q.shape[1])
        self.device, self.framework, self.stream = device, name, stream_handle
        self._call = call
        self._layout, self.buffer = None, None
        env_rows, env_compact = _env_switches()
        self.configure(query_pruning=query_pruning,
                       history_row_cache=env_rows if history_row_cache is None else history_row_cache,
                       history_compaction=env_compact if history_compaction is None else history_compaction)

    def configure(self, *, query_pruning=None, history_row_cache=None, history_compaction=None):
        """Changes the named options (None keeps one) and remakes the workspace; on an error
        (a budget error included) the previous mode stays."""
        op = "OrderedBackwardWorkspace"
        old = self._layout
        current = (True, False, False) if old is None else old[:3]
        wanted = [current[i] if v is None else flag(op, name, v) for i, (name, v) in enumerate(
            (("query_pruning", query_pruning), ("history_row_cache", history_row_cache),
             ("history_compaction", history_compaction)))]
        layout = _C.paged_ordered_layout(**self.host._args(), heads=self.heads, query_pruning=wanted[0],
                                         history_row_cache=wanted[1], history_compaction=wanted[2])
        call = self._call
        if call is None:  # JAX: a host array
            buffer = np.zeros((layout[-1],), np.uint8)
            _C.paged_ordered_pack(**self.host._args(), layout=layout, out=buffer)
        elif call.device[0] == "cpu":
            buffer = call.zeros((layout[-1],), "uint8")
            _C.paged_ordered_pack(**self.host._args(), layout=layout, out=call.arg(buffer))
        else:  # the index built on the host, copied on the workspace's stream (as DevicePlan.upload does)
            buffer = call.zeros((layout[-1],), "uint8")
            staged = np.zeros((layout[-1],), np.uint8)
            _C.paged_ordered_pack(**self.host._args(), layout=layout, out=staged)
            call.copy_from_host(buffer, staged)
        self.buffer = buffer
        self._layout = layout
        return self

    @property
    def query_pruning(self):
        return self._layout[0]

    @property
    def history_row_cache(self):
        return self._layout[1]

    @property
    def history_compaction(self):
        return self._layout[2]

    def bytes(self):
        """Bytes of device memory the workspace holds (index and scratch), at most 64 MiB."""
        return int(self._layout[-1])

    def compaction_pages(self):
        """(active, inactive): int64 arrays of the physical pages that sequences with query rows
        reach and of the others (whose gradients are zero), in ascending order."""
        pages = self._layout[5]
        active = np.zeros((pages,), bool)
        for r in range(self.host.queries):
            s = int(self.host._sequence_ids[r])
            n = -(-int(self.host._lengths[s]) // self.host.page_size)
            active[np.asarray(self.host._tables[s][:n], np.int64)] = True
        ids = np.arange(pages, dtype=np.int64)
        return ids[active], ids[~active]

    def __repr__(self):
        return (f"OrderedBackwardWorkspace(query_pruning={self.query_pruning}, history_row_cache="
                f"{self.history_row_cache}, history_compaction={self.history_compaction}, bytes={self.bytes()})")


def last_algorithm() -> str:
    """The path the last paged call on this thread ran: "cpu", "cuda_decode",
    "cuda_decode_split", "cuda_mixed" / "cuda_mixed_split" (the tensor-core prefill kernel was
    launched beside the decode kernel: it takes the rows of prefill runs, if any, see README),
    "cuda_mla" / "cuda_mla_split" (MLA with R = 512, P = 64 in f16/bf16 on the tensor-core MLA
    decode kernel), "cuda_append", or a backward's ("cpu_ordered", "cuda_atomic", "cuda_ordered")."""
    return _C.paged_last_algorithm()
