"""rudnn for JAX: the CTC loss as XLA FFI custom calls, differentiable with custom_vjp.

Same arguments and results as ``rudnn.ctc_loss``; ``rudnn.ctc_loss`` called with JAX arrays
comes here. The calls run on the "cpu" and "CUDA" platforms. libruDNN reads the targets and
lengths on the host: on CUDA the handler copies them from the GPU on XLA's stream and waits for
it, a synchronization per call (as torch's ctc_loss makes with CUDA lengths; the handlers are
registered without XLA's command-buffer trait, so XLA never captures them in a CUDA graph). The
option checks run when the call is traced; the checks of the values (lengths, labels) run as XLA
runs the call: an eager call raises them as rudnn errors, a jitted one as XLA's runtime error
with the same message.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import ctc as _ctc
from .._args import flag as _flag
from . import _ffi

__all__ = ["ctc_loss", "ctc_loss_backward"]


def _ints(op, name, v):
    """A JAX integer array as it is, anything else through rudnn.ctc's host conversion."""
    if isinstance(v, jax.Array):
        return v
    return jnp.asarray(_ctc.host_ints(op, name, v))


def _attrs(blank, reduction, zero_infinity):
    return dict(blank=np.int64(blank), reduction=np.int32(reduction), zero_infinity=bool(zero_infinity))


def _forward(log_probs, targets, il, tl, options):
    shape = (log_probs.shape[1],) if options[1] == 0 else ()
    return jax.ffi.ffi_call("rudnn_ctc_loss_forward", _ffi.sds(shape, log_probs.dtype), vmap_method="sequential")(
        log_probs, targets, il, tl, **_attrs(*options))


def _backward(dloss, log_probs, targets, il, tl, options):
    return jax.ffi.ffi_call("rudnn_ctc_loss_backward", _ffi.sds(log_probs.shape, log_probs.dtype),
                            vmap_method="sequential")(dloss.astype(log_probs.dtype), log_probs, targets, il, tl,
                                                      **_attrs(*options))


@functools.lru_cache(maxsize=None)
def _op(options):
    """The differentiable loss of (log_probs, targets, input_lengths, target_lengths) for one
    (blank, reduction code, zero_infinity); the integer inputs get no cotangent."""
    loss = jax.custom_vjp(lambda lp, t, il, tl: _forward(lp, t, il, tl, options))
    loss.defvjp(lambda lp, t, il, tl: (_forward(lp, t, il, tl, options), (lp, t, il, tl)),
                lambda saved, dloss: (_backward(dloss, *saved, options), None, None, None))
    return jax.jit(loss)


def _prepare(op, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    """The batched (T, N, C) arrays and the static options; batch-less inputs get a batch of one."""
    _ffi.ensure_ready(op)
    log_probs = _ffi.array(log_probs, op, "log_probs", required=True)
    targets = _ints(op, "targets", targets)
    il, tl = _ints(op, "input_lengths", input_lengths), _ints(op, "target_lengths", target_lengths)
    options = (_ctc.blank_index(op, blank), _ctc.reduction_code(op, reduction), _flag(op, "zero_infinity",
                                                                                      zero_infinity))
    batched = log_probs.ndim != 2
    if not batched:
        log_probs = log_probs[:, None, :]
        targets = targets[None] if targets.ndim == 1 else targets
        il, tl = il.reshape(-1), tl.reshape(-1)
    return batched, log_probs, targets, il, tl, options


@_ffi.raises_rudnn_errors
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """rudnn.ctc_loss for JAX arrays (differentiable in log_probs)."""
    batched, lp, t, il, tl, options = _prepare("ctc_loss", log_probs, targets, input_lengths, target_lengths, blank,
                                               reduction, zero_infinity)
    loss = _op(options)(lp, t, il, tl)
    return loss if batched or options[1] != 0 else loss.reshape(())


@_ffi.raises_rudnn_errors
def ctc_loss_backward(dloss, log_probs, targets, input_lengths, target_lengths, *, blank=0, reduction="mean",
                      zero_infinity=False):
    """rudnn.ctc_loss_backward for JAX arrays."""
    op = "ctc_loss_backward"
    batched, lp, t, il, tl, options = _prepare(op, log_probs, targets, input_lengths, target_lengths, blank,
                                               reduction, zero_infinity)
    dloss = _ffi.array(dloss, op, "dloss", required=True)
    if not batched and options[1] == 0:
        dloss = dloss.reshape((1,))
    grad = _backward(dloss, lp, t, il, tl, options)
    return grad if batched else grad[:, 0, :]
