"""Every documented error of rudnn.attention / attention_backward: type, message, and
nothing written into the caller's arrays."""

import math

import numpy as np
import pytest
import torch

import rudnn
import rudnn.torch as rt
from util import DEVICES


def _t(shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


def _qkv(device, B=2, Hq=4, Hkv=2, Sq=5, Sk=6, D=8, dtype=torch.float32):
    return _t((B, Hq, Sq, D), dtype, device), _t((B, Hkv, Sk, D), dtype, device), _t((B, Hkv, Sk, D), dtype, device)


def _cu(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _packed(device):
    return _t((7, 4, 8), device=device), _t((9, 2, 8), device=device), _t((9, 2, 8), device=device)


FORWARD_ERRORS = [
    (lambda d: rudnn.attention(*_qkv(d, dtype=torch.int32)), rudnn.DTypeError,
     "attention: q: expected float32, float16 or bfloat16, got int32"),
    (lambda d: rudnn.attention(_qkv(d)[0], _qkv(d, dtype=torch.float16)[1], _qkv(d)[2]), rudnn.DTypeError,
     "attention: k: expected the dtype of q (float32), got float16"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _qkv(d, dtype=torch.bfloat16)[2]), rudnn.DTypeError,
     "attention: v: expected the dtype of q (float32), got bfloat16"),
    (lambda d: rudnn.attention(_t((4, 5, 8), device=d), *_qkv(d)[1:]), rudnn.ShapeError,
     "attention: q: expected rank 4 [B, H, S, D], got shape [4, 5, 8]"),
    (lambda d: rudnn.attention(*_qkv(d, Hq=6, Hkv=4)), rudnn.ShapeError,
     "attention: the number of query heads Hq = 6 must be a multiple of the number of key/value heads Hkv = 4"),
    (lambda d: rudnn.attention(_qkv(d)[0], _t((2, 2, 6, 16), device=d), _qkv(d)[2]), rudnn.ShapeError,
     "attention: k: expected head dim D = 8 (the last axis of q), got 16"),
    (lambda d: rudnn.attention(_qkv(d)[0], _t((3, 2, 6, 8), device=d), _qkv(d)[2]), rudnn.ShapeError,
     "attention: k: expected batch size B = 2 (q.shape[0]), got 3"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _t((2, 3, 6, 8), device=d)), rudnn.ShapeError,
     "attention: v: expected Hkv = 2 heads (like k), got 3"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _t((2, 2, 7, 8), device=d)), rudnn.ShapeError,
     "attention: v: expected 6 keys (like k), got 7"),
    (lambda d: rudnn.attention(_t((2, 4, 8, 5), device=d).transpose(-1, -2), *_qkv(d)[1:]), rudnn.ShapeError,
     "attention: q: the last axis must be contiguous (stride 1), got stride 5"),
    (lambda d: rudnn.attention(*_qkv(d), scale=0.0), rudnn.ArgumentError,
     "attention: scale: expected a finite value > 0, got 0"),
    (lambda d: rudnn.attention(*_qkv(d), scale=-1.0), rudnn.ArgumentError,
     "attention: scale: expected a finite value > 0, got -1"),
    (lambda d: rudnn.attention(*_qkv(d), scale=float("inf")), rudnn.ArgumentError,
     "attention: scale: expected a finite value > 0"),
    (lambda d: rudnn.attention(*_qkv(d), softcap=0.0), rudnn.ArgumentError,
     "attention: softcap: expected a finite value > 0 (or None), got 0.0"),
    (lambda d: rudnn.attention(*_qkv(d), softcap=float("inf")), rudnn.ArgumentError,
     "attention: softcap: expected a finite value > 0 (or None), got inf"),
    (lambda d: rudnn.attention(*_qkv(d), window=(-2, 0)), rudnn.ArgumentError,
     "attention: window: expected (left, right) with each >= 0, or -1 / None for unbounded, got (-2, 0)"),
    (lambda d: rudnn.attention(*_qkv(d), causal="no"), rudnn.ArgumentError,
     "attention: causal: expected True or False, got 'no'"),
    (lambda d: rudnn.attention(*_qkv(d), return_lse=1), rudnn.ArgumentError,
     "attention: return_lse: expected True or False, got 1"),
    (lambda d: rt.attention(*_qkv(d), return_lse="yes"), rudnn.ArgumentError,
     "rudnn.torch.attention: return_lse: expected True or False, got 'yes'"),
    (lambda d: rudnn.attention(*_qkv(d), window=3), rudnn.ArgumentError,
     "attention: window: expected None or a pair (left, right), got 3"),
    (lambda d: rudnn.attention(*_qkv(d), window=(1.5, 2)), rudnn.ArgumentError,
     "attention: window: expected (left, right) with each an int >= 0 or None, got (1.5, 2)"),
    (lambda d: rudnn.attention(*_qkv(d), strategy="fast"), rudnn.ArgumentError,
     "attention: strategy: expected one of 'auto', 'flash', 'fallback', 'autotune', got 'fast'"),
    (lambda d: rudnn.attention(*_qkv(d), mask=torch.ones(5, 7, dtype=torch.bool, device=d)), rudnn.ShapeError,
     "attention: mask: expected a shape broadcastable to [B, Hq, Sq, Sk] = [2, 4, 5, 6], got [5, 7]"),
    (lambda d: rudnn.attention(*_qkv(d), mask=torch.ones(1, 2, 4, 5, 6, dtype=torch.bool, device=d)),
     rudnn.ShapeError, "attention: mask: expected a shape broadcastable to [B, Hq, Sq, Sk] = [2, 4, 5, 6], got "
     "[1, 2, 4, 5, 6]"),
    (lambda d: rudnn.attention(*_qkv(d), mask=torch.ones(5, 6, dtype=torch.int32, device=d)), rudnn.DTypeError,
     "attention: mask: expected bool (true = keep) or a float dtype (additive), got int32"),
    (lambda d: rudnn.attention(*_qkv(d), bias=torch.ones(5, 6, dtype=torch.bool, device=d)), rudnn.DTypeError,
     "attention: bias: expected float32, float16 or bfloat16, got bool"),
    (lambda d: rudnn.attention(*_qkv(d), bias=torch.ones(3, 5, 6, device=d)), rudnn.ShapeError,
     "attention: bias: expected a shape broadcastable to [B, Hq, Sq, Sk] = [2, 4, 5, 6], got [3, 5, 6]"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 7], d)), rudnn.ArgumentError,
     "attention: cu_seqlens_q and cu_seqlens_k must be given together, got cu_seqlens_q without cu_seqlens_k"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_k=_cu([0, 9], d)), rudnn.ArgumentError,
     "attention: cu_seqlens_q and cu_seqlens_k must be given together, got cu_seqlens_k without cu_seqlens_q"),
    (lambda d: rudnn.attention(*_qkv(d), cu_seqlens_q=_cu([0, 5], d), cu_seqlens_k=_cu([0, 6], d)),
     rudnn.ShapeError, "attention: q: expected rank 3 [total, H, D] (packed, with cu_seqlens), got shape [2, 4, 5, 8]"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 7], d).long(), cu_seqlens_k=_cu([0, 9], d)),
     rudnn.DTypeError, "attention: cu_seqlens_q: expected int32, got int64"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 3, 7], d), cu_seqlens_k=_cu([0, 9], d)),
     rudnn.ShapeError, "attention: cu_seqlens_k: expected the shape of cu_seqlens_q [3], got [2]"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 7], d), cu_seqlens_k=_cu([[0, 9]], d)),
     rudnn.ShapeError, "attention: cu_seqlens_k: expected shape [B + 1] (one offset per sequence plus the end), "
     "got [1, 2]"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 7], d), cu_seqlens_k=_cu([0, 9], d),
                               mask=torch.ones(7, 9, dtype=torch.bool, device=d)), rudnn.UnsupportedError,
     "attention: mask and bias are not supported with cu_seqlens (packed sequences)"),
    (lambda d: rudnn.attention(*_qkv(d), out=torch.empty(2, 4, 5, 7, device=d)), rudnn.ShapeError,
     "attention: out: expected shape [2, 4, 5, 8], got [2, 4, 5, 7]"),
    (lambda d: rudnn.attention(*_qkv(d), out=torch.empty(2, 4, 5, 8, dtype=torch.float16, device=d)),
     rudnn.DTypeError, "attention: out: expected float32 (q's dtype), got float16"),
    (lambda d: rudnn.attention(*_qkv(d), out=torch.empty(2, 4, 8, 5, device=d).transpose(-1, -2)), rudnn.ShapeError,
     "attention: out: the last axis must be contiguous (stride 1), got stride 5"),
    (lambda d: rudnn.attention(*_qkv(d), out=torch.empty(1, 1, 5, 8, device=d).expand(2, 4, 5, 8)), rudnn.ShapeError,
     "attention: out: expected an output whose elements do not share memory (no stride 0 on an axis of size > 1), "
     "got shape [2, 4, 5, 8] with strides [0, 0, 8, 1]"),
    (lambda d: rudnn.attention(_qkv(d)[0], _t((2, 2, 6), device=d), _qkv(d)[2]), rudnn.ShapeError,
     "attention: k: expected rank 4 [B, H, S, D], got shape [2, 2, 6]"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _t((2, 2, 6, 8, 1), device=d)), rudnn.ShapeError,
     "attention: v: expected rank 4 [B, H, S, D], got shape [2, 2, 6, 8, 1]"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _t((3, 2, 6, 8), device=d)), rudnn.ShapeError,
     "attention: v: expected batch size B = 2 (q.shape[0]), got 3"),
    (lambda d: rudnn.attention(*_qkv(d, D=0)), rudnn.ShapeError,
     "attention: q: the head dim D (last axis) must be >= 1, got shape [2, 4, 5, 0]"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _t((2, 2, 6, 0), device=d)), rudnn.ShapeError,
     "attention: v: the head dim Dv (last axis) must be >= 1, got shape [2, 2, 6, 0]"),
    (lambda d: rudnn.attention(_qkv(d)[0], _t((2, 0, 6, 8), device=d), _t((2, 0, 6, 8), device=d)), rudnn.ShapeError,
     "attention: k: expected at least one key/value head, got shape [2, 0, 6, 8]"),
    (lambda d: rudnn.attention(_qkv(d)[0], _t((2, 2, 8, 6), device=d).transpose(-1, -2), _qkv(d)[2]),
     rudnn.ShapeError, "attention: k: the last axis must be contiguous (stride 1), got stride 6"),
    (lambda d: rudnn.attention(*_qkv(d)[:2], _t((2, 2, 8, 6), device=d).transpose(-1, -2)), rudnn.ShapeError,
     "attention: v: the last axis must be contiguous (stride 1), got stride 6"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 7], d), cu_seqlens_k=_cu([0, 9], d),
                               bias=torch.ones(7, 9, device=d)), rudnn.UnsupportedError,
     "attention: mask and bias are not supported with cu_seqlens (packed sequences)"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 0, 7, 7], d)[::2], cu_seqlens_k=_cu([0, 9], d)),
     rudnn.ShapeError, "attention: cu_seqlens_q: the last axis must be contiguous (stride 1), got stride 2"),
    (lambda d: rudnn.attention(*_qkv(d), scale="0.5"), rudnn.ArgumentError,
     "attention: scale: expected a finite value > 0 (or None for 1/sqrt(D)), got '0.5'"),
    (lambda d: rudnn.attention(*_qkv(d), softcap=[30.0]), rudnn.ArgumentError,
     "attention: softcap: expected a finite value > 0 (or None), got [30.0]"),
]

# Value checks of cu_seqlens read the offsets, which the host does only on the CPU.
CPU_ONLY_ERRORS = [
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([1, 7], d), cu_seqlens_k=_cu([0, 9], d)),
     rudnn.ArgumentError, "attention: cu_seqlens_q: expected cu_seqlens_q[0] == 0, got 1"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 5, 3, 7], d), cu_seqlens_k=_cu([0, 3, 6, 9], d)),
     rudnn.ArgumentError, "attention: cu_seqlens_q: expected non-decreasing offsets, got 3 after 5 at index 2"),
    (lambda d: rudnn.attention(*_packed(d), cu_seqlens_q=_cu([0, 7], d), cu_seqlens_k=_cu([0, 8], d)),
     rudnn.ArgumentError, "attention: cu_seqlens_k: expected the last offset to equal the packed length of k (9), "
     "got 8"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call, exc, message", FORWARD_ERRORS)
def test_forward_errors(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert message in str(info.value)


@pytest.mark.parametrize("call, exc, message", CPU_ONLY_ERRORS)
def test_cu_seqlens_value_errors(call, exc, message):
    with pytest.raises(exc) as info:
        call("cpu")
    assert message in str(info.value)


def test_errors_are_builtin_exceptions():
    with pytest.raises(ValueError):
        rudnn.attention(*_qkv("cpu", Hq=3, Hkv=2))
    with pytest.raises(TypeError):
        rudnn.attention(*_qkv("cpu", dtype=torch.int64))


def test_mixed_frameworks_and_devices():
    q, k, v = _qkv("cpu")
    with pytest.raises(rudnn.FrameworkError, match="attention: k: expected a torch.Tensor like q"):
        rudnn.attention(q, k.numpy(), v)
    with pytest.raises(rudnn.FrameworkError, match="attention: q: expected a torch.Tensor, cupy.ndarray"):
        rudnn.attention([1.0], k, v)


@pytest.mark.cuda
def test_mixed_devices():
    q, k, v = _qkv("cpu")
    with pytest.raises(rudnn.DeviceError, match="attention: k: expected device cpu like q, got cuda:0"):
        rudnn.attention(q, k.cuda(), v)
    with pytest.raises(rudnn.DeviceError, match="attention: v: expected device cpu like q, got cuda:0"):
        rudnn.attention(q, k, v.cuda())
    with pytest.raises(rudnn.DeviceError, match="attention: mask: expected device cpu like q, got cuda:0"):
        rudnn.attention(q, k, v, mask=torch.ones(5, 6, dtype=torch.bool, device="cuda"))
    with pytest.raises(rudnn.DeviceError, match="attention: bias: expected device cpu like q, got cuda:0"):
        rudnn.attention(q, k, v, bias=torch.ones(5, 6, device="cuda"))
    with pytest.raises(rudnn.DeviceError, match="attention: out: expected device cpu like q, got cuda:0"):
        rudnn.attention(q, k, v, out=torch.empty(2, 4, 5, 8, device="cuda"))
    with pytest.raises(rudnn.DeviceError, match="attention: cu_seqlens_q: expected device cpu like q, got cuda:0"):
        rudnn.attention(*_packed("cpu"), cu_seqlens_q=_cu([0, 7], "cuda"), cu_seqlens_k=_cu([0, 9], "cpu"))
    dout, q, k, v, out, lse = _backward_inputs("cpu")
    with pytest.raises(rudnn.DeviceError, match="attention_backward: lse: expected device cpu like dout, got cuda:0"):
        rudnn.attention_backward(dout, q, k, v, out, lse.cuda())
    with pytest.raises(rudnn.DeviceError, match="attention_backward: dlse: expected device cpu like dout, got cuda:0"):
        rudnn.attention_backward(dout, q, k, v, out, lse, dlse=lse.cuda())


def _misaligned(shape, dtype):
    """A dense CUDA tensor whose data pointer sits one element (2 bytes) past a 16-byte boundary."""
    return torch.randn(math.prod(shape) + 1, device="cuda").to(dtype)[1:].view(shape)


def _bf16_kv():
    return _qkv("cuda", D=64, dtype=torch.bfloat16)[1:]


# Inputs no flash kernel takes (bfloat16 unless the dtype is the reason) and the reasons
# strategy='flash' gives for the forward and the backward ('auto' runs the fallback there).
FLASH_REFUSALS = {
    "float32": (lambda: _qkv("cuda", D=64), "supports float16 and bfloat16, got float32",
                "supports float16 and bfloat16, got float32"),
    "misaligned_pointer": (lambda: (_misaligned((2, 4, 5, 64), torch.bfloat16), *_bf16_kv()),
                           r"needs 16-byte aligned rows \(data pointers aligned to 16 bytes, strides multiples of 8 "
                           r"elements\)", "needs data pointers aligned to 16 bytes"),
    # rows 68 elements apart: not a multiple of 8
    "row_stride": (lambda: (_t((2, 4, 5, 68), torch.bfloat16, "cuda")[..., :64], *_bf16_kv()),
                   "needs 16-byte aligned rows", "needs row strides that are multiples of 8 elements"),
    "65536_heads": (lambda: (_t((1, 65536, 1, 64), torch.bfloat16, "cuda"), _t((1, 1, 3, 64), torch.bfloat16, "cuda"),
                             _t((1, 1, 3, 64), torch.bfloat16, "cuda")),
                    "supports at most 65535 heads and 65535 sequences per call",
                    "supports at most 65535 heads and 65535 sequences per call"),
}


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(FLASH_REFUSALS))
def test_flash_says_why_it_cannot_run(case):
    inputs, forward_reason, backward_reason = FLASH_REFUSALS[case]
    q, k, v = inputs()
    with pytest.raises(rudnn.UnsupportedError, match=f"attention: strategy 'flash': {forward_reason}"):
        rudnn.attention(q, k, v, strategy="flash")
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype, device="cuda")
    lse = torch.zeros(q.shape[:3], device="cuda")
    with pytest.raises(rudnn.UnsupportedError, match=f"attention_backward: strategy 'flash': {backward_reason}"):
        rudnn.attention_backward(torch.ones_like(out), q, k, v, out, lse, strategy="flash")


def _backward_inputs(device):
    q, k, v = _qkv(device)
    out, lse = rudnn.attention(q, k, v, return_lse=True)
    return torch.randn_like(out), q, k, v, out, lse


BACKWARD_ERRORS = [
    (lambda a: rudnn.attention_backward(a[0][..., :7].contiguous(), *a[1:]), rudnn.ShapeError,
     "attention_backward: dout: expected shape [2, 4, 5, 8], got [2, 4, 5, 7]"),
    (lambda a: rudnn.attention_backward(a[0].half(), *a[1:]), rudnn.DTypeError,
     "attention_backward: dout: expected float32 (the dtype of q), got float16"),
    (lambda a: rudnn.attention_backward(*a[:5], a[5].half()), rudnn.DTypeError,
     "attention_backward: lse: expected float32, got float16"),
    (lambda a: rudnn.attention_backward(*a[:5], a[5][:, :, :4]), rudnn.ShapeError,
     "attention_backward: lse: expected shape [2, 4, 5] ([B, Hq, Sq]), got [2, 4, 4]"),
    (lambda a: rudnn.attention_backward(*a[:4], a[4][:, :3], a[5]), rudnn.ShapeError,
     "attention_backward: out: expected shape [2, 4, 5, 8], got [2, 3, 5, 8]"),
    (lambda a: rudnn.attention_backward(*a, scale=-0.5), rudnn.ArgumentError,
     "attention_backward: scale: expected a finite value > 0, got -0.5"),
    (lambda a: rudnn.attention_backward(a[0], a[1], a[2][:, :1].expand(2, 3, 6, 8), a[3][:, :1].expand(2, 3, 6, 8),
                                        *a[4:]), rudnn.ShapeError,
     "attention_backward: the number of query heads Hq = 4 must be a multiple of the number of key/value heads Hkv = 3"),
    (lambda a: rudnn.attention_backward(*a, strategy=None), rudnn.ArgumentError,
     "attention_backward: strategy: expected one of"),
    (lambda a: rudnn.attention_backward(*a[:4], a[4].half(), a[5]), rudnn.DTypeError,
     "attention_backward: out: expected float32 (the dtype of q), got float16"),
    (lambda a: rudnn.attention_backward(a[0].transpose(-1, -2).contiguous().transpose(-1, -2), *a[1:]),
     rudnn.ShapeError, "attention_backward: dout: the last axis must be contiguous (stride 1), got stride 5"),
    (lambda a: rudnn.attention_backward(*a, softcap="on"), rudnn.ArgumentError,
     "attention_backward: softcap: expected a finite value > 0 (or None), got 'on'"),
    (lambda a: rudnn.attention_backward(*a, deterministic="yes"), rudnn.ArgumentError,
     "attention_backward: deterministic: expected True or False, got 'yes'"),
    (lambda a: rt.attention_backward(*a, deterministic=None), rudnn.ArgumentError,
     "rudnn.torch.attention_backward: deterministic: expected True or False, got None"),
    (lambda a: rudnn.attention_backward(*a, dlse=a[5].half()), rudnn.DTypeError,
     "attention_backward: dlse: expected float32, got float16"),
    (lambda a: rudnn.attention_backward(*a, dlse=a[5][:, :, :4]), rudnn.ShapeError,
     "attention_backward: dlse: expected shape [2, 4, 5] ([B, Hq, Sq]), got [2, 4, 4]"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call, exc, message", BACKWARD_ERRORS)
def test_backward_errors(device, call, exc, message):
    args = _backward_inputs(device)
    with pytest.raises(exc) as info:
        call(args)
    assert message in str(info.value)


def test_packed_backward_lse_shape():
    q, k, v = _packed("cpu")
    cu = dict(cu_seqlens_q=_cu([0, 3, 7], "cpu"), cu_seqlens_k=_cu([0, 4, 9], "cpu"))
    out, lse = rudnn.attention(q, k, v, return_lse=True, **cu)
    assert lse.shape == (4, 7)
    with pytest.raises(rudnn.ShapeError, match=r"attention_backward: lse: expected shape \[4, 7\] \(\[Hq, total_q\]\), "
                                               r"got \[7, 4\]"):
        rudnn.attention_backward(torch.ones_like(out), q, k, v, out, lse.t().contiguous(), **cu)


def test_failed_call_writes_nothing():
    q, k, v = _qkv("cpu")
    out = torch.full((2, 4, 5, 8), 7.0)
    with pytest.raises(rudnn.ArgumentError):
        rudnn.attention(q, k, v, scale=0.0, out=out)
    assert (out == 7.0).all()
    with pytest.raises(rudnn.ShapeError):
        rudnn.attention(q, k, v, mask=torch.ones(3, 3, dtype=torch.bool), out=out)
    assert (out == 7.0).all()
    qn = q.numpy().copy()
    with pytest.raises(rudnn.ArgumentError):
        rudnn.attention(qn, k.numpy(), v.numpy(), softcap=-1.0)
    assert np.array_equal(qn, q.numpy())
