"""The attention fallback kernels' own source (cpp/src/attention/fallback_cuda.cu: forward, dq,
dk/dv), run on the CPU by a host emulator (tests/emulation/attention_fallback_emu.cpp: std::threads
for CUDA threads, barriers for __syncthreads and warp shuffles), against the float64 reference
(and torch autograd through it) with the FlashAttention error budget. It checks the kernels' tiling
(16-row blocks, 32-row tiles, 64-column slices, 256-column accumulator blocks), staging, barriers,
team reductions and every score option without a GPU. Skipped when g++ (C++20) or the CUDA
toolkit's headers are missing."""

import os
import subprocess

import numpy as np
import pytest
import torch

from test_attention import CASES, _grads, _inputs, _oracle, _same_dtype
from util import ROOT, assert_close_to_oracle, build_emulator, rand


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "attention", "fallback_cuda.cu")).read()
    start = src.index("namespace {\n", src.index("namespace cuda {"))
    end = src.index("// Grid of (blocks, heads, sequences)", start)  # the host helpers stay out
    body = src[start + len("namespace {\n"):end]
    edit = "extern __shared__ float smem[];"
    assert edit in body, "emulation edit no longer applies"
    body = body.replace(edit, "float* smem = reinterpret_cast<float*>(emu_smem);")
    return "namespace rudnn::attention::cuda {\nnamespace emu_fb {\n" + body + "}\n}\n"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return build_emulator("attention_fallback_emu.cpp", _kernels_source(), tmp_path_factory.mktemp("attn_emu"))


def _bits(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().float().numpy()


def _from_bits(path, shape, dtype):
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.fromfile(path, np.uint16).astype(np.int16)).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(np.fromfile(path, np.float32)).reshape(shape)


def _run(exe, tmp_path, q, k, v, opts, cu_q=None, cu_k=None, backward=None):
    """Dense q [B, Hq, Sq, D] or packed [Tq, Hq, D] with cu_seqlens. Forward: (out, lse) of the
    emulated kernel. backward=(dout, out, lse): (dq, dk, dv) of the emulated dq and dk/dv kernels."""
    varlen = cu_q is not None
    if varlen:
        (Tq, Hq, D), (Tk, Hkv, Dv) = q.shape, v.shape
        B, Sq, Sk = len(cu_q) - 1, int(np.diff(cu_q).max(initial=0)), int(np.diff(cu_k).max(initial=0))
    else:
        (B, Hq, Sq, D), (_, Hkv, Sk, Dv) = q.shape, v.shape
        Tq = Tk = 0
    scale = opts.get("scale", D ** -0.5)
    left, right = opts.get("window") or (None, None)
    mask_kind = mask_batch = bias_kind = bias_batch = 0
    full = (B, Hq, Sq, Sk)
    if opts.get("mask") is not None:
        m = opts["mask"].expand(full).contiguous()
        mask_kind, mask_batch = (1, B) if m.dtype == torch.bool else (2, B)
        (m.to(torch.uint8) if m.dtype == torch.bool else m.float()).numpy().tofile(tmp_path / "mask.bin")
    if opts.get("bias") is not None:
        opts["bias"].float().expand(full).contiguous().numpy().tofile(tmp_path / "bias.bin")
        bias_kind, bias_batch = 2, B
    bf16 = q.dtype == torch.bfloat16
    meta = [B, Hq, Hkv, Sq, Sk, D, Dv, int(bf16), repr(float(scale)), repr(float(opts.get("softcap") or 0.0)),
            int(bool(opts.get("causal"))), -1 if left is None else left, -1 if right is None else right,
            int(varlen), Tq, Tk, mask_kind, mask_batch, bias_kind, bias_batch]
    (tmp_path / "meta.txt").write_text(" ".join(map(str, meta)) + "\n")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _bits(t).tofile(tmp_path / f"{name}.bin")  # dense: contiguous copies of strided views
    if varlen:
        np.asarray(cu_q, np.int32).tofile(tmp_path / "cu_q.bin")
        np.asarray(cu_k, np.int32).tofile(tmp_path / "cu_k.bin")
    if backward is not None:
        dout, out, lse = backward
        _bits(dout).tofile(tmp_path / "dout.bin")
        _bits(out.to(q.dtype)).tofile(tmp_path / "out.bin")
        lse.float().contiguous().numpy().tofile(tmp_path / "lse.bin")
    mode = "forward" if backward is None else "backward"
    result = subprocess.run([str(exe), mode, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    if backward is not None:
        return [_from_bits(tmp_path / f"{n}.bin", t.shape, q.dtype) for n, t in (("dq", q), ("dk", k), ("dv", v))]
    out_shape = (Tq, Hq, Dv) if varlen else (B, Hq, Sq, Dv)
    lse_shape = (Hq, Tq) if varlen else (B, Hq, Sq)
    return _from_bits(tmp_path / "out.bin", out_shape, q.dtype), _from_bits(tmp_path / "lse.bin", lse_shape,
                                                                          torch.float32)


# Every score option, GQA, Sq != Sk, rows that see no key, tile tails (Sq 67 > 4 row blocks,
# Sk 71 > 2 key tiles), head dims across 64-column slices (96, 192 with Dv 128, 256) and an output
# wider than one 256-column block (Dv 300).
NAMES = ["basic", "sq_gt_sk_causal", "decode_window", "window", "softcap_causal_gqa4", "bool_mask_empty_rows",
         "float_mask", "all_options", "d64_tile_tail", "d96", "d192_dv128", "d256", "odd_dims", "no_keys"]
WIDE = dict(shape=(1, 2, 1, 18, 20, 40, 300), causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES + ["wide_dv"])
def test_fallback_forward_kernel(emulator, tmp_path, name, dtype):
    case = WIDE if name == "wide_dv" else CASES[name]
    q, k, v, opts = _inputs(case, dtype, "cpu", seed=11)
    out, lse = _run(emulator, tmp_path, q, k, v, dict(opts))
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, dtype)
    assert_close_to_oracle(out, o_same, o64, f"{name} out")
    torch.testing.assert_close(lse.double(), l64, rtol=1e-5, atol=1e-5)


def test_fallback_forward_kernel_varlen(emulator, tmp_path):
    lengths_q, lengths_k = [5, 0, 19, 1], [7, 3, 40, 0]
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lengths_q)]), np.concatenate([[0], np.cumsum(lengths_k)])
    g = torch.Generator().manual_seed(5)
    q = torch.randn(int(cu_q[-1]), 4, 24, generator=g)
    k = torch.randn(int(cu_k[-1]), 2, 24, generator=g)
    v = torch.randn(int(cu_k[-1]), 2, 20, generator=g)
    out, lse = _run(emulator, tmp_path, q, k, v, {"causal": True}, cu_q, cu_k)
    for b in range(len(lengths_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        dq, dk, dv = (t.transpose(0, 1)[None] for t in (q[qs], k[ks], v[ks]))
        o64, l64 = _oracle(dq, dk, dv, {"causal": True})
        o_same, _ = _same_dtype(dq, dk, dv, {"causal": True}, torch.float32)
        assert_close_to_oracle(out[qs].transpose(0, 1)[None], o_same, o64, f"sequence {b} out")
        torch.testing.assert_close(lse[:, qs][None].double(), l64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["basic", "sq_gt_sk_causal", "window", "softcap_causal_gqa4", "bool_mask_empty_rows",
                                  "all_options", "float_mask_bias_gqa8", "d64_tile_tail", "d192_dv128", "odd_dims",
                                  "wide_dv"])
def test_fallback_backward_kernels(emulator, tmp_path, name, dtype):
    case = WIDE if name == "wide_dv" else CASES[name]
    q, k, v, opts = _inputs(case, dtype, "cpu", seed=13)
    out, lse = _oracle(q, k, v, opts)  # the backward takes the forward's results as given
    dout = rand(out.shape, dtype, seed=7)
    ours = _run(emulator, tmp_path, q, k, v, dict(opts), backward=(dout, out, lse))
    g64 = _grads(q, k, v, opts, dout, torch.float64)
    g_same = _grads(q, k, v, opts, dout, dtype)
    for mine, same, exact, what in zip(ours, g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(mine.float()).all(), what
        assert_close_to_oracle(mine, same, exact, f"{name} {what}")
