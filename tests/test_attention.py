"""rudnn.attention / attention_backward against a float64 reference written from the math
(tests/reference/attention.py, itself checked against torch SDPA), with the FlashAttention
error budget: at most twice the error of the same computation done by torch in the input
dtype. CUDA variants are the same tests with device "cuda" (all strategies)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from reference import attention as ref
from util import DEVICES, DTYPES, assert_close_to_oracle, rand, run_with_autotune_cache

CUDA_STRATEGIES = ["auto", "fallback", "flash", "autotune"]


def _device_strategies():
    out = [("cpu", "auto")]
    for s in CUDA_STRATEGIES:
        out.append(pytest.param("cuda", s, marks=pytest.mark.cuda, id=f"cuda-{s}"))
    return out


DEVICE_STRATEGIES = _device_strategies()


# The head dims (D, Dv) of the flash kernels in this build (float16/bfloat16 only).
FLASH_FORWARD_DIMS = {(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)}
FLASH_BACKWARD_DIMS = FLASH_FORWARD_DIMS


def _skip_unsupported_flash(strategy, dtype, D, Dv):
    if strategy == "flash" and (dtype == torch.float32 or (D, Dv) not in FLASH_FORWARD_DIMS):
        pytest.skip("no flash kernel for this case in this build (strategy 'flash' raises UnsupportedError)")


def _device_holds_d256_backward():
    """The D = 256 flash backward takes 144 KiB of shared memory per block: A100/A800 and Hopper have
    it, Ada and consumer Ampere do not."""
    props = torch.cuda.get_device_properties(0)
    big = (props.major, props.minor) == (8, 0) or props.major == 9
    return getattr(props, "shared_memory_per_block_optin", (144 if big else 99) * 1024) >= 144 * 1024


def _backward_strategy(strategy, dtype=None, D=None, Dv=None):
    """Cases of a flash forward without a flash backward are differentiated by the 'auto' backward."""
    if strategy == "flash" and (dtype == torch.float32 or (D, Dv) not in FLASH_BACKWARD_DIMS
                                or (D == 256 and not _device_holds_d256_backward())):
        return "auto"
    return strategy


def _bshd(B, H, S, D, dtype, device, seed):
    """[B, H, S, D] as a transposed view of [B, S, H, D] memory (strided, last axis dense)."""
    return rand((B, S, H, D), dtype, device, seed=seed).transpose(1, 2)


# Each case: shapes (B, Hq, Hkv, Sq, Sk, D, Dv) and options. Masks/biases are built by _inputs.
CASES = {
    "basic": dict(shape=(2, 2, 2, 9, 9, 16, 16)),
    "sq_lt_sk_causal": dict(shape=(1, 2, 2, 5, 13, 32, 32), causal=True),
    "sq_gt_sk_causal": dict(shape=(2, 2, 1, 13, 5, 32, 32), causal=True),  # first rows see no key
    "decode": dict(shape=(3, 4, 1, 1, 37, 64, 64), causal=True),
    "decode_window": dict(shape=(2, 8, 2, 1, 40, 64, 64), window=(7, None)),
    "window": dict(shape=(1, 2, 2, 19, 23, 16, 16), window=(3, 2)),
    "window_causal": dict(shape=(1, 4, 1, 17, 17, 16, 16), causal=True, window=(4, 0)),
    "softcap": dict(shape=(1, 2, 2, 11, 14, 32, 32), softcap=2.0),
    "softcap_causal_gqa4": dict(shape=(1, 8, 2, 15, 15, 32, 32), causal=True, softcap=5.0, scale=0.3),
    "bool_mask": dict(shape=(2, 2, 1, 10, 12, 16, 16), mask="bool"),
    "bool_mask_empty_rows": dict(shape=(1, 2, 2, 6, 8, 16, 16), mask="bool_empty"),
    "float_mask": dict(shape=(2, 4, 4, 7, 9, 16, 16), mask="float"),
    "bias": dict(shape=(2, 4, 2, 8, 11, 16, 16), bias=True),
    "all_options": dict(shape=(2, 8, 1, 9, 12, 32, 32), causal=True, window=(5, None), softcap=3.0, mask="bool",
                        bias=True),
    "float_mask_bias_gqa8": dict(shape=(1, 8, 1, 5, 7, 16, 16), mask="float", bias=True),
    "float_mask_causal_window_softcap": dict(shape=(1, 4, 2, 12, 15, 16, 16), causal=True, window=(6, 1),
                                             softcap=3.0, mask="float"),
    "decode_softcap_bias": dict(shape=(2, 4, 1, 1, 30, 32, 32), softcap=4.0, bias=True),
    "decode_float_mask_gqa8": dict(shape=(1, 8, 1, 1, 25, 16, 16), mask="float"),
    "d64_tile_tail": dict(shape=(1, 2, 2, 67, 71, 64, 64), causal=True),
    "d96": dict(shape=(1, 2, 2, 20, 33, 96, 96)),
    "d128_gqa4": dict(shape=(1, 4, 1, 33, 33, 128, 128), causal=True),
    "d192_dv128": dict(shape=(1, 2, 1, 17, 19, 192, 128)),
    "d256": dict(shape=(1, 1, 1, 9, 21, 256, 256)),
    "odd_dims": dict(shape=(1, 3, 1, 5, 6, 40, 24)),
    "no_keys": dict(shape=(1, 2, 2, 4, 0, 16, 16)),
    # Cases the flash kernels take (f16/bf16, FLASH_FORWARD_DIMS) with every per-element option.
    "flash_all_options_d64": dict(shape=(2, 8, 2, 70, 75, 64, 64), causal=True, window=(20, None), softcap=3.0,
                                  mask="bool", bias=True),
    "flash_float_mask_bias_d128": dict(shape=(1, 4, 4, 65, 130, 128, 128), mask="float", bias=True),
    "flash_no_keys_d64": dict(shape=(1, 2, 1, 5, 0, 64, 64)),
    "flash_sq_gt_sk_window_d128": dict(shape=(1, 2, 1, 80, 33, 128, 128), window=(10, 3)),
    # Long enough for tiles inside both sequences (and below the causal diagonal), which the flash
    # kernels score with the scale alone.
    "flash_long_d64": dict(shape=(1, 2, 1, 200, 260, 64, 64)),
    "flash_long_causal_d128": dict(shape=(1, 2, 2, 190, 250, 128, 128), causal=True),
    # The other head dims, several tiles each way (D = 96 runs on 64-byte smem rows).
    "flash_d96_causal_gqa": dict(shape=(1, 4, 2, 70, 100, 96, 96), causal=True),
    "flash_d192_dv128_window": dict(shape=(1, 2, 1, 90, 70, 192, 128), window=(30, 5), softcap=4.0),
    "flash_d256_causal_bias": dict(shape=(1, 2, 2, 66, 130, 256, 256), causal=True, bias=True),
    # GQA 8 and decode (Sq = 1) on the flash path, with a mask and softcap.
    "flash_gqa8_causal_d64": dict(shape=(1, 8, 1, 40, 70, 64, 64), causal=True),
    "flash_decode_gqa8_d128": dict(shape=(2, 8, 1, 1, 150, 128, 128), mask="bool", softcap=5.0),
    # Softcap alone (causal, GQA) at D = 128 over several key blocks: the sm90ws kernels' inline
    # softcap instantiations (forward and dk/dv), as Gemma-style models run them.
    "flash_softcap_causal_gqa_d128": dict(shape=(1, 4, 2, 100, 300, 128, 128), causal=True, softcap=30.0),
}


def _inputs(case, dtype, device, seed=0):
    B, Hq, Hkv, Sq, Sk, D, Dv = case["shape"]
    q = _bshd(B, Hq, Sq, D, dtype, device, seed)
    k = _bshd(B, Hkv, Sk, D, dtype, device, seed + 1)
    v = _bshd(B, Hkv, Sk, Dv, dtype, device, seed + 2)
    opts = {name: case[name] for name in ("causal", "window", "softcap", "scale") if name in case}
    g = torch.Generator().manual_seed(seed + 3)
    mask = case.get("mask")
    if mask == "bool":  # [Sq, Sk], broadcast over batch and heads; every row keeps its diagonal-ish key
        m = torch.rand(Sq, Sk, generator=g) > 0.3
        opts["mask"] = m.to(device)
    elif mask == "bool_empty":  # [B, 1, Sq, Sk] with two rows that see nothing
        m = torch.rand(B, 1, Sq, Sk, generator=g) > 0.4
        m[:, :, 1] = False
        m[:, :, 4] = False
        opts["mask"] = m.to(device)
    elif mask == "float":  # additive [B, Hq, Sq, Sk] with some -inf
        m = torch.randn(B, Hq, Sq, Sk, generator=g)
        m[torch.rand(B, Hq, Sq, Sk, generator=g) > 0.8] = float("-inf")
        opts["mask"] = m.to(dtype).to(device)
    if case.get("bias"):  # [Hq, 1, Sk] (ALiBi-like: broadcast over batch and queries), float32
        opts["bias"] = (torch.randn(Hq, 1, Sk, generator=g) * 0.5).to(device)
    return q, k, v, opts


def _same_dtype(q, k, v, opts, dtype):
    cpu = {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in opts.items()}
    return ref.attention(q.cpu(), k.cpu(), v.cpu(), dtype=dtype, **cpu)


def _oracle(q, k, v, opts):
    cpu = {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in opts.items()}
    return ref.attention(q.cpu(), k.cpu(), v.cpu(), **cpu)


# ---- the reference itself against torch SDPA -----------------------------------------------

@pytest.mark.parametrize("name", ["basic", "sq_lt_sk_causal", "bool_mask", "float_mask", "bias", "d128_gqa4",
                                  "window", "float_mask_bias_gqa8"])
def test_reference_matches_torch_sdpa(name):
    case = CASES[name]
    q, k, v, opts = _inputs(case, torch.float64, "cpu")
    Sq, Sk = q.shape[2], k.shape[2]
    # SDPA's is_causal is top-left aligned: pass the bottom-right alignment as an explicit mask.
    keep = ref.visibility(Sq, Sk, opts.get("causal", False), opts.get("window"))
    additive = torch.zeros(Sq, Sk, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    if "mask" in opts:
        m = opts["mask"]
        additive = additive + (torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, float("-inf"))
                               if m.dtype == torch.bool else m.double())
    if "bias" in opts:
        additive = additive + opts["bias"].double()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=opts.get("scale"),
                                              enable_gqa=q.shape[1] != k.shape[1])
    out, _ = ref.attention(q, k, v, **opts)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


# ---- forward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_forward(device, strategy, dtype, name):
    case = CASES[name]
    _skip_unsupported_flash(strategy, dtype, case["shape"][5], case["shape"][6])
    q, k, v, opts = _inputs(case, dtype, device)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy=strategy, **opts)
    assert out.dtype == dtype and out.device == q.device and lse.dtype == torch.float32
    B, Hq, Sq = q.shape[:3]
    assert out.shape == (B, Hq, Sq, v.shape[-1]) and lse.shape == (B, Hq, Sq)
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, dtype)
    assert torch.isfinite(out.cpu().float()).all()
    assert_close_to_oracle(out, o_same, o64, "out")
    torch.testing.assert_close(lse.cpu().double(), l64, rtol=2e-5, atol=2e-5)


def test_forward_matches_torch_sdpa_directly():
    """The plain cases straight against F.scaled_dot_product_attention (float32, CPU)."""
    q, k, v, _ = _inputs(CASES["d128_gqa4"], torch.float32, "cpu")
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(rudnn.attention(q, k, v), expected, rtol=2e-5, atol=2e-6)
    # Sq == Sk: bottom-right and top-left causal alignment agree.
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(rudnn.attention(q, k, v, causal=True), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
def test_empty_rows_are_zero_with_minus_inf_lse(device, strategy):
    dtype = torch.bfloat16 if strategy == "flash" else torch.float32
    case = dict(CASES["sq_gt_sk_causal"], shape=(2, 2, 1, 13, 5, 64, 64))  # D = 64: the flash kernels take it
    q, k, v, opts = _inputs(case, dtype, device)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy=strategy, **opts)
    # Query i sees keys j <= i + Sk - Sq = i - 8: rows 0..7 see nothing.
    assert (out[:, :, :8] == 0).all() and (lse[:, :, :8] == float("-inf")).all()
    assert torch.isfinite(lse[:, :, 8:]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_defaults_and_out(device):
    q, k, v, _ = _inputs(CASES["basic"], torch.float32, device)
    out = torch.full((2, 2, 9, 16), float("nan"), device=device)
    result = rudnn.attention(q, k, v, out=out)
    assert result is out
    o64, _ = _oracle(q, k, v, {})
    torch.testing.assert_close(out.cpu().double(), o64, rtol=1e-5, atol=1e-6)
    # scale defaults to 1/sqrt(D)
    torch.testing.assert_close(rudnn.attention(q, k, v, scale=1 / math.sqrt(16)), out)


def test_numpy_inputs():
    q, k, v, opts = _inputs(CASES["all_options"], torch.float32, "cpu")
    qn, kn, vn = (t.numpy() for t in (q, k, v))
    mask, bias = opts.pop("mask").numpy(), opts.pop("bias").numpy()
    out, lse = rudnn.attention(qn, kn, vn, mask=mask, bias=bias, return_lse=True, **opts)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and lse.dtype == np.float32
    o64, l64 = _oracle(q, k, v, dict(opts, mask=torch.from_numpy(mask), bias=torch.from_numpy(bias)))
    torch.testing.assert_close(torch.from_numpy(out).double(), o64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.from_numpy(lse).double(), l64, rtol=1e-5, atol=1e-5)
    dout = np.random.default_rng(0).standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = rudnn.attention_backward(dout, qn, kn, vn, out, lse, mask=mask, bias=bias, **opts)
    assert isinstance(dq, np.ndarray) and dq.shape == qn.shape and dk.shape == kn.shape and dv.shape == vn.shape


# ---- backward --------------------------------------------------------------------------------

def _grads(q, k, v, opts, dout, dtype, dlse=None):
    """(dq, dk, dv) of the reference computed in `dtype` by torch autograd: of sum(out * dout),
    plus sum(lse * dlse) over the rows that see a key when dlse is given."""
    leaves = [t.detach().cpu().to(dtype).requires_grad_() for t in (q, k, v)]
    cpu = {n: (t.cpu() if torch.is_tensor(t) else t) for n, t in opts.items()}
    out, lse = ref.attention(*leaves, dtype=dtype, **cpu)
    loss = (out * dout.cpu().to(dtype)).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isfinite(lse), lse, 0) * dlse.cpu().to(dtype)).sum()
    loss.backward()
    return [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_backward(device, strategy, dtype, name):
    _check_backward(device, strategy, dtype, name)


def _check_backward(device, strategy, dtype, name, through_lse=False):
    case = CASES[name]
    _skip_unsupported_flash(strategy, dtype, case["shape"][5], case["shape"][6])
    q, k, v, opts = _inputs(case, dtype, device)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy=strategy, **opts)
    dout = rand(out.shape, dtype, device, seed=7)
    dlse = rand(lse.shape, torch.float32, device, seed=8) if through_lse else None
    bs = _backward_strategy(strategy, dtype, *case["shape"][5:])
    dq, dk, dv = rudnn.attention_backward(dout, q, k, v, out, lse, dlse=dlse, strategy=bs, **opts)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dq.dtype == dk.dtype == dv.dtype == dtype
    if through_lse:
        without = rudnn.attention_backward(dout, q, k, v, out, lse, strategy=bs, **opts)
        assert not torch.equal(dq, without[0]), "dlse changed nothing"
        torch.testing.assert_close(dv, without[2], rtol=0, atol=0)  # lse does not depend on v
    g64 = _grads(q, k, v, opts, dout, torch.float64, dlse)
    g_same = _grads(q, k, v, opts, dout, dtype, dlse)
    for ours, same, exact, what in zip((dq, dk, dv), g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(ours.cpu().float()).all(), what
        assert_close_to_oracle(ours, same, exact, what)


# dlse, the gradient with respect to lse, adds the path through lse: dS_ij gains P_ij dlse_i.
# The loss of the oracle is sum(out * dout) + sum(lse * dlse) over the rows that see a key.
LSE_GRADIENT_CASES = ["basic", "sq_gt_sk_causal", "flash_long_causal_d128", "flash_gqa8_causal_d64",
                      "flash_decode_gqa8_d128", "flash_d192_dv128_window"]


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", LSE_GRADIENT_CASES)
def test_backward_through_lse(device, strategy, dtype, name):
    _check_backward(device, strategy, dtype, name, through_lse=True)


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
def test_backward_through_lse_varlen_broadcast_dlse(device, strategy):
    """A dlse of any strides (here expanded: every element the same memory, as torch hands the
    gradient of lse.sum()) and packed sequences with an empty one."""
    case = VARLEN["causal_gqa8"]
    q, k, v, cu_q, cu_k, opts = _varlen_inputs(case, torch.bfloat16 if device == "cuda" else torch.float32, device)
    kw = dict(cu_seqlens_q=cu_q.to(device), cu_seqlens_k=cu_k.to(device), **opts)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy=strategy, **kw)
    dout = rand(out.shape, q.dtype, device, seed=9)
    dlse = torch.full((1, 1), 0.75, device=device).expand(lse.shape)
    dq, dk, dv = rudnn.attention_backward(dout, q, k, v, out, lse, dlse=dlse,
                                          strategy=_backward_strategy(strategy, q.dtype, 64, 64), **kw)

    def grads(dt):
        leaves = [t.detach().cpu().to(dt).requires_grad_() for t in (q, k, v)]
        o, l = ref.attention_varlen(*leaves, cu_q, cu_k, dtype=dt, **opts)
        ((o * dout.cpu().to(dt)).sum() + 0.75 * torch.where(torch.isfinite(l), l, 0).sum()).backward()
        return [t.grad for t in leaves]

    for ours, same, exact, what in zip((dq, dk, dv), grads(q.dtype), grads(torch.float64), ("dq", "dk", "dv")):
        assert_close_to_oracle(ours, same, exact, what)


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
def test_backward_deterministic(device, strategy):
    q, k, v, opts = _inputs(CASES["d64_tile_tail"], torch.bfloat16, device)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy=strategy, **opts)
    dout = rand(out.shape, torch.bfloat16, device, seed=7)
    bs = _backward_strategy(strategy, torch.bfloat16, 64, 64)
    first = rudnn.attention_backward(dout, q, k, v, out, lse, deterministic=True, strategy=bs, **opts)
    for _ in range(3):
        again = rudnn.attention_backward(dout, q, k, v, out, lse, deterministic=True, strategy=bs, **opts)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


# ---- varlen ----------------------------------------------------------------------------------

VARLEN = {
    "plain": dict(lens_q=[5, 0, 9, 1], lens_k=[7, 3, 9, 0], Hq=4, Hkv=2, D=32),
    "causal_gqa8": dict(lens_q=[3, 11, 0, 6], lens_k=[8, 11, 2, 6], Hq=8, Hkv=1, D=64, causal=True),
    "window_softcap": dict(lens_q=[13, 4], lens_k=[13, 17], Hq=2, Hkv=2, D=16, window=(3, 1), softcap=4.0),
    "long_d128": dict(lens_q=[70, 0, 130], lens_k=[150, 5, 129], Hq=4, Hkv=1, D=128, causal=True, softcap=6.0),
    "causal_window_decode": dict(lens_q=[9, 1, 0, 12], lens_k=[14, 6, 3, 12], Hq=4, Hkv=1, D=32, causal=True,
                                 window=(4, 2)),
}


def _varlen_inputs(case, dtype, device):
    lens_q, lens_k = case["lens_q"], case["lens_k"]
    cu_q = torch.tensor([0] + np.cumsum(lens_q).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(lens_k).tolist(), dtype=torch.int32)
    Tq, Tk = int(cu_q[-1]), int(cu_k[-1])
    q = rand((Tq, case["Hq"], case["D"]), dtype, device, seed=1)
    k = rand((Tk, case["Hkv"], case["D"]), dtype, device, seed=2)
    v = rand((Tk, case["Hkv"], case["D"]), dtype, device, seed=3)
    opts = {n: case[n] for n in ("causal", "window", "softcap") if n in case}
    return q, k, v, cu_q, cu_k, opts


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(VARLEN))
def test_varlen(device, strategy, dtype, name):
    _skip_unsupported_flash(strategy, dtype, VARLEN[name]["D"], VARLEN[name]["D"])
    q, k, v, cu_q, cu_k, opts = _varlen_inputs(VARLEN[name], dtype, device)
    out, lse = rudnn.attention(q, k, v, cu_seqlens_q=cu_q.to(device), cu_seqlens_k=cu_k.to(device),
                               return_lse=True, strategy=strategy, **opts)
    assert out.shape == q.shape[:2] + v.shape[-1:] and lse.shape == (q.shape[1], q.shape[0])
    o64, l64 = ref.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu_q, cu_k, **opts)
    o_same, _ = ref.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu_q, cu_k, dtype=dtype, **opts)
    assert_close_to_oracle(out, o_same, o64, "out")
    torch.testing.assert_close(lse.cpu().double(), l64, rtol=2e-5, atol=2e-5)

    dout = rand(out.shape, dtype, device, seed=9)
    dq, dk, dv = rudnn.attention_backward(dout, q, k, v, out, lse, cu_seqlens_q=cu_q.to(device),
                                          cu_seqlens_k=cu_k.to(device),
                                          strategy=_backward_strategy(strategy, dtype, VARLEN[name]["D"],
                                                                      VARLEN[name]["D"]), **opts)

    def grads(dt):
        leaves = [t.detach().cpu().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = ref.attention_varlen(*leaves, cu_q, cu_k, dtype=dt, **opts)
        o.backward(dout.cpu().to(dt))
        return [t.grad for t in leaves]

    for ours, same, exact, what in zip((dq, dk, dv), grads(dtype), grads(torch.float64), ("dq", "dk", "dv")):
        assert_close_to_oracle(ours, same, exact, what)


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
def test_varlen_strided_views(device, strategy):
    """q, k and v as the three slices of one packed [T, 3, H, D] projection (rows 3 H D apart), out
    written into a [T, H, D] slice of a wider buffer: no copies, the oracle's results."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu = torch.tensor([0, 37, 37, 80, 81], dtype=torch.int32)
    qkv = rand((81, 3, 4, 64), dtype, device, seed=11)
    q, k, v = qkv.unbind(1)
    out_buffer = torch.full((81, 4, 80), 7.0, dtype=dtype, device=device)
    out = out_buffer[..., 8:72]
    result = rudnn.attention(q, k, v, cu_seqlens_q=cu.to(device), cu_seqlens_k=cu.to(device), causal=True,
                             out=out, strategy=strategy)
    assert result.data_ptr() == out.data_ptr()
    o64, _ = ref.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu, cu, causal=True)
    o_same, _ = ref.attention_varlen(q.cpu(), k.cpu(), v.cpu(), cu, cu, dtype=dtype, causal=True)
    assert_close_to_oracle(out, o_same, o64, "out")
    assert (out_buffer[..., :8] == 7).all() and (out_buffer[..., 72:] == 7).all()


@pytest.mark.parametrize("device, strategy", DEVICE_STRATEGIES)
def test_strided_out_mask_bias_and_dout(device, strategy):
    """out= and dout as [B, S, H, D] memory, a mask that is a transposed view (keys not the dense
    axis) broadcast over batch and heads, a bias expanded over the batch (stride 0)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    B, Hq, Hkv, Sq, Sk, D = 2, 4, 2, 33, 70, 64
    q, k, v = _bshd(B, Hq, Sq, D, dtype, device, 1), _bshd(B, Hkv, Sk, D, dtype, device, 2), \
        _bshd(B, Hkv, Sk, D, dtype, device, 3)
    g = torch.Generator().manual_seed(5)
    mask = (torch.rand(Sk, Sq, generator=g) > 0.3).to(device).t()
    bias = (torch.randn(1, Hq, Sq, Sk, generator=g) * 0.5).to(device).expand(B, Hq, Sq, Sk)
    opts = dict(mask=mask, bias=bias, softcap=6.0)
    out = torch.empty(B, Sq, Hq, D, dtype=dtype, device=device).transpose(1, 2)
    _, lse = rudnn.attention(q, k, v, out=out, return_lse=True, strategy=strategy, **opts)
    o64, _ = _oracle(q, k, v, opts)
    assert_close_to_oracle(out, _same_dtype(q, k, v, opts, dtype)[0], o64, "out")
    dout = rand((B, Sq, Hq, D), dtype, device, seed=7).transpose(1, 2)
    grads = rudnn.attention_backward(dout, q, k, v, out, lse, strategy=_backward_strategy(strategy, dtype, D, D),
                                     **opts)
    for ours, same, exact, what in zip(grads, _grads(q, k, v, opts, dout, dtype),
                                       _grads(q, k, v, opts, dout, torch.float64), ("dq", "dk", "dv")):
        assert_close_to_oracle(ours, same, exact, what)


def test_varlen_matches_dense_per_sequence():
    q, k, v, cu_q, cu_k, opts = _varlen_inputs(VARLEN["causal_gqa8"], torch.float32, "cpu")
    out = rudnn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        dense = rudnn.attention(q[qs].transpose(0, 1)[None], k[ks].transpose(0, 1)[None],
                                v[ks].transpose(0, 1)[None], **opts)
        assert torch.equal(out[qs], dense[0].transpose(0, 1))


@pytest.mark.cuda
def test_auto_picks_flash_where_supported_and_fallback_elsewhere():
    q, k, v, _ = _inputs(CASES["d128_gqa4"], torch.bfloat16, "cuda")
    rudnn.attention(q, k, v)
    expected = "flash_sm90" if torch.cuda.get_device_capability()[0] == 9 else "flash_sm80"
    assert rudnn.attention_last_algorithm() == expected
    q, k, v, _ = _inputs(CASES["d256"], torch.bfloat16, "cuda")
    rudnn.attention(q, k, v)
    assert rudnn.attention_last_algorithm() == expected
    q, k, v, _ = _inputs(CASES["d96"], torch.bfloat16, "cuda")
    rudnn.attention(q, k, v)
    assert rudnn.attention_last_algorithm() == expected
    q, k, v, _ = _inputs(CASES["odd_dims"], torch.bfloat16, "cuda")
    rudnn.attention(q, k, v)
    assert rudnn.attention_last_algorithm() == "fallback"
    with pytest.raises(rudnn.UnsupportedError, match=r"attention: strategy 'flash': supports head dims \(D, Dv\) in "
                                                     r"\{\(64, 64\).*got D = 40, Dv = 24"):
        rudnn.attention(q, k, v, strategy="flash")
    q, k, v, _ = _inputs(CASES["odd_dims"], torch.bfloat16, "cuda")
    out, lse = rudnn.attention(q, k, v, return_lse=True)
    with pytest.raises(rudnn.UnsupportedError, match=r"attention_backward: strategy 'flash': supports head dims "
                                                     r"\(D, Dv\) in \{\(64, 64\), \(96, 96\), \(128, 128\), "
                                                     r"\(192, 128\), \(256, 256\)\}, got D = 40, Dv = 24"):
        rudnn.attention_backward(out, q, k, v, out, lse, strategy="flash")


@pytest.mark.cuda
@pytest.mark.parametrize("softcap", [1e-30, 1e35, 50.0])
def test_flash_softcap_at_the_ends_of_its_range(softcap):
    """softcap * tanh(score / softcap) in the flash kernels, forward and backward, at the ends of
    its range and at Gemma 2's 50: 1e35 is no cap at all; 1e-30 leaves every logit within 1e-30
    of 0 (uniform weights over the visible keys)."""
    case = dict(shape=(1, 4, 2, 70, 150, 64, 64), causal=True, softcap=softcap)
    q, k, v, opts = _inputs(case, torch.bfloat16, "cuda")
    q = q * 4  # logits of several units: the cap of 50 bends the largest
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy="flash", **opts)
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, "out")
    torch.testing.assert_close(lse.cpu().double(), l64, rtol=2e-5, atol=2e-5)
    dout = rand(out.shape, torch.bfloat16, "cuda", seed=7)
    grads = rudnn.attention_backward(dout, q, k, v, out, lse, strategy="flash", **opts)
    g64 = _grads(q, k, v, opts, dout, torch.float64)
    g_same = _grads(q, k, v, opts, dout, torch.bfloat16)
    for ours, same, exact, what in zip(grads, g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(ours.cpu().float()).all(), what
        assert_close_to_oracle(ours, same, exact, what)


@pytest.mark.cuda
def test_flash_backward_d256_needs_its_shared_memory():
    """The D = 256 flash backward holds 144 KiB of tiles per block: it runs where the device allows
    that (A100, Hopper) and says why not elsewhere (Ada, consumer Ampere)."""
    q, k, v, _ = _inputs(CASES["d256"], torch.bfloat16, "cuda")
    out, lse = rudnn.attention(q, k, v, return_lse=True)
    dout = torch.randn_like(out)
    if _device_holds_d256_backward():
        rudnn.attention_backward(dout, q, k, v, out, lse, strategy="flash")  # its values: test_backward_*
        hopper = torch.cuda.get_device_capability() == (9, 0)  # the sm90a backward has D = 256 too
        assert rudnn.attention_last_algorithm() == ("flash_sm90" if hopper else "flash_sm80")
    else:
        with pytest.raises(rudnn.UnsupportedError, match=r"attention_backward: strategy 'flash': needs 144 KiB of "
                                                         r"shared memory per block for head dims \(256, 256\)"):
            rudnn.attention_backward(dout, q, k, v, out, lse, strategy="flash")


# The head-dim pairs of the sm90a kernels: every flash pair (sm90ws leaves (96, 96) to sm90).
SM90_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256))


SM90WS_NOT_BUILT = "this libruDNN was built without the sm90ws kernels"


def _skip_unless_built(monkeypatch, kernel):
    """Sets RUDNN_ATTENTION_FLASH to `kernel`; skips where this build lacks it (sm90ws is compiled
    only with -DRUDNN_WITH_SM90WS=ON, as bench/gpu_check.sh builds it)."""
    monkeypatch.setenv("RUDNN_ATTENTION_FLASH", kernel)
    if kernel != "sm90ws":
        return
    q = torch.zeros((1, 1, 8, 64), dtype=torch.bfloat16, device="cuda")
    try:
        rudnn.attention(q, q, q, strategy="flash")
    except rudnn.UnsupportedError as e:
        if SM90WS_NOT_BUILT not in str(e):
            raise
        pytest.skip("this build has no sm90ws kernels (-DRUDNN_WITH_SM90WS=ON builds them)")


def _hopper_inputs(monkeypatch, kernel, name, head_dims):
    """bfloat16 CUDA inputs of case `name` (head dims 64 unless its (D, Dv) is in `head_dims`, those
    the sm90a kernels have) with RUDNN_ATTENTION_FLASH set to `kernel`."""
    _skip_unless_built(monkeypatch, kernel)
    case = dict(CASES[name])
    B, Hq, Hkv, Sq, Sk, D, Dv = case["shape"]
    if (D, Dv) not in head_dims:
        case["shape"] = (B, Hq, Hkv, Sq, Sk, 64, 64)
    monkeypatch.setenv("RUDNN_ATTENTION_FLASH", kernel)
    return _inputs(case, torch.bfloat16, "cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (every flash kernel generation runs there)")
@pytest.mark.parametrize("kernel", ["sm80", "sm90", "sm90ws"])
@pytest.mark.parametrize("name", ["d64_tile_tail", "d128_gqa4", "all_options", "decode", "sq_gt_sk_causal",
                                  "flash_long_d64", "flash_long_causal_d128", "flash_no_keys_d64",
                                  "flash_float_mask_bias_d128", "flash_d96_causal_gqa", "flash_d192_dv128_window",
                                  "flash_d256_causal_bias", "flash_softcap_causal_gqa_d128"])
def test_every_flash_kernel_on_hopper(monkeypatch, kernel, name):
    q, k, v, opts = _hopper_inputs(monkeypatch, kernel, name, SM90_HEAD_DIMS)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy="flash", **opts)
    ran = "sm90" if kernel == "sm90ws" and q.shape[-1] == 96 else kernel  # TMA boxes: 64-column multiples
    assert rudnn.attention_last_algorithm() == f"flash_{ran}"
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, "out")
    torch.testing.assert_close(lse.cpu().double(), l64, rtol=2e-5, atol=2e-5)


# Packed sequences next to each other whose tail tiles (64 query rows; 64 or 128 keys) reach into
# the next sequence: sequence 1 has keys but no queries, sequence 2 queries but no keys, so their
# rows (NaN in the test below) change no result, and a kernel that multiplies them (0 x NaN)
# turns sequence 0's NaN.
VARLEN_NEIGHBOURS = dict(lens_q=[70, 0, 5, 130], lens_k=[150, 5, 0, 129], Hq=4, Hkv=1, D=128, causal=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (every flash kernel generation runs there)")
@pytest.mark.parametrize("kernel", ["sm80", "sm90", "sm90ws"])
def test_every_flash_kernel_varlen_on_hopper(monkeypatch, kernel):
    """Packed batches on every generation, forward and backward (sm90ws: one TMA descriptor over
    every sequence's rows, the next sequence's rows in a tail tile cleared), with NaN in the rows
    that no result depends on: the results must be those of the same inputs without them."""
    _skip_unless_built(monkeypatch, kernel)
    q, k, v, cu_q, cu_k, opts = _varlen_inputs(VARLEN_NEIGHBOURS, torch.bfloat16, "cuda")
    dout = rand(q.shape, torch.bfloat16, "cuda", seed=9)
    clean = [t.clone() for t in (q, k, v, dout)]
    keys_1, queries_2 = slice(150, 155), slice(70, 75)
    k[keys_1] = v[keys_1] = float("nan")
    q[queries_2] = dout[queries_2] = float("nan")
    cu = dict(cu_seqlens_q=cu_q.cuda(), cu_seqlens_k=cu_k.cuda())
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy="flash", **cu, **opts)
    assert rudnn.attention_last_algorithm() == f"flash_{kernel}"
    o64, l64 = ref.attention_varlen(*(t.cpu() for t in clean[:3]), cu_q, cu_k, **opts)
    o_same, _ = ref.attention_varlen(*(t.cpu() for t in clean[:3]), cu_q, cu_k, dtype=torch.bfloat16, **opts)
    assert_close_to_oracle(out, o_same, o64, f"{kernel} varlen out")
    torch.testing.assert_close(lse.cpu().double(), l64, rtol=2e-5, atol=2e-5)

    grads = rudnn.attention_backward(dout, q, k, v, out, lse, strategy="flash", **cu, **opts)
    assert rudnn.attention_last_algorithm() == f"flash_{kernel}"

    def reference_grads(dt):
        leaves = [t.detach().cpu().to(dt).requires_grad_() for t in clean[:3]]
        o, _ = ref.attention_varlen(*leaves, cu_q, cu_k, dtype=dt, **opts)
        o.backward(clean[3].cpu().to(dt))
        return [t.grad for t in leaves]

    for ours, same, exact, what in zip(grads, reference_grads(torch.bfloat16), reference_grads(torch.float64),
                                       ("dq", "dk", "dv")):
        assert torch.isfinite(ours.cpu().float()).all(), f"{kernel} varlen {what}"
        assert_close_to_oracle(ours, same, exact, f"{kernel} varlen {what}")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
def test_sm90ws_leaves_broadcast_operands_to_sm90(monkeypatch):
    """sm90ws loads by TMA, whose strides are 16-byte multiples: zero-stride (expanded) operands
    run the sm90 kernels instead, with correct results (forward and backward)."""
    _skip_unless_built(monkeypatch, "sm90ws")
    q = rand((2, 4, 70, 64), torch.bfloat16, "cuda", seed=1)
    k, v = (rand((1, 4, 90, 64), torch.bfloat16, "cuda", seed=s).expand(2, 4, 90, 64) for s in (2, 3))
    out = rudnn.attention(q, k, v, strategy="flash")
    assert rudnn.attention_last_algorithm() == "flash_sm90"
    o64, _ = _oracle(q, k, v, {})
    o_same, _ = _same_dtype(q, k, v, {}, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, "broadcast out")
    q, k, v = (rand((2, 4, 70, 64), torch.bfloat16, "cuda", seed=s) for s in (1, 2, 3))
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy="flash")
    assert rudnn.attention_last_algorithm() == "flash_sm90ws"
    # The backward likewise (its dk/dv kernel loads Q, K, V and dO by TMA): sm90ws for these
    # operands, sm90 for a zero-stride dO.
    rudnn.attention_backward(rand(out.shape, torch.bfloat16, "cuda", seed=4), q, k, v, out, lse, strategy="flash")
    assert rudnn.attention_last_algorithm() == "flash_sm90ws"
    dout = rand((1, 4, 70, 64), torch.bfloat16, "cuda", seed=5).expand(2, 4, 70, 64)
    grads = rudnn.attention_backward(dout, q, k, v, out, lse, strategy="flash")
    assert rudnn.attention_last_algorithm() == "flash_sm90"
    for ours, same, exact, what in zip(grads, _grads(q, k, v, {}, dout, torch.bfloat16),
                                       _grads(q, k, v, {}, dout, torch.float64), ("dq", "dk", "dv")):
        assert_close_to_oracle(ours, same, exact, f"broadcast dout {what}")


@pytest.mark.cuda
def test_flash_generation_variable_errors(monkeypatch):
    q, k, v, _ = _inputs(CASES["d64_tile_tail"], torch.bfloat16, "cuda")
    monkeypatch.setenv("RUDNN_ATTENTION_FLASH", "sm70")
    with pytest.raises(rudnn.ArgumentError, match="RUDNN_ATTENTION_FLASH: expected 'sm80', 'sm90', 'sm90ws' or unset, "
                                               "got 'sm70'"):
        rudnn.attention(q, k, v, strategy="flash")
    monkeypatch.setenv("RUDNN_ATTENTION_FLASH", "sm90ws")
    if torch.cuda.get_device_capability()[0] != 9:
        with pytest.raises(rudnn.UnsupportedError, match="RUDNN_ATTENTION_FLASH=sm90ws needs a Hopper GPU"):
            rudnn.attention(q, k, v, strategy="flash")
    else:
        # Built (gpu_check builds it): it runs; not built: the error says how to build it.
        try:
            rudnn.attention(q, k, v, strategy="flash")
            assert rudnn.attention_last_algorithm() == "flash_sm90ws"
        except rudnn.UnsupportedError as e:
            assert f"RUDNN_ATTENTION_FLASH=sm90ws: {SM90WS_NOT_BUILT} (configure with -DRUDNN_WITH_SM90WS=ON)" in str(e)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["d64_tile_tail", "flash_d96_causal_gqa", "flash_d256_causal_bias"])
def test_auto_backward_picks_flash(name):
    """auto's backward is the sm90a one on Hopper for every head-dim pair; sm80 elsewhere (D = 64
    checked: wider heads depend on the device's shared memory)."""
    hopper = torch.cuda.get_device_capability()[0] == 9
    if not hopper and name != "d64_tile_tail":
        pytest.skip("the sm80 backward of wide heads needs A100-class shared memory")
    q, k, v, opts = _inputs(CASES[name], torch.bfloat16, "cuda")
    out, lse = rudnn.attention(q, k, v, return_lse=True, **opts)
    rudnn.attention_backward(torch.ones_like(out), q, k, v, out, lse, **opts)
    assert rudnn.attention_last_algorithm() == ("flash_sm90" if hopper else "flash_sm80")


@pytest.mark.cuda
def test_autotune_times_every_flash_generation_and_keeps_its_pick(monkeypatch):
    """autotune picks among the fallback and every flash generation the device runs (all three on
    Hopper; only the one RUDNN_ATTENTION_FLASH names when it is set), forward and backward apart,
    and keeps its pick for the shape class."""
    hopper = torch.cuda.get_device_capability()[0] == 9
    q, k, v, opts = _inputs(CASES["flash_long_causal_d128"], torch.bfloat16, "cuda")
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy="autotune", **opts)
    picked = rudnn.attention_last_algorithm()
    assert picked in {"fallback", "flash_sm80"} | ({"flash_sm90", "flash_sm90ws"} if hopper else set())
    o64, _ = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, "out")
    rudnn.attention(q, k, v, strategy="autotune", **opts)
    assert rudnn.attention_last_algorithm() == picked
    dout = rand(out.shape, torch.bfloat16, "cuda", seed=7)
    grads = rudnn.attention_backward(dout, q, k, v, out, lse, strategy="autotune", **opts)
    picked_backward = rudnn.attention_last_algorithm()
    assert picked_backward in {"fallback", "flash_sm80"} | ({"flash_sm90", "flash_sm90ws"} if hopper else set())
    rudnn.attention_backward(dout, q, k, v, out, lse, strategy="autotune", **opts)
    assert rudnn.attention_last_algorithm() == picked_backward
    for ours, same, exact, what in zip(grads, _grads(q, k, v, opts, dout, torch.bfloat16),
                                       _grads(q, k, v, opts, dout, torch.float64), ("dq", "dk", "dv")):
        assert_close_to_oracle(ours, same, exact, what)
    monkeypatch.setenv("RUDNN_ATTENTION_FLASH", "sm80")
    # a shape class no other test tunes (a tuned pick is kept whatever the variable says)
    q, k, v, opts = _inputs(dict(shape=(1, 2, 1, 600, 700, 64, 64)), torch.bfloat16, "cuda")
    rudnn.attention(q, k, v, strategy="autotune", **opts)
    assert rudnn.attention_last_algorithm() in {"fallback", "flash_sm80"}


@pytest.mark.cuda
def test_work_is_queued_on_the_callers_stream():
    """stream= (and torch's current stream, without it) order the call after the work already
    queued there: q is produced on a side stream at the end of a chain of products the call must
    wait for; run on another stream it would read q unfinished."""
    k, v = rand((1, 2, 300, 64), torch.bfloat16, "cuda", seed=2), rand((1, 2, 300, 64), torch.bfloat16, "cuda", seed=3)
    base = rand((1, 4, 300, 64), torch.bfloat16, "cuda", seed=1)
    expected = rudnn.attention(base, k, v, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()

    def q_after_a_long_chain():
        busy = torch.randn(2048, 2048, device="cuda")
        for _ in range(30):
            busy = torch.tanh(busy @ busy)
        return base + busy[0, 0].to(torch.bfloat16) * 0  # ready only when the chain is

    with torch.cuda.stream(side):
        q = q_after_a_long_chain()
    explicit = rudnn.attention(q, k, v, causal=True, stream=side)
    with torch.cuda.stream(side):
        q = q_after_a_long_chain()
        current = rudnn.attention(q, k, v, causal=True)
    side.synchronize()
    assert torch.equal(explicit, expected) and torch.equal(current, expected)


# A process that autotunes one forward shape class, and prints what ran.
_AUTOTUNE_ONE_CALL = """
import torch, rudnn
q = torch.randn(1, 4, 300, 64, device="cuda", dtype=torch.bfloat16)
kv = torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16)
rudnn.attention(q, kv, kv, causal=True, strategy="autotune")
print(rudnn.attention_last_algorithm())
"""


@pytest.mark.cuda
def test_autotune_choices_persist_across_processes(tmp_path):
    """RUDNN_AUTOTUNE_CACHE=<file>: the first process's pick lands in the file under a key naming
    this build and the device; a later process takes the recorded pick without timing (a line
    edited to 'fallback' is what it then runs, and it adds no line)."""
    path = tmp_path / "autotune.tsv"

    def run():
        return run_with_autotune_cache(_AUTOTUNE_ONE_CALL, path)

    first = run()
    lines = path.read_text().splitlines()
    assert len(lines) == 1, lines
    key, choice = lines[0].split("\t")
    assert choice == first and key.startswith(rudnn._C.build_id() + " | attention forward | ")
    assert torch.cuda.get_device_name() in key
    path.write_text(f"{key}\tfallback\n")
    assert run() == "fallback"
    assert path.read_text() == f"{key}\tfallback\n"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU (every flash backward generation runs there)")
@pytest.mark.parametrize("kernel", ["sm80", "sm90", "sm90ws"])
@pytest.mark.parametrize("name", ["d64_tile_tail", "d128_gqa4", "all_options", "decode", "sq_gt_sk_causal",
                                  "flash_long_causal_d128", "flash_no_keys_d64", "flash_float_mask_bias_d128",
                                  "flash_d96_causal_gqa", "flash_d192_dv128_window", "flash_d256_causal_bias",
                                  "flash_softcap_causal_gqa_d128"])
def test_every_flash_backward_on_hopper(monkeypatch, kernel, name):
    """Every backward generation on Hopper, every head-dim pair (sm90a: two warpgroups in dk/dv for
    (192, 128) and 256; sm90ws: a TMA producer and two consumers in dk/dv, 64-column head dims)."""
    q, k, v, opts = _hopper_inputs(monkeypatch, kernel, name, SM90_HEAD_DIMS)
    out, lse = rudnn.attention(q, k, v, return_lse=True, strategy="flash", **opts)
    dout = rand(out.shape, torch.bfloat16, "cuda", seed=7)
    grads = rudnn.attention_backward(dout, q, k, v, out, lse, strategy="flash", **opts)
    ran = "sm90" if kernel == "sm90ws" and q.shape[-1] == 96 else kernel  # TMA boxes: 64-column multiples
    assert rudnn.attention_last_algorithm() == f"flash_{ran}"
    g64 = _grads(q, k, v, opts, dout, torch.float64)
    g_same = _grads(q, k, v, opts, dout, torch.bfloat16)
    for ours, same, exact, what in zip(grads, g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(ours.cpu().float()).all(), what
        assert_close_to_oracle(ours, same, exact, what)


def test_last_algorithm_cpu():
    q, k, v, _ = _inputs(CASES["basic"], torch.float32, "cpu")
    rudnn.attention(q, k, v, strategy="flash")  # strategies choose CUDA kernels; the CPU runs the reference
    assert rudnn.attention_last_algorithm() == "cpu"


@pytest.mark.parametrize("device", DEVICES)
def test_backward_of_empty_batch_takes_any_strides(device):
    """An empty array has no element to read: a zero-stride dout (torch's gradient of a sum) and
    an empty q whose last axis is not dense are valid."""
    q = torch.empty(0, 4, 16, 5, device=device).transpose(-1, -2)  # [0, 4, 5, 16], last-axis stride 5
    k, v = torch.randn(0, 2, 7, 16, device=device), torch.randn(0, 2, 7, 8, device=device)
    out, lse = rudnn.attention(q, k, v, return_lse=True)
    assert out.shape == (0, 4, 5, 8) and lse.shape == (0, 4, 5)
    dout = torch.zeros((), device=device).expand(0, 4, 5, 8)
    dq, dk, dv = rudnn.attention_backward(dout, q, k, v, out, lse)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_window_takes_any_integer():
    """window sides may be NumPy integers (as in FlashAttention's window_size); bools and floats
    are refused."""
    q, k, v, _ = _inputs(CASES["window"], torch.float32, "cpu")
    expected = rudnn.attention(q, k, v, window=(3, 2))
    torch.testing.assert_close(rudnn.attention(q, k, v, window=(np.int64(3), np.int32(2))), expected,
                               rtol=0, atol=0)
    torch.testing.assert_close(rudnn.attention(q, k, v, window=[np.int64(3), 2]), expected, rtol=0, atol=0)
    with pytest.raises(rudnn.ArgumentError, match=r"attention: window: expected \(left, right\) with each an int "
                                                  r">= 0 or None, got \(True, 2\)"):
        rudnn.attention(q, k, v, window=(True, 2))
    with pytest.raises(rudnn.ArgumentError, match=r"attention: window: expected \(left, right\) with each an int "
                                                  r">= 0 or None, got \(3, np.float64\(2.0\)\)"):
        rudnn.attention(q, k, v, window=(3, np.float64(2.0)))
