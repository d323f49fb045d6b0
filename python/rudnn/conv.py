"""Convolution over 1-3 spatial axes and its backward passes (SPEC section 6), with
torch.nn.functional.conv1d/2d/3d's semantics (cross-correlation, zero padding, groups).

The rank of x decides the spatial dims (3, 4 or 5 axes; the batch axis is required).
``layout="NCHW"`` (the default, at every rank: channels first): x is (N, C, *spatial) and w
(Cout, Cin / groups, *kernel), as in torch. ``layout="NHWC"`` (channels last): x is
(N, *spatial, C) and w (Cout, *kernel, Cin / groups), as cuDNN and CUTLASS keep them; the
rank-specific names "NCW"/"NCL"/"NCDHW" and "NWC"/"NLC"/"NDHWC" are accepted where they match
x's rank. A torch ``channels_last`` tensor passed with the default layout is read in place through
its strides (no layout copy) and its result comes back ``channels_last``. The direct kernels read
every tensor through its strides (no layout makes a copy); implicit_gemm copies what is not packed
channels-last (below).

``padding`` is an int, a sequence of one int per spatial axis, "valid" (no padding) or "same"
(stride 1 only; an even kernel extent puts the extra element after, as torch does).

Strategies: "direct" (any groups incl. depthwise, dtype, size, stride, dilation; float32 sums in a
fixed order), "implicit_gemm" (CUTLASS's implicit-GEMM convolution kernels on CUDA: the CUTLASS
3.x collective builder with TMA im2col on sm90a, the CUTLASS 2.x kernels on sm80-class GPUs and
for what the sm90 kernels refuse; float16/bfloat16 with float32 accumulation, and float32 as TF32
(inputs rounded to 10 mantissa bits, float32 accumulation, as torch's default
cudnn.allow_tf32 convolutions; the CUTLASS 2.x kernels on every GPU); groups == 1, input and
output channels multiples of 8 (16-bit) or 4 (float32); the bias is added in the forward's
epilogue; the weight gradient has no split-K, so it is deterministic. A case it cannot take is an
UnsupportedError saying why, as is any CPU array), "auto" (implicit_gemm where it applies, direct otherwise;
float32 always direct, exact: TF32 only when implicit_gemm is asked for by name) and "autotune" (on CUDA, where
implicit_gemm applies: both timed on the caller's stream the first time an (op, device, dtype,
exact shape, layout) is seen, one synchronization, then the faster reused in this process and,
with RUDNN_AUTOTUNE_CACHE=<file>, recorded there for later processes; elsewhere as auto). Arrays implicit_gemm cannot read in place (NCHW, other strides) are copied
once each way through a workspace allocated with the caller's framework; NHWC and torch
channels_last tensors run without copies. ``conv_last_algorithm()`` says what the last call of
this thread ran: "cpu", "direct", "direct_packed" (the CUDA forward reading x and w in 16-byte
packs of input channels, taken when both are dense along them: NHWC or channels_last, Cin / groups
a multiple of 8 (f16/bf16) or 4 (f32)), "implicit_gemm_sm80" or "implicit_gemm_sm90". Direct sums
are float32 in a fixed order, the weight and bias gradients too (no atomics: bitwise deterministic
run to run); outputs take x's dtype.
"""

from __future__ import annotations

from typing import NamedTuple

from . import _C
from . import _frameworks as fw
from ._args import int64 as _integer
from .errors import ArgumentError, ShapeError
from .pooling import _is_sequence, _spec, allocate, channels_last_result

_LAYOUTS = {"NCHW": (0, None), "NHWC": (1, None),
            "NCW": (0, 1), "NCL": (0, 1), "NWC": (1, 1), "NLC": (1, 1), "NCDHW": (0, 3), "NDHWC": (1, 3)}
_STRATEGIES = {"auto": 0, "direct": 1, "implicit_gemm": 2, "autotune": 3}
_RANK_NAMES = "3, 4 or 5 axes ([N, C, L], [N, C, H, W] or [N, C, D, H, W]; channels last with layout='NHWC')"


class ConvOptions(NamedTuple):
    """Normalized options: one int per spatial axis (hashable, for custom ops and jit)."""

    stride: tuple
    pad_before: tuple
    pad_after: tuple
    dilation: tuple
    groups: int
    layout: int      # 0 channels first, 1 channels last
    strategy: int    # a _STRATEGIES code

    @property
    def dims(self):
        return len(self.stride)

    def args(self):
        return (list(self.stride), list(self.pad_before), list(self.pad_after), list(self.dilation), self.groups,
                self.layout, self.strategy)


def _jax():
    from . import jax as rudnn_jax

    return rudnn_jax


def dims_of(op, name, shape):
    rank = len(shape)
    if rank not in (3, 4, 5):
        raise ShapeError(f"{op}: {name}: expected {_RANK_NAMES}, got shape {tuple(shape)}")
    return rank - 2


def layout_code(op, layout, dims):
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ArgumentError(f"{op}: layout: expected 'NCHW' (channels first) or 'NHWC' (channels last), got "
                            f"{layout!r}")
    code, rank_dims = _LAYOUTS[layout]
    if rank_dims is not None and rank_dims != dims:
        raise ShapeError(f"{op}: layout: layout mismatch: {layout!r} is a layout for {rank_dims} spatial dims, but "
                         f"the arrays have {dims} ({dims + 2} axes)")
    return code


def _sizes(op, name, v, dims):
    what = f"an int or a sequence of {dims} ints (one per spatial axis)"
    if _is_sequence(v):
        if len(v) != dims:
            raise ArgumentError(f"{op}: {name}: expected {what}, got {v!r}")
        return tuple(_integer(op, name, e, what) for e in v)
    return (_integer(op, name, v, what),) * dims


def _kernel_sizes(w_shape, dims, layout):
    return tuple(w_shape[1:1 + dims]) if layout == 1 else tuple(w_shape[2:2 + dims])


def options(op, dims, w_shape, stride, padding, dilation, groups, layout, strategy):
    """ConvOptions from the public keywords; w_shape gives the kernel for padding="same"."""
    code = layout_code(op, layout, dims)
    stride = _sizes(op, "stride", stride, dims)
    dilation = _sizes(op, "dilation", dilation, dims)
    groups = _integer(op, "groups", groups, "an int >= 1")
    if not isinstance(strategy, str) or strategy not in _STRATEGIES:
        raise ArgumentError(f"{op}: strategy: expected one of {', '.join(map(repr, _STRATEGIES))}, got {strategy!r}")
    if isinstance(padding, str):
        if padding == "valid":
            before = after = (0,) * dims
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ArgumentError(f"{op}: padding: padding='same' is not supported for strided convolutions "
                                    f"(stride {stride}); give the padding as ints")
            kernel = _kernel_sizes(w_shape, dims, code)
            if len(kernel) != dims:  # a w of the wrong rank: the C++ checks name it
                kernel = (1,) * dims
            total = tuple(d * (k - 1) for d, k in zip(dilation, kernel))
            before = tuple(t // 2 for t in total)
            after = tuple(t - b for t, b in zip(total, before))
        else:
            raise ArgumentError(f"{op}: padding: expected an int, a sequence of {dims} ints, 'same' or 'valid', "
                                f"got {padding!r}")
    else:
        before = after = _sizes(op, "padding", padding, dims)
    return ConvOptions(stride, before, after, dilation, groups, code, _STRATEGIES[strategy])


def _shape(op, name, shape):
    try:
        return tuple(_integer(op, name, d, "a sequence of ints") for d in shape)
    except TypeError:
        raise ArgumentError(f"{op}: {name}: expected a sequence of ints, got {shape!r}") from None


def output_shape(x_shape, x_dtype, w_shape, w_dtype, o):
    """y's shape for x and w of these shapes and dtype names; raises what conv would for bad arguments."""
    return _C.conv_output_shape(_spec(x_shape, x_dtype), _spec(w_shape, w_dtype), *o.args())


# ---- the calls on normalized options (shared with rudnn.torch) -------------------------------

def run_conv(op, x, w, bias, o, out=None, stream=None):
    call = fw.Call(op, {"x": x, "w": w, "bias": bias, "out": out}, stream)
    shape = output_shape(x.shape, call.dtype_name(x), w.shape, call.dtype_name(w), o)
    y = out if out is not None else allocate(call.empty, shape, call.dtype_name(x),
                                             channels_last_result(x, o.dims, o.layout))
    _C.conv_forward(call.arg(x), call.arg(w), call.arg(bias), call.arg(y), *o.args(), call.stream,
                    call.workspace_alloc)
    return y


def run_data_backward(op, dy, w, x_shape, o, stream=None):
    call = fw.Call(op, {"dy": dy, "w": w}, stream)
    dx = allocate(call.empty, x_shape, call.dtype_name(dy), channels_last_result(dy, o.dims, o.layout, len(x_shape)))
    _C.conv_data_backward(call.arg(dy), call.arg(w), call.arg(dx), *o.args(), call.stream, call.workspace_alloc)
    return dx


def run_weight_backward(op, dy, x, w_shape, o, stream=None):
    call = fw.Call(op, {"dy": dy, "x": x}, stream)
    dw = call.empty(w_shape, call.dtype_name(dy))
    _C.conv_weight_backward(call.arg(dy), call.arg(x), call.arg(dw), *o.args(), call.stream, call.workspace_alloc)
    return dw


def run_bias_backward(op, dy, layout, stream=None):
    call = fw.Call(op, {"dy": dy}, stream)
    dims = dims_of(op, "dy", dy.shape)
    channels = dy.shape[-1] if layout == 1 else dy.shape[1]
    db = call.empty((channels,), call.dtype_name(dy))
    _C.conv_bias_backward(call.arg(dy), call.arg(db), dims, layout, call.stream)
    return db


# ---- public API --------------------------------------------------------------------------------

def conv(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto", *, out=None,
         stream=None):
    """y = conv(x, w) + bias (torch.nn.functional.conv1d/2d/3d). x: (N, C, *spatial) or with
    layout="NHWC" (N, *spatial, C); w: (Cout, Cin / groups, *kernel) or (Cout, *kernel, Cin / groups);
    bias: (Cout,) or None. Returns y in x's layout and dtype."""
    if fw.is_jax(x):
        return _jax().conv(x, w, bias, stride, padding, dilation, groups, layout, strategy)
    op = "conv"
    o = options(op, dims_of(op, "x", x.shape), tuple(w.shape), stride, padding, dilation, groups, layout, strategy)
    return run_conv(op, x, w, bias, o, out, stream)


def conv_data_backward(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto", *,
                       stream=None):
    """dx (of shape x_shape, dy's dtype) of conv given dy: a gather over the output elements
    that read each input element (elements no output reads get 0)."""
    if fw.is_jax(dy):
        return _jax().conv_data_backward(dy, w, x_shape, stride, padding, dilation, groups, layout, strategy)
    op = "conv_data_backward"
    x_shape = _shape(op, "x_shape", x_shape)
    o = options(op, dims_of(op, "x_shape", x_shape), tuple(w.shape), stride, padding, dilation, groups, layout,
                strategy)
    return run_data_backward(op, dy, w, x_shape, o, stream)


def conv_weight_backward(dy, x, w_shape, stride=1, padding=0, dilation=1, groups=1, layout="NCHW", strategy="auto",
                         *, stream=None):
    """dw (of shape w_shape, dy's dtype) of conv given dy and x: a fixed-order float32 sum per
    weight element (deterministic)."""
    if fw.is_jax(dy):
        return _jax().conv_weight_backward(dy, x, w_shape, stride, padding, dilation, groups, layout, strategy)
    op = "conv_weight_backward"
    w_shape = _shape(op, "w_shape", w_shape)
    o = options(op, dims_of(op, "x", x.shape), w_shape, stride, padding, dilation, groups, layout, strategy)
    return run_weight_backward(op, dy, x, w_shape, o, stream)


def conv_bias_backward(dy, layout="NCHW", *, stream=None):
    """db (Cout,) of conv: dy summed over every axis but the channels (deterministic)."""
    if fw.is_jax(dy):
        return _jax().conv_bias_backward(dy, layout)
    op = "conv_bias_backward"
    code = layout_code(op, layout, dims_of(op, "dy", dy.shape))
    return run_bias_backward(op, dy, code, stream)


def conv_last_algorithm() -> str:
    """What the last conv call of this thread ran: "cpu", "direct", "direct_packed",
    "implicit_gemm_sm80", "implicit_gemm_sm90" or "none"."""
    return _C.conv_last_algorithm()


__all__ = ["conv", "conv_data_backward", "conv_weight_backward", "conv_bias_backward", "conv_last_algorithm"]
