"""interpolate as torch.library custom ops: a fake implementation (the output shape from
libruDNN's own checks, a channels_last result for a channels_last input as in eager) and autograd
through the explicit backward gather.

`rudnn.torch.interpolate` takes the same arguments as `rudnn.interpolate`; with `out=` or
`stream=` the call runs eagerly without autograd.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from ._op import custom_op

from .. import pooling as _pool

# The module: the package attribute rudnn.interpolate is the function of the same name.
_interp = importlib.import_module("..interpolate", __package__)


def _opts(mode, size, scale_factor, align_corners, recompute_scale_factor, antialias):
    return _interp.Options(mode, tuple(size), tuple(scale_factor), align_corners, recompute_scale_factor, antialias)


def _fake(like: Tensor, shape, channels_last: bool) -> Tensor:
    return _pool.allocate(lambda s, _: like.new_empty(tuple(s)), tuple(shape), None, channels_last)


@custom_op("rudnn::interpolate_forward", mutates_args=())
def _forward(x: Tensor, mode: int, layout: int, size: list[int], scale_factor: list[float], align_corners: int,
             recompute_scale_factor: int, antialias: bool) -> Tensor:
    opts = _opts(mode, size, scale_factor, align_corners, recompute_scale_factor, antialias)
    return _interp.run_interpolate("rudnn.torch.interpolate", x, opts, layout)


@_forward.register_fake
def _(x, mode, layout, size, scale_factor, align_corners, recompute_scale_factor, antialias):
    opts = _opts(mode, size, scale_factor, align_corners, recompute_scale_factor, antialias)
    shape = _interp.output_shape(x.shape, str(x.dtype).replace("torch.", ""), opts, layout)
    return _fake(x, shape, _pool.channels_last_result(x, x.dim() - 2, layout))


@custom_op("rudnn::interpolate_backward", mutates_args=())
def _backward(dy: Tensor, x_shape: list[int], mode: int, layout: int, size: list[int], scale_factor: list[float],
              align_corners: int, recompute_scale_factor: int, antialias: bool) -> Tensor:
    opts = _opts(mode, size, scale_factor, align_corners, recompute_scale_factor, antialias)
    return _interp.run_interpolate_backward("rudnn.torch.interpolate_backward", dy, tuple(x_shape), opts, layout)


@_backward.register_fake
def _(dy, x_shape, mode, layout, size, scale_factor, align_corners, recompute_scale_factor, antialias):
    return _fake(dy, x_shape, _pool.channels_last_result(dy, len(x_shape) - 2, layout, len(x_shape)))


def _setup_context(ctx, inputs, output):
    x, *ctx.options = inputs
    ctx.x_shape = list(x.shape)


def _autograd_backward(ctx, dy):
    return (_backward(dy, ctx.x_shape, *ctx.options),) + (None,) * len(ctx.options)


torch.library.register_autograd("rudnn::interpolate_forward", _autograd_backward, setup_context=_setup_context)


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                antialias=False, *, layout="NCHW", out=None, stream=None):
    """rudnn.interpolate as a differentiable, torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _interp.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias,
                                   layout=layout, out=out, stream=stream)
    op = "rudnn.torch.interpolate"
    opts = _interp.options(op, x.dim(), size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    return _forward(x, *opts.args(_pool.layout_code(op, layout)))


def interpolate_backward(dy, x_shape, *, size=None, scale_factor=None, mode="nearest", align_corners=None,
                         recompute_scale_factor=None, antialias=False, layout="NCHW"):
    """rudnn.interpolate_backward as a custom op."""
    op = "rudnn.torch.interpolate_backward"
    x_shape = _pool._shape(op, x_shape)
    opts = _interp.options(op, len(x_shape), size, scale_factor, mode, align_corners, recompute_scale_factor,
                           antialias)
    layout = _pool.layout_code(op, layout)
    return _backward(dy, list(x_shape), opts.mode, layout, *opts.args(layout)[2:])


__all__ = ["interpolate", "interpolate_backward"]
