"""Max, average and adaptive pooling over 1-3 spatial axes, and their backward passes
(SPEC section 7), with torch.nn.functional's semantics.

x is (N, C, *spatial) by default, (N, *spatial, C) with ``layout="NHWC"`` (at every rank:
"NCHW" means channels first, "NHWC" channels last); the batch axis may be absent. The number
of spatial axes is the length of the window options when one is a sequence, else x's rank
minus 2. A torch ``channels_last`` tensor is read in place through its strides, and its results
come back ``channels_last`` too. Indices are int64 and flat per input plane, as torch returns
them (rudnn.jax: int32 unless jax_enable_x64; the backward functions take either). Windows
accumulate in float32; outputs take x's dtype.

Backward passes are gathers (each input element sums the output windows that cover it, in a
fixed order): deterministic, bitwise run to run, without atomics. Their window options are the
forward's, passed by keyword.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _C
from . import _frameworks as fw
from ._args import flag
from ._args import int64 as _integer
from .errors import ArgumentError, ShapeError

_LAYOUTS = {"NCHW": 0, "NHWC": 1}
_ADAPTIVE_AVG, _ADAPTIVE_MAX = 0, 1


class Window(NamedTuple):
    """Normalized window options: one int per spatial axis (hashable, for custom ops and jit)."""

    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    ceil_mode: bool

    def args(self):
        return list(self.kernel), list(self.stride), list(self.padding), list(self.dilation), self.ceil_mode


class AvgWindow(NamedTuple):
    kernel: tuple
    stride: tuple
    padding: tuple
    ceil_mode: bool
    count_include_pad: bool
    divisor_override: int | None

    def args(self):
        return (list(self.kernel), list(self.stride), list(self.padding), self.ceil_mode, self.count_include_pad,
                self.divisor_override)


def _jax():
    from . import jax as rudnn_jax

    return rudnn_jax


def _is_sequence(v):
    return isinstance(v, (tuple, list)) or (hasattr(v, "__len__") and not isinstance(v, (str, bytes)))


def spatial_dims(op, rank, options):
    """The number of spatial axes: the common length of the sequence options, else rank - 2."""
    lengths = {name: len(v) for name, v in options.items() if v is not None and _is_sequence(v) and len(v)}
    if len(set(lengths.values())) > 1:
        raise ArgumentError(f"{op}: {', '.join(lengths)}: expected one length (one entry per spatial axis), got "
                            + ", ".join(f"{name} of length {n}" for name, n in lengths.items()))
    if lengths:
        return next(iter(lengths.values()))
    if rank < 3:
        raise ShapeError(f"{op}: x: expected 3 to 5 axes ([N, C, *spatial]), got {rank}; for a batch-less input "
                         "give the window as a tuple (one entry per spatial axis)")
    return rank - 2


def sizes(op, name, v, dims):
    """An int or a sequence of `dims` ints as a tuple of `dims` ints."""
    what = f"an int or a sequence of {dims} ints"
    if _is_sequence(v):
        return tuple(_integer(op, name, e, what) for e in v)
    return (_integer(op, name, v, what),) * dims


def layout_code(op, layout):
    if layout not in _LAYOUTS:
        raise ArgumentError(f"{op}: layout: expected 'NCHW' (channels first) or 'NHWC' (channels last), "
                            f"got {layout!r}")
    return _LAYOUTS[layout]


def _default_stride(stride):
    """None for torch's two spellings of "the kernel": None and an empty sequence."""
    return None if stride is not None and _is_sequence(stride) and len(stride) == 0 else stride


def max_window(op, rank, kernel, stride, padding, dilation, ceil_mode):
    stride = _default_stride(stride)
    dims = spatial_dims(op, rank, {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation})
    k = sizes(op, "kernel", kernel, dims)
    return Window(k, k if stride is None else sizes(op, "stride", stride, dims), sizes(op, "padding", padding, dims),
                  sizes(op, "dilation", dilation, dims), flag(op, "ceil_mode", ceil_mode))


def avg_window(op, rank, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    stride = _default_stride(stride)
    dims = spatial_dims(op, rank, {"kernel": kernel, "stride": stride, "padding": padding})
    k = sizes(op, "kernel", kernel, dims)
    if divisor_override is not None:
        divisor_override = _integer(op, "divisor_override", divisor_override, "a nonzero int or None")
    return AvgWindow(k, k if stride is None else sizes(op, "stride", stride, dims),
                     sizes(op, "padding", padding, dims), flag(op, "ceil_mode", ceil_mode),
                     flag(op, "count_include_pad", count_include_pad), divisor_override)


def _spatial_shape(shape, dims, layout):
    rank = len(shape)
    if rank not in (dims + 1, dims + 2):
        return None
    return tuple(shape[rank - dims:]) if layout == 0 else tuple(shape[rank - dims - 1:rank - 1])


def output_sizes(op, shape, output_size, layout):
    """adaptive pooling's output_size as a tuple; None entries keep the input's size (torch)."""
    dims = spatial_dims(op, len(shape), {"output_size": output_size})
    entries = tuple(output_size) if _is_sequence(output_size) else (output_size,) * dims
    spatial = _spatial_shape(shape, dims, layout)
    what = "an int >= 0, None, or a sequence of them (one per spatial axis)"
    return tuple((spatial[i] if spatial else 1) if e is None else _integer(op, "output_size", e, what)
                 for i, e in enumerate(entries))


def _channels_last_memory(a, rank_batched):
    """A batched torch tensor whose channels are its densest axis (torch.channels_last & co.)."""
    if fw._module_of(a) != "torch" or a.dim() != rank_batched or a.dim() < 3 or a.is_contiguous():
        return False
    order = (0,) + tuple(range(2, a.dim())) + (1,)
    return a.permute(order).is_contiguous()


def channels_last_result(a, dims, layout, rank=None):
    """Whether a result (of rank `rank`, default a's) follows torch channels_last input `a`."""
    rank = len(a.shape) if rank is None else rank
    return layout == 0 and rank == dims + 2 and _channels_last_memory(a, dims + 2)


def allocate(empty, shape, dtype, channels_last_memory):
    """empty(shape, dtype), or channels-last memory seen in (N, C, *spatial) order (torch only)."""
    if not channels_last_memory:
        return empty(shape, dtype)
    rank = len(shape)
    dense = empty((shape[0],) + tuple(shape[2:]) + (shape[1],), dtype)
    return dense.permute((0, rank - 1) + tuple(range(1, rank - 1)))


def _spec(shape, dtype):
    """A data-less stand-in for an array of this shape and dtype name, for the C++ checks and
    output shapes (bfloat16, which NumPy lacks, stands in as float32: the checks only ask for a float)."""
    return np.broadcast_to(np.zeros((), "float32" if dtype == "bfloat16" else dtype), tuple(int(d) for d in shape))


def max_pool_shape(shape, dtype, w, layout):
    """y's shape for x of this shape and dtype name; raises what max_pool would for bad arguments."""
    return _C.max_pool_output_shape(_spec(shape, dtype), *w.args(), layout)


def avg_pool_shape(shape, dtype, w, layout):
    return _C.avg_pool_output_shape(_spec(shape, dtype), *w.args(), layout)


def adaptive_pool_shape(kind, shape, dtype, output_size, layout):
    return _C.adaptive_pool_output_shape(kind, _spec(shape, dtype), list(output_size), layout)


# ---- the calls on normalized options (shared with rudnn.torch) -------------------------------

def run_max_pool(op, x, w, return_indices, layout, out=None, stream=None):
    call = fw.Call(op, {"x": x, "out": out}, stream)
    dtype = call.dtype_name(x)
    shape = max_pool_shape(x.shape, dtype, w, layout)
    cl = channels_last_result(x, len(w.kernel), layout)
    y = out if out is not None else allocate(call.empty, shape, dtype, cl)
    indices = allocate(call.empty, shape, "int64", cl) if return_indices else None
    _C.max_pool_forward(call.arg(x), call.arg(y), call.arg(indices), *w.args(), layout, call.stream)
    return (y, indices) if return_indices else y


def run_avg_pool(op, x, w, layout, out=None, stream=None):
    call = fw.Call(op, {"x": x, "out": out}, stream)
    dtype = call.dtype_name(x)
    shape = avg_pool_shape(x.shape, dtype, w, layout)
    y = out if out is not None else allocate(call.empty, shape, dtype, channels_last_result(x, len(w.kernel), layout))
    _C.avg_pool_forward(call.arg(x), call.arg(y), *w.args(), layout, call.stream)
    return y


def run_adaptive_pool(op, kind, x, output_size, return_indices, layout, out=None, stream=None):
    call = fw.Call(op, {"x": x, "out": out}, stream)
    dtype = call.dtype_name(x)
    shape = adaptive_pool_shape(kind, x.shape, dtype, output_size, layout)
    cl = channels_last_result(x, len(output_size), layout)
    y = out if out is not None else allocate(call.empty, shape, dtype, cl)
    indices = allocate(call.empty, shape, "int64", cl) if return_indices else None
    _C.adaptive_pool_forward(kind, call.arg(x), call.arg(y), call.arg(indices), list(output_size), layout,
                             call.stream)
    return (y, indices) if return_indices else y


def run_max_pool_backward(op, dy, x, indices, w, layout, stream=None):
    call = fw.Call(op, {"dy": dy, "x": x, "indices": indices}, stream)
    dx = allocate(call.empty, tuple(x.shape), call.dtype_name(x), channels_last_result(x, len(w.kernel), layout))
    _C.max_pool_backward(call.arg(dy), call.arg(x), call.arg(indices), call.arg(dx), *w.args(), layout, call.stream)
    return dx


def _shape(op, x_shape):
    try:
        return tuple(_integer(op, "x_shape", d, "a sequence of ints") for d in x_shape)
    except TypeError:
        raise ArgumentError(f"{op}: x_shape: expected a sequence of ints, got {x_shape!r}") from None


def run_avg_pool_backward(op, dy, x_shape, w, layout, stream=None):
    call = fw.Call(op, {"dy": dy}, stream)
    dx = allocate(call.empty, x_shape, call.dtype_name(dy), channels_last_result(dy, len(w.kernel), layout,
                                                                                len(x_shape)))
    _C.avg_pool_backward(call.arg(dy), call.arg(dx), *w.args(), layout, call.stream)
    return dx


def run_adaptive_pool_backward(op, kind, dy, x, indices, x_shape, dims, layout, stream=None):
    call = fw.Call(op, {"dy": dy, "x": x, "indices": indices}, stream)
    like = x if x is not None else dy
    dx = allocate(call.empty, x_shape, call.dtype_name(like), channels_last_result(like, dims, layout, len(x_shape)))
    _C.adaptive_pool_backward(kind, call.arg(dy), call.arg(x), call.arg(indices), call.arg(dx), dims, layout,
                              call.stream)
    return dx


# ---- public API --------------------------------------------------------------------------------

def max_pool(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False, *,
             layout="NCHW", out=None, stream=None):
    """Max pooling (torch.nn.functional.max_pool1d/2d/3d). Padding is -inf; the first maximum of a
    window wins and NaN propagates. Returns y, or (y, indices) with return_indices."""
    if fw.is_jax(x):
        return _jax().max_pool(x, kernel, stride, padding, dilation, ceil_mode, return_indices, layout=layout,
                               out=out, stream=stream)
    op = "max_pool"
    w = max_window(op, len(x.shape), kernel, stride, padding, dilation, ceil_mode)
    return run_max_pool(op, x, w, flag(op, "return_indices", return_indices), layout_code(op, layout), out, stream)


def avg_pool(x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None, *,
             layout="NCHW", out=None, stream=None):
    """Average pooling (torch.nn.functional.avg_pool1d/2d/3d): the window sum divided by
    divisor_override, else by the window size counting padding (count_include_pad) or not."""
    if fw.is_jax(x):
        return _jax().avg_pool(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override,
                               layout=layout, out=out, stream=stream)
    op = "avg_pool"
    w = avg_window(op, len(x.shape), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return run_avg_pool(op, x, w, layout_code(op, layout), out, stream)


def adaptive_avg_pool(x, output_size, *, layout="NCHW", out=None, stream=None):
    """Adaptive average pooling (torch.nn.functional.adaptive_avg_pool1d/2d/3d); output element o
    of an axis pools [floor(o * I / O), ceil((o + 1) * I / O)). None in output_size keeps a size."""
    if fw.is_jax(x):
        return _jax().adaptive_avg_pool(x, output_size, layout=layout, out=out, stream=stream)
    op = "adaptive_avg_pool"
    code = layout_code(op, layout)
    return run_adaptive_pool(op, _ADAPTIVE_AVG, x, output_sizes(op, tuple(x.shape), output_size, code), False, code,
                             out, stream)


def adaptive_max_pool(x, output_size, return_indices=False, *, layout="NCHW", out=None, stream=None):
    """Adaptive max pooling (torch.nn.functional.adaptive_max_pool1d/2d/3d)."""
    if fw.is_jax(x):
        return _jax().adaptive_max_pool(x, output_size, return_indices, layout=layout, out=out, stream=stream)
    op = "adaptive_max_pool"
    code = layout_code(op, layout)
    return run_adaptive_pool(op, _ADAPTIVE_MAX, x, output_sizes(op, tuple(x.shape), output_size, code),
                             flag(op, "return_indices", return_indices), code, out, stream)


def max_pool_backward(dy, x, indices, *, kernel, stride=None, padding=0, dilation=1, ceil_mode=False,
                      return_indices=None, layout="NCHW", stream=None):
    """dx of max_pool: each element of x receives the dy of every window whose index names it.
    x supplies the shape, dtype and device. (return_indices is accepted and ignored.)"""
    del return_indices
    if fw.is_jax(x):
        return _jax().max_pool_backward(dy, x, indices, kernel=kernel, stride=stride, padding=padding,
                                        dilation=dilation, ceil_mode=ceil_mode, layout=layout)
    op = "max_pool_backward"
    w = max_window(op, len(x.shape), kernel, stride, padding, dilation, ceil_mode)
    return run_max_pool_backward(op, dy, x, indices, w, layout_code(op, layout), stream)


def avg_pool_backward(dy, x_shape, *, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                      divisor_override=None, layout="NCHW", stream=None):
    """dx (of shape x_shape, dy's dtype) of avg_pool."""
    if fw.is_jax(dy):
        return _jax().avg_pool_backward(dy, x_shape, kernel=kernel, stride=stride, padding=padding,
                                        ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                                        divisor_override=divisor_override, layout=layout)
    op = "avg_pool_backward"
    x_shape = _shape(op, x_shape)
    w = avg_window(op, len(x_shape), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return run_avg_pool_backward(op, dy, x_shape, w, layout_code(op, layout), stream)


def adaptive_avg_pool_backward(dy, x_shape, *, output_size=None, layout="NCHW", stream=None):
    """dx (of shape x_shape, dy's dtype) of adaptive_avg_pool; the output size is dy's. A sequence
    output_size (the forward's) tells the number of spatial axes of a batch-less input."""
    if fw.is_jax(dy):
        return _jax().adaptive_avg_pool_backward(dy, x_shape, output_size=output_size, layout=layout)
    op = "adaptive_avg_pool_backward"
    x_shape = _shape(op, x_shape)
    dims = spatial_dims(op, len(x_shape), {"output_size": output_size})
    return run_adaptive_pool_backward(op, _ADAPTIVE_AVG, dy, None, None, x_shape, dims, layout_code(op, layout),
                                      stream)


def adaptive_max_pool_backward(dy, x, indices, *, output_size=None, return_indices=None, layout="NCHW",
                               stream=None):
    """dx of adaptive_max_pool given the indices it returned; x supplies shape, dtype and device."""
    del return_indices
    if fw.is_jax(x):
        return _jax().adaptive_max_pool_backward(dy, x, indices, output_size=output_size, layout=layout)
    op = "adaptive_max_pool_backward"
    dims = spatial_dims(op, len(x.shape), {"output_size": output_size})
    return run_adaptive_pool_backward(op, _ADAPTIVE_MAX, dy, x, indices, tuple(x.shape), dims,
                                      layout_code(op, layout), stream)


__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "max_pool_backward",
           "avg_pool_backward", "adaptive_avg_pool_backward", "adaptive_max_pool_backward"]
