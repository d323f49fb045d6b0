"""rudnn for JAX: the gated delta rule as XLA FFI custom calls, differentiable with custom_vjp.

Same names, arguments and results as ``rudnn.chunk_gated_delta_rule`` / ``gated_delta_rule``
(and their ``*_backward``); ``rudnn.<op>`` called with JAX arrays comes here. Arguments are
checked by libruDNN's validation when the call is traced (cu_seqlens' values are checked when
the CPU handler runs). Under ``jax.vmap`` the call runs once per batch element. JAX arrays are
dense, so the [B, T, H, K] layout arrives as a transposed copy made by XLA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _C
from ..errors import UnsupportedError
from ..gated_delta import kernel_code
from . import _ffi

__all__ = ["chunk_gated_delta_rule", "gated_delta_rule", "chunk_gated_delta_rule_backward",
           "gated_delta_rule_backward"]

_CHUNKED, _RECURRENT = 0, 1


def _shapes(q, v, cu_seqlens):
    B, _, T, K = q.shape
    Hv, V = v.shape[1], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return (B, Hv, T, V), (N, Hv, K, V)


@functools.lru_cache(maxsize=None)
def _forward_call(algo, scale, chunk_size, kernel, has_initial, has_cu):
    """f(q, k, v, beta, log_decay, *[initial_state], [cu_seqlens]) -> (out, final_state)."""

    def call(q, k, v, beta, g, *operands):
        out_shape, state_shape = _shapes(q, v, operands[-1] if has_cu else None)
        results = (_ffi.sds(out_shape, q.dtype), _ffi.sds(state_shape, jnp.float32))
        return jax.ffi.ffi_call("rudnn_gated_delta_forward", results, vmap_method="sequential")(
            q, k, v, beta, g, *operands, algo=np.int32(algo), scale=np.float32(scale), chunk_size=np.int32(chunk_size),
            kernel=np.int32(kernel), has_initial=has_initial, has_cu=has_cu)

    return call


@functools.lru_cache(maxsize=None)
def _backward_call(algo, scale, chunk_size, has_initial, has_dfinal, has_cu):
    """f(dout, q, k, v, beta, log_decay, *[initial_state], [dfinal_state], [cu_seqlens])
    -> (dq, dk, dv, dbeta, dlog_decay, [dinitial_state])."""

    def call(dout, q, k, v, beta, g, *operands):
        results = tuple(_ffi.sds(x.shape, x.dtype) for x in (q, k, v, beta, g))
        if has_initial:
            results += (_ffi.sds(operands[0].shape, jnp.float32),)
        return jax.ffi.ffi_call("rudnn_gated_delta_backward", results, vmap_method="sequential")(
            dout, q, k, v, beta, g, *operands, algo=np.int32(algo), scale=np.float32(scale),
            chunk_size=np.int32(chunk_size), has_initial=has_initial, has_dfinal=has_dfinal, has_cu=has_cu,
            has_dinitial=has_initial)

    return call


@functools.lru_cache(maxsize=None)
def _op(algo, scale, chunk_size, kernel, has_initial, has_cu):
    """custom_vjp f(q, k, v, beta, log_decay, *[initial_state], [cu_seqlens]) -> (out, final_state)."""
    forward = _forward_call(algo, scale, chunk_size, kernel, has_initial, has_cu)
    backward = _backward_call(algo, scale, chunk_size, has_initial, True, has_cu)

    def fwd(*args):
        return forward(*args), args

    def bwd(saved, cotangents):
        dout, dfinal = cotangents
        q, k, v, beta, g, *operands = saved
        initial = operands[0] if has_initial else None
        cu = operands[-1] if has_cu else None
        grads = backward(dout.astype(q.dtype), q, k, v, beta, g,
                         *_ffi.present(initial, dfinal.astype(jnp.float32), cu))
        return tuple(grads) + ((None,) if has_cu else ())  # cu_seqlens: integer offsets, no gradient

    op = jax.custom_vjp(forward)
    op.defvjp(fwd, bwd)
    return jax.jit(op)


def _arrays(op, q, k, v, beta, log_decay, initial_state, cu_seqlens):
    names = ("q", "k", "v", "beta", "log_decay")
    arrays = [_ffi.array(a, op, n, required=True) for a, n in zip((q, k, v, beta, log_decay), names)]
    return arrays, _ffi.array(initial_state, op, "initial_state"), _ffi.array(cu_seqlens, op, "cu_seqlens")


def _validate_forward(op, algo, arrays, initial, cu, scale, chunk_size, kernel):
    q, _, v = arrays[:3]
    _ffi.ensure_ready(op)
    out_spec = state_spec = ((0,), "float32")
    if q.ndim == 4 and v.ndim == 4 and (cu is None or cu.ndim == 1):
        out_shape, state_shape = _shapes(q, v, cu)
        out_spec, state_spec = (out_shape, jnp.dtype(q.dtype).name), (state_shape, "float32")
    _C.jax_validate_gated_delta_forward(algo, *(_ffi.spec(a) for a in arrays), _ffi.spec(initial), _ffi.spec(cu),
                                        scale, chunk_size, kernel, out_spec, state_spec)


def _forward(op, algo, q, k, v, beta, log_decay, initial_state, scale, chunk_size, cu_seqlens, strategy="auto",
             out=None):
    _ffi.no_out(op, out)
    kernel = kernel_code(op, strategy)
    arrays, initial, cu = _arrays(op, q, k, v, beta, log_decay, initial_state, cu_seqlens)
    scale = _ffi.static_float(scale, op, "scale")
    chunk_size = int(chunk_size)
    _validate_forward(op, algo, arrays, initial, cu, scale, chunk_size, kernel)
    f = _op(algo, scale, chunk_size, kernel, initial is not None, cu is not None)
    return tuple(f(*arrays, *_ffi.present(initial, cu)))


@_ffi.raises_rudnn_errors
def chunk_gated_delta_rule(q, k, v, beta, log_decay, initial_state=None, *, scale, chunk_size=64, cu_seqlens=None,
                           strategy="auto", out=None, stream=None):
    """Chunked gated delta rule: (out, final_state). Differentiable with respect to q, k, v,
    beta, log_decay and initial_state (see rudnn.gated_delta for the arguments)."""
    del stream  # XLA provides the stream
    return _forward("chunk_gated_delta_rule", _CHUNKED, q, k, v, beta, log_decay, initial_state, scale, chunk_size,
                    cu_seqlens, strategy, out)


@_ffi.raises_rudnn_errors
def gated_delta_rule(q, k, v, beta, log_decay, initial_state=None, *, scale, cu_seqlens=None, out=None, stream=None):
    """Token-by-token gated delta rule (decode): (out, final_state). Differentiable."""
    del stream
    return _forward("gated_delta_rule", _RECURRENT, q, k, v, beta, log_decay, initial_state, scale, 64, cu_seqlens,
                    out=out)


def _backward(op, algo, dout, q, k, v, beta, log_decay, initial_state, dfinal_state, scale, chunk_size, cu_seqlens):
    arrays, initial, cu = _arrays(op, q, k, v, beta, log_decay, initial_state, cu_seqlens)
    dout = _ffi.array(dout, op, "dout", required=True)
    dfinal = _ffi.array(dfinal_state, op, "dfinal_state")
    scale = _ffi.static_float(scale, op, "scale")
    chunk_size = int(chunk_size)
    _ffi.ensure_ready(op)
    _C.jax_validate_gated_delta_backward(algo, _ffi.spec(dout), *(_ffi.spec(a) for a in arrays), _ffi.spec(initial),
                                         _ffi.spec(dfinal), _ffi.spec(cu), scale, chunk_size)
    call = _backward_call(algo, scale, chunk_size, initial is not None, dfinal is not None, cu is not None)
    grads = jax.jit(call)(dout, *arrays, *_ffi.present(initial, dfinal, cu))
    return tuple(grads[:5]) + ((grads[5],) if initial is not None else (None,))


@_ffi.raises_rudnn_errors
def chunk_gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state=None, dfinal_state=None, *, scale,
                                    chunk_size=64, cu_seqlens=None, strategy="auto", stream=None):
    """(dq, dk, dv, dbeta, dlog_decay, dinitial_state); dinitial_state is None without initial_state.
    strategy: only "auto" (the XLA FFI backward takes no kernel attribute yet)."""
    del stream
    if kernel_code("chunk_gated_delta_rule_backward", strategy) != 0:
        raise UnsupportedError(f"chunk_gated_delta_rule_backward: strategy={strategy!r} with JAX arrays: only "
                               "'auto' is supported")
    return _backward("chunk_gated_delta_rule_backward", _CHUNKED, dout, q, k, v, beta, log_decay, initial_state,
                     dfinal_state, scale, chunk_size, cu_seqlens)


@_ffi.raises_rudnn_errors
def gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state=None, dfinal_state=None, *, scale,
                              cu_seqlens=None, stream=None):
    """rudnn.gated_delta_rule_backward for JAX arrays (jit-able; its arguments and results)."""
    del stream
    return _backward("gated_delta_rule_backward", _RECURRENT, dout, q, k, v, beta, log_decay, initial_state,
                     dfinal_state, scale, 64, cu_seqlens)
