"""Gated delta rule: the linear attention of Gated DeltaNet (Qwen3-Next / Qwen3.5), SPEC section 5.

Per value head, with a float32 state S of shape [K, V]::

    S_t = exp(g_t) * S_{t-1}
    S_t += k_t (x) (beta_t * (v_t - S_t^T k_t))
    o_t = S_t^T (scale * q_t)

Arguments (torch, CuPy, NumPy or JAX arrays; results in the framework of q):

- q, k: [B, H, T, K] float32 / float16 / bfloat16; v: [B, Hv, T, V] in q's dtype, Hv a multiple
  of H (value head j reads q/k head j // (Hv // H), grouped value heads as in Qwen3.5).
- beta: [B, Hv, T] in q's dtype (usually in (0, 1)); log_decay: [B, Hv, T] float32 (g_t, usually
  a log-sigmoid output, <= 0; -inf resets the state).
- initial_state: float32 [B, Hv, K, V] (zeros when None); it is only read, never written.
- scale: the query scale, keyword-only and explicit (K ** -0.5 for Qwen); must be finite.
- cu_seqlens: int32/int64 [N + 1] offsets for varlen packing (B == 1); sequence n is tokens
  cu_seqlens[n]:cu_seqlens[n+1] and has its own state, so the states are [N, Hv, K, V]. CPU
  calls check the offsets (0 first, non-decreasing, T last); CUDA calls do not read them on the
  host (that would synchronize) and the kernels clamp them into [0, T].

The FLA / vLLM memory layout [B, T, H, K] is accepted as a strided view: pass
``x.transpose(1, 2)`` (beta / log_decay as [B, T, H] transposed to [B, H, T]); no copy is made.
Every tensor may be strided; q, k, v and the states need a dense last axis.

Returns (out [B, Hv, T, V] in q's dtype, final_state float32 [N, Hv, K, V]). Q/K
normalization is the caller's.
"""

from __future__ import annotations

from . import _C
from . import _frameworks as fw
from ._args import float32_number, integer
from .errors import ArgumentError

_CHUNKED, _RECURRENT = 0, 1
STRATEGIES = {"auto": 0, "chunked": 1, "recurrent": 2}  # the kernel attribute of libruDNN


def kernel_code(op, strategy):
    try:
        return STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ArgumentError(f"{op}: strategy: expected 'auto', 'chunked' or 'recurrent', got {strategy!r}") from None


def _jax():
    from . import jax as rudnn_jax

    return rudnn_jax


def _shape(a):
    return tuple(int(d) for d in a.shape)


def _sizes(q, v, cu_seqlens):
    """(out shape, state shape) from q and v, or empty shapes when their ranks are wrong
    (the C++ validation then reports the bad input before it looks at the outputs)."""
    qs, vs = _shape(q), _shape(v)
    if len(qs) != 4 or len(vs) != 4:
        return (0,), (0,)
    B, _, T, K = qs
    Hv, V = vs[1], vs[3]
    N = B
    if cu_seqlens is not None:
        N = max(_shape(cu_seqlens)[0] - 1, 0) if len(_shape(cu_seqlens)) == 1 else 0
    return (B, Hv, T, V), (N, Hv, K, V)


def _numbers(op, scale, chunk_size):
    return (float32_number(op, "scale", scale, "a finite value"),
            integer(op, "chunk_size", chunk_size, expected="an integer in [1, 2^31 - 1]"))


def _forward(op, algo, q, k, v, beta, log_decay, initial_state, scale, chunk_size, cu_seqlens, stream, kernel=0,
             out=None):
    scale, chunk_size = _numbers(op, scale, chunk_size)
    call = fw.Call(op, {"q": q, "k": k, "v": v, "beta": beta, "log_decay": log_decay,
                        "initial_state": initial_state, "cu_seqlens": cu_seqlens, "out": out}, stream)
    out_shape, state_shape = _sizes(q, v, cu_seqlens)
    if out is None:
        out = call.empty(out_shape, call.dtype_name(q))
    final_state = call.empty(state_shape, "float32")

    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.gated_delta_forward(algo, call.arg(q), call.arg(k), call.arg(v), call.arg(beta), call.arg(log_decay),
                           call.arg(initial_state), call.arg(cu_seqlens), scale, chunk_size, call.arg(out),
                           call.arg(final_state), int(kernel), None, call.stream, call.workspace_alloc)
    return out, final_state


def chunk_gated_delta_rule(q, k, v, beta, log_decay, initial_state=None, *, scale, chunk_size=64, cu_seqlens=None,
                           strategy="auto", out=None, stream=None):
    """Chunked prefill of the gated delta rule: (out, final_state). See the module docstring.

    chunk_size > 0, and its triangular workspace 4 * (c^2 + c) bytes must fit the device's
    shared memory per block (on the CPU: 232448 bytes, the sm90 limit). The last chunk is
    padded internally. The result does not depend on chunk_size beyond rounding.

    strategy: "auto" (the chunked kernel where it applies, else the recurrent one), "chunked"
    (the chunked WY/UT form; on CUDA the tensor-core kernel, which needs chunk_size 64, K <= 128
    and float16/bfloat16 inputs, UnsupportedError otherwise) or "recurrent" (token by token).
    The CUDA chunked kernel multiplies in the input dtype with float32 accumulation and a
    float32 state, like FLA; the others compute in float32 throughout. log_decay may be -inf (a
    reset: the decay is 0, as in the recurrence; the chunked form raises log decays below -80 to
    -80, e^-80 being 0 to float32 precision); NaN propagates.
    out= (torch, CuPy, NumPy) receives the output [B, Hv, T, V] in q's dtype (any strides with a
    dense last axis); the returned out is that array.
    """
    kernel = kernel_code("chunk_gated_delta_rule", strategy)
    if fw.is_jax(q):
        return _jax().chunk_gated_delta_rule(q, k, v, beta, log_decay, initial_state, scale=scale,
                                             chunk_size=chunk_size, cu_seqlens=cu_seqlens, strategy=strategy, out=out)
    return _forward("chunk_gated_delta_rule", _CHUNKED, q, k, v, beta, log_decay, initial_state, scale, chunk_size,
                    cu_seqlens, stream, kernel, out)


def gated_delta_rule(q, k, v, beta, log_decay, initial_state=None, *, scale, cu_seqlens=None, out=None, stream=None):
    """Token-by-token gated delta rule (the decode path; T = 1 is the common case):
    (out, final_state). Same arguments and results as chunk_gated_delta_rule."""
    if fw.is_jax(q):
        return _jax().gated_delta_rule(q, k, v, beta, log_decay, initial_state, scale=scale, cu_seqlens=cu_seqlens,
                                       out=out)
    return _forward("gated_delta_rule", _RECURRENT, q, k, v, beta, log_decay, initial_state, scale, 64, cu_seqlens,
                    stream, 0, out)


def _backward(op, algo, dout, q, k, v, beta, log_decay, initial_state, dfinal_state, scale, chunk_size, cu_seqlens,
              stream, kernel=0):
    scale, chunk_size = _numbers(op, scale, chunk_size)
    call = fw.Call(op, {"dout": dout, "q": q, "k": k, "v": v, "beta": beta, "log_decay": log_decay,
                        "initial_state": initial_state, "dfinal_state": dfinal_state, "cu_seqlens": cu_seqlens},
                   stream)
    dtype = call.dtype_name(q)
    dq = call.empty(_shape(q), dtype)
    dk = call.empty(_shape(k), dtype)
    dv = call.empty(_shape(v), dtype)
    dbeta = call.empty(_shape(beta), dtype)
    dlog_decay = call.empty(_shape(log_decay), "float32")
    dinitial = call.empty(_sizes(q, v, cu_seqlens)[1], "float32") if initial_state is not None else None

    # one export per array: the binding sizes the workspace and allocates it through the callback
    _C.gated_delta_backward(algo, call.arg(q), call.arg(k), call.arg(v), call.arg(beta), call.arg(log_decay),
                            call.arg(initial_state), call.arg(cu_seqlens), scale, chunk_size, call.arg(dout),
                            call.arg(dfinal_state), call.arg(dq), call.arg(dk), call.arg(dv), call.arg(dbeta),
                            call.arg(dlog_decay), call.arg(dinitial), None, call.stream, call.workspace_alloc,
                            kernel=int(kernel))
    return dq, dk, dv, dbeta, dlog_decay, dinitial


def chunk_gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state=None, dfinal_state=None, *,
                                    scale, chunk_size=64, cu_seqlens=None, strategy="auto", stream=None):
    """Gradients of chunk_gated_delta_rule given d(out) and optionally d(final_state):
    (dq, dk, dv, dbeta, dlog_decay, dinitial_state). dq/dk/dv/dbeta take q's dtype,
    dlog_decay and dinitial_state are float32; dinitial_state is None without initial_state.

    strategy (CUDA; the CPU computes the same function either way): "auto" (the chunked backward
    for T >= 256 where it applies, else token by token), "chunked" (states checkpointed every
    chunk_size tokens, the state gradient carried backwards over chunks, each chunk's gradients
    in parallel; needs chunk_size <= 64 and K <= 128, UnsupportedError otherwise) or "recurrent"
    (token by token). Both are deterministic (fixed-order sums, no atomics). With JAX arrays only
    "auto"."""
    kernel = kernel_code("chunk_gated_delta_rule_backward", strategy)
    if fw.is_jax(q):
        return _jax().chunk_gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state, dfinal_state,
                                                      scale=scale, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
                                                      strategy=strategy)
    return _backward("chunk_gated_delta_rule_backward", _CHUNKED, dout, q, k, v, beta, log_decay, initial_state,
                     dfinal_state, scale, chunk_size, cu_seqlens, stream, kernel)


def gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state=None, dfinal_state=None, *, scale,
                              cu_seqlens=None, stream=None):
    """Gradients of gated_delta_rule; same results as chunk_gated_delta_rule_backward."""
    if fw.is_jax(q):
        return _jax().gated_delta_rule_backward(dout, q, k, v, beta, log_decay, initial_state, dfinal_state,
                                                scale=scale, cu_seqlens=cu_seqlens)
    return _backward("gated_delta_rule_backward", _RECURRENT, dout, q, k, v, beta, log_decay, initial_state,
                     dfinal_state, scale, 64, cu_seqlens, stream)


def gated_delta_last_algorithm() -> str:
    """What the last gated delta forward or backward on this thread ran: "cpu", "chunked" (the
    tensor-core chunked CUDA kernels), "chunked_wgmma" (the same with the state kernel's products
    on wgmma: Hopper with RUDNN_GATED_DELTA_WGMMA=1), "recurrent" (the token-by-token CUDA kernel),
    "recurrent_backward" or "chunked_backward" (the CUDA backwards; "none" before any)."""
    return _C.gated_delta_last_algorithm()
