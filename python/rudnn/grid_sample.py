"""Sampling an input at grid points (torch.nn.functional.grid_sample) and its backward pass
(SPEC section 7).

x is (N, C, H, W) or (N, C, D, H, W) by default, (N, H, W, C) or (N, D, H, W, C) with
``layout="NHWC"``; grid is (N, H_out, W_out, 2) or (N, D_out, H_out, W_out, 3) in either layout,
its last axis (x, y[, z]) in [-1, 1], of x's dtype and device. A torch ``channels_last`` x is read
in place through its strides, and its result comes back ``channels_last`` too. Modes: bilinear
(trilinear on 5-D input), nearest (round half to even) and bicubic (4-D only, A = -0.75);
padding_mode zeros, border or reflection; align_corners as in torch. The coordinate math is
torch's, in float32; outputs take x's dtype.

The backward pass returns (dx, dgrid) as torch's autograd does; ``output_mask=(want_dx,
want_dgrid)`` skips either (its slot is None). dgrid sums each point over the channels in a
fixed order. dx: on the CPU, and on CUDA with ``deterministic=True``, a fixed-order sum (one
writer per element, bitwise run-to-run deterministic); the CUDA default accumulates with float32
atomics (faster; the last bits may vary run to run). On CUDA dx accumulates in a float32
workspace allocated here with the caller's framework.
"""

from __future__ import annotations

from typing import NamedTuple

from . import _C
from . import _frameworks as fw
from ._args import flag
from .errors import ArgumentError
from .pooling import _spec, allocate, channels_last_result, layout_code

MODES = ("bilinear", "nearest", "bicubic")  # the C++ codes' order
PADDING_MODES = ("zeros", "border", "reflection")


class Options(NamedTuple):
    """Normalized grid_sample options (hashable, for custom ops and jit)."""

    mode: int
    padding_mode: int
    align_corners: bool

    def args(self, layout):
        return (self.mode, self.padding_mode, self.align_corners, layout)


def options(op, mode, padding_mode, align_corners):
    if mode not in MODES:
        raise ArgumentError(f"{op}: mode: expected one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    if padding_mode not in PADDING_MODES:
        raise ArgumentError(f"{op}: padding_mode: expected one of {', '.join(repr(m) for m in PADDING_MODES)}, "
                            f"got {padding_mode!r}")
    # torch's default align_corners=None means False (with a warning); rudnn takes None as False too.
    align = False if align_corners is None else flag(op, "align_corners", align_corners)
    return Options(MODES.index(mode), PADDING_MODES.index(padding_mode), align)


def _output_mask(op, mask):
    if not (isinstance(mask, (tuple, list)) and len(mask) == 2):
        raise ArgumentError(f"{op}: output_mask: expected (want_dx, want_dgrid), two bools, got {mask!r}")
    return tuple(flag(op, "output_mask", m) for m in mask)


def output_shape(x_shape, grid_shape, dtype, opts, layout):
    """y's shape for x and grid of these shapes and dtype name; raises what grid_sample would."""
    return _C.grid_sample_output_shape(_spec(x_shape, dtype), _spec(grid_shape, dtype), *opts.args(layout))


# ---- the calls on normalized options (shared with rudnn.torch) -------------------------------

def run_grid_sample(op, x, grid, opts, layout, out=None, stream=None):
    call = fw.Call(op, {"x": x, "grid": grid, "out": out}, stream)
    dtype = call.dtype_name(x)
    shape = output_shape(x.shape, grid.shape, dtype, opts, layout)
    y = out if out is not None else allocate(call.empty, shape, dtype,
                                             channels_last_result(x, len(x.shape) - 2, layout))
    _C.grid_sample_forward(call.arg(x), call.arg(grid), call.arg(y), *opts.args(layout), call.stream)
    return y


def run_grid_sample_backward(op, dy, x, grid, opts, layout, mask=(True, True), deterministic=False, stream=None):
    call = fw.Call(op, {"dy": dy, "x": x, "grid": grid}, stream)
    dtype = call.dtype_name(x)
    dx = allocate(call.empty, tuple(x.shape), dtype, channels_last_result(x, len(x.shape) - 2, layout)) \
        if mask[0] else None
    dgrid = call.empty(tuple(grid.shape), dtype) if mask[1] else None
    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.grid_sample_backward(call.arg(dy), call.arg(x), call.arg(grid), call.arg(dx), call.arg(dgrid), None,
                            *opts.args(layout), deterministic, call.stream, call.workspace_alloc)
    return dx, dgrid


# ---- public API --------------------------------------------------------------------------------

def grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False, *, layout="NCHW", out=None,
                stream=None):
    """torch.nn.functional.grid_sample: x sampled at grid's points (bilinear, nearest or bicubic;
    zeros, border or reflection padding)."""
    if fw.is_jax(x):
        from . import jax as rudnn_jax

        return rudnn_jax.grid_sample(x, grid, mode, padding_mode, align_corners, layout=layout)
    op = "grid_sample"
    opts = options(op, mode, padding_mode, align_corners)
    return run_grid_sample(op, x, grid, opts, layout_code(op, layout), out, stream)


def grid_sample_backward(dy, x, grid, *, mode="bilinear", padding_mode="zeros", align_corners=False, layout="NCHW",
                         deterministic=False, output_mask=(True, True), stream=None):
    """(dx, dgrid) of grid_sample with these options given dy; a slot masked off by output_mask
    is None. deterministic=True: CUDA's dx without atomics (the CPU's always is)."""
    if fw.is_jax(dy):
        from . import jax as rudnn_jax

        return rudnn_jax.grid_sample_backward(dy, x, grid, mode=mode, padding_mode=padding_mode,
                                              align_corners=align_corners, layout=layout,
                                              deterministic=deterministic, output_mask=output_mask)
    op = "grid_sample_backward"
    opts = options(op, mode, padding_mode, align_corners)
    mask = _output_mask(op, output_mask)
    return run_grid_sample_backward(op, dy, x, grid, opts, layout_code(op, layout), mask,
                                    flag(op, "deterministic", deterministic), stream)


__all__ = ["grid_sample", "grid_sample_backward"]
