"""The attention kernels' own source, run on the CPU by host emulators (std::threads for CUDA
threads, barriers for __syncthreads and warp shuffles; tests/emulation/), against the float64
reference (and torch autograd through it) with the FlashAttention error budget:
- the fallback kernels (cpp/src/attention/fallback_cuda.cu: forward, dq, dk/dv): tiling (16-row
  blocks, 32-row tiles, 64-column slices, 256-column accumulator blocks), staging, barriers, team
  reductions and every score option;
- the flash kernels (flash_sm80.cuh, flash_bwd_sm80.cuh, and the sm90a ones), with the tensor-core
  MMA, ldmatrix, cp.async, wgmma, mbarrier and TMA atoms replaced by stand-ins written from the PTX
  ISA (emu_sm80_atoms.hpp, emu_sm90_atoms.hpp): CuTe layouts, swizzles, the copy schedule, online
  softmax, masking and the backward's kernels. Copies land as late as they may; an ordering check
  (emu_runtime.hpp: vector clocks passed through __syncthreads, named barriers and mbarriers)
  fails any run in which a copy (cp.async, TMA) and a tensor-core read (ldmatrix, wgmma) of the
  same bytes are not ordered by the barriers, in either direction.
Skipped when g++ (C++20), the CUDA toolkit's headers or (flash) CUTLASS's headers are missing."""

import math
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from test_attention import CASES, _grads, _inputs, _oracle, _same_dtype
from util import FLASH_SM80_EDITS, ROOT, emu_array_bits, emu_array_from_file, assert_close_to_oracle, build_emulator, rand


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
def emulator():
    return build_emulator("attention_fallback_emu.cpp", _kernels_source())


def _run(exe, tmp_path, q, k, v, opts, cu_q=None, cu_k=None, backward=None, env=None):
    """Dense q [B, Hq, Sq, D] or packed [Tq, Hq, D] with cu_seqlens. Forward: (out, lse) of the
    emulated kernel. backward=(dout, out, lse) or (dout, out, lse, dlse): (dq, dk, dv) of the
    emulated dq and dk/dv kernels."""
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
        emu_array_bits(t).tofile(tmp_path / f"{name}.bin")  # dense: contiguous copies of strided views
    if varlen:
        np.asarray(cu_q, np.int32).tofile(tmp_path / "cu_q.bin")
        np.asarray(cu_k, np.int32).tofile(tmp_path / "cu_k.bin")
    if backward is not None:
        dout, out, lse, *dlse = backward
        emu_array_bits(dout).tofile(tmp_path / "dout.bin")
        emu_array_bits(out.to(q.dtype)).tofile(tmp_path / "out.bin")
        lse.float().contiguous().numpy().tofile(tmp_path / "lse.bin")
        if dlse:  # laid out like lse
            dlse[0].float().contiguous().numpy().tofile(tmp_path / "dlse.bin")
    mode = "forward" if backward is None else "backward"
    result = subprocess.run([str(exe), mode, str(tmp_path)], capture_output=True, text=True, timeout=600,
                            env=None if env is None else {**os.environ, **env})
    assert result.returncode == 0, result.stderr
    if backward is not None:
        return [emu_array_from_file(tmp_path / f"{n}.bin", t.shape, q.dtype) for n, t in (("dq", q), ("dk", k), ("dv", v))]
    out_shape = (Tq, Hq, Dv) if varlen else (B, Hq, Sq, Dv)
    lse_shape = (Hq, Tq) if varlen else (B, Hq, Sq)
    return emu_array_from_file(tmp_path / "out.bin", out_shape, q.dtype), emu_array_from_file(tmp_path / "lse.bin", lse_shape,
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


def _per_sequence(cu_q, cu_k):
    """(b, its query rows, its key rows) of every sequence."""
    for b in range(len(cu_q) - 1):
        yield b, slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))


def _dense(packed, rows):
    """Rows of a packed [T, H, D] tensor as a [1, H, S, D] one."""
    return packed[rows].transpose(0, 1)[None]


def test_fallback_forward_kernel_varlen(emulator, tmp_path):
    lengths_q, lengths_k = [5, 0, 19, 1], [7, 3, 40, 0]
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lengths_q)]), np.concatenate([[0], np.cumsum(lengths_k)])
    g = torch.Generator().manual_seed(5)
    q = torch.randn(int(cu_q[-1]), 4, 24, generator=g)
    k = torch.randn(int(cu_k[-1]), 2, 24, generator=g)
    v = torch.randn(int(cu_k[-1]), 2, 20, generator=g)
    out, lse = _run(emulator, tmp_path, q, k, v, {"causal": True}, cu_q, cu_k)
    for b, qs, ks in _per_sequence(cu_q, cu_k):
        dq, dk, dv = _dense(q, qs), _dense(k, ks), _dense(v, ks)
        o64, l64 = _oracle(dq, dk, dv, {"causal": True})
        o_same, _ = _same_dtype(dq, dk, dv, {"causal": True}, torch.float32)
        assert_close_to_oracle(_dense(out, qs), o_same, o64, f"sequence {b} out")
        torch.testing.assert_close(lse[:, qs][None].double(), l64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["basic", "sq_gt_sk_causal", "window", "softcap_causal_gqa4", "bool_mask_empty_rows",
                                  "all_options", "float_mask_bias_gqa8", "d64_tile_tail", "d192_dv128", "odd_dims",
                                  "wide_dv"])
def test_fallback_backward_kernels(emulator, tmp_path, name, dtype):
    _check_fallback_backward(emulator, tmp_path, name, dtype)


# With dlse (the gradient through lse) the dq kernel subtracts it from each row's dout . out.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["sq_gt_sk_causal", "bool_mask_empty_rows", "softcap_causal_gqa4", "d64_tile_tail"])
def test_fallback_backward_kernels_through_lse(emulator, tmp_path, name, dtype):
    _check_fallback_backward(emulator, tmp_path, name, dtype, through_lse=True)


def _check_fallback_backward(emulator, tmp_path, name, dtype, through_lse=False):
    case = WIDE if name == "wide_dv" else CASES[name]
    q, k, v, opts = _inputs(case, dtype, "cpu", seed=13)
    out, lse = _oracle(q, k, v, opts)  # the backward takes the forward's results as given
    dout = rand(out.shape, dtype, seed=7)
    dlse = rand(lse.shape, torch.float32, seed=8) if through_lse else None
    ours = _run(emulator, tmp_path, q, k, v, dict(opts), backward=(dout, out, lse) + ((dlse,) if through_lse else ()))
    g64 = _grads(q, k, v, opts, dout, torch.float64, dlse)
    g_same = _grads(q, k, v, opts, dout, dtype, dlse)
    for mine, same, exact, what in zip(ours, g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(mine.float()).all(), what
        assert_close_to_oracle(mine, same, exact, f"{name} {what}")


# ---- the flash sm80 kernels (CuTe, mma.sync) ------------------------------------------------

# The hardware atoms' names in the kernel text and their host stand-ins (util.py).
FLASH_EDITS = FLASH_SM80_EDITS


# ... and the sm90a kernel's (emu_sm90_atoms.hpp); its body is compiled for sm_90a only.
FLASH_SM90_EDITS = [("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900", "#if 1"),
                    ("extern __shared__ __align__(1024) unsigned char smem_raw[];",
                     "unsigned char* smem_raw = emu_smem;"),
                    ("SM90::GMMA::MMA_64x64x16_F32F16F16_SS", "EmuGmmaSS64F16"),
                    ("SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS", "EmuGmmaSS64BF16"),
                    ("SM90::GMMA::MMA_64x128x16_F32F16F16_SS", "EmuGmmaSS128F16"),
                    ("SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS", "EmuGmmaSS128BF16"),
                    ("SM90::GMMA::MMA_64x64x16_F32F16F16_RS", "EmuGmmaRS64F16"),
                    ("SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS", "EmuGmmaRS64BF16"),
                    ("SM90::GMMA::MMA_64x96x16_F32F16F16_RS", "EmuGmmaRS96F16"),
                    ("SM90::GMMA::MMA_64x96x16_F32BF16BF16_RS", "EmuGmmaRS96BF16"),
                    ("SM90::GMMA::MMA_64x128x16_F32F16F16_RS", "EmuGmmaRS128F16"),
                    ("SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS", "EmuGmmaRS128BF16"),
                    ("SM90::GMMA::MMA_64x192x16_F32F16F16_RS", "EmuGmmaRS192F16"),
                    ("SM90::GMMA::MMA_64x192x16_F32BF16BF16_RS", "EmuGmmaRS192BF16"),
                    ("SM90::GMMA::MMA_64x256x16_F32F16F16_RS", "EmuGmmaRS256F16"),
                    ("SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS", "EmuGmmaRS256BF16"),
                    ("warpgroup_arrive()", "emu_warpgroup_arrive()"),
                    ("warpgroup_commit_batch()", "emu_warpgroup_commit_batch()"),
                    ("warpgroup_wait<", "emu_warpgroup_wait<"),
                    ("cutlass::arch::fence_view_async_shared()", "emu_fence_view_async_shared()")]
# ... and the warp-specialized sm90a kernel's (flash_sm90_ws.cuh).
FLASH_SM90WS_EDITS = [("cutlass::arch::ClusterBarrier", "EmuMbarrier"),
                      ("cutlass::arch::NamedBarrier", "EmuNamedBarrier"),
                      ("cutlass::arch::ClusterTransactionBarrier", "EmuMbarrier"),
                      ("SM90_TMA_LOAD_4D::copy(", "emu_tma_load_4d("),
                      ("cutlass::arch::fence_barrier_init()", "emu_fence_barrier_init()"),
                      ("cutlass::arch::warpgroup_reg_dealloc<", "emu_setmaxnreg<"),
                      ("cutlass::arch::warpgroup_reg_alloc<", "emu_setmaxnreg<"),
                      # the backward's dQ reductions (deterministic = false)
                      ('asm volatile("{ .reg .pred p; setp.ne.b32 p, %3, 0; @p red.global.add.v2.f32 [%0], '
                       '{%1, %2}; }" ::"l"(address),\n               "f"(a), "f"(b), "r"(int(add)));',
                       "if (add) emu_red_add_f32x2(address, a, b);")]


def _flash_source(extra_edits=()):
    """flash_sm80.cuh, flash_bwd_sm80.cuh, flash_sm90.cuh, flash_sm90_ws.cuh, flash_bwd_sm90.cuh and
    flash_bwd_sm90_ws.cuh without their host launchers, atoms renamed."""
    def kernels_of(name, end):
        text = open(os.path.join(ROOT, "cpp", "src", "attention", name)).read()
        return text[text.index("namespace rudnn::attention::flash {"):text.index(end)]
    launcher = "template <class Element, int kHeadDim, int kHeadDimV>\nvoid launch_backward_sm90"
    end = "}  // namespace rudnn::attention::flash\n"
    text = (kernels_of("flash_sm80.cuh", '#include "core/cuda_check.hpp"')
            + kernels_of("flash_bwd_sm80.cuh", "// The dq and dk/dv kernels of one generation") + end
            + kernels_of("flash_sm90.cuh", "template <class Element, int kHeadDim, int kHeadDimV>\nvoid launch") + end
            + kernels_of("flash_sm90_ws.cuh", '#include "core/cuda_check.hpp"')
            + kernels_of("flash_bwd_sm90.cuh", launcher) + end
            + kernels_of("flash_bwd_sm90_ws.cuh", '#include "core/cuda_check.hpp"'))
    edits = FLASH_EDITS + FLASH_SM90_EDITS + FLASH_SM90WS_EDITS
    for old, new in list(extra_edits) + edits:  # planted bugs use the original names
        assert old in text, f"emulation edit no longer applies: {old}"
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def flash_emulator():
    return build_emulator("attention_flash_emu.cpp", _flash_source(), needs_cutlass=True)


# Shapes the flash kernels take (bfloat16, every head-dim pair the build has): tile tails on both
# axes (Sq 67, Sk 71 are not multiples of 64), several key blocks, causal with Sq != Sk
# (bottom-right), GQA; causal and window through the plain instantiation (kPlain: no mask, bias or
# softcap) and, beside softcap, a bias or mask, through the general one.
FLASH_CASES = {
    "plain_tails": dict(shape=(1, 2, 2, 67, 71, 64, 64)),
    "causal_three_blocks": dict(shape=(1, 1, 1, 150, 150, 64, 64), causal=True),
    "causal_sq_lt_sk_gqa": dict(shape=(2, 4, 2, 40, 130, 64, 64), causal=True),
    "causal_sq_gt_sk": dict(shape=(1, 2, 1, 100, 70, 64, 64), causal=True),
    "d128_causal": dict(shape=(1, 2, 1, 80, 140, 128, 128), causal=True),
    "window_softcap": dict(shape=(1, 2, 2, 90, 130, 64, 64), window=(50, 10), softcap=20.0),
    "bias_gqa4": dict(shape=(1, 4, 1, 70, 70, 64, 64), bias="float"),
    "causal_window_gqa": dict(shape=(1, 4, 2, 100, 260, 64, 64), causal=True, window=(70, 0)),
    "bool_mask_empty_rows": dict(shape=(1, 2, 2, 70, 70, 64, 64), mask="bool_empty_rows"),
    "d96_causal_gqa": dict(shape=(1, 2, 1, 70, 100, 96, 96), causal=True),
    "d128_window": dict(shape=(1, 1, 1, 100, 90, 128, 128), window=(40, 0)),
    "d192_dv128_causal": dict(shape=(1, 2, 1, 70, 150, 192, 128), causal=True),
    "d256_softcap": dict(shape=(1, 1, 1, 65, 100, 256, 256), softcap=15.0),
    # softcap with causal and GQA at D = 128 over three 128-key blocks: the warp-specialized
    # forward's softcap instantiation (transform inline) where Gemma-style models run it
    "d128_softcap_causal_gqa": dict(shape=(1, 4, 2, 100, 300, 128, 128), causal=True, softcap=30.0),
    # a cap far beyond the inline transform's range (Problem::kInlineSoftcapMax), where its
    # cap - 2 cap / (1 + e^(2x)) would be 0 for every logit: the general instantiation takes it
    "softcap_beyond_inline": dict(shape=(1, 2, 1, 70, 130, 64, 64), causal=True, softcap=1e35),
    # six blocks of the warp-specialized forward's 128 keys: its ring of K/V stages (3) goes
    # round twice
    "ring_wraps": dict(shape=(1, 2, 1, 70, 700, 64, 64)),
}


def _flash_inputs(name, seed):
    case = dict(FLASH_CASES[name])
    B, Hq, Hkv, Sq, Sk, D, Dv = case.pop("shape")
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, s, d, generator=g, dtype=torch.float64).to(torch.bfloat16)
               for h, s, d in ((Hq, Sq, D), (Hkv, Sk, D), (Hkv, Sk, Dv)))
    opts = {key: case[key] for key in ("causal", "window", "softcap") if key in case}
    if case.get("bias") == "float":
        opts["bias"] = torch.randn(1, Hq, Sq, Sk, generator=g, dtype=torch.float64).float()
    if case.get("mask") == "bool_empty_rows":
        mask = torch.rand(B, Hq, Sq, Sk, generator=g) > 0.3
        mask[:, :, 5] = False  # a row that sees no key: output 0, lse -inf
        opts["mask"] = mask
    return q, k, v, opts


@pytest.mark.parametrize("name", list(FLASH_CASES))
def test_flash_forward_kernel(flash_emulator, tmp_path, name):
    q, k, v, opts = _flash_inputs(name, seed=21)
    out, lse = _run(flash_emulator, tmp_path, q, k, v, dict(opts))
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, f"{name} out")
    torch.testing.assert_close(lse.double(), l64, rtol=1e-4, atol=1e-4)


# The sm90a kernels (wgmma; sm90 is what Hopper runs for every head-dim pair, sm90ws the
# warp-specialized one, whose TMA boxes take 64-column multiples) on the same cases.
@pytest.mark.parametrize("name,generation", [(n, g) for n, c in FLASH_CASES.items() for g in ("sm90", "sm90ws")
                                             if g == "sm90" or c["shape"][5] % 64 == 0])
def test_flash_sm90_forward_kernels(flash_emulator, tmp_path, name, generation):
    q, k, v, opts = _flash_inputs(name, seed=22)
    out, lse = _run(flash_emulator, tmp_path, q, k, v, dict(opts), env={"EMU_FLASH_GENERATION": generation})
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, f"{name} out")
    torch.testing.assert_close(lse.double(), l64, rtol=1e-4, atol=1e-4)


# A strided out= (rows longer than Dv): an even row stride keeps the epilogue's pair stores, an
# odd one takes its element stores; the padding between rows must stay untouched (the emulator
# checks it: exit 4 otherwise). Every generation, dense and packed.
@pytest.mark.parametrize("generation", ["sm80", "sm90", "sm90ws"])
@pytest.mark.parametrize("pad", [1, 8])
def test_flash_forward_strided_out(flash_emulator, tmp_path, generation, pad):
    env = {"EMU_FLASH_GENERATION": generation, "EMU_OUT_ROW_PAD": str(pad)}
    name = next(n for n, c in FLASH_CASES.items() if c["shape"][5] == 128 and c["shape"][6] == 128)
    q, k, v, opts = _flash_inputs(name, seed=23)
    out, lse = _run(flash_emulator, tmp_path, q, k, v, dict(opts), env=env)
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, f"{name} out, rows padded by {pad}")
    torch.testing.assert_close(lse.double(), l64, rtol=1e-4, atol=1e-4)
    qv, kv, vv, cu_q, cu_k = _varlen_inputs(seed=32)
    out, lse = _run(flash_emulator, tmp_path, qv, kv, vv, {"causal": True}, cu_q, cu_k, env=env)
    _check_varlen_forward(out, lse, qv, kv, vv, cu_q, cu_k, {"causal": True}, generation)


# Packed variable-length batches on the flash kernels (bfloat16, D = 64, GQA 2, causal): an
# empty query sequence, one without keys (its rows: output 0, lse -inf), sequences spanning
# several 64- and 128-key blocks with tails, and one short enough to sit inside one tile.
VARLEN_LENGTHS_Q, VARLEN_LENGTHS_K = [70, 0, 5, 150, 33], [130, 70, 0, 200, 33]
_VARLEN_POISONED_Q = slice(sum(VARLEN_LENGTHS_Q[:2]), sum(VARLEN_LENGTHS_Q[:3]))  # sequence 2's queries
_VARLEN_POISONED_K = slice(VARLEN_LENGTHS_K[0], sum(VARLEN_LENGTHS_K[:2]))        # sequence 1's keys



def _varlen_inputs(seed):
    """q, k, v, cu_q, cu_k; the rows right after sequence 0's (which its tail tiles of 64 query
    rows and of 64 or 128 keys cover: keys 128-255, both 64-key halves of the sm90ws dk/dv kernel's
    tail CTA) are NaN: the keys of sequence 1 (no queries) and the queries
    of sequence 2 (no keys), whose own results do not depend on them. A kernel that lets a tail
    tile's rows of the next sequence into a product (0 x NaN) turns sequence 0's results NaN."""
    cu_q = np.concatenate([[0], np.cumsum(VARLEN_LENGTHS_Q)])
    cu_k = np.concatenate([[0], np.cumsum(VARLEN_LENGTHS_K)])
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(int(cu[-1]), h, 64, generator=g, dtype=torch.float64).to(torch.bfloat16)
               for cu, h in ((cu_q, 4), (cu_k, 2), (cu_k, 2)))
    q[_VARLEN_POISONED_Q] = float("nan")
    k[_VARLEN_POISONED_K] = v[_VARLEN_POISONED_K] = float("nan")
    return q, k, v, cu_q, cu_k


# (softcap: the warp-specialized forward's softcap instantiation, whose transform runs on the
# NaN keys of the tail tiles before their scores are masked)
@pytest.mark.parametrize("generation,softcap", [("sm80", None), ("sm90", None), ("sm90ws", None), ("sm90ws", 25.0)])
def test_flash_forward_kernel_varlen(flash_emulator, tmp_path, generation, softcap):
    q, k, v, cu_q, cu_k = _varlen_inputs(seed=31)
    opts = {"causal": True, **({"softcap": softcap} if softcap else {})}
    out, lse = _run(flash_emulator, tmp_path, q, k, v, dict(opts), cu_q, cu_k,
                    env={"EMU_FLASH_GENERATION": generation})
    _check_varlen_forward(out, lse, q, k, v, cu_q, cu_k, opts, generation)


def _check_varlen_forward(out, lse, q, k, v, cu_q, cu_k, opts, label):
    """A packed batch's forward results, sequence by sequence, against the float64 oracle."""
    for b, qs, ks in _per_sequence(cu_q, cu_k):
        if qs.stop == qs.start:
            continue
        if ks.stop == ks.start:  # rows that see no key, whatever their (NaN) queries: 0 and -inf
            assert (out[qs].float() == 0).all() and (lse[:, qs] == -math.inf).all(), f"{label} sequence {b}"
            continue
        sq, sk, sv = _dense(q, qs), _dense(k, ks), _dense(v, ks)
        o64, l64 = _oracle(sq, sk, sv, opts)
        o_same, _ = _same_dtype(sq, sk, sv, opts, torch.bfloat16)
        assert_close_to_oracle(_dense(out, qs), o_same, o64, f"{label} sequence {b} out")
        torch.testing.assert_close(lse[:, qs][None].double(), l64, rtol=1e-4, atol=1e-4)


# The persistent sm90ws forward (issue 24 item 1): min(work items, SMs) CTAs, each walking items
# (128 query rows of one head of one sequence) with a static stride, the producer loading the next
# item's Q and K/V under the current one's epilogue. The emulator launches it for EMU_SMS SMs
# (default 3); here 1, 4 and 7: one CTA walking every item, and CTAs ending on different items.
# Whatever the grid, each item's rows are computed by the same code in the same order: the results
# must be the same bits. Cases: dense causal with Sq > Sk (its first query block sees no key: an
# item without keys between items with keys; GQA, 24 items, three key blocks for the longest), and
# the packed causal batch of _varlen_inputs (a sequence without keys, one without queries, tails).
PERSISTENT_SMS = (1, 4, 7)


def _persistent_runs(exe, tmp_path, q, k, v, opts, cu_q=None, cu_k=None):
    """(out, lse) of the sm90ws forward for each SM count of PERSISTENT_SMS, after checking that they
    are bitwise equal."""
    results = []
    for sms in PERSISTENT_SMS:
        run_dir = tmp_path / f"sms{sms}"
        run_dir.mkdir()
        results.append(_run(exe, run_dir, q, k, v, dict(opts), cu_q, cu_k,
                            env={"EMU_FLASH_GENERATION": "sm90ws", "EMU_SMS": str(sms)}))
    (out, lse), *others = results
    for sms, (o, l) in zip(PERSISTENT_SMS[1:], others):
        assert torch.equal(o.view(torch.int16), out.view(torch.int16)), f"out with {sms} SMs differs from 1 SM"
        assert torch.equal(l.view(torch.int32), lse.view(torch.int32)), f"lse with {sms} SMs differs from 1 SM"
    return out, lse


def test_flash_sm90ws_forward_persistent_dense(flash_emulator, tmp_path):
    g = torch.Generator().manual_seed(41)
    q, k, v = (torch.randn(2, h, s, 64, generator=g, dtype=torch.float64).to(torch.bfloat16)
               for h, s in ((4, 300), (2, 100), (2, 100)))
    opts = {"causal": True}
    out, lse = _persistent_runs(flash_emulator, tmp_path, q, k, v, opts)
    o64, l64 = _oracle(q, k, v, opts)
    o_same, _ = _same_dtype(q, k, v, opts, torch.bfloat16)
    assert_close_to_oracle(out, o_same, o64, "persistent dense out")
    torch.testing.assert_close(lse.double(), l64, rtol=1e-4, atol=1e-4)
    assert (out[:, :, :200].float() == 0).all() and (lse[:, :, :200] == -math.inf).all()  # rows that see no key


def test_flash_sm90ws_forward_persistent_varlen(flash_emulator, tmp_path):
    q, k, v, cu_q, cu_k = _varlen_inputs(seed=43)
    opts = {"causal": True}
    out, lse = _persistent_runs(flash_emulator, tmp_path, q, k, v, opts, cu_q, cu_k)
    _check_varlen_forward(out, lse, q, k, v, cu_q, cu_k, opts, "persistent")


@pytest.mark.parametrize("generation", ["sm80", "sm90", "sm90ws"])
def test_flash_backward_kernels_varlen(flash_emulator, tmp_path, generation):
    q, k, v, cu_q, cu_k = _varlen_inputs(seed=32)
    opts = {"causal": True}
    out = torch.zeros(q.shape[0], 4, 64, dtype=torch.float64)
    lse = torch.zeros(4, q.shape[0], dtype=torch.float64)
    for b, qs, ks in _per_sequence(cu_q, cu_k):
        if ks.stop == ks.start:  # 0 and -inf (the oracle's are NaN for the NaN queries)
            out[qs], lse[:, qs] = 0.0, -math.inf
            continue
        o64, l64 = _oracle(_dense(q, qs), _dense(k, ks), _dense(v, ks), opts)
        out[qs], lse[:, qs] = o64[0].transpose(0, 1), l64[0]
    dout = rand(out.shape, torch.bfloat16, seed=19)
    dout[_VARLEN_POISONED_Q] = float("nan")  # beside sequence 0's tail query tile, as q's rows
    grads = _run(flash_emulator, tmp_path, q, k, v, dict(opts), cu_q, cu_k, backward=(dout, out, lse),
                 env={"EMU_FLASH_GENERATION": generation})
    for b, qs, ks in _per_sequence(cu_q, cu_k):
        if qs.stop == qs.start or ks.stop == ks.start:  # no (query, key) pair: every gradient 0
            for mine, what in ((grads[0][qs], "dq"), (grads[1][ks], "dk"), (grads[2][ks], "dv")):
                assert (mine.float() == 0).all(), f"{generation} sequence {b} {what}"
            continue
        dense = (_dense(q, qs), _dense(k, ks), _dense(v, ks))
        g64 = _grads(*dense, opts, _dense(dout, qs), torch.float64)
        g_same = _grads(*dense, opts, _dense(dout, qs), torch.bfloat16)
        for mine, same, exact, what in zip((grads[0][qs], grads[1][ks], grads[2][ks]), g_same, g64, ("dq", "dk", "dv")):
            assert torch.isfinite(mine.float()).all(), f"{generation} sequence {b} {what}"
            assert_close_to_oracle(_dense(mine, slice(None)), same, exact, f"{generation} sequence {b} {what}")


FLASH_BACKWARD_CASES = ["plain_tails", "causal_sq_lt_sk_gqa", "causal_sq_gt_sk", "window_softcap", "bias_gqa4",
                        "causal_window_gqa", "bool_mask_empty_rows", "d96_causal_gqa", "d128_causal", "d128_window", "d192_dv128_causal",
                        "d256_softcap"]


@pytest.mark.parametrize("name", FLASH_BACKWARD_CASES)
def test_flash_backward_kernels(flash_emulator, tmp_path, name):
    _check_flash_backward(flash_emulator, tmp_path, name)


def _check_flash_backward(exe, tmp_path, name, env=None, through_lse=False):
    q, k, v, opts = _flash_inputs(name, seed=23)
    out, lse = _oracle(q, k, v, opts)
    dout = rand(out.shape, torch.bfloat16, seed=9)
    dlse = rand(lse.shape, torch.float32, seed=10) if through_lse else None
    ours = _run(exe, tmp_path, q, k, v, dict(opts), backward=(dout, out, lse) + ((dlse,) if through_lse else ()),
                env=env)
    g64 = _grads(q, k, v, opts, dout, torch.float64, dlse)
    g_same = _grads(q, k, v, opts, dout, torch.bfloat16, dlse)
    for mine, same, exact, what in zip(ours, g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(mine.float()).all(), what
        assert_close_to_oracle(mine, same, exact, f"{name} {what}")


# The sm90a backward (wgmma; what Hopper runs for every head-dim pair; two warpgroups in dk/dv for
# (192, 128) and 256) and the warp-specialized one (TMA producer and two consumers in dk/dv;
# 64-column head dims) on the same cases.
@pytest.mark.parametrize("name,generation", [(n, g) for n in FLASH_BACKWARD_CASES for g in ("sm90", "sm90ws")
                                             if g == "sm90" or FLASH_CASES[n]["shape"][5] % 64 == 0])
def test_flash_sm90_backward_kernels(flash_emulator, tmp_path, name, generation):
    _check_flash_backward(flash_emulator, tmp_path, name, env={"EMU_FLASH_GENERATION": generation})


# With dlse (the gradient through lse) the delta kernel subtracts it from each row's dout . out.
@pytest.mark.parametrize("generation", ["sm80", "sm90", "sm90ws"])
@pytest.mark.parametrize("name", ["causal_sq_gt_sk", "d128_causal"])
def test_flash_backward_kernels_through_lse(flash_emulator, tmp_path, name, generation):
    _check_flash_backward(flash_emulator, tmp_path, name, env={"EMU_FLASH_GENERATION": generation},
                          through_lse=True)


# The emulator is only evidence if a broken kernel fails in it: a forward that reads K before its
# cp.async group has landed, one whose softmax reads the accumulator with the MMA's row and column
# pairs swapped, sm90a forwards whose wgmma reads the first 16 columns of K (or the first 16 keys
# of V) at every k step, and warp-specialized ones whose consumers read V from the first stage of
# the ring only, or the next block's scores before waiting for their wgmma group, or whose TMA
# boxes land in the wrong place or copy the wrong slab.
PLANTED_FLASH_BUGS = {
    "k_read_before_its_copy_lands": ("cp_async_wait<0>();  // Q and K of block n have landed", ";", "sm80"),
    # the accumulator's (row, col) view with the m16n8 atom's row pair and column pair swapped
    "accumulator_rows_and_cols_swapped": (
        "make_layout(make_layout(get<0, 1>(d), get<1>(d)), make_layout(get<0, 0>(d), get<2>(d)))",
        "make_layout(make_layout(get<0, 0>(d), get<1>(d)), make_layout(get<0, 1>(d), get<2>(d)))", "sm80"),
    "sm90_v_descriptor_not_advanced": ("for (int kk = 0; kk < size<2>(a); ++kk) cute::gemm(mma, a(_, _, kk), b(_, _, kk), acc);",
                                       "for (int kk = 0; kk < size<2>(a); ++kk) cute::gemm(mma, a(_, _, kk), b(_, _, 0), acc);",
                                       "sm90"),
    "sm90ws_v_read_from_stage_0": ("thr_o.make_fragment_B(thr_o.partition_B(sVt(stage)))",
                                   "thr_o.make_fragment_B(thr_o.partition_B(sVt(0)))", "sm90ws"),
    "sm90ws_next_scores_read_before_their_wait": (
        "          warpgroup_wait<1>();  // groups complete in order: Q K^T of block i + 1 is done", "", "sm90ws"),
    "sm90_k_descriptor_not_advanced": ("    cute::gemm(mma, a(_, _, kk), b(_, _, kk), acc);\n    mma.accumulate_",
                                       "    cute::gemm(mma, a(_, _, kk), b(_, _, 0), acc);\n    mma.accumulate_", "sm90"),
    # TMA: both consumers' Q boxes land in the first consumer's rows; every K and V box copies D's first slab.
    "sm90ws_tma_q_boxes_overlap": ("q_bytes + Cfg::box_offset(Cfg::kQBytes, Cfg::kSlabsK, slab, half),",
                                   "q_bytes + Cfg::box_offset(Cfg::kQBytes, Cfg::kSlabsK, slab, 0),", "sm90ws"),
    "sm90ws_tma_key_tile_slab_coordinate_ignored": (
        "slab * 64, int(k0 + n * BN + 64 * box), int(hk), batch);",
        "0, int(k0 + n * BN + 64 * box), int(hk), batch);", "sm90ws", "d128_causal"),
    # both 64-key boxes of a 128-key K or V tile copy the block's first 64 keys.
    "sm90ws_tma_second_key_box_repeats_the_first": (
        "slab * 64, int(k0 + n * BN + 64 * box), int(hk), batch);",
        "slab * 64, int(k0 + n * BN), int(hk), batch);", "sm90ws", "d128_causal"),
    # a dense batch's last V tile whose second 64-key box lies past the sequence (Sk = 150: keys
    # 192-255 of the 128-key block from 128) is not loaded, and not cleared either: the poisoned
    # shared memory times P = 0
    "sm90ws_unloaded_v_box_not_cleared": (
        "(Cfg::kBoxesPerSlab == 2 && len_k - n * BN <= 64);", "false;", "sm90ws"),
    # O rescaled after P V is issued instead of before (under Q K^T): O written while its wgmma is
    # in flight (the emulator's wgmma stand-in reports it; the numbers would come out right)
    "sm90ws_o_rescaled_while_pv_is_in_flight": (
        "        rescale_rows(acc_o_rc, correction);  // block i's correction, under Q K^T of block i + 1\n"
        "        Barrier::wait(&full_v[stage], Cfg::round_parity(position));\n"
        "        cute::Tensor tOrV = thr_o.make_fragment_B(thr_o.partition_B(sVt(stage)));\n"
        "        warpgroup_fence_operand(acc_o90);\n        warpgroup_arrive();\n"
        "        wgmma_accumulate(mma_o, tOrP, tOrV, acc_o90);\n",
        "        Barrier::wait(&full_v[stage], Cfg::round_parity(position));\n"
        "        cute::Tensor tOrV = thr_o.make_fragment_B(thr_o.partition_B(sVt(stage)));\n"
        "        warpgroup_fence_operand(acc_o90);\n        warpgroup_arrive();\n"
        "        wgmma_accumulate(mma_o, tOrP, tOrV, acc_o90);\n"
        "        rescale_rows(acc_o_rc, correction);\n", "sm90ws", "ring_wraps"),
    # the softcap instantiation's transform taking half the score; or its scores never masked by
    # position (hidden keys of the window weighed in)
    "sm90ws_softcap_of_half_the_score": ("for (int i = 0; i < size(acc_s); ++i) acc_s(i) = transform(acc_s(i));",
                                         "for (int i = 0; i < size(acc_s); ++i) acc_s(i) = transform(0.5f * acc_s(i));",
                                         "sm90ws", "window_softcap"),
    "sm90ws_softcap_scores_not_masked": (
        "    acc_s(i) = band.visible(get<0>(coords(i)), get<1>(coords(i))) ? acc_s(i) : -INFINITY;",
        "    acc_s(i) = acc_s(i);", "sm90ws", "window_softcap"),
    # V's boxes at K's tile size apart (right for D = Dv only): caught where Dv != D.
    "sm90ws_v_tiles_at_k_tile_stride": ("v_tiles + stage * Cfg::kTileBytesV", "v_tiles + stage * Cfg::kTileBytesK",
                                        "sm90ws", "d192_dv128_causal"),
    # The persistent forward (4 items of three key blocks on the emulator's 3 CTAs: CTA 0 walks
    # items 0 and 3): a stride that skips items (their rows stay poisoned), and consumers that
    # restart the ring at stage 0 for each item while the producer carries on from where it is
    # (the emulator's run deadlocks: its mbarrier stand-in stops it).
    "sm90ws_items_skipped_by_a_wrong_stride": ("t += gridDim.x) {", "t += gridDim.x + 1) {", "sm90ws",
                                               "causal_window_gqa"),
    "sm90ws_consumer_ring_restarted_per_item": ("      ring = (ring + std::uint32_t(blocks)) % Cfg::kRingPeriod;\n",
                                                "", "sm90ws", "causal_window_gqa"),
}


def _planted_setup(test, bug):
    """(edit, case, generation, backward) of the planted-bug test function `test` for `bug`."""
    if test == "test_flash_emulator_catches_planted_bug":
        old, new, generation, *case = PLANTED_FLASH_BUGS[bug]
        return (old, new), case[0] if case else "causal_three_blocks", generation, False
    if test == "test_flash_emulator_catches_planted_backward_bug":
        old, new, _, generation, *case = PLANTED_FLASH_BACKWARD_BUGS[bug]
        return (old, new), case[0] if case else "d128_causal", generation, True
    if test == "test_flash_emulator_catches_planted_varlen_bug":
        old, new, mode = PLANTED_VARLEN_BUGS[bug]
        return (old, new), "plain_tails", "sm90ws", mode == "backward"  # D = 64, as _varlen_inputs
    assert test == "test_flash_emulator_reports_unordered_access", test
    old, new, mode, generation, *case = PLANTED_ORDERING_HAZARDS[bug]
    return (old, new), case[0] if case else "causal_three_blocks", generation, mode == "backward"


PLANTED_TESTS = ("test_flash_emulator_catches_planted_bug", "test_flash_emulator_catches_planted_backward_bug",
                 "test_flash_emulator_catches_planted_varlen_bug", "test_flash_emulator_reports_unordered_access")


def _planted_emulator(edit, case, generation, backward):
    """The flash emulator with one edit of the kernels' text, built with only the kernels that
    `case` runs through `generation` in one pass (its head dim, plain or general scores:
    attention_flash_emu.cpp); a run that needs another kernel fails instead of passing unchecked."""
    # Problem::plain_scores: no mask, bias or softcap (causal and window allowed)
    plain = not any(option in FLASH_CASES[case] for option in ("mask", "bias", "softcap"))
    defines = [f"EMU_HEAD_DIM={FLASH_CASES[case]['shape'][5]}", f"EMU_BACKWARD={int(backward)}",
               f"EMU_GENERATION={('sm80', 'sm90', 'sm90ws').index(generation)}", f"EMU_PLAIN={int(plain)}"]
    return build_emulator("attention_flash_emu.cpp", _flash_source([edit]), needs_cutlass=True, defines=defines)


@pytest.fixture(scope="module")
def planted_emulators(request):
    """The emulators of every selected planted-bug test, built os.cpu_count() at a time (one g++
    process each) from when the first of those tests runs: {(test, bug): future executable}."""
    wanted = [(item.originalname, item.callspec.params["bug"]) for item in request.session.items
              if item.module is request.module and item.originalname in PLANTED_TESTS]
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    try:
        yield {key: pool.submit(_planted_emulator, *_planted_setup(*key)) for key in wanted}
    finally:
        pool.shutdown(cancel_futures=True)


@pytest.fixture
def planted(planted_emulators, request):
    """(emulator, case, generation) of this planted-bug test."""
    key = (request.node.originalname, request.node.callspec.params["bug"])
    _, case, generation, _ = _planted_setup(*key)
    return planted_emulators[key].result(), case, generation


def _run_planted(*args, **kwargs):
    """_run of a kernel with a planted bug; None when the emulator's ordering or bounds check, its
    check of wgmma accumulators written in flight, or its mbarrier stand-in (a wait that missed its
    phase, more arrivals than a phase takes, a deadlock) reports it (caught, whatever the numbers)."""
    try:
        return _run(*args, **kwargs)
    except AssertionError as e:
        if not any(report in str(e) for report in ("shared-memory ordering hazard", "shared-memory access out of bounds",
                                                   "wgmma accumulator written while its wgmma was in flight",
                                                   "mbarrier stand-in:")):
            raise
        return None


@pytest.mark.parametrize("bug", list(PLANTED_FLASH_BUGS))
def test_flash_emulator_catches_planted_bug(planted, tmp_path, bug):
    exe, case, generation = planted
    q, k, v, opts = _flash_inputs(case, seed=21)
    # (a deadlocked run stops after 30 s without an mbarrier phase, not at the 600 s limit)
    result = _run_planted(exe, tmp_path, q, k, v, dict(opts),
                          env={"EMU_FLASH_GENERATION": generation, "EMU_STALL_SECONDS": "30"})
    if result is not None:
        o64, _ = _oracle(q, k, v, opts)
        assert not torch.allclose(result[0].double(), o64, atol=0.05), f"{bug} went unnoticed"


# ... and the backward: an sm80 dq kernel (8 warps) that reads dS back from shared
# memory before the other warps of its rows have written their halves, an sm80 dk/dv kernel whose
# dK takes P^T instead of dS^T, and sm90a ones whose dK reads dO^T instead of Q^T or that read
# products (S and dP in the dq kernel) before waiting for their wgmma group; and two-warpgroup
# dk/dv kernels (wide heads) whose dS side takes another element's weight or lse for delta, and a
# warp-specialized one whose producer lands dO on Q. (A [D, 64] view that is not the transpose of
# its tile cannot be planted: CuTe rejects the non-canonical layout when compiling.)
PLANTED_FLASH_BACKWARD_BUGS = {
    "dq_reads_ds_before_every_warp_wrote_it": (
        "    __syncthreads();\n    smem_gemm(mma, copy_a, tQsdS,", "    smem_gemm(mma, copy_a, tQsdS,", "dq",
        "sm80"),
    "dk_from_p_instead_of_ds": ("smem_gemm(mma, copy_at, tKsdSt, tKrdSt,", "smem_gemm(mma, copy_at, tVsPt, tKrdSt,",
                                "dk", "sm80"),
    "sm90_dk_from_dout_instead_of_q": ("tKrdSt, tKrQt, acc_dk90);", "tKrdSt, tVrdOt, acc_dk90);", "dk", "sm90"),
    "sm90_dq_reads_scores_before_their_wait": (
        "  warpgroup_wait<0>();\n  warpgroup_fence_operand(acc1);", "  warpgroup_fence_operand(acc1);", "dq", "sm90"),
    "sm90_split_weight_of_another_element": ("cuda::dscore(weight_at(r, c),", "cuda::dscore(weight_at(r ^ 1, c),",
                                             "dk", "sm90", "d256_softcap"),
    # the warp-specialized dk/dv kernel's producer lands dO's boxes on Q's
    "sm90ws_dout_boxes_over_q": ("load_rows(&tma.dout, bar, stage_smem + Cfg::kBytesD,",
                                 "load_rows(&tma.dout, bar, stage_smem,", "dk", "sm90ws"),
    # ... or whose second key-half warpgroup multiplies the first half's K and V (keys 64-70)
    "sm90ws_key_halves_on_one_kv_tile": ("const int kv_bytes = half * Cfg::kPairBytes;", "const int kv_bytes = 0;",
                                         "dk", "sm90ws", "plain_tails"),
    # ... or whose dQ over both key halves (D = 128: each warpgroup 64 columns over 128 keys) takes
    # the first half's dS^T for the second's
    "sm90ws_dq_by_columns_second_half_on_the_first_ds": (
        "DqOperands{Cfg::kDsOffset + int(i & 1) * Cfg::kDsBytes, 2 * Cfg::kDsBytes,",
        "DqOperands{Cfg::kDsOffset + int(i & 1) * Cfg::kDsBytes, 0,", "dq", "sm90ws"),
    "sm90_split_lse_for_delta": ("stats[BM + query_of(c)]", "stats[query_of(c)]", "dk", "sm90", "d192_dv128_causal"),
    # the warp-specialized dk/dv kernel's softcap instantiation (transform inline) taking the capped
    # logit for its tanh (key halves, D = 64), or capping half the score (roles, D = 256)
    "sm90ws_backward_softcap_tanh_not_divided_by_cap": (
        "if constexpr (kSoftcap) t = s * inverse_cap;", "if constexpr (kSoftcap) t = s;", "dk", "sm90ws",
        "window_softcap"),
    "sm90ws_backward_softcap_of_half_the_score": ("acc_s(j) = transform(acc_s(j));",
                                                  "acc_s(j) = transform(0.5f * acc_s(j));", "dk", "sm90ws",
                                                  "d256_softcap"),
}


@pytest.mark.parametrize("bug", list(PLANTED_FLASH_BACKWARD_BUGS))
def test_flash_emulator_catches_planted_backward_bug(planted, tmp_path, bug):
    exe, case, generation = planted
    grad = PLANTED_FLASH_BACKWARD_BUGS[bug][2]
    q, k, v, opts = _flash_inputs(case, seed=23)
    out, lse = _oracle(q, k, v, opts)
    dout = rand(out.shape, torch.bfloat16, seed=9)
    result = _run_planted(exe, tmp_path, q, k, v, dict(opts), backward=(dout, out, lse),
                          env={"EMU_FLASH_GENERATION": generation})
    if result is not None:
        g64 = _grads(q, k, v, opts, dout, torch.float64)
        mine, exact = (result[0], g64[0]) if grad == "dq" else (result[1], g64[1])
        assert not torch.allclose(mine.double(), exact, atol=0.05), f"{bug} went unnoticed"


# ... and packed variable-length batches loaded by TMA (one descriptor over every sequence's rows)
# whose tail tiles keep the next sequence's rows: V's in the warp-specialized forward, Q's or dO's
# in its dk/dv kernel. _varlen_inputs puts NaN there, which reaches sequence 0 through 0 x NaN.
PLANTED_VARLEN_BUGS = {
    "sm90ws_tail_v_rows_kept": (
        "clear_tile_rows(v_stage, Cfg::kTileBytesV / Cfg::kSlabsV, Cfg::kSlabsV, BN, int(len_k - n * BN), tid, 32);",
        "", "forward"),
    "sm90ws_backward_tail_q_rows_kept": (
        "clear_tile_rows(stage_smem, Cfg::kBoxBytes, kHeadDim / 64, BM, first_row, tid, 32);", "", "backward"),
    "sm90ws_backward_tail_dout_rows_kept": (
        "clear_tile_rows(stage_smem + Cfg::kBytesD, Cfg::kBoxBytes, kHeadDimV / 64, BM, first_row, tid, 32);", "",
        "backward"),
}


@pytest.mark.parametrize("bug", list(PLANTED_VARLEN_BUGS))
def test_flash_emulator_catches_planted_varlen_bug(planted, tmp_path, bug):
    exe, _, _ = planted
    mode = PLANTED_VARLEN_BUGS[bug][2]
    q, k, v, cu_q, cu_k = _varlen_inputs(seed=33)
    env = {"EMU_FLASH_GENERATION": "sm90ws"}
    rows_q, rows_k = slice(0, VARLEN_LENGTHS_Q[0]), slice(0, VARLEN_LENGTHS_K[0])  # sequence 0's
    if mode == "forward":
        out, _ = _run_planted(exe, tmp_path, q, k, v, {"causal": True}, cu_q, cu_k, env=env)
        assert not torch.isfinite(out[rows_q].float()).all(), f"{bug} went unnoticed"
    else:
        out = torch.zeros(q.shape[0], 4, 64, dtype=torch.float64)
        lse = torch.full((4, q.shape[0]), -math.inf, dtype=torch.float64)
        o64, l64 = _oracle(_dense(q, rows_q), _dense(k, rows_k), _dense(v, rows_k), {"causal": True})
        out[rows_q], lse[:, rows_q] = o64[0].transpose(0, 1), l64[0]
        dout = rand(out.shape, torch.bfloat16, seed=19)
        dout[_VARLEN_POISONED_Q] = float("nan")
        _, dk, dv = _run_planted(exe, tmp_path, q, k, v, {"causal": True}, cu_q, cu_k, backward=(dout, out, lse),
                                 env=env)
        assert not (torch.isfinite(dk[rows_k].float()).all() and torch.isfinite(dv[rows_k].float()).all()), \
            f"{bug} went unnoticed"


# ... and shared-memory accesses the barriers do not order: a prefetch into a tile that other warps
# may still be reading (write after read), a warp-specialized consumer that hands a ring stage
# back before its last wgmma on it is done, reads a stage after waiting for another copy's
# barrier or without waiting at all (read after write). The emulator lands copies and runs wgmma as late as it may, and its
# TMA copies land as soon as they are issued, so most of these kernels still give the right
# numbers there; its ordering check (emu_runtime.hpp: vector clocks through every barrier, the
# copies' writes against the tensor-core reads) must report them.
PLANTED_ORDERING_HAZARDS = {
    "sm80_next_k_before_every_warp_read_k": (
        "  __syncthreads();     // ... for every warp; and every warp is done reading sK\n  prefetch_next_k();",
        "  prefetch_next_k();\n  __syncthreads();", "forward", "sm80"),
    "sm90_v_before_every_warp_read_v": (
        "    __syncthreads();                           // ... for every warp; every warp is done with sV\n"
        "    v_loader.load(rows_v, n0, raw_pointer_cast(sV.data()));",
        "    v_loader.load(rows_v, n0, raw_pointer_cast(sV.data()));\n    __syncthreads();", "forward", "sm90"),
    "sm80_dq_next_v_before_every_warp_read_v": (
        "    __syncthreads();  // every warp is done reading sV\n    if (more) {\n      v_loader.load(",
        "    if (more) {\n      v_loader.load(", "backward", "sm80"),
    # the two-warpgroup dk/dv kernel without its end-of-step barrier: one warpgroup prefetches into
    # the stage the other may still be reading
    "sm90_split_next_tiles_before_both_warpgroups_read_them": (
        "    both(kStageRead);", "", "backward", "sm90", "d192_dv128_causal"),
    # the warp-specialized forward's consumers release V of a block before P V is done
    "sm90ws_stage_released_before_pv_is_done": (
        "        warpgroup_wait<0>();\n        warpgroup_fence_operand(acc_o90);\n        Barrier::arrive(&empty_v[stage]);",
        "        Barrier::arrive(&empty_v[stage]);\n        warpgroup_wait<0>();\n        warpgroup_fence_operand(acc_o90);",
        "forward", "sm90ws", "ring_wraps"),
    # ... or K of block 0 before its Q K^T is done. (K of a later block released before its wait
    # is no hazard: the producer refills that stage only after V of the block before, released
    # once P V of the previous block is done, which is after that wait. A producer that skips the
    # wait on K's release hangs: its K copies run two phases ahead of the consumers' waits.)
    "sm90ws_first_k_released_before_its_scores_are_done": (
        "      warpgroup_wait<0>();\n      warpgroup_fence_operand(acc_s90);\n      release_scores(0);",
        "      release_scores(0);\n      warpgroup_wait<0>();\n      warpgroup_fence_operand(acc_s90);",
        "forward", "sm90ws", "ring_wraps"),
    # ... or read V after waiting for K's copy only (V's copies are issued with K's: right numbers)
    "sm90ws_v_read_after_waiting_for_k": (
        "Barrier::wait(&full_v[stage], Cfg::round_parity(position));",
        "Barrier::wait(&full_k[stage], Cfg::round_parity(position));", "forward", "sm90ws"),
    # ... or hands Q back one key block early (after Q K^T of the next-to-last block), so that the
    # producer loads the next item's Q while the last block's Q K^T is still to read this one's
    # (4 items of three key blocks on the emulator's 3 CTAs: CTA 0 walks items 0 and 3)
    "sm90ws_q_released_before_its_last_scores_are_done": (
        "        if (i + 1 == blocks) Barrier::arrive(empty_q);",
        "        if (i + 2 == blocks || blocks == 1) Barrier::arrive(empty_q);", "forward", "sm90ws",
        "causal_window_gqa"),
    # the warp-specialized dk/dv kernel's consumers read each stage without waiting for its copies
    "sm90ws_backward_stage_read_before_it_lands": (
        "      Barrier::wait(&full[stage], std::uint32_t((i / kStages) & 1));\n      keys.visit(", "      keys.visit(",
        "backward", "sm90ws", "bias_gqa4"),
}


@pytest.mark.parametrize("bug", list(PLANTED_ORDERING_HAZARDS))
def test_flash_emulator_reports_unordered_access(planted, tmp_path, bug):
    exe, case, generation = planted
    mode = PLANTED_ORDERING_HAZARDS[bug][2]
    q, k, v, opts = _flash_inputs(case, seed=21)
    backward = None
    if mode == "backward":
        out, lse = _oracle(q, k, v, opts)
        backward = (rand(out.shape, torch.bfloat16, seed=9), out, lse)
    with pytest.raises(AssertionError, match="shared-memory ordering hazard"):
        _run(exe, tmp_path, q, k, v, dict(opts), backward=backward, env={"EMU_FLASH_GENERATION": generation})


# ---- the sm90ws backward's two dQ paths ---------------------------------------------------------
# With deterministic = false (the library's default, and the emulator's unless EMU_DETERMINISTIC=1)
# the warp-specialized dk/dv kernel also forms dQ = dS K per (query block, key block) and adds it
# into a float32 accumulator with vector reductions (red.global.add.v2.f32), zeroed before and
# converted to dq after it; no dq kernel runs. The sm90ws cases above run that path; here it is
# asked for explicitly on D = 64 and 128, causal and not, GQA (several query heads and key blocks
# add into one row) and a packed variable-length batch, and the deterministic path (sm90's dq
# kernel) keeps its own run of every sm90ws case.
ACCUMULATED_DQ_CASES = {
    "d128_gqa_plain": dict(shape=(1, 4, 2, 90, 200, 128, 128)),  # four key blocks add into each dQ row
}


def _check_sm90ws_backward(exe, tmp_path, name, deterministic):
    if name in FLASH_CASES:  # the same inputs as _check_flash_backward's
        q, k, v, opts = _flash_inputs(name, seed=23)
    else:  # plain scores
        B, Hq, Hkv, Sq, Sk, D, Dv = ACCUMULATED_DQ_CASES[name]["shape"]
        g = torch.Generator().manual_seed(23)
        q, k, v = (torch.randn(B, h, s, d, generator=g, dtype=torch.float64).to(torch.bfloat16)
                   for h, s, d in ((Hq, Sq, D), (Hkv, Sk, D), (Hkv, Sk, Dv)))
        opts = {}
    out, lse = _oracle(q, k, v, opts)
    dout = rand(out.shape, torch.bfloat16, seed=9)
    ours = _run(exe, tmp_path, q, k, v, dict(opts), backward=(dout, out, lse),
                env={"EMU_FLASH_GENERATION": "sm90ws", "EMU_DETERMINISTIC": str(int(deterministic))})
    g64 = _grads(q, k, v, opts, dout, torch.float64)
    g_same = _grads(q, k, v, opts, dout, torch.bfloat16)
    for mine, same, exact, what in zip(ours, g_same, g64, ("dq", "dk", "dv")):
        assert torch.isfinite(mine.float()).all(), what
        assert_close_to_oracle(mine, same, exact, f"{name} {what}")


# (d128_softcap_causal_gqa: the softcap instantiation, transform inline, at D = 128 where dQ is
# formed by columns; softcap_beyond_inline: a cap too large for it, the general instantiation)
@pytest.mark.parametrize("name", ["plain_tails", "causal_sq_lt_sk_gqa", "causal_sq_gt_sk", "window_softcap",
                                  "d128_causal", "d128_gqa_plain", "d128_softcap_causal_gqa", "softcap_beyond_inline"])
def test_flash_sm90ws_backward_accumulated_dq(flash_emulator, tmp_path, name):
    _check_sm90ws_backward(flash_emulator, tmp_path, name, deterministic=False)


@pytest.mark.parametrize("deterministic", ["0", "1"])
def test_flash_sm90ws_backward_varlen_dq_paths(flash_emulator, tmp_path, monkeypatch, deterministic):
    monkeypatch.setenv("EMU_DETERMINISTIC", deterministic)  # _run passes the environment on
    test_flash_backward_kernels_varlen(flash_emulator, tmp_path, "sm90ws")


@pytest.mark.parametrize("name", [n for n in FLASH_BACKWARD_CASES if FLASH_CASES[n]["shape"][5] % 64 == 0])
def test_flash_sm90ws_backward_deterministic(flash_emulator, tmp_path, name):
    _check_sm90ws_backward(flash_emulator, tmp_path, name, deterministic=True)


# ... and the accumulated dQ is only evidence if a broken one fails: an accumulator that is never
# zeroed (NaN in the emulator until zero_dq_accumulator_kernel runs), dQ formed from the V tile
# instead of K's, or from the other dS^T tile (the previous visit's), a packed batch whose tail
# K rows (the next sequence's, NaN in _varlen_inputs) are not cleared, and the reductions' two
# columns swapped.
PLANTED_ACCUMULATED_DQ_BUGS = {
    "accumulator_not_zeroed": (
        "i += 128) base[i] = 0.0f;", "i += 128) base[i] += 0.0f;", "plain_tails"),
    "dq_from_v_tile": (
        "smem, at.k_bytes + part * at.k_stride + (col / 64) * Cfg::kBoxBytes,",
        "smem, Cfg::kBytesD + at.k_bytes + part * at.k_stride + (col / 64) * Cfg::kBoxBytes,", "d128_causal"),
    # (D = 64: each key half's own dS^T and keys)
    "dq_from_previous_visits_ds": (
        "DqOperands{ds_bytes, 0, kv_bytes, 0, 0}",
        "DqOperands{Cfg::kDsOffset + (2 * half + int((i + 1) & 1)) * Cfg::kDsBytes, 0, kv_bytes, 0, 0}",
        "causal_sq_lt_sk_gqa"),
    "tail_k_rows_kept": (
        "for (int half = 0; half < kHalves; ++half)\n        clear_tile_rows(",
        "for (int half = 0; half < 0; ++half)\n        clear_tile_rows(", "varlen"),
    # K's rows past the sequence in the second 64-key half of the tail CTA (keys 192-199 of sequence 1)
    "tail_k_rows_of_the_second_half_kept": (
        "for (int half = 0; half < kHalves; ++half)\n        clear_tile_rows(",
        "for (int half = 0; half < 1; ++half)\n        clear_tile_rows(", "varlen"),
    "reduction_columns_swapped": ("acc(4 * j), acc(4 * j + 1));", "acc(4 * j + 1), acc(4 * j));", "plain_tails"),
}


@pytest.mark.parametrize("bug", list(PLANTED_ACCUMULATED_DQ_BUGS))
def test_flash_emulator_catches_planted_accumulated_dq_bug(tmp_path, bug):
    old, new, case = PLANTED_ACCUMULATED_DQ_BUGS[bug]
    exe = _planted_emulator((old, new), "plain_tails" if case == "varlen" else case, "sm90ws", True)
    env = {"EMU_FLASH_GENERATION": "sm90ws", "EMU_DETERMINISTIC": "0"}
    if case == "varlen":  # as test_flash_emulator_catches_planted_varlen_bug: sequence 0's dq
        q, k, v, cu_q, cu_k = _varlen_inputs(seed=33)
        rows_q, rows_k = slice(0, VARLEN_LENGTHS_Q[0]), slice(0, VARLEN_LENGTHS_K[0])
        out = torch.zeros(q.shape[0], 4, 64, dtype=torch.float64)
        lse = torch.full((4, q.shape[0]), -math.inf, dtype=torch.float64)
        o64, l64 = _oracle(_dense(q, rows_q), _dense(k, rows_k), _dense(v, rows_k), {"causal": True})
        out[rows_q], lse[:, rows_q] = o64[0].transpose(0, 1), l64[0]
        dout = rand(out.shape, torch.bfloat16, seed=19)
        dq, _, _ = _run_planted(exe, tmp_path, q, k, v, {"causal": True}, cu_q, cu_k, backward=(dout, out, lse),
                                env=env)
        assert not torch.isfinite(dq[rows_q].float()).all(), f"{bug} went unnoticed"
        return
    q, k, v, opts = _flash_inputs(case, seed=23)
    out, lse = _oracle(q, k, v, opts)
    dout = rand(out.shape, torch.bfloat16, seed=9)
    result = _run_planted(exe, tmp_path, q, k, v, dict(opts), backward=(dout, out, lse), env=env)
    if result is not None:
        g64 = _grads(q, k, v, opts, dout, torch.float64)
        assert not torch.allclose(result[0].double(), g64[0], atol=0.05), f"{bug} went unnoticed"
