"""LayerNorm, RMSNorm and softmax over the last axis (SPEC section 1).

Each function takes torch, CuPy, NumPy or JAX arrays and returns arrays of the
same framework on the same device. Statistics are float32; outputs take x's dtype.
"""

from __future__ import annotations

from . import _C
from . import _frameworks as fw
from ._args import flag, float32_number

_LAYER, _RMS = 0, 1


def _jax():
    from . import jax as rudnn_jax

    return rudnn_jax


def _forward(op, kind, x, weight, bias, residual, eps, return_stats, out, stream):
    eps = float32_number(op, "eps", eps, "a finite value > 0")  # libruDNN refuses <= 0 by its own words
    return_stats = flag(op, "return_stats", return_stats)
    call = fw.Call(op, {"x": x, "weight": weight, "bias": bias, "residual": residual, "out": out}, stream)
    shape = tuple(x.shape)
    dtype = call.dtype_name(x)
    y = out if out is not None else call.empty(shape, dtype)
    h = call.empty(shape, dtype) if residual is not None else None
    mean = call.empty(shape[:-1], "float32") if return_stats and kind == _LAYER else None
    rstd = call.empty(shape[:-1], "float32") if return_stats else None
    _C.norm_forward(kind, call.arg(x), call.arg(weight), call.arg(bias), call.arg(residual), eps,
                    call.arg(y), call.arg(h), call.arg(mean), call.arg(rstd), call.stream)
    results = (y,) + ((h,) if h is not None else ()) + tuple(s for s in (mean, rstd) if s is not None)
    return results[0] if len(results) == 1 else results


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, residual=None, return_stats=False, out=None, stream=None):
    """LayerNorm over the last axis: (h - mean) / sqrt(var + eps) * weight + bias.

    weight, bias: [H], float32 or x's dtype (optional). With `residual`, h = x + residual
    is normalized and returned too: (y, h). `return_stats=True` appends float32 mean and
    rstd of shape x.shape[:-1]. `out=` receives y (torch, CuPy, NumPy); it may be x itself
    (in place) when there is no residual, and must not otherwise share memory with an argument.
    """
    if fw.is_jax(x):
        return _jax().layer_norm(x, weight, bias, eps, residual=residual, return_stats=return_stats, out=out,
                                 stream=stream)
    return _forward("layer_norm", _LAYER, x, weight, bias, residual, eps, return_stats, out, stream)


def rms_norm(x, weight=None, eps=1e-6, *, residual=None, return_stats=False, out=None, stream=None):
    """RMSNorm over the last axis: h / sqrt(mean(h^2) + eps) * weight.

    With `residual`, h = x + residual is normalized and returned too: (y, h).
    `return_stats=True` appends the float32 rstd of shape x.shape[:-1]. `out=` as in layer_norm
    (x itself without a residual, else memory shared with no argument).
    """
    if fw.is_jax(x):
        return _jax().rms_norm(x, weight, eps, residual=residual, return_stats=return_stats, out=out, stream=stream)
    return _forward("rms_norm", _RMS, x, weight, None, residual, eps, return_stats, out, stream)


def softmax(x, *, out=None, stream=None):
    """Softmax over the last axis, computed in float32. A row of only -inf gives NaN.
    `out=` may be x itself (in place), and must not otherwise share memory with x."""
    if fw.is_jax(x):
        return _jax().softmax(x, out=out, stream=stream)
    call = fw.Call("softmax", {"x": x, "out": out}, stream)
    y = out if out is not None else call.empty(tuple(x.shape), call.dtype_name(x))
    _C.softmax_forward(call.arg(x), call.arg(y), call.stream)
    return y


def _backward(op, kind, dy, x, weight, mean, rstd, stream):
    call = fw.Call(op, {"dy": dy, "x": x, "weight": weight, "mean": mean, "rstd": rstd}, stream)
    hidden = tuple(x.shape)[-1:] or (0,)
    dx = call.empty(tuple(x.shape), call.dtype_name(x))
    dweight = call.empty(hidden, "float32") if weight is not None else None
    dbias = call.empty(hidden, "float32") if kind == _LAYER else None

    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.norm_backward(kind, call.arg(dy), call.arg(x), call.arg(weight), call.arg(mean), call.arg(rstd), call.arg(dx),
                     call.arg(dweight), call.arg(dbias), None, call.stream, call.workspace_alloc)
    return dx, dweight, dbias


def layer_norm_backward(dy, x, weight, mean, rstd, *, stream=None):
    """Gradients of layer_norm: (dx, dweight, dbias); dweight/dbias float32 [H], reduced
    over rows in a fixed order (deterministic). dweight is None when weight is None.
    x is the normalized input (x + residual when a residual was fused)."""
    if fw.is_jax(x):
        return _jax().layer_norm_backward(dy, x, weight, mean, rstd)
    return _backward("layer_norm_backward", _LAYER, dy, x, weight, mean, rstd, stream)


def rms_norm_backward(dy, x, weight, rstd, *, stream=None):
    """Gradients of rms_norm: (dx, dweight); dweight float32 [H] (None without weight)."""
    if fw.is_jax(x):
        return _jax().rms_norm_backward(dy, x, weight, rstd)
    dx, dweight, _ = _backward("rms_norm_backward", _RMS, dy, x, weight, None, rstd, stream)
    return dx, dweight


def softmax_backward(dy, y, *, stream=None):
    """Gradient of softmax given its output y: dx = y * (dy - sum(dy * y))."""
    if fw.is_jax(y):
        return _jax().softmax_backward(dy, y)
    call = fw.Call("softmax_backward", {"dy": dy, "y": y}, stream)
    dx = call.empty(tuple(y.shape), call.dtype_name(y))
    _C.softmax_backward(call.arg(dy), call.arg(y), call.arg(dx), call.stream)
    return dx
