"""rudnn for JAX: the pooling family as XLA FFI custom calls, differentiable with custom_vjp.

Same names, arguments and results as ``rudnn.<op>``; ``rudnn.<op>`` called with JAX arrays comes
here. Arguments are checked when the call is traced (libruDNN's own checks, which also give the
output shapes), so a bad call raises ``rudnn.ShapeError``, ``rudnn.ArgumentError``, ... at once.
Indices are int64 when jax_enable_x64 is on, else int32 (JAX's integer), flat per plane as in
torch. JAX arrays are dense: ``layout="NHWC"`` selects channels-last. vmap runs the calls one
batch element at a time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import pooling as _pool
from .._args import flag as _flag
from . import _ffi

__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "max_pool_backward",
           "avg_pool_backward", "adaptive_avg_pool_backward", "adaptive_max_pool_backward"]

_MAX, _AVG = _pool._ADAPTIVE_MAX, _pool._ADAPTIVE_AVG


def _index_dtype():
    return jnp.dtype(jnp.int64) if jax.config.jax_enable_x64 else jnp.dtype(jnp.int32)


def _i64s(values):
    return np.asarray(values, np.int64)


def _window_attrs(w):
    return dict(kernel=_i64s(w.kernel), stride=_i64s(w.stride), padding=_i64s(w.padding),
                dilation=_i64s(w.dilation), ceil_mode=bool(w.ceil_mode))


def _avg_attrs(w):
    return dict(kernel=_i64s(w.kernel), stride=_i64s(w.stride), padding=_i64s(w.padding),
                ceil_mode=bool(w.ceil_mode), count_include_pad=bool(w.count_include_pad),
                has_divisor_override=w.divisor_override is not None,
                divisor_override=np.int64(w.divisor_override or 0))


def _call(target, results, *operands, **attrs):
    return jax.ffi.ffi_call(target, results, vmap_method="sequential")(*operands, **attrs)


# ---- custom calls ---------------------------------------------------------------------------

def _max_pool_forward(x, w, layout, y_shape, with_indices):
    results = (_ffi.sds(y_shape, x.dtype),) + ((_ffi.sds(y_shape, _index_dtype()),) if with_indices else ())
    return _call("rudnn_max_pool_forward", results, x, **_window_attrs(w), layout=np.int32(layout),
                 has_indices=with_indices)


def _max_pool_backward(dy, x, indices, w, layout):
    return _call("rudnn_max_pool_backward", _ffi.sds(x.shape, x.dtype), dy, x, indices, **_window_attrs(w),
                 layout=np.int32(layout))


def _avg_pool_forward(x, w, layout, y_shape):
    return _call("rudnn_avg_pool_forward", _ffi.sds(y_shape, x.dtype), x, **_avg_attrs(w), layout=np.int32(layout))


def _avg_pool_backward(dy, x_shape, w, layout):
    return _call("rudnn_avg_pool_backward", _ffi.sds(x_shape, dy.dtype), dy, **_avg_attrs(w),
                 layout=np.int32(layout))


def _adaptive_forward(x, kind, output_size, layout, y_shape, with_indices):
    results = (_ffi.sds(y_shape, x.dtype),) + ((_ffi.sds(y_shape, _index_dtype()),) if with_indices else ())
    return _call("rudnn_adaptive_pool_forward", results, x, kind=np.int32(kind), output_size=_i64s(output_size),
                 layout=np.int32(layout), has_indices=with_indices)


def _adaptive_backward(dy, x, indices, kind, x_shape, dtype, dims, layout):
    return _call("rudnn_adaptive_pool_backward", _ffi.sds(x_shape, dtype), dy, *_ffi.present(x, indices),
                 kind=np.int32(kind), dims=np.int32(dims), layout=np.int32(layout))


# ---- differentiable ops (one per static configuration) ----------------------------------------

@functools.lru_cache(maxsize=None)
def _max_pool_op(w, layout, y_shape, return_indices):
    def primal(x):
        outs = _max_pool_forward(x, w, layout, y_shape, return_indices)
        return tuple(outs) if return_indices else outs[0]

    def fwd(x):
        y, indices = _max_pool_forward(x, w, layout, y_shape, True)
        return ((y, indices) if return_indices else y), (x, indices)

    def bwd(saved, cotangent):
        x, indices = saved
        dy = cotangent[0] if return_indices else cotangent
        return (_max_pool_backward(dy, x, indices, w, layout),)

    op = jax.custom_vjp(primal)
    op.defvjp(fwd, bwd)
    return jax.jit(op)


@functools.lru_cache(maxsize=None)
def _avg_pool_op(w, layout, x_shape, y_shape):
    op = jax.custom_vjp(lambda x: _avg_pool_forward(x, w, layout, y_shape))
    op.defvjp(lambda x: (_avg_pool_forward(x, w, layout, y_shape), None),
              lambda _, dy: (_avg_pool_backward(dy, x_shape, w, layout),))
    return jax.jit(op)


@functools.lru_cache(maxsize=None)
def _adaptive_op(kind, output_size, layout, x_shape, y_shape, return_indices):
    dims = len(output_size)
    is_max = kind == _MAX

    def primal(x):
        outs = _adaptive_forward(x, kind, output_size, layout, y_shape, return_indices)
        return tuple(outs) if return_indices else outs[0]

    def fwd(x):
        outs = _adaptive_forward(x, kind, output_size, layout, y_shape, is_max)
        y = outs[0]
        indices = outs[1] if is_max else None
        return ((y, indices) if return_indices else y), (x if is_max else None, indices)

    def bwd(saved, cotangent):
        x, indices = saved
        dy = cotangent[0] if return_indices else cotangent
        return (_adaptive_backward(dy, x, indices, kind, x_shape, dy.dtype, dims, layout),)

    op = jax.custom_vjp(primal)
    op.defvjp(fwd, bwd)
    return jax.jit(op)


# ---- public API (the same as rudnn.<op>) ------------------------------------------------------

def _dtype(a):
    return jnp.dtype(a.dtype).name


@_ffi.raises_rudnn_errors
def max_pool(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False, *,
             layout="NCHW", out=None, stream=None):
    """rudnn.max_pool for JAX arrays; differentiable (jax.grad) with respect to x."""
    del stream  # XLA provides the stream
    op = "max_pool"
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    w = _pool.max_window(op, x.ndim, kernel, stride, padding, dilation, ceil_mode)
    code = _pool.layout_code(op, layout)
    return_indices = _flag(op, "return_indices", return_indices)
    y_shape = _pool.max_pool_shape(x.shape, _dtype(x), w, code)
    _ffi.ensure_ready(op)
    return _max_pool_op(w, code, tuple(y_shape), return_indices)(x)


@_ffi.raises_rudnn_errors
def avg_pool(x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None, *,
             layout="NCHW", out=None, stream=None):
    """rudnn.avg_pool for JAX arrays; differentiable with respect to x."""
    del stream
    op = "avg_pool"
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    w = _pool.avg_window(op, x.ndim, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    code = _pool.layout_code(op, layout)
    y_shape = _pool.avg_pool_shape(x.shape, _dtype(x), w, code)
    _ffi.ensure_ready(op)
    return _avg_pool_op(w, code, tuple(x.shape), tuple(y_shape))(x)


def _adaptive(op, kind, x, output_size, return_indices, layout, out):
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    code = _pool.layout_code(op, layout)
    sizes = _pool.output_sizes(op, tuple(x.shape), output_size, code)
    y_shape = _pool.adaptive_pool_shape(kind, x.shape, _dtype(x), sizes, code)
    _ffi.ensure_ready(op)
    return _adaptive_op(kind, sizes, code, tuple(x.shape), tuple(y_shape), return_indices)(x)


@_ffi.raises_rudnn_errors
def adaptive_avg_pool(x, output_size, *, layout="NCHW", out=None, stream=None):
    """rudnn.adaptive_avg_pool for JAX arrays; differentiable with respect to x."""
    del stream
    return _adaptive("adaptive_avg_pool", _AVG, x, output_size, False, layout, out)


@_ffi.raises_rudnn_errors
def adaptive_max_pool(x, output_size, return_indices=False, *, layout="NCHW", out=None, stream=None):
    """rudnn.adaptive_max_pool for JAX arrays; differentiable with respect to x."""
    del stream
    op = "adaptive_max_pool"
    return _adaptive(op, _MAX, x, output_size, _flag(op, "return_indices", return_indices), layout, out)


@_ffi.raises_rudnn_errors
def max_pool_backward(dy, x, indices, *, kernel, stride=None, padding=0, dilation=1, ceil_mode=False,
                      return_indices=None, layout="NCHW", stream=None):
    """dx of max_pool; x supplies the shape and dtype."""
    del stream, return_indices
    op = "max_pool_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x = _ffi.array(x, op, "x", required=True)
    indices = _ffi.array(indices, op, "indices", required=True)
    w = _pool.max_window(op, x.ndim, kernel, stride, padding, dilation, ceil_mode)
    _ffi.ensure_ready(op)
    return _max_pool_backward(dy, x, indices, w, _pool.layout_code(op, layout))


@_ffi.raises_rudnn_errors
def avg_pool_backward(dy, x_shape, *, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                      divisor_override=None, layout="NCHW", stream=None):
    """dx (of shape x_shape, dy's dtype) of avg_pool."""
    del stream
    op = "avg_pool_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x_shape = _pool._shape(op, x_shape)
    w = _pool.avg_window(op, len(x_shape), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    _ffi.ensure_ready(op)
    return _avg_pool_backward(dy, x_shape, w, _pool.layout_code(op, layout))


@_ffi.raises_rudnn_errors
def adaptive_avg_pool_backward(dy, x_shape, *, output_size=None, layout="NCHW", stream=None):
    """dx (of shape x_shape, dy's dtype) of adaptive_avg_pool; the output size is dy's."""
    del stream
    op = "adaptive_avg_pool_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x_shape = _pool._shape(op, x_shape)
    dims = _pool.spatial_dims(op, len(x_shape), {"output_size": output_size})
    _ffi.ensure_ready(op)
    return _adaptive_backward(dy, None, None, _AVG, x_shape, dy.dtype, dims, _pool.layout_code(op, layout))


@_ffi.raises_rudnn_errors
def adaptive_max_pool_backward(dy, x, indices, *, output_size=None, return_indices=None, layout="NCHW",
                               stream=None):
    """dx of adaptive_max_pool given the indices it returned."""
    del stream, return_indices
    op = "adaptive_max_pool_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x = _ffi.array(x, op, "x", required=True)
    indices = _ffi.array(indices, op, "indices", required=True)
    dims = _pool.spatial_dims(op, x.ndim, {"output_size": output_size})
    _ffi.ensure_ready(op)
    return _adaptive_backward(dy, x, indices, _MAX, tuple(x.shape), x.dtype, dims, _pool.layout_code(op, layout))
