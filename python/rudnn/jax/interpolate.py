"""rudnn for JAX: interpolate as XLA FFI custom calls, differentiable with custom_vjp.

Same names, arguments and results as ``rudnn.interpolate`` / ``rudnn.interpolate_backward``;
``rudnn.interpolate`` called with JAX arrays comes here. Arguments are checked when the call is
traced (libruDNN's own checks, which also give the output shape), so a bad call raises
``rudnn.ShapeError``, ``rudnn.ArgumentError``, ... at once. JAX arrays are dense:
``layout="NHWC"`` selects channels-last. vmap runs the calls one batch element at a time.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np

from .. import pooling as _pool
from . import _ffi

# The module: the package attribute rudnn.interpolate is the function of the same name.
_interp = importlib.import_module("..interpolate", __package__)

__all__ = ["interpolate", "interpolate_backward"]


def _attrs(opts, layout, dims):
    # XLA attributes have no None: arrays of the spatial dims' length and flags saying which is given.
    size = opts.size or (0,) * dims
    scale = opts.scale_factor or (0.0,) * dims
    return dict(mode=np.int32(opts.mode), layout=np.int32(layout), has_size=bool(opts.size),
                size=np.asarray(size, np.int64), has_scale_factor=bool(opts.scale_factor),
                scale_factor=np.asarray(scale, np.float64), align_corners=np.int32(opts.align_corners),
                recompute_scale_factor=np.int32(opts.recompute_scale_factor), antialias=bool(opts.antialias))


def _call(target, result, operand, opts, layout, dims):
    return jax.ffi.ffi_call(target, result, vmap_method="sequential")(operand, **_attrs(opts, layout, dims))


def _forward(x, opts, layout, y_shape):
    return _call("rudnn_interpolate_forward", _ffi.sds(y_shape, x.dtype), x, opts, layout, len(y_shape) - 2)


def _backward(dy, x_shape, opts, layout):
    return _call("rudnn_interpolate_backward", _ffi.sds(x_shape, dy.dtype), dy, opts, layout, len(x_shape) - 2)


@functools.lru_cache(maxsize=None)
def _op(opts, layout, x_shape, y_shape):
    op = jax.custom_vjp(lambda x: _forward(x, opts, layout, y_shape))
    op.defvjp(lambda x: (_forward(x, opts, layout, y_shape), None),
              lambda _, dy: (_backward(dy, x_shape, opts, layout),))
    return jax.jit(op)


@_ffi.raises_rudnn_errors
def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                antialias=False, *, layout="NCHW", out=None, stream=None):
    """rudnn.interpolate for JAX arrays; differentiable (jax.grad) with respect to x."""
    del stream  # XLA provides the stream
    op = "interpolate"
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    opts = _interp.options(op, x.ndim, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    code = _pool.layout_code(op, layout)
    y_shape = _interp.output_shape(x.shape, jnp.dtype(x.dtype).name, opts, code)
    _ffi.ensure_ready(op)
    return _op(opts, code, tuple(x.shape), tuple(y_shape))(x)


@_ffi.raises_rudnn_errors
def interpolate_backward(dy, x_shape, *, size=None, scale_factor=None, mode="nearest", align_corners=None,
                         recompute_scale_factor=None, antialias=False, layout="NCHW", stream=None):
    """dx (of shape x_shape, dy's dtype) of interpolate."""
    del stream
    op = "interpolate_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x_shape = _pool._shape(op, x_shape)
    opts = _interp.options(op, len(x_shape), size, scale_factor, mode, align_corners, recompute_scale_factor,
                           antialias)
    code = _pool.layout_code(op, layout)
    y_shape = _interp.output_shape(x_shape, jnp.dtype(dy.dtype).name, opts, code)
    if tuple(dy.shape) != tuple(y_shape):
        from ..errors import ShapeError

        raise ShapeError(f"{op}: dy: expected shape {list(y_shape)} (x_shape resampled), got {list(dy.shape)}")
    _ffi.ensure_ready(op)
    return _backward(dy, x_shape, opts, code)
