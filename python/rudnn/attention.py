"""Dense scaled-dot-product attention, forward and backward (SPEC section 2).

Each function takes torch, CuPy, NumPy or JAX arrays and returns arrays of the same
framework on the same device. Softmax statistics are float32; outputs take q's dtype.
"""

from __future__ import annotations

import operator

import numpy as np

from . import _C
from . import _frameworks as fw
from ._args import flag, float32_number
from .errors import ArgumentError

STRATEGIES = {"auto": 0, "flash": 1, "fallback": 2, "autotune": 3}


def _jax():
    from . import jax as rudnn_jax

    return rudnn_jax


def _strategy(op, strategy):
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ArgumentError(f"{op}: strategy: expected one of 'auto', 'flash', 'fallback', 'autotune', "
                            f"got {strategy!r}")
    return STRATEGIES[strategy]


def _window(op, window):
    if window is None:
        return -1, -1
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ArgumentError(f"{op}: window: expected None or a pair (left, right), got {window!r}") from None
    sides = []
    for side in (left, right):
        if side is None:
            sides.append(-1)
            continue
        try:  # any integer (NumPy's too, as FlashAttention's window_size takes), not bool or float
            if isinstance(side, (bool, np.bool_)):
                raise TypeError
            sides.append(operator.index(side))
        except TypeError:
            raise ArgumentError(f"{op}: window: expected (left, right) with each an int >= 0 or None, "
                                f"got {window!r}") from None
    return tuple(sides)


def _softcap(op, softcap):
    # 0 would silently mean "off" in the C++ API, so a softcap float32 flushes to 0 is refused too.
    return 0.0 if softcap is None else float32_number(op, "softcap", softcap, "a finite value > 0 (or None)",
                                                      positive=True)


def _scale(op, scale):
    # its sign and zero are libruDNN's to refuse; here only what float32 cannot hold
    return None if scale is None else float32_number(op, "scale", scale, "a finite value > 0 (or None for 1/sqrt(D))")


def options(op, *, mask, bias, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, strategy):
    """The option arguments of the _C.attention_* functions, checked where Python must."""
    left, right = _window(op, window)
    return dict(scale=_scale(op, scale), causal=flag(op, "causal", causal), window_left=left,
                window_right=right, softcap=_softcap(op, softcap), strategy=_strategy(op, strategy))


def _shapes(q, v, varlen):
    """(out shape, lse shape), or empty placeholders when the ranks are wrong (the C++
    validation then reports the real problem)."""
    qs, vs = tuple(q.shape), tuple(v.shape)
    if varlen and len(qs) == 3 and len(vs) == 3:
        return (qs[0], qs[1], vs[2]), (qs[1], qs[0])
    if not varlen and len(qs) == 4 and len(vs) == 4:
        return (qs[0], qs[1], qs[2], vs[3]), qs[:3]
    return (0,), (0,)


def attention(q, k, v, *, mask=None, bias=None, scale=None, causal=False, window=None, softcap=None,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, strategy="auto", out=None, stream=None):
    """Scaled-dot-product attention softmax(scale * q k^T + bias + mask) v.

    q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (any strides with the last axis
    contiguous; Hq % Hkv == 0 for GQA/MQA). Varlen: q [Tq, Hq, D], k/v [Tk, Hkv, *] packed with
    int32 cu_seqlens_q/k [B + 1]. Returns out [B, Hq, Sq, Dv] (varlen [Tq, Hq, Dv]) in q's
    dtype, and with return_lse=True also the float32 natural-log lse [B, Hq, Sq] (varlen
    [Hq, Tq]).

    scale: default 1/sqrt(D). causal: query i sees keys j <= i + Sk - Sq (bottom-right
    aligned). mask: bool (True = keep) or additive float, broadcastable to [B, Hq, Sq, Sk];
    bias: additive float, same broadcasting. window=(left, right): key j visible iff
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (None = unbounded side). softcap: scores
    become softcap * tanh(score / softcap) before bias and mask. A row that sees no key gives
    out 0 and lse -inf. strategy: "auto", "flash", "fallback" or "autotune" (CUDA; the CPU
    runs the reference backend). "autotune" times the candidates on the caller's stream the
    first time it meets a (shape class, dtype, device, options) key, which synchronizes that
    stream once (not while a CUDA graph is being captured: use "auto" or "flash" there), and
    reuses the choice afterwards; with the environment variable RUDNN_AUTOTUNE_CACHE=<file>,
    the choices are also appended to that file and read back by later processes (keys name the
    rudnn build and the device, so a rebuilt library or another GPU times anew).

    On CUDA, cu_seqlens values are not read by the host (that would synchronize): offsets
    outside [0, total] are clamped rather than checked, and rows that no sequence covers
    (offsets that decrease, or a last offset below the packed length) are not written. The CPU
    checks the values and raises ArgumentError.
    """
    if fw.is_jax(q):
        return _jax().attention(q, k, v, mask=mask, bias=bias, scale=scale, causal=causal, window=window,
                                softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                return_lse=return_lse, strategy=strategy, out=out, stream=stream)
    op = "attention"
    return_lse = flag(op, "return_lse", return_lse)
    call = fw.Call(op, {"q": q, "k": k, "v": v, "mask": mask, "bias": bias, "cu_seqlens_q": cu_seqlens_q,
                        "cu_seqlens_k": cu_seqlens_k, "out": out}, stream, required=("q", "k", "v"))
    opts = options(op, mask=mask, bias=bias, scale=scale, causal=causal, window=window, softcap=softcap,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, strategy=strategy)
    out_shape, lse_shape = _shapes(q, v, cu_seqlens_q is not None)
    o = out if out is not None else call.empty(out_shape, call.dtype_name(q))
    lse = call.empty(lse_shape, "float32") if return_lse else None

    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.attention_forward(q=call.arg(q), k=call.arg(k), v=call.arg(v), mask=call.arg(mask), bias=call.arg(bias),
                         cu_seqlens_q=call.arg(cu_seqlens_q), cu_seqlens_k=call.arg(cu_seqlens_k), out=call.arg(o),
                         lse=call.arg(lse), **opts, workspace=None, stream=call.stream,
                         workspace_alloc=call.workspace_alloc)
    return (o, lse) if return_lse else o


def attention_backward(dout, q, k, v, out, lse, *, mask=None, bias=None, scale=None, causal=False, window=None,
                       softcap=None, cu_seqlens_q=None, cu_seqlens_k=None, deterministic=False, strategy="auto",
                       dlse=None, stream=None):
    """Gradients (dq, dk, dv) of attention, recomputing the probabilities from lse (no
    Sq x Sk matrix is stored). Takes the forward's options; out and lse are its results.
    dk/dv sum over the query heads of each key/value head (GQA). deterministic=True gives
    bitwise run-to-run reproducible gradients. dlse (float32, lse's shape), the gradient with
    respect to lse, adds the path through lse (for partial attentions merged by their lse)."""
    if fw.is_jax(q):
        return _jax().attention_backward(dout, q, k, v, out, lse, mask=mask, bias=bias, scale=scale, causal=causal,
                                         window=window, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                                         cu_seqlens_k=cu_seqlens_k, deterministic=deterministic, strategy=strategy,
                                         dlse=dlse)
    op = "attention_backward"
    deterministic = flag(op, "deterministic", deterministic)
    call = fw.Call(op, {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse, "mask": mask, "bias": bias,
                        "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k, "dlse": dlse}, stream,
                   required=("dout", "q", "k", "v", "out", "lse"), outputs=())
    opts = options(op, mask=mask, bias=bias, scale=scale, causal=causal, window=window, softcap=softcap,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, strategy=strategy)
    dq = call.empty(tuple(q.shape), call.dtype_name(q))
    dk = call.empty(tuple(k.shape), call.dtype_name(k))
    dv = call.empty(tuple(v.shape), call.dtype_name(v))

    _C.attention_backward(dout=call.arg(dout), q=call.arg(q), k=call.arg(k), v=call.arg(v), out=call.arg(out),
                          lse=call.arg(lse), mask=call.arg(mask), bias=call.arg(bias),
                          cu_seqlens_q=call.arg(cu_seqlens_q), cu_seqlens_k=call.arg(cu_seqlens_k),
                          deterministic=deterministic, dlse=call.arg(dlse), dq=call.arg(dq), dk=call.arg(dk),
                          dv=call.arg(dv), **opts, workspace=None, stream=call.stream,
                          workspace_alloc=call.workspace_alloc)
    return dq, dk, dv


def attention_last_algorithm() -> str:
    """The kernel the last attention call on this thread ran: "cpu", "fallback", "flash_sm80", ..."""
    return _C.attention_last_algorithm()
