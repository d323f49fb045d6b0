"""rudnn for JAX: the norm/softmax ops as XLA FFI custom calls, differentiable with custom_vjp.

Same names, arguments and results as ``rudnn.<op>``; ``rudnn.<op>`` called with JAX arrays
comes here. Every call, eager or traced, is a ``jax.ffi.ffi_call`` to a libruDNN handler
registered for the "cpu" and "CUDA" platforms, so outputs are allocated by XLA and the ops
work under ``jax.jit``, ``jax.grad`` and ``jax.vmap``. On CUDA the handler runs on the stream
XLA gives it (``stream=`` is ignored); ``out=`` is not supported (JAX arrays are immutable).

Arguments are checked by libruDNN's own validation when the call is traced, so a bad call
raises ``rudnn.ShapeError``, ``rudnn.DTypeError``, ... at once, as for the other frameworks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _C
from . import _ffi

__all__ = ["layer_norm", "rms_norm", "softmax", "layer_norm_backward", "rms_norm_backward", "softmax_backward"]

_LAYER, _RMS = 0, 1  # the "kind" attribute of the norm targets
_KIND_NAME = {_LAYER: "layer", _RMS: "rms"}

# ---------------------------------------------------------------------------
# The custom calls. Norm calls take the optional operands as trailing arguments;
# the has_* attributes tell the handler which are present.
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _norm_forward_call(kind, eps, has_weight, has_bias, has_residual, want_mean, want_rstd):
    """f(x, *[weight, bias, residual]) -> (y, [h], [mean], [rstd])."""

    def call(x, *operands):
        lead = x.shape[:-1]
        results = [_ffi.sds(x.shape, x.dtype)]
        if has_residual:
            results.append(_ffi.sds(x.shape, x.dtype))
        if want_mean:
            results.append(_ffi.sds(lead, jnp.float32))
        if want_rstd:
            results.append(_ffi.sds(lead, jnp.float32))
        return jax.ffi.ffi_call("rudnn_norm_forward", tuple(results))(
            x, *operands, kind=np.int32(kind), eps=np.float32(eps), has_weight=has_weight, has_bias=has_bias,
            has_residual=has_residual, has_mean=want_mean, has_rstd=want_rstd)

    f = jax.custom_batching.custom_vmap(call)
    row_args = (True,) + (False,) * has_weight + (False,) * has_bias + (True,) * has_residual
    f.def_vmap(_ffi.row_batching_rule(f, row_args, row_only_outputs=True))
    return f


@functools.lru_cache(maxsize=None)
def _norm_backward_call(kind, has_weight, has_dweight, has_dbias):
    """f(dy, x, *[weight], [mean], rstd) -> (dx, [dweight], [dbias]); mean iff layer norm."""

    def call(dy, x, *operands):
        hidden = x.shape[-1:]
        results = [_ffi.sds(x.shape, x.dtype)]
        if has_dweight:
            results.append(_ffi.sds(hidden, jnp.float32))
        if has_dbias:
            results.append(_ffi.sds(hidden, jnp.float32))
        return jax.ffi.ffi_call("rudnn_norm_backward", tuple(results))(
            dy, x, *operands, kind=np.int32(kind), has_weight=has_weight, has_dweight=has_dweight,
            has_dbias=has_dbias)

    f = jax.custom_batching.custom_vmap(call)
    row_args = (True, True) + (False,) * has_weight + (True,) * (kind == _LAYER) + (True,)
    f.def_vmap(_ffi.row_batching_rule(f, row_args, row_only_outputs=not (has_dweight or has_dbias)))
    return f


@functools.lru_cache(maxsize=None)
def _norm_backward_op(kind, has_weight):
    """The explicit layer_norm_backward / rms_norm_backward (all parameter gradients)."""
    return jax.jit(_norm_backward_call(kind, has_weight, has_weight, kind == _LAYER))


_softmax_backward_op = jax.jit(lambda dy, y: _softmax_backward_call(dy, y))


def _softmax_forward_call(x):
    # Softmax is row-wise in and out, so vmap just adds a leading axis to every operand.
    return jax.ffi.ffi_call("rudnn_softmax_forward", _ffi.sds(x.shape, x.dtype), vmap_method="broadcast_all")(x)


def _softmax_backward_call(dy, y):
    return jax.ffi.ffi_call("rudnn_softmax_backward", _ffi.sds(y.shape, y.dtype), vmap_method="broadcast_all")(dy, y)


# ---------------------------------------------------------------------------
# Differentiable ops
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _norm_op(kind, eps, has_weight, has_bias, has_residual, return_stats):
    """custom_vjp f(x, *[weight, bias, residual]) -> tuple of the public results."""
    layer = kind == _LAYER

    def split(operands):
        it = iter(operands)
        return tuple(next(it) if present else None for present in (has_weight, has_bias, has_residual))

    def primal(x, *operands):
        call = _norm_forward_call(kind, eps, has_weight, has_bias, has_residual, layer and return_stats,
                                  return_stats)
        return call(x, *operands)

    def fwd(x, *operands):
        outs = _norm_forward_call(kind, eps, has_weight, has_bias, has_residual, layer, True)(x, *operands)
        y = outs[0]
        h = outs[1] if has_residual else x  # the tensor that was normalized
        mean = outs[-2] if layer else None
        rstd = outs[-1]
        visible = (y,) + ((h,) if has_residual else ())
        if return_stats:
            visible += ((mean, rstd) if layer else (rstd,))
        weight, bias, _ = split(operands)
        return visible, (h, weight, bias, mean, rstd)

    def bwd(saved, cotangents):
        h, weight, bias, mean, rstd = saved
        dy = cotangents[0]
        call = _norm_backward_call(kind, has_weight, has_weight, layer and has_bias)
        outs = call(dy, h, *_ffi.present(weight, mean), rstd)
        dh = outs[0]
        dweight = outs[1] if has_weight else None
        dbias = outs[-1] if has_bias else None
        if has_residual or return_stats:
            # Other paths into h: the returned h itself and the statistics. Summed in float32.
            total = dh.astype(jnp.float32)
            k = 1
            if has_residual:
                total = total + cotangents[k].astype(jnp.float32)
                k += 1
            if return_stats:
                hidden = h.shape[-1]
                centered = h.astype(jnp.float32)
                if layer:
                    mean_bar = cotangents[k]
                    centered = centered - mean[..., None]
                    total = total + (mean_bar / hidden)[..., None]  # d mean / d h = 1/H
                rstd_bar = cotangents[-1]
                # d rstd / d h = -rstd^3 (h - mean) / H  (rms: mean = 0)
                total = total - (rstd_bar * rstd**3 / hidden)[..., None] * centered
            dh = total.astype(h.dtype)
        grads = (dh,)
        if has_weight:
            grads += (dweight.astype(weight.dtype),)
        if has_bias:
            grads += (dbias.astype(bias.dtype),)
        if has_residual:
            grads += (dh,)  # h = x + residual: both get the whole gradient of h
        return grads

    op = jax.custom_vjp(primal)
    op.defvjp(fwd, bwd)
    return jax.jit(op)  # jit: eager calls take jax's fast dispatch path; inlined when traced


@jax.custom_vjp
def _softmax_op(x):
    return _softmax_forward_call(x)


def _softmax_fwd(x):
    y = _softmax_forward_call(x)
    return y, y


def _softmax_bwd(y, dy):
    return (_softmax_backward_call(dy, y),)


_softmax_op.defvjp(_softmax_fwd, _softmax_bwd)
_softmax_op = jax.jit(_softmax_op)


# ---------------------------------------------------------------------------
# Public API (the same as rudnn.<op>)
# ---------------------------------------------------------------------------


def _norm(op, kind, x, weight, bias, eps, residual, return_stats, out):
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    weight = _ffi.array(weight, op, "weight")
    bias = _ffi.array(bias, op, "bias")
    residual = _ffi.array(residual, op, "residual")
    eps = _ffi.static_float(eps, op, "eps")
    return_stats = bool(return_stats)
    _ffi.ensure_ready(op)
    _C.jax_validate_norm_forward(_KIND_NAME[kind], _ffi.spec(x), _ffi.spec(weight), _ffi.spec(bias), _ffi.spec(residual), eps,
                                 return_stats)
    f = _norm_op(kind, eps, weight is not None, bias is not None, residual is not None, return_stats)
    return _ffi.unpack(f(x, *_ffi.present(weight, bias, residual)))


@_ffi.raises_rudnn_errors
def layer_norm(x, weight=None, bias=None, eps=1e-5, *, residual=None, return_stats=False, out=None, stream=None):
    """LayerNorm over the last axis: (h - mean) / sqrt(var + eps) * weight + bias, h = x (+ residual).

    Returns y; (y, h) with ``residual``; ``return_stats=True`` appends float32 mean and rstd of
    shape x.shape[:-1]. Differentiable (jax.grad) with respect to x, weight, bias and residual.
    """
    del stream  # XLA provides the stream
    return _norm("layer_norm", _LAYER, x, weight, bias, eps, residual, return_stats, out)


@_ffi.raises_rudnn_errors
def rms_norm(x, weight=None, eps=1e-6, *, residual=None, return_stats=False, out=None, stream=None):
    """RMSNorm over the last axis: h / sqrt(mean(h^2) + eps) * weight, h = x (+ residual).

    Returns y; (y, h) with ``residual``; ``return_stats=True`` appends the float32 rstd.
    Differentiable with respect to x, weight and residual.
    """
    del stream
    return _norm("rms_norm", _RMS, x, weight, None, eps, residual, return_stats, out)


@_ffi.raises_rudnn_errors
def softmax(x, *, out=None, stream=None):
    """Softmax over the last axis, computed in float32. Differentiable."""
    del stream
    op = "softmax"
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    _ffi.ensure_ready(op)
    _C.jax_validate_softmax_forward(_ffi.spec(x))
    return _softmax_op(x)


@_ffi.raises_rudnn_errors
def layer_norm_backward(dy, x, weight, mean, rstd, *, stream=None):
    """Gradients of layer_norm: (dx, dweight, dbias). dweight/dbias are float32 [H] reduced over
    rows in a fixed order; dweight is None when weight is None. x is the normalized input
    (x + residual when a residual was fused)."""
    del stream
    op = "layer_norm_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x = _ffi.array(x, op, "x", required=True)
    weight = _ffi.array(weight, op, "weight")
    mean = _ffi.array(mean, op, "mean", required=True)
    rstd = _ffi.array(rstd, op, "rstd", required=True)
    _ffi.ensure_ready(op)
    has_weight = weight is not None
    _C.jax_validate_norm_backward("layer", _ffi.spec(dy), _ffi.spec(x), _ffi.spec(weight), _ffi.spec(mean), _ffi.spec(rstd),
                                  has_weight, True)
    outs = _norm_backward_op(_LAYER, has_weight)(dy, x, *_ffi.present(weight), mean, rstd)
    return outs[0], (outs[1] if has_weight else None), outs[-1]


@_ffi.raises_rudnn_errors
def rms_norm_backward(dy, x, weight, rstd, *, stream=None):
    """Gradients of rms_norm: (dx, dweight); dweight float32 [H] (None when weight is None)."""
    del stream
    op = "rms_norm_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x = _ffi.array(x, op, "x", required=True)
    weight = _ffi.array(weight, op, "weight")
    rstd = _ffi.array(rstd, op, "rstd", required=True)
    _ffi.ensure_ready(op)
    has_weight = weight is not None
    _C.jax_validate_norm_backward("rms", _ffi.spec(dy), _ffi.spec(x), _ffi.spec(weight), None, _ffi.spec(rstd), has_weight, False)
    outs = _norm_backward_op(_RMS, has_weight)(dy, x, *_ffi.present(weight), rstd)
    return outs[0], (outs[1] if has_weight else None)


@_ffi.raises_rudnn_errors
def softmax_backward(dy, y, *, stream=None):
    """Gradient of softmax given its output y: dx = y * (dy - sum(dy * y))."""
    del stream
    op = "softmax_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    y = _ffi.array(y, op, "y", required=True)
    _ffi.ensure_ready(op)
    _C.jax_validate_softmax_backward(_ffi.spec(dy), _ffi.spec(y))
    return _softmax_backward_op(dy, y)
