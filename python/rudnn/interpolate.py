"""Resampling over 1-3 spatial axes (torch.nn.functional.interpolate) and its backward pass
(SPEC section 7).

x is (N, C, *spatial) by default, (N, *spatial, C) with ``layout="NHWC"`` (at every rank); the
number of spatial axes is x's rank minus 2. A torch ``channels_last`` tensor is read in place
through its strides, and its result comes back ``channels_last`` too. The options follow torch:
exactly one of size and scale_factor; the output size is size, else floor(input size *
scale_factor); the given scale maps coordinates unless recompute_scale_factor=True (area: always
recomputed); align_corners with the linear modes and bicubic only; antialias with bilinear and
bicubic only. Taps accumulate in float32; outputs take x's dtype.

The backward pass is a gather (each input element sums the outputs that read it, in a fixed
order): deterministic, bitwise run to run, without atomics. Its options are the forward's,
passed by keyword.
"""

from __future__ import annotations

from typing import NamedTuple

from . import _C
from . import _frameworks as fw
from ._args import flag
from ._args import int64 as _integer
from ._args import number as _number
from .errors import ArgumentError
from .pooling import _is_sequence, _shape, _spec, allocate, channels_last_result, layout_code

MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic", "area")  # the C++ codes' order


class Options(NamedTuple):
    """Normalized interpolate options (hashable, for custom ops and jit). size and scale_factor
    are tuples, empty when not given; align_corners and recompute_scale_factor -1 for None."""

    mode: int
    size: tuple
    scale_factor: tuple
    align_corners: int
    recompute_scale_factor: int
    antialias: bool

    def args(self, layout):
        return (self.mode, layout, list(self.size), list(self.scale_factor), self.align_corners,
                self.recompute_scale_factor, self.antialias)


def _optional_flag(op, name, value):
    return -1 if value is None else int(flag(op, name, value))


def _per_axis(op, name, v, dims, convert):
    """One entry per spatial axis: a scalar repeats, a sequence is taken as given (libruDNN checks its length)."""
    if not _is_sequence(v):
        return (convert(v),) * dims
    if len(v) == 0:
        raise ArgumentError(f"{op}: {name}: expected {dims} entries (one per spatial axis), got an empty sequence")
    return tuple(convert(e) for e in v)


def options(op, rank, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    if mode not in MODES:
        raise ArgumentError(f"{op}: mode: expected one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    dims = max(rank - 2, 1)
    sizes = () if size is None else _per_axis(
        op, "size", size, dims, lambda e: _integer(op, "size", e, "an int or a sequence of ints"))
    scales = () if scale_factor is None else _per_axis(
        op, "scale_factor", scale_factor, dims,
        lambda e: _number(op, "scale_factor", e, "a number or a sequence of numbers"))
    return Options(MODES.index(mode), sizes, scales, _optional_flag(op, "align_corners", align_corners),
                   _optional_flag(op, "recompute_scale_factor", recompute_scale_factor),
                   flag(op, "antialias", antialias))


def output_shape(shape, dtype, opts, layout):
    """y's shape for x of this shape and dtype name; raises what interpolate would for bad arguments."""
    return _C.interpolate_output_shape(_spec(shape, dtype), *opts.args(layout))


# ---- the calls on normalized options (shared with rudnn.torch) -------------------------------

def run_interpolate(op, x, opts, layout, out=None, stream=None):
    call = fw.Call(op, {"x": x, "out": out}, stream)
    dtype = call.dtype_name(x)
    shape = output_shape(x.shape, dtype, opts, layout)
    y = out if out is not None else allocate(call.empty, shape, dtype,
                                             channels_last_result(x, len(x.shape) - 2, layout))
    _C.interpolate_forward(call.arg(x), call.arg(y), *opts.args(layout), call.stream)
    return y


def run_interpolate_backward(op, dy, x_shape, opts, layout, stream=None):
    call = fw.Call(op, {"dy": dy}, stream)
    dx = allocate(call.empty, x_shape, call.dtype_name(dy),
                  channels_last_result(dy, len(x_shape) - 2, layout, len(x_shape)))
    _C.interpolate_backward(call.arg(dy), call.arg(dx), *opts.args(layout), call.stream)
    return dx


# ---- public API --------------------------------------------------------------------------------

def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None,
                antialias=False, *, layout="NCHW", out=None, stream=None):
    """torch.nn.functional.interpolate: nearest, nearest-exact, linear (3-D x), bilinear (4-D),
    trilinear (5-D), bicubic (4-D; A = -0.75, border taps clamped) and area (adaptive average
    pooling) resampling; antialias (bilinear, bicubic) widens the filter when downsampling."""
    if fw.is_jax(x):
        from . import jax as rudnn_jax

        return rudnn_jax.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias,
                                     layout=layout)
    op = "interpolate"
    opts = options(op, len(x.shape), size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    return run_interpolate(op, x, opts, layout_code(op, layout), out, stream)


def interpolate_backward(dy, x_shape, *, size=None, scale_factor=None, mode="nearest", align_corners=None,
                         recompute_scale_factor=None, antialias=False, layout="NCHW", stream=None):
    """dx (of shape x_shape, dy's dtype) of interpolate with these options."""
    if fw.is_jax(dy):
        from . import jax as rudnn_jax

        return rudnn_jax.interpolate_backward(dy, x_shape, size=size, scale_factor=scale_factor, mode=mode,
                                              align_corners=align_corners,
                                              recompute_scale_factor=recompute_scale_factor, antialias=antialias,
                                              layout=layout)
    op = "interpolate_backward"
    x_shape = _shape(op, x_shape)
    opts = options(op, len(x_shape), size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    return run_interpolate_backward(op, dy, x_shape, opts, layout_code(op, layout), stream)


__all__ = ["interpolate", "interpolate_backward"]
