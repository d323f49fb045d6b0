"""Every documented error of the gated delta rule family: type and message."""

import numpy as np
import pytest
import torch

import rudnn
from util import DEVICES

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def inputs(device, B=1, Hk=2, Hv=2, T=8, K=8, V=4, dtype=F32, **over):
    """Valid arguments; `over` replaces some of them."""
    a = {
        "q": torch.randn(B, Hk, T, K).to(dtype), "k": torch.randn(B, Hk, T, K).to(dtype),
        "v": torch.randn(B, Hv, T, V).to(dtype), "beta": torch.rand(B, Hv, T).to(dtype),
        "log_decay": -torch.rand(B, Hv, T), "initial_state": torch.zeros(B, Hv, K, V),
    }
    a.update(over)
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in a.items()}


def chunk(device, scale=0.5, chunk_size=16, cu_seqlens=None, **over):
    a = inputs(device, **over)
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.to(device)
    return rudnn.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["beta"], a["log_decay"], a["initial_state"],
                                        scale=scale, chunk_size=chunk_size, cu_seqlens=cu_seqlens)


def recurrent(device, scale=0.5, **over):
    a = inputs(device, **over)
    return rudnn.gated_delta_rule(a["q"], a["k"], a["v"], a["beta"], a["log_decay"], a["initial_state"], scale=scale)


def backward(device, dout=None, dfinal=None, **over):
    a = inputs(device, **over)
    dout = torch.randn(a["v"].shape).to(a["q"].dtype) if dout is None else dout
    return rudnn.chunk_gated_delta_rule_backward(dout.to(device), a["q"], a["k"], a["v"], a["beta"], a["log_decay"],
                                                 a["initial_state"], None if dfinal is None else dfinal.to(device),
                                                 scale=0.5)


OP = "chunk_gated_delta_rule"
CASES = [
    (lambda d: chunk(d, q=torch.zeros(1, 2, 8, 8, dtype=torch.int32)), rudnn.DTypeError,
     f"{OP}: q: expected float32, float16 or bfloat16, got int32"),
    (lambda d: chunk(d, q=torch.zeros(2, 8, 8)), rudnn.ShapeError,
     f"{OP}: q: expected 4 axes [B, H, T, K], got shape [2, 8, 8]"),
    (lambda d: chunk(d, q=torch.zeros(1, 0, 8, 8)), rudnn.ShapeError,
     f"{OP}: q: expected at least one head and K >= 1, got shape [1, 0, 8, 8]"),
    (lambda d: chunk(d, q=torch.zeros(1, 2, 8, 8).transpose(2, 3)), rudnn.ShapeError,
     f"{OP}: q: the last axis must be contiguous (stride 1), got stride 8"),
    (lambda d: chunk(d, k=torch.zeros(1, 2, 7, 8)), rudnn.ShapeError,
     f"{OP}: k: expected shape [1, 2, 8, 8] [B, H, T, K] (the shape of q), got [1, 2, 7, 8]"),
    (lambda d: chunk(d, k=torch.zeros(1, 2, 8, 8, dtype=F16)), rudnn.DTypeError,
     f"{OP}: k: expected the dtype of q (float32), got float16"),
    (lambda d: chunk(d, v=torch.zeros(1, 2, 8, 4, dtype=BF16)), rudnn.DTypeError,
     f"{OP}: v: expected the dtype of q (float32), got bfloat16"),
    (lambda d: chunk(d, v=torch.zeros(1, 2, 9, 4)), rudnn.ShapeError,
     f"{OP}: v: expected shape [B, Hv, T, V] with B = 1 and T = 8 (from q) and Hv, V >= 1, got [1, 2, 9, 4]"),
    (lambda d: chunk(d, v=torch.zeros(1, 3, 8, 4), beta=torch.zeros(1, 3, 8), log_decay=torch.zeros(1, 3, 8)),
     rudnn.ShapeError, f"{OP}: v: the number of value heads (3) must be a multiple of the number of q/k heads (2)"),
    (lambda d: chunk(d, dtype=BF16, beta=torch.rand(1, 2, 8)), rudnn.DTypeError,
     f"{OP}: beta: expected the dtype of q (bfloat16), got float32"),
    (lambda d: chunk(d, beta=torch.rand(1, 2, 7)), rudnn.ShapeError,
     f"{OP}: beta: expected shape [1, 2, 8] [B, Hv, T], got [1, 2, 7]"),
    (lambda d: chunk(d, log_decay=torch.zeros(1, 2, 8, dtype=BF16)), rudnn.DTypeError,
     f"{OP}: log_decay: expected float32, got bfloat16"),
    (lambda d: chunk(d, log_decay=torch.zeros(1, 1, 8)), rudnn.ShapeError,
     f"{OP}: log_decay: expected shape [1, 2, 8] [B, Hv, T], got [1, 1, 8]"),
    (lambda d: chunk(d, initial_state=torch.zeros(1, 2, 8, 4, dtype=F16)), rudnn.DTypeError,
     f"{OP}: initial_state: expected float32, got float16"),
    (lambda d: chunk(d, initial_state=torch.zeros(1, 2, 4, 8)), rudnn.ShapeError,
     f"{OP}: initial_state: expected shape [1, 2, 8, 4] [B, Hv, K, V], got [1, 2, 4, 8]"),
    (lambda d: chunk(d, initial_state=torch.zeros(1, 2, 4, 8).transpose(2, 3)), rudnn.ShapeError,
     f"{OP}: initial_state: the last axis must be contiguous (stride 1), got stride 8"),
    (lambda d: chunk(d, scale=float("inf")), rudnn.ArgumentError, f"{OP}: scale: expected a finite value, got inf"),
    (lambda d: recurrent(d, scale=float("nan")), rudnn.ArgumentError,
     "gated_delta_rule: scale: expected a finite value, got nan"),
    (lambda d: chunk(d, chunk_size=0), rudnn.ArgumentError, f"{OP}: chunk_size: expected a value > 0, got 0"),
    (lambda d: chunk(d, chunk_size=-16), rudnn.ArgumentError, f"{OP}: chunk_size: expected a value > 0, got -16"),
    (lambda d: chunk(d, chunk_size=256), rudnn.ArgumentError,
     f"{OP}: chunk_size: 256 needs 263168 bytes of triangular workspace (4 * (c^2 + c)), more than the "),
    (lambda d: chunk(d, cu_seqlens=torch.tensor([0.0, 8.0])), rudnn.DTypeError,
     f"{OP}: cu_seqlens: expected int32 or int64, got float32"),
    (lambda d: chunk(d, cu_seqlens=torch.tensor([[0, 8]])), rudnn.ShapeError,
     f"{OP}: cu_seqlens: expected shape [N + 1] with N >= 0 sequences, got [1, 2]"),
    (lambda d: chunk(d, B=2, initial_state=None, cu_seqlens=torch.tensor([0, 8])), rudnn.ShapeError,
     f"{OP}: cu_seqlens: varlen packing needs B == 1 (sequences packed along T), got B = 2"),
    (lambda d: chunk(d, cu_seqlens=torch.tensor([0, 3, 8])), rudnn.ShapeError,
     f"{OP}: initial_state: expected shape [2, 2, 8, 4] [N, Hv, K, V] (one state per sequence of cu_seqlens), "
     "got [1, 2, 8, 4]"),
    (lambda d: rudnn.gated_delta_rule(*inputs(d).values(), scale=0.5, out=torch.zeros(1, 2, 8, 5, device=d)),
     rudnn.ShapeError, "gated_delta_rule: out: expected shape [1, 2, 8, 4] [B, Hv, T, V], got [1, 2, 8, 5]"),
    (lambda d: rudnn.gated_delta_rule(*inputs(d).values(), scale=0.5,
                                      out=torch.zeros(1, 2, 8, 4, dtype=F16, device=d)),
     rudnn.DTypeError, "gated_delta_rule: out: expected the dtype of q (float32), got float16"),
    (lambda d: chunk(d, k=np.zeros((1, 2, 8, 8), np.float32)), rudnn.FrameworkError,
     f"{OP}: k: expected a torch.Tensor like q (one framework per call), got numpy.ndarray"),
    (lambda d: backward(d, dout=torch.zeros(1, 2, 8, 5)), rudnn.ShapeError,
     f"{OP}_backward: dout: expected shape [1, 2, 8, 4] [B, Hv, T, V] (the shape of out), got [1, 2, 8, 5]"),
    (lambda d: backward(d, dout=torch.zeros(1, 2, 8, 4, dtype=F16)), rudnn.DTypeError,
     f"{OP}_backward: dout: expected the dtype of q (float32), got float16"),
    (lambda d: backward(d, dfinal=torch.zeros(1, 2, 8, 4, dtype=BF16)), rudnn.DTypeError,
     f"{OP}_backward: dfinal_state: expected float32, got bfloat16"),
    (lambda d: backward(d, dfinal=torch.zeros(2, 2, 8, 4)), rudnn.ShapeError,
     f"{OP}_backward: dfinal_state: expected shape [1, 2, 8, 4] [B, Hv, K, V], got [2, 2, 8, 4]"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call, exc, message", CASES)
def test_errors(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert message in str(info.value)


# The offsets of cu_seqlens are checked on the CPU only: CUDA calls would have to synchronize
# to read them (the kernels clamp them instead).
@pytest.mark.parametrize(
    "cu, message",
    [
        ([1, 8], "cu_seqlens: expected cu_seqlens[0] == 0, got 1"),
        ([0, 5, 3, 8], "cu_seqlens: expected non-decreasing offsets, got cu_seqlens[2] = 3 < 5"),
        ([0, 4, 7], "cu_seqlens: expected cu_seqlens[-1] == T = 8, got 7"),
    ],
)
def test_cu_seqlens_values(cu, message):
    with pytest.raises(rudnn.ArgumentError) as info:
        chunk("cpu", initial_state=None, cu_seqlens=torch.tensor(cu, dtype=torch.int32))
    assert f"{OP}: {message}" in str(info.value)


def test_unknown_strategy():
    a = inputs("cpu")
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn.chunk_gated_delta_rule(*a.values(), scale=0.5, strategy="fast")
    assert "chunk_gated_delta_rule: strategy: expected 'auto', 'chunked' or 'recurrent', got 'fast'" in str(info.value)


def test_scale_is_required():
    a = inputs("cpu")
    with pytest.raises(TypeError, match="scale"):
        rudnn.chunk_gated_delta_rule(a["q"], a["k"], a["v"], a["beta"], a["log_decay"])


def test_failed_call_writes_nothing():
    a = inputs("cpu")
    before = {n: t.clone() for n, t in a.items()}
    with pytest.raises(rudnn.ArgumentError):
        rudnn.chunk_gated_delta_rule(*a.values(), scale=0.5, chunk_size=0)
    assert all(torch.equal(a[n], before[n]) for n in a)
