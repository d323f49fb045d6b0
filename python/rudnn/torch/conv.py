"""The conv family as torch.library custom ops: fake implementations (output shapes from
libruDNN's own checks, channels_last results for channels_last inputs as in eager) and autograd
for x, w and bias through the explicit backward kernels.

`rudnn.torch.<op>` takes the same arguments as `rudnn.<op>`; with `out=` or `stream=` the call
runs eagerly without autograd.
"""

from __future__ import annotations

from importlib import import_module
from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from ..pooling import allocate as _allocate, channels_last_result as _channels_last_result

# The module rudnn.conv (the package attribute of that name is the function rudnn.conv).
_conv = import_module("..conv", __package__)


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _fake(like: Tensor, shape, channels_last: bool) -> Tensor:
    return _allocate(lambda s, _: like.new_empty(tuple(s), dtype=like.dtype), tuple(shape), None, channels_last)


def _options(stride, pad_before, pad_after, dilation, groups, layout, strategy):
    return _conv.ConvOptions(tuple(stride), tuple(pad_before), tuple(pad_after), tuple(dilation), groups, layout,
                             strategy)


@custom_op("rudnn::conv_forward", mutates_args=())
def _conv_forward(x: Tensor, w: Tensor, bias: Optional[Tensor], stride: list[int], pad_before: list[int],
                  pad_after: list[int], dilation: list[int], groups: int, layout: int, strategy: int) -> Tensor:
    o = _options(stride, pad_before, pad_after, dilation, groups, layout, strategy)
    return _conv.run_conv("rudnn.torch.conv", x, w, bias, o)


@_conv_forward.register_fake
def _(x, w, bias, stride, pad_before, pad_after, dilation, groups, layout, strategy):
    o = _options(stride, pad_before, pad_after, dilation, groups, layout, strategy)
    shape = _conv.output_shape(x.shape, _dtype_name(x), w.shape, _dtype_name(w), o)
    return _fake(x, shape, _channels_last_result(x, o.dims, layout))


@custom_op("rudnn::conv_data_backward", mutates_args=())
def _conv_data_backward(dy: Tensor, w: Tensor, x_shape: list[int], stride: list[int], pad_before: list[int],
                        pad_after: list[int], dilation: list[int], groups: int, layout: int,
                        strategy: int) -> Tensor:
    o = _options(stride, pad_before, pad_after, dilation, groups, layout, strategy)
    return _conv.run_data_backward("rudnn.torch.conv_data_backward", dy, w, tuple(x_shape), o)


@_conv_data_backward.register_fake
def _(dy, w, x_shape, stride, pad_before, pad_after, dilation, groups, layout, strategy):
    return _fake(dy, x_shape, _channels_last_result(dy, len(stride), layout, len(x_shape)))


@custom_op("rudnn::conv_weight_backward", mutates_args=())
def _conv_weight_backward(dy: Tensor, x: Tensor, w_shape: list[int], stride: list[int], pad_before: list[int],
                          pad_after: list[int], dilation: list[int], groups: int, layout: int,
                          strategy: int) -> Tensor:
    o = _options(stride, pad_before, pad_after, dilation, groups, layout, strategy)
    return _conv.run_weight_backward("rudnn.torch.conv_weight_backward", dy, x, tuple(w_shape), o)


@_conv_weight_backward.register_fake
def _(dy, x, w_shape, stride, pad_before, pad_after, dilation, groups, layout, strategy):
    return dy.new_empty(tuple(w_shape))


@custom_op("rudnn::conv_bias_backward", mutates_args=())
def _conv_bias_backward(dy: Tensor, layout: int) -> Tensor:
    return _conv.run_bias_backward("rudnn.torch.conv_bias_backward", dy, layout)


@_conv_bias_backward.register_fake
def _(dy, layout):
    return dy.new_empty((dy.shape[-1] if layout == 1 else dy.shape[1],))


def _setup_context(ctx, inputs, output):
    x, w, bias, *ctx.options = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, w)


def _autograd_backward(ctx, dy):
    x, w = ctx.saved_tensors
    need_x, need_w, need_bias = ctx.needs_input_grad[:3]
    dx = _conv_data_backward(dy, w, list(x.shape), *ctx.options) if need_x else None
    dw = _conv_weight_backward(dy, x, list(w.shape), *ctx.options) if need_w else None
    db = _conv_bias_backward(dy, ctx.options[5]) if ctx.has_bias and need_bias else None
    return (dx, dw, db) + (None,) * len(ctx.options)


torch.library.register_autograd("rudnn::conv_forward", _autograd_backward, setup_context=_setup_context)


# ---- public API --------------------------------------------------------------------------------

def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto", *, out=None,
         stream=None):
    """rudnn.conv as a differentiable (x, w, bias), torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _conv.conv(x, w, bias, stride, padding, dilation, groups, layout, strategy, out=out, stream=stream)
    op = "rudnn.torch.conv"
    o = _conv.options(op, _conv.dims_of(op, "x", x.shape), tuple(w.shape), stride, padding, dilation, groups, layout,
                      strategy)
    return _conv_forward(x, w, bias, *o.args())


def conv_data_backward(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto", *,
                       stream=None):
    """rudnn.conv_data_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _conv.conv_data_backward(dy, w, x_shape, stride, padding, dilation, groups, layout, strategy,
                                        stream=stream)
    op = "rudnn.torch.conv_data_backward"
    x_shape = _conv._shape(op, "x_shape", x_shape)
    o = _conv.options(op, _conv.dims_of(op, "x_shape", x_shape), tuple(w.shape), stride, padding, dilation, groups,
                      layout, strategy)
    return _conv_data_backward(dy, w, list(x_shape), *o.args())


def conv_weight_backward(dy, x, w_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto",
                         *, stream=None):
    """rudnn.conv_weight_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _conv.conv_weight_backward(dy, x, w_shape, stride, padding, dilation, groups, layout, strategy,
                                          stream=stream)
    op = "rudnn.torch.conv_weight_backward"
    w_shape = _conv._shape(op, "w_shape", w_shape)
    o = _conv.options(op, _conv.dims_of(op, "x", x.shape), w_shape, stride, padding, dilation, groups, layout,
                      strategy)
    return _conv_weight_backward(dy, x, list(w_shape), *o.args())


def conv_bias_backward(dy, layout="NCHW", *, stream=None):
    """rudnn.conv_bias_backward as a torch custom op: torch.compile-able, the same arguments and
    results (no double backward)."""
    if stream is not None:
        return _conv.conv_bias_backward(dy, layout, stream=stream)
    op = "rudnn.torch.conv_bias_backward"
    return _conv_bias_backward(dy, _conv.layout_code(op, layout, _conv.dims_of(op, "dy", dy.shape)))


__all__ = ["conv", "conv_data_backward", "conv_weight_backward", "conv_bias_backward"]
