"""rudnn for JAX: the conv family as XLA FFI custom calls, differentiable (x, w, bias) with
custom_vjp.

Same names, arguments and results as ``rudnn.<op>``; ``rudnn.<op>`` called with JAX arrays comes
here. The forward's arguments are checked when the call is traced (libruDNN's own checks, which
also give the output shape), so a bad call raises ``rudnn.ShapeError``, ``rudnn.ArgumentError``,
... at once. JAX arrays are dense: ``layout="NHWC"`` selects channels-last (x (N, *spatial, C),
w (Cout, *kernel, Cin / groups)). vmap runs the calls one batch element at a time.

XLA's FFI gives these calls no workspace, so strategy="implicit_gemm" needs the tensors it reads
in place: ``layout="NHWC"`` (dense channels-last); with the channels-first layout it is an error
asking for the workspace bytes its layout copies would take, and "auto" runs direct there.
"""

from __future__ import annotations

import functools
from importlib import import_module

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi

# The module rudnn.conv (the package attribute of that name is the function rudnn.conv).
_conv = import_module("..conv", __package__)

__all__ = ["conv", "conv_data_backward", "conv_weight_backward", "conv_bias_backward"]


def _attrs(o):
    i64s = lambda v: np.asarray(v, np.int64)  # noqa: E731
    return dict(stride=i64s(o.stride), pad_before=i64s(o.pad_before), pad_after=i64s(o.pad_after),
                dilation=i64s(o.dilation), groups=np.int64(o.groups), layout=np.int32(o.layout),
                strategy=np.int32(o.strategy))


def _call(target, result, *operands, **attrs):
    return jax.ffi.ffi_call(target, result, vmap_method="sequential")(*operands, **attrs)


def _forward(x, w, bias, o, y_shape):
    return _call("rudnn_conv_forward", _ffi.sds(y_shape, x.dtype), x, w, *_ffi.present(bias), **_attrs(o))


def _data_backward(dy, w, x_shape, o):
    return _call("rudnn_conv_data_backward", _ffi.sds(x_shape, dy.dtype), dy, w, **_attrs(o))


def _weight_backward(dy, x, w_shape, o):
    return _call("rudnn_conv_weight_backward", _ffi.sds(w_shape, dy.dtype), dy, x, **_attrs(o))


def _bias_backward(dy, layout):
    channels = dy.shape[-1] if layout == 1 else dy.shape[1]
    return _call("rudnn_conv_bias_backward", _ffi.sds((channels,), dy.dtype), dy, dims=np.int32(dy.ndim - 2),
                 layout=np.int32(layout))


@functools.lru_cache(maxsize=None)
def _conv_op(o, has_bias, x_shape, w_shape, y_shape):
    if has_bias:
        def primal(x, w, b):
            return _forward(x, w, b, o, y_shape)

        def fwd(x, w, b):
            return primal(x, w, b), (x, w)

        def bwd(saved, dy):
            x, w = saved
            return (_data_backward(dy, w, x_shape, o), _weight_backward(dy, x, w_shape, o),
                    _bias_backward(dy, o.layout))
    else:
        def primal(x, w):
            return _forward(x, w, None, o, y_shape)

        def fwd(x, w):
            return primal(x, w), (x, w)

        def bwd(saved, dy):
            x, w = saved
            return _data_backward(dy, w, x_shape, o), _weight_backward(dy, x, w_shape, o)

    op = jax.custom_vjp(primal)
    op.defvjp(fwd, bwd)
    return jax.jit(op)


def _dtype(a):
    return jnp.dtype(a.dtype).name


@_ffi.raises_rudnn_errors
def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto", *, out=None,
         stream=None):
    """rudnn.conv for JAX arrays; differentiable (jax.grad) with respect to x, w and bias."""
    del stream  # XLA provides the stream
    op = "conv"
    _ffi.no_out(op, out)
    x = _ffi.array(x, op, "x", required=True)
    w = _ffi.array(w, op, "w", required=True)
    bias = _ffi.array(bias, op, "bias")
    o = _conv.options(op, _conv.dims_of(op, "x", x.shape), tuple(w.shape), stride, padding, dilation, groups, layout,
                      strategy)
    y_shape = _conv.output_shape(x.shape, _dtype(x), w.shape, _dtype(w), o)
    _ffi.ensure_ready(op)
    f = _conv_op(o, bias is not None, tuple(x.shape), tuple(w.shape), tuple(y_shape))
    return f(x, w, bias) if bias is not None else f(x, w)


@_ffi.raises_rudnn_errors
def conv_data_backward(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto", *,
                       stream=None):
    """dx (of shape x_shape, dy's dtype) of conv."""
    del stream
    op = "conv_data_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    w = _ffi.array(w, op, "w", required=True)
    x_shape = _conv._shape(op, "x_shape", x_shape)
    o = _conv.options(op, _conv.dims_of(op, "x_shape", x_shape), tuple(w.shape), stride, padding, dilation, groups,
                      layout, strategy)
    _ffi.ensure_ready(op)
    return _data_backward(dy, w, x_shape, o)


@_ffi.raises_rudnn_errors
def conv_weight_backward(dy, x, w_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto",
                         *, stream=None):
    """dw (of shape w_shape, dy's dtype) of conv."""
    del stream
    op = "conv_weight_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    x = _ffi.array(x, op, "x", required=True)
    w_shape = _conv._shape(op, "w_shape", w_shape)
    o = _conv.options(op, _conv.dims_of(op, "x", x.shape), w_shape, stride, padding, dilation, groups, layout,
                      strategy)
    _ffi.ensure_ready(op)
    return _weight_backward(dy, x, w_shape, o)


@_ffi.raises_rudnn_errors
def conv_bias_backward(dy, layout="NCHW", *, stream=None):
    """db (Cout,) of conv."""
    del stream
    op = "conv_bias_backward"
    dy = _ffi.array(dy, op, "dy", required=True)
    code = _conv.layout_code(op, layout, _conv.dims_of(op, "dy", dy.shape))
    _ffi.ensure_ready(op)
    return _bias_backward(dy, code)
