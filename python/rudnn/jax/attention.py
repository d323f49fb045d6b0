"""rudnn for JAX: attention as XLA FFI custom calls, differentiable with custom_vjp.

Same names, arguments and results as ``rudnn.attention`` / ``rudnn.attention_backward``;
``rudnn.attention`` called with JAX arrays comes here. Every call, eager or traced, is a
``jax.ffi.ffi_call`` to a libruDNN handler registered for the "cpu" and "CUDA" platforms,
so it works under ``jax.jit`` and ``jax.grad`` (gradients for q, k and v, through out and,
with return_lse=True, through lse; mask and bias are not differentiated, so differentiating
with respect to either is refused, as rudnn.torch does). ``vmap`` runs the call once per
batch element.
Arguments are checked by libruDNN's validation when the call is traced; on the CPU the
cu_seqlens values are checked when the call runs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .. import _C
from .._args import flag as _flag
from ..attention import options as _options
from ..errors import UnsupportedError
from . import _ffi

__all__ = ["attention", "attention_backward"]


def _attrs(has_mask, has_bias, varlen, scale, causal, wl, wr, softcap, strategy):
    return dict(has_mask=has_mask, has_bias=has_bias, varlen=varlen, has_scale=scale is not None, causal=causal,
                scale=np.float32(scale if scale is not None else 0.0), softcap=np.float32(softcap),
                window_left=np.int64(wl), window_right=np.int64(wr), strategy=np.int32(strategy))


@functools.lru_cache(maxsize=None)
def _op(key, out_shape, lse_shape, return_lse):
    """custom_vjp f(q, k, v, *[mask], *[bias], *[cu_q, cu_k]) -> out or (out, lse)."""
    attrs = _attrs(*key)
    deterministic = False

    def forward(q, k, v, *extra):
        results = (_ffi.sds(out_shape, q.dtype), _ffi.sds(lse_shape, jnp.float32))
        return jax.ffi.ffi_call("rudnn_attention_forward", results, vmap_method="sequential")(q, k, v, *extra, **attrs)

    def primal(q, k, v, *extra):
        out, lse = forward(q, k, v, *extra)
        return (out, lse) if return_lse else out

    def fwd(*primals):  # symbolic_zeros: each primal comes as a CustomVJPPrimal
        for name, p in zip(["mask"] * key[0] + ["bias"] * key[1], primals[3:]):
            if p.perturbed:  # no cotangent would be computed for it: refused, not left at zero
                raise UnsupportedError(f"attention: {name}: gradients with respect to {name} are not computed; "
                                       f"pass jax.lax.stop_gradient({name})")
        q, k, v, *extra = (p.value for p in primals)
        out, lse = forward(q, k, v, *extra)
        return ((out, lse) if return_lse else out), (q, k, v, out, lse, tuple(extra))

    def bwd(saved, cotangent):
        q, k, v, out, lse, extra = saved
        dout, dlse = cotangent if return_lse else (cotangent, None)
        if isinstance(dout, SymbolicZero) and (dlse is None or isinstance(dlse, SymbolicZero)):
            return (jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)) + tuple(None for _ in extra)
        dout = jnp.zeros_like(out) if isinstance(dout, SymbolicZero) else dout.astype(out.dtype)
        # the gradient through lse, when lse is used (decided when traced)
        dlse = () if dlse is None or isinstance(dlse, SymbolicZero) else (dlse.astype(jnp.float32),)
        # The flash backward covers fewer cases than the flash forward: a flash forward is
        # differentiated by the "auto" backward (flash where it supports the case).
        bkey = key[:-1] + ((0,) if key[-1] == 1 else (key[-1],))
        dq, dk, dv = _backward_call(bkey, deterministic, bool(dlse))(dout, q, k, v, out, lse, *extra, *dlse)
        return (dq, dk, dv) + tuple(None for _ in extra)

    f = jax.custom_vjp(primal)
    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return jax.jit(f)


@functools.lru_cache(maxsize=None)
def _backward_call(key, deterministic, has_dlse):
    """f(dout, q, k, v, out, lse, *[mask], *[bias], *[cu_q, cu_k], *[dlse]) -> (dq, dk, dv)."""
    attrs = _attrs(*key)

    def call(dout, q, k, v, out, lse, *extra):
        results = (_ffi.sds(q.shape, q.dtype), _ffi.sds(k.shape, k.dtype), _ffi.sds(v.shape, v.dtype))
        return jax.ffi.ffi_call("rudnn_attention_backward", results, vmap_method="sequential")(
            dout, q, k, v, out, lse, *extra, **attrs, deterministic=deterministic, has_dlse=has_dlse)

    return jax.jit(call)


def _prepare(op, q, k, v, mask, bias, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, strategy):
    q = _ffi.array(q, op, "q", required=True)
    k = _ffi.array(k, op, "k", required=True)
    v = _ffi.array(v, op, "v", required=True)
    mask, bias = _ffi.array(mask, op, "mask"), _ffi.array(bias, op, "bias")
    cu_q, cu_k = _ffi.array(cu_seqlens_q, op, "cu_seqlens_q"), _ffi.array(cu_seqlens_k, op, "cu_seqlens_k")
    if scale is not None:
        scale = _ffi.static_float(scale, op, "scale")
    if softcap is not None:
        softcap = _ffi.static_float(softcap, op, "softcap")
    o = _options(op, mask=mask, bias=bias, scale=scale, causal=causal, window=window, softcap=softcap,
                 cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, strategy=strategy)
    _ffi.ensure_ready(op)
    return q, k, v, mask, bias, cu_q, cu_k, o


@_ffi.raises_rudnn_errors
def attention(q, k, v, *, mask=None, bias=None, scale=None, causal=False, window=None, softcap=None,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, strategy="auto", out=None, stream=None):
    """rudnn.attention for JAX arrays (see rudnn.attention). Differentiable in q, k, v."""
    del stream  # XLA provides the stream
    op = "attention"
    _ffi.no_out(op, out)
    q, k, v, mask, bias, cu_q, cu_k, o = _prepare(op, q, k, v, mask, bias, scale, causal, window, softcap,
                                                  cu_seqlens_q, cu_seqlens_k, strategy)
    out_shape, lse_shape = _C.jax_validate_attention_forward(
        _ffi.spec(q), _ffi.spec(k), _ffi.spec(v), _ffi.spec(mask), _ffi.spec(bias), _ffi.spec(cu_q), _ffi.spec(cu_k),
        o["scale"], o["causal"], o["window_left"], o["window_right"], o["softcap"])
    varlen = cu_q is not None
    key = (mask is not None, bias is not None, varlen, o["scale"], o["causal"], o["window_left"], o["window_right"],
           o["softcap"], o["strategy"])
    f = _op(key, tuple(out_shape), tuple(lse_shape), _flag(op, "return_lse", return_lse))
    return f(q, k, v, *_ffi.present(mask, bias, cu_q, cu_k))


@_ffi.raises_rudnn_errors
def attention_backward(dout, q, k, v, out, lse, *, mask=None, bias=None, scale=None, causal=False, window=None,
                       softcap=None, cu_seqlens_q=None, cu_seqlens_k=None, deterministic=False, strategy="auto",
                       dlse=None, stream=None):
    """rudnn.attention_backward for JAX arrays: (dq, dk, dv)."""
    del stream
    op = "attention_backward"
    q, k, v, mask, bias, cu_q, cu_k, o = _prepare(op, q, k, v, mask, bias, scale, causal, window, softcap,
                                                  cu_seqlens_q, cu_seqlens_k, strategy)
    dout = _ffi.array(dout, op, "dout", required=True)
    out = _ffi.array(out, op, "out", required=True)
    lse = _ffi.array(lse, op, "lse", required=True)
    dlse = _ffi.array(dlse, op, "dlse")
    _C.jax_validate_attention_backward(
        _ffi.spec(dout), _ffi.spec(q), _ffi.spec(k), _ffi.spec(v), _ffi.spec(out), _ffi.spec(lse), _ffi.spec(mask),
        _ffi.spec(bias), _ffi.spec(cu_q), _ffi.spec(cu_k), o["scale"], o["causal"], o["window_left"],
        o["window_right"], o["softcap"], _ffi.spec(dlse))
    key = (mask is not None, bias is not None, cu_q is not None, o["scale"], o["causal"], o["window_left"],
           o["window_right"], o["softcap"], o["strategy"])
    return _backward_call(key, _flag(op, "deterministic", deterministic), dlse is not None)(
        dout, q, k, v, out, lse, *_ffi.present(mask, bias, cu_q, cu_k, dlse))
