"""rudnn for JAX: grid_sample as XLA FFI custom calls, differentiable (x and grid) with custom_vjp.

Same names, arguments and results as ``rudnn.grid_sample`` / ``rudnn.grid_sample_backward``;
``rudnn.grid_sample`` called with JAX arrays comes here. Arguments are checked when the call is
traced (libruDNN's own checks, which also give the output shape), so a bad call raises
``rudnn.ShapeError``, ``rudnn.ArgumentError``, ... at once. JAX arrays are dense:
``layout="NHWC"`` selects channels-last. On CUDA dx's float32 workspace comes from XLA's scratch
allocator. vmap runs the calls one batch element at a time.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np

from .. import pooling as _pool
from .._args import flag
from ..errors import DTypeError, ShapeError
from . import _ffi

# The module: the package attribute rudnn.grid_sample is the function of the same name.
_gs = importlib.import_module("..grid_sample", __package__)

__all__ = ["grid_sample", "grid_sample_backward"]


def _attrs(opts, layout):
    return dict(mode=np.int32(opts.mode), padding_mode=np.int32(opts.padding_mode),
                align_corners=bool(opts.align_corners), layout=np.int32(layout))


def _forward(x, grid, opts, layout, y_shape):
    return jax.ffi.ffi_call("rudnn_grid_sample_forward", _ffi.sds(y_shape, x.dtype), vmap_method="sequential")(
        x, grid, **_attrs(opts, layout))


def _backward(dy, x, grid, opts, layout, deterministic):
    results = (_ffi.sds(x.shape, x.dtype), _ffi.sds(grid.shape, grid.dtype))
    return jax.ffi.ffi_call("rudnn_grid_sample_backward", results, vmap_method="sequential")(
        dy, x, grid, **_attrs(opts, layout), deterministic=bool(deterministic))


@functools.lru_cache(maxsize=None)
def _op(opts, layout, deterministic, y_shape):
    op = jax.custom_vjp(lambda x, grid: _forward(x, grid, opts, layout, y_shape))
    op.defvjp(lambda x, grid: (_forward(x, grid, opts, layout, y_shape), (x, grid)),
              lambda res, dy: _backward(dy, res[0], res[1], opts, layout, deterministic))
    return jax.jit(op)


def _checked(op, x, grid, mode, padding_mode, align_corners, layout):
    x = _ffi.array(x, op, "x", required=True)
    grid = _ffi.array(grid, op, "grid", required=True)
    opts = _gs.options(op, mode, padding_mode, align_corners)
    code = _pool.layout_code(op, layout)
    dtype = jnp.dtype(x.dtype).name
    if jnp.dtype(grid.dtype).name != dtype and dtype in ("float32", "float16", "bfloat16"):
        raise DTypeError(f"{op}: grid: expected the dtype of x ({dtype}), got {jnp.dtype(grid.dtype).name}")
    y_shape = tuple(_gs.output_shape(x.shape, grid.shape, dtype, opts, code))
    return x, grid, opts, code, y_shape


@_ffi.raises_rudnn_errors
def grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False, *, layout="NCHW",
                deterministic=False, out=None, stream=None):
    """rudnn.grid_sample for JAX arrays; differentiable (jax.grad) with respect to x and grid."""
    del stream  # XLA provides the stream
    op = "grid_sample"
    _ffi.no_out(op, out)
    x, grid, opts, code, y_shape = _checked(op, x, grid, mode, padding_mode, align_corners, layout)
    det = flag(op, "deterministic", deterministic)
    _ffi.ensure_ready(op)
    return _op(opts, code, det, y_shape)(x, grid)


@_ffi.raises_rudnn_errors
def grid_sample_backward(dy, x, grid, *, mode="bilinear", padding_mode="zeros", align_corners=False, layout="NCHW",
                         deterministic=False, output_mask=(True, True), stream=None):
    """(dx, dgrid) of grid_sample for JAX arrays (None where output_mask says so)."""
    del stream
    op = "grid_sample_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x, grid, opts, code, y_shape = _checked(op, x, grid, mode, padding_mode, align_corners, layout)
    mask = _gs._output_mask(op, output_mask)
    det = flag(op, "deterministic", deterministic)
    if tuple(dy.shape) != y_shape:
        raise ShapeError(f"{op}: dy: expected shape {list(y_shape)} (y's shape: x sampled at the grid), "
                         f"got {list(dy.shape)}")
    if jnp.dtype(dy.dtype) != jnp.dtype(x.dtype):
        raise DTypeError(f"{op}: dy: expected the dtype of x ({jnp.dtype(x.dtype).name}), "
                         f"got {jnp.dtype(dy.dtype).name}")
    _ffi.ensure_ready(op)
    dx, dgrid = _backward(dy, x, grid, opts, code, det)
    return (dx if mask[0] else None), (dgrid if mask[1] else None)
