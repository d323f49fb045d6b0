"""The pooling family as torch.library custom ops: fake implementations (output shapes from
libruDNN's own checks, channels_last results for channels_last inputs as in eager) and autograd
through the explicit backward gathers.

`rudnn.torch.<op>` takes the same arguments as `rudnn.<op>`; with `out=` or `stream=` the call
runs eagerly without autograd.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from .. import pooling as _pool
from .._args import flag as _flag

_MAX, _AVG = _pool._ADAPTIVE_MAX, _pool._ADAPTIVE_AVG


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _fake(like: Tensor, shape, dtype: torch.dtype, channels_last: bool) -> Tensor:
    return _pool.allocate(lambda s, _: like.new_empty(tuple(s), dtype=dtype), tuple(shape), None, channels_last)


def _window(kernel, stride, padding, dilation, ceil_mode):
    return _pool.Window(tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), ceil_mode)


def _avg_window(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _pool.AvgWindow(tuple(kernel), tuple(stride), tuple(padding), ceil_mode, count_include_pad,
                           divisor_override)


def _no_indices(like: Tensor) -> Tensor:
    """Stands for absent indices: custom ops cannot return None."""
    return like.new_empty((0,), dtype=torch.int64)


# ---- max pooling ---------------------------------------------------------------------------------

@custom_op("rudnn::max_pool_forward", mutates_args=())
def _max_pool_forward(x: Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
                      ceil_mode: bool, layout: int) -> tuple[Tensor, Tensor]:
    """(y, indices)."""
    w = _window(kernel, stride, padding, dilation, ceil_mode)
    return _pool.run_max_pool("rudnn.torch.max_pool", x, w, True, layout)


@_max_pool_forward.register_fake
def _(x, kernel, stride, padding, dilation, ceil_mode, layout):
    w = _window(kernel, stride, padding, dilation, ceil_mode)
    shape = _pool.max_pool_shape(x.shape, _dtype_name(x), w, layout)
    cl = _pool.channels_last_result(x, len(kernel), layout)
    return _fake(x, shape, x.dtype, cl), _fake(x, shape, torch.int64, cl)


@custom_op("rudnn::max_pool_backward", mutates_args=())
def _max_pool_backward(dy: Tensor, x: Tensor, indices: Tensor, kernel: list[int], stride: list[int],
                       padding: list[int], dilation: list[int], ceil_mode: bool, layout: int) -> Tensor:
    w = _window(kernel, stride, padding, dilation, ceil_mode)
    return _pool.run_max_pool_backward("rudnn.torch.max_pool_backward", dy, x, indices, w, layout)


@_max_pool_backward.register_fake
def _(dy, x, indices, kernel, stride, padding, dilation, ceil_mode, layout):
    return _fake(x, x.shape, x.dtype, _pool.channels_last_result(x, len(kernel), layout))


def _max_pool_setup_context(ctx, inputs, output):
    x, *ctx.options = inputs
    ctx.save_for_backward(x, output[1])
    ctx.mark_non_differentiable(output[1])


def _max_pool_autograd_backward(ctx, dy, dindices):
    x, indices = ctx.saved_tensors
    return (_max_pool_backward(dy, x, indices, *ctx.options),) + (None,) * len(ctx.options)


torch.library.register_autograd("rudnn::max_pool_forward", _max_pool_autograd_backward,
                                setup_context=_max_pool_setup_context)


# ---- average pooling -----------------------------------------------------------------------------

@custom_op("rudnn::avg_pool_forward", mutates_args=())
def _avg_pool_forward(x: Tensor, kernel: list[int], stride: list[int], padding: list[int], ceil_mode: bool,
                      count_include_pad: bool, divisor_override: Optional[int], layout: int) -> Tensor:
    w = _avg_window(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _pool.run_avg_pool("rudnn.torch.avg_pool", x, w, layout)


@_avg_pool_forward.register_fake
def _(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, layout):
    w = _avg_window(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    shape = _pool.avg_pool_shape(x.shape, _dtype_name(x), w, layout)
    return _fake(x, shape, x.dtype, _pool.channels_last_result(x, len(kernel), layout))


@custom_op("rudnn::avg_pool_backward", mutates_args=())
def _avg_pool_backward(dy: Tensor, x_shape: list[int], kernel: list[int], stride: list[int], padding: list[int],
                       ceil_mode: bool, count_include_pad: bool, divisor_override: Optional[int],
                       layout: int) -> Tensor:
    w = _avg_window(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _pool.run_avg_pool_backward("rudnn.torch.avg_pool_backward", dy, tuple(x_shape), w, layout)


@_avg_pool_backward.register_fake
def _(dy, x_shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, layout):
    return _fake(dy, x_shape, dy.dtype, _pool.channels_last_result(dy, len(kernel), layout, len(x_shape)))


def _avg_pool_setup_context(ctx, inputs, output):
    x, *ctx.options = inputs
    ctx.x_shape = list(x.shape)


def _avg_pool_autograd_backward(ctx, dy):
    return (_avg_pool_backward(dy, ctx.x_shape, *ctx.options),) + (None,) * len(ctx.options)


torch.library.register_autograd("rudnn::avg_pool_forward", _avg_pool_autograd_backward,
                                setup_context=_avg_pool_setup_context)


# ---- adaptive pooling ----------------------------------------------------------------------------

@custom_op("rudnn::adaptive_pool_forward", mutates_args=())
def _adaptive_pool_forward(x: Tensor, output_size: list[int], kind: int, layout: int) -> tuple[Tensor, Tensor]:
    """(y, indices, or a placeholder for average pooling)."""
    out = _pool.run_adaptive_pool("rudnn.torch.adaptive_pool", kind, x, tuple(output_size), kind == _MAX, layout)
    return out if kind == _MAX else (out, _no_indices(x))


@_adaptive_pool_forward.register_fake
def _(x, output_size, kind, layout):
    shape = _pool.adaptive_pool_shape(kind, x.shape, _dtype_name(x), output_size, layout)
    cl = _pool.channels_last_result(x, len(output_size), layout)
    return _fake(x, shape, x.dtype, cl), _fake(x, shape, torch.int64, cl) if kind == _MAX else _no_indices(x)


@custom_op("rudnn::adaptive_pool_backward", mutates_args=())
def _adaptive_pool_backward(dy: Tensor, x: Optional[Tensor], indices: Optional[Tensor], x_shape: list[int],
                            kind: int, dims: int, layout: int) -> Tensor:
    return _pool.run_adaptive_pool_backward("rudnn.torch.adaptive_pool_backward", kind, dy, x, indices,
                                            tuple(x_shape), dims, layout)


@_adaptive_pool_backward.register_fake
def _(dy, x, indices, x_shape, kind, dims, layout):
    like = x if x is not None else dy
    return _fake(like, x_shape, like.dtype, _pool.channels_last_result(like, dims, layout, len(x_shape)))


def _adaptive_setup_context(ctx, inputs, output):
    x, output_size, ctx.kind, ctx.layout = inputs
    ctx.dims = len(output_size)
    ctx.x_shape = list(x.shape)
    ctx.save_for_backward(x if ctx.kind == _MAX else None, output[1] if ctx.kind == _MAX else None)
    ctx.mark_non_differentiable(output[1])


def _adaptive_autograd_backward(ctx, dy, dindices):
    x, indices = ctx.saved_tensors
    return _adaptive_pool_backward(dy, x, indices, ctx.x_shape, ctx.kind, ctx.dims, ctx.layout), None, None, None


torch.library.register_autograd("rudnn::adaptive_pool_forward", _adaptive_autograd_backward,
                                setup_context=_adaptive_setup_context)


# ---- public API (the arguments of rudnn.<op>) ----------------------------------------------------

def max_pool(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False, *,
             layout="NCHW", out=None, stream=None):
    """rudnn.max_pool as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _pool.max_pool(x, kernel, stride, padding, dilation, ceil_mode, return_indices, layout=layout, out=out,
                              stream=stream)
    op = "rudnn.torch.max_pool"
    w = _pool.max_window(op, x.dim(), kernel, stride, padding, dilation, ceil_mode)
    return_indices = _flag(op, "return_indices", return_indices)
    y, indices = _max_pool_forward(x, *w.args(), _pool.layout_code(op, layout))
    return (y, indices) if return_indices else y


def avg_pool(x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None, *,
             layout="NCHW", out=None, stream=None):
    """rudnn.avg_pool as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _pool.avg_pool(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                              layout=layout, out=out, stream=stream)
    op = "rudnn.torch.avg_pool"
    w = _pool.avg_window(op, x.dim(), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _avg_pool_forward(x, *w.args(), _pool.layout_code(op, layout))


def _adaptive(op, kind, x, output_size, return_indices, layout):
    code = _pool.layout_code(op, layout)
    sizes = _pool.output_sizes(op, tuple(x.shape), output_size, code)
    y, indices = _adaptive_pool_forward(x, list(sizes), kind, code)
    return (y, indices) if return_indices else y


def adaptive_avg_pool(x, output_size, *, layout="NCHW", out=None, stream=None):
    """rudnn.adaptive_avg_pool as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _pool.adaptive_avg_pool(x, output_size, layout=layout, out=out, stream=stream)
    return _adaptive("rudnn.torch.adaptive_avg_pool", _AVG, x, output_size, False, layout)


def adaptive_max_pool(x, output_size, return_indices=False, *, layout="NCHW", out=None, stream=None):
    """rudnn.adaptive_max_pool as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _pool.adaptive_max_pool(x, output_size, return_indices, layout=layout, out=out, stream=stream)
    op = "rudnn.torch.adaptive_max_pool"
    return _adaptive(op, _MAX, x, output_size, _flag(op, "return_indices", return_indices), layout)


def max_pool_backward(dy, x, indices, *, kernel, stride=None, padding=0, dilation=1, ceil_mode=False,
                      return_indices=None, layout="NCHW", stream=None):
    """rudnn.max_pool_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _pool.max_pool_backward(dy, x, indices, kernel=kernel, stride=stride, padding=padding,
                                       dilation=dilation, ceil_mode=ceil_mode, layout=layout, stream=stream)
    op = "rudnn.torch.max_pool_backward"
    w = _pool.max_window(op, x.dim(), kernel, stride, padding, dilation, ceil_mode)
    return _max_pool_backward(dy, x, indices, *w.args(), _pool.layout_code(op, layout))


def avg_pool_backward(dy, x_shape, *, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                      divisor_override=None, layout="NCHW", stream=None):
    """rudnn.avg_pool_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _pool.avg_pool_backward(dy, x_shape, kernel=kernel, stride=stride, padding=padding,
                                       ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                                       divisor_override=divisor_override, layout=layout, stream=stream)
    op = "rudnn.torch.avg_pool_backward"
    x_shape = _pool._shape(op, x_shape)
    w = _pool.avg_window(op, len(x_shape), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _avg_pool_backward(dy, list(x_shape), *w.args(), _pool.layout_code(op, layout))


def adaptive_avg_pool_backward(dy, x_shape, *, output_size=None, layout="NCHW", stream=None):
    """rudnn.adaptive_avg_pool_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _pool.adaptive_avg_pool_backward(dy, x_shape, output_size=output_size, layout=layout, stream=stream)
    op = "rudnn.torch.adaptive_avg_pool_backward"
    x_shape = _pool._shape(op, x_shape)
    dims = _pool.spatial_dims(op, len(x_shape), {"output_size": output_size})
    return _adaptive_pool_backward(dy, None, None, list(x_shape), _AVG, dims, _pool.layout_code(op, layout))


def adaptive_max_pool_backward(dy, x, indices, *, output_size=None, return_indices=None, layout="NCHW",
                               stream=None):
    """rudnn.adaptive_max_pool_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _pool.adaptive_max_pool_backward(dy, x, indices, output_size=output_size, layout=layout,
                                                stream=stream)
    op = "rudnn.torch.adaptive_max_pool_backward"
    dims = _pool.spatial_dims(op, x.dim(), {"output_size": output_size})
    return _adaptive_pool_backward(dy, x, indices, list(x.shape), _MAX, dims, _pool.layout_code(op, layout))


__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "max_pool_backward",
           "avg_pool_backward", "adaptive_avg_pool_backward", "adaptive_max_pool_backward"]
