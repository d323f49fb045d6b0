"""grid_sample as torch.library custom ops: a fake implementation (the output shape from
libruDNN's own checks, a channels_last result for a channels_last input as in eager) and autograd
through the explicit backward (dx and dgrid, each only where an input needs it).

`rudnn.torch.grid_sample` takes the same arguments as `rudnn.grid_sample`, plus
``deterministic`` (the backward's CUDA dx without atomics); with `out=` or `stream=` the call
runs eagerly without autograd.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor

from ._op import custom_op

from .. import pooling as _pool
from .._args import flag

# The module: the package attribute rudnn.grid_sample is the function of the same name.
_gs = importlib.import_module("..grid_sample", __package__)


def _opts(mode, padding_mode, align_corners):
    return _gs.Options(mode, padding_mode, align_corners)


def _like(t: Tensor, shape, channels_last: bool) -> Tensor:
    return _pool.allocate(lambda s, _: t.new_empty(tuple(s)), tuple(shape), None, channels_last)


# `deterministic` is the backward's (CUDA dx without atomics), carried by the forward for autograd.
@custom_op("rudnn::grid_sample_forward", mutates_args=())
def _forward(x: Tensor, grid: Tensor, mode: int, padding_mode: int, align_corners: bool, layout: int,
             deterministic: bool) -> Tensor:
    return _gs.run_grid_sample("rudnn.torch.grid_sample", x, grid, _opts(mode, padding_mode, align_corners), layout)


@_forward.register_fake
def _(x, grid, mode, padding_mode, align_corners, layout, deterministic):
    opts = _opts(mode, padding_mode, align_corners)
    shape = _gs.output_shape(x.shape, grid.shape, str(x.dtype).replace("torch.", ""), opts, layout)
    return _like(x, shape, _pool.channels_last_result(x, x.dim() - 2, layout))


@custom_op("rudnn::grid_sample_backward", mutates_args=())
def _backward(dy: Tensor, x: Tensor, grid: Tensor, mode: int, padding_mode: int, align_corners: bool, layout: int,
              deterministic: bool, want_dx: bool, want_dgrid: bool) -> tuple[Tensor, Tensor]:
    # Custom ops return tensors: a slot not asked for comes back empty (and is dropped by the callers).
    dx, dgrid = _gs.run_grid_sample_backward("rudnn.torch.grid_sample_backward", dy, x, grid,
                                             _opts(mode, padding_mode, align_corners), layout, (want_dx, want_dgrid),
                                             deterministic)
    return (dx if dx is not None else x.new_empty(0)), (dgrid if dgrid is not None else grid.new_empty(0))


@_backward.register_fake
def _(dy, x, grid, mode, padding_mode, align_corners, layout, deterministic, want_dx, want_dgrid):
    dx = _like(x, x.shape, _pool.channels_last_result(x, x.dim() - 2, layout)) if want_dx else x.new_empty(0)
    dgrid = grid.new_empty(grid.shape) if want_dgrid else grid.new_empty(0)
    return dx, dgrid


def _setup_context(ctx, inputs, output):
    x, grid, *ctx.options = inputs
    ctx.save_for_backward(x, grid)


def _autograd_backward(ctx, dy):
    x, grid = ctx.saved_tensors
    want_dx, want_dgrid = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (want_dx or want_dgrid):
        return (None,) * (2 + len(ctx.options))
    dx, dgrid = _backward(dy, x, grid, *ctx.options, want_dx, want_dgrid)
    return (dx if want_dx else None, dgrid if want_dgrid else None) + (None,) * len(ctx.options)


torch.library.register_autograd("rudnn::grid_sample_forward", _autograd_backward, setup_context=_setup_context)

def grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False, *, layout="NCHW",
                deterministic=False, out=None, stream=None):
    """rudnn.grid_sample as a differentiable (x and grid), torch.compile-able custom op."""
    if out is not None or stream is not None:
        return _gs.grid_sample(x, grid, mode, padding_mode, align_corners, layout=layout, out=out, stream=stream)
    op = "rudnn.torch.grid_sample"
    opts = _gs.options(op, mode, padding_mode, align_corners)
    code = _pool.layout_code(op, layout)
    return _forward(x, grid, *opts.args(code), flag(op, "deterministic", deterministic))


def grid_sample_backward(dy, x, grid, *, mode="bilinear", padding_mode="zeros", align_corners=False, layout="NCHW",
                         deterministic=False, output_mask=(True, True)) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """rudnn.grid_sample_backward as a custom op: (dx, dgrid), None where output_mask says so."""
    op = "rudnn.torch.grid_sample_backward"
    opts = _gs.options(op, mode, padding_mode, align_corners)
    mask = _gs._output_mask(op, output_mask)
    det = flag(op, "deterministic", deterministic)
    dx, dgrid = _backward(dy, x, grid, *opts.args(_pool.layout_code(op, layout)), det, *mask)
    return (dx if mask[0] else None), (dgrid if mask[1] else None)


__all__ = ["grid_sample", "grid_sample_backward"]
