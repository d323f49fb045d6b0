"""The gated delta CUDA kernels' own source, run on the CPU by a host emulator
(tests/emulation/gated_delta_emu.cpp: std::threads for CUDA threads, barriers for
__syncthreads and warp shuffles, and for the chunked forward the stand-ins of emu_sm80_atoms.hpp:
mma.sync and ldmatrix (.trans) with the PTX ISA's fragment layouts, cp.async that lands a copy
only when its group is waited for, and the shared-memory ordering check over the copies and the
ldmatrix reads), against the float64 reference and torch autograd through it. It checks the
kernels' indexing, 16-byte and scalar staging into the swizzled tiles, the ldmatrix fragment
mapping, barriers, padding, varlen handling, triangular solve and reductions without a GPU, and
that planted staging and swizzle bugs are caught; timing is left to the GPU run. Skipped when
g++ (C++20), the CUDA toolkit's headers or CUTLASS's headers are missing."""

import os
import re
import subprocess

import numpy as np
import pytest
import torch

import rudnn
from test_gated_delta import make_inputs, oracle_grads
from reference import gated_delta as ref
from util import ROOT, emu_array_bits, emu_array_from_file, assert_close_to_oracle, build_emulator

SRC = os.path.join(ROOT, "cpp", "src", "gated_delta")


def _namespace_block(src, name):
    """The anonymous namespace of a .cu file (its kernels), renamed `name`."""
    start = src.index("namespace {\n")
    end = src.index("}  // namespace\n", start)
    return f"namespace {name} {{\n" + src[start + len("namespace {\n"):end] + "}\n"


# The chunked kernels' hardware atoms (mma.sync, ldmatrix, cp.async; wgmma in the state kernel's
# sm_90a path) and their host stand-ins (emu_sm80_atoms.hpp, emu_sm90_atoms.hpp: the PTX ISA's
# fragment layouts and matrix descriptors, so a swizzle, fragment mapping or descriptor that
# disagrees with the hardware's gives wrong numbers here).
# The mma.sync and ldmatrix atoms live in chunk_mma.cuh, which gated_delta_emu.cpp includes with
# macros naming the stand-ins.
CHUNK_EDITS = [("extern __shared__ __align__(128) unsigned char smem_raw[];", "unsigned char* smem_raw = emu_smem;"),
               ("extern __shared__ __align__(1024) unsigned char state_smem_raw[];",
                "unsigned char* state_smem_raw = emu_smem;"),
               ("SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<", "EmuCpAsyncZfill<"),
               ("cp_async_fence()", "emu_cp_async_fence()"), ("cp_async_wait<", "emu_cp_async_wait<"),
               # the state kernel's wgmma path (compiled for sm_90a only) and its atoms (emu_sm90_atoms.hpp)
               ("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900", "#if 1"),
               ("SM90::GMMA::MMA_64x32x16_F32F16F16_SS", "EmuGmmaSS32F16"),
               ("SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS", "EmuGmmaSS32BF16"),
               ("warpgroup_arrive()", "emu_warpgroup_arrive()"),
               ("warpgroup_commit_batch()", "emu_warpgroup_commit_batch()"),
               ("warpgroup_wait<", "emu_warpgroup_wait<"),
               ("cutlass::arch::fence_view_async_shared()", "emu_fence_view_async_shared()")]


# The chunked backward's dynamic shared memory is the emulator's block buffer, its cp.async the
# stand-in, its L2 prefetches plain byte reads, and every read of a staged tile of its state passes (bwd_staged) is recorded for the
# ordering check (a copy issued over a tile that another thread may still read, a tile read before
# its copy has landed or without a barrier after it).
CB_EDITS = [("extern __shared__ __align__(16) unsigned char bwd_smem_raw[];", "unsigned char* bwd_smem_raw = emu_smem;"),
            ("SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<", "EmuCpAsyncZfill<"), ("cp_async_fence()", "emu_cp_async_fence()"),
            ("cp_async_wait<", "emu_cp_async_wait<"),
            # the local kernel's L2 prefetches: the byte is read (an address far off faults)
            ('asm volatile("prefetch.global.L2 [%0];" ::"l"(at));', "(void)*static_cast<const volatile char*>(at);"),
            ("__device__ __forceinline__ E bwd_staged(const E* at) { return *at; }",
             "E bwd_staged(const E* at) {\n  emu_note_read(std::size_t(reinterpret_cast<const unsigned char*>(at) - emu_smem),"
             " emu_clock);\n  return *at;\n}")]


def _kernels_source(extra_edits=(), cb_edits=(), backward=True):
    read = lambda f: open(os.path.join(SRC, f)).read()
    fwd = _namespace_block(read("recurrent_forward.cu"), "emu_rf")
    bwd_src = read("recurrent_backward.cu")
    bwd = _namespace_block(bwd_src, "emu_rb")
    layout = re.search(r"BackwardLayout backward_layout\(const Problem& p\) \{.*?\n\}\n", bwd_src, re.S).group(0)
    bwd = bwd[:-2] + layout + "}\n"
    chunk_src = read("chunked_forward.cu")
    chunk = _namespace_block(chunk_src, "emu_ch")
    layout = re.search(r"ChunkLayout chunked_forward_layout\(const Problem& p\) \{.*?\n\}\n", chunk_src, re.S).group(0)
    chunk = chunk[:-2] + layout + "}\n"
    header = read("chunk_mma.cuh")  # the emulator includes it as chunk_mma.inc (edits apply there too)
    for old, new in list(extra_edits) + CHUNK_EDITS:  # planted bugs use the original text
        if old not in chunk and old in header:
            header = header.replace(old, new)
            continue
        assert old in chunk, f"emulation edit no longer applies: {old}"
        chunk = chunk.replace(old, new)
    if not backward:  # an emulator of the forwards and the recurrent backward: half the compile
        return "namespace rudnn::gated_delta::cuda {\n" + fwd + bwd + chunk + "}\n", header
    cb_src = read("chunked_backward.cu")
    cb = _namespace_block(cb_src, "emu_cb")
    layout = re.search(r"ChunkedBackwardLayout chunked_backward_layout\(const Problem& p\) \{.*?\n\}\n", cb_src,
                       re.S).group(0)
    cb = cb[:-2] + layout + "}\n"
    for old, new in list(cb_edits) + CB_EDITS:
        assert old in cb, f"emulation edit no longer applies: {old}"
        cb = cb.replace(old, new)
    return "namespace rudnn::gated_delta::cuda {\n" + fwd + bwd + chunk + cb + "}\n", header


def _build(extra_edits=(), cb_edits=(), backward=True):
    """backward=False: without the chunked backward's kernels (its runs exit with 2), for the planted
    bugs of the forwards."""
    kernels, header = _kernels_source(extra_edits, cb_edits, backward)
    return build_emulator("gated_delta_emu.cpp", kernels, needs_cutlass=True, extra_includes={"chunk_mma.inc": header},
                          defines=() if backward else ("EMU_NO_CHUNKED_BACKWARD=1",))


@pytest.fixture(scope="module")
def emulator():
    return _build()


def _run(exe, tmp_path, kernel, q, k, v, beta, g, state, scale, cu=None, dout=None, dfinal=None, bthk=False,
         chunk_size=64):
    """bthk: the forward's q k v beta g and out in memory as [B, T, H, ...] (the kernels read them
    through those strides); every tensor is given and returned as [B, H, T, ...]."""
    B, Hk, T, K = q.shape
    Hv, V = v.shape[1], v.shape[3]
    N = B if cu is None else len(cu) - 1
    bf16 = q.dtype == torch.bfloat16
    meta = [B, T, Hk, Hv, K, V, N, int(state is not None), int(cu is not None), int(dfinal is not None), int(bf16)]
    (tmp_path / "meta.txt").write_text(" ".join(map(str, meta)) + f" {scale!r} {int(bthk)} {chunk_size}\n")
    stored = (lambda t: t.transpose(1, 2)) if bthk else (lambda t: t)
    for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta), ("dout", dout)):
        if t is not None:
            emu_array_bits(stored(t)).tofile(tmp_path / f"{name}.bin")
    for name, t in (("g", stored(g)), ("init", state), ("dfinal", dfinal)):
        if t is not None:
            t.contiguous().float().numpy().tofile(tmp_path / f"{name}.bin")
    if cu is not None:
        np.asarray(cu, np.int32).tofile(tmp_path / "cu.bin")
    result = subprocess.run([str(exe), kernel, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    f = lambda name, shape, dtype: emu_array_from_file(tmp_path / f"{name}.bin", shape, dtype)
    if not kernel.endswith("_backward"):
        out = f("out", (B, T, Hv, V), q.dtype).transpose(1, 2) if bthk else f("out", (B, Hv, T, V), q.dtype)
        return out, f("final", (N, Hv, K, V), torch.float32)
    grads = [f("dq", q.shape, q.dtype), f("dk", k.shape, q.dtype), f("dv", v.shape, q.dtype),
             f("dbeta", beta.shape, q.dtype), f("dg", g.shape, torch.float32), f("dinit", (N, Hv, K, V), torch.float32)]
    return grads


# (B, Hk, Hv, T, K, V): K and V not multiples of the tiles, grouped heads, several chunks.
CASES = [(1, 1, 1, 1, 8, 8), (2, 1, 2, 37, 40, 48), (1, 2, 4, 70, 32, 16)]
LENGTHS = [5, 0, 1, 70, 17]


# chunked_forward_wgmma: the state kernel's sm_90a path (wgmma from shared-memory descriptors).
@pytest.mark.parametrize("kernel, dtype", [("recurrent_forward", torch.float32),
                                           ("recurrent_forward", torch.bfloat16),
                                           ("chunked_forward", torch.bfloat16),
                                           ("chunked_forward_wgmma", torch.bfloat16)])
@pytest.mark.parametrize("varlen", [False, True])
def test_forward_kernels(emulator, tmp_path, kernel, dtype, varlen):
    tensor_cores = kernel.startswith("chunked_forward")
    for n, case in enumerate(CASES[1:] if varlen else CASES):
        cu = None
        if varlen:
            cu = [0] + np.cumsum(LENGTHS).tolist()
            case = (1, case[1], case[2], cu[-1], case[4], case[5])
        q, k, v, beta, g, state = make_inputs(*case, dtype, seed=101 + n, decay=[8.0, 0.0, -6.0][n % 3],
                                              cu_seqlens=cu)
        out, final = _run(emulator, tmp_path, kernel, q, k, v, beta, g, state, 0.3, cu)
        o64, s64 = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, cu, torch.float64)
        peer_dtype = dtype if tensor_cores else torch.float32
        o_peer, s_peer = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, cu, peer_dtype)
        assert_close_to_oracle(out, o_peer.to(dtype), o64, f"{kernel} out {case}")
        assert_close_to_oracle(final, s_peer.float(), s64, f"{kernel} final_state {case}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("varlen", [False, True])
def test_recurrent_backward_kernel(emulator, tmp_path, dtype, varlen):
    case, cu = (2, 1, 2, 37, 40, 48), None
    if varlen:
        cu = [0] + np.cumsum(LENGTHS).tolist()
        case = (1, 2, 4, cu[-1], 32, 16)
    q, k, v, beta, g, state = make_inputs(*case, dtype, seed=7, cu_seqlens=cu)
    gen = torch.Generator().manual_seed(8)
    dout = torch.randn(v.shape, generator=gen).to(dtype)
    dfinal = torch.randn(state.shape, generator=gen)
    ours = _run(emulator, tmp_path, "recurrent_backward", q, k, v, beta, g, state, 0.3, cu, dout, dfinal)
    g64 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.3, cu, torch.float64)
    g32 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.3, cu, torch.float32)
    for name, mine, o64, o32, x in zip(["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"], ours, g64, g32,
                                       (q, k, v, beta, g, state)):
        assert_close_to_oracle(mine, o32.to(x.dtype), o64, name)


@pytest.mark.parametrize("kernel", ["recurrent_forward", "chunked_forward", "chunked_forward_wgmma"])
def test_forward_kernels_with_minus_inf_log_decays(emulator, tmp_path, kernel):
    """log_decay = -inf resets the state in both CUDA forwards (the chunked one raises it to its
    floor, problem.hpp: chunked_log_decay), within the kernels' usual budget of the recurrence."""
    case = (1, 2, 2, 75, 16, 8)
    q, k, v, beta, g, state = make_inputs(*case, torch.bfloat16, seed=9)
    g = g.clone()
    g[:, 0, [0, 5, 6, 63, 64, 74]] = float("-inf")
    g[:, 1, 30] = -1e30
    out, final = _run(emulator, tmp_path, kernel, q, k, v, beta, g, state, 0.3)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    o64, s64 = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, None, torch.float64)
    peer = torch.bfloat16 if kernel.startswith("chunked_forward") else torch.float32
    o_peer, s_peer = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, None, peer)
    assert_close_to_oracle(out, o_peer.to(torch.bfloat16), o64, f"{kernel} out")
    assert_close_to_oracle(final, s_peer.float(), s64, f"{kernel} final_state")


def _staging(tmp_path):
    """(qk, v, ws) of the last chunked run: whether those tiles took 16-byte cp.async."""
    return tuple(bool(int(x)) for x in (tmp_path / "staging.txt").read_text().split())


# (B, Hk, Hv, T, K, V, cu_seqlens, layout): sequence ends inside a chunk, odd K and V (the element
# path), 16-byte rows narrower than the tile (zero-filled pieces beyond K and V), more value tiles
# than the prep kernel's four slots (two rounds), varlen through both paths, [B, T, H, X]
# tensors (16-byte rows H * X elements apart; with odd K their rows are not 16-byte aligned), and
# K = 128 (the state kernel's second 64-key block of K, Q and -W: the wgmma schedule's second K^T
# atom and its k steps 4-7 over -W and Q read data, not zero padding).
STAGING_CASES = [(1, 1, 2, 133, 13, 12, None, "bhtk"), (2, 2, 2, 100, 24, 20, None, "bhtk"),
                 (1, 1, 1, 70, 16, 136, None, "bhtk"), (1, 1, 2, 92, 13, 40, [0, 5, 0, 70, 17], "bhtk"),
                 (1, 2, 2, 92, 40, 24, [0, 5, 0, 70, 17], "bhtk"), (2, 2, 4, 100, 24, 40, None, "bthk"),
                 (1, 2, 4, 92, 13, 16, [0, 5, 0, 70, 17], "bthk"),
                 (1, 2, 4, 150, 128, 40, None, "bthk")]  # K = 128: both 64-key blocks of K, Q, -W hold data


@pytest.mark.parametrize("kernel", ["chunked_forward", "chunked_forward_wgmma"])
@pytest.mark.parametrize("case", STAGING_CASES,
                         ids=lambda c: "x".join(map(str, c[:6])) + ("_varlen" if c[6] else "") + "_" + c[7])
def test_chunked_forward_staging(emulator, tmp_path, case, kernel):
    *shape, cu, layout = case
    q, k, v, beta, g, state = make_inputs(*shape, torch.bfloat16, seed=31, decay=2.0, cu_seqlens=cu)
    out, final = _run(emulator, tmp_path, kernel, q, k, v, beta, g, state, 0.3, cu, bthk=layout == "bthk")
    K, V = shape[4], shape[5]
    assert _staging(tmp_path) == (K % 8 == 0, V % 8 == 0, True)
    o64, s64 = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, cu, torch.float64)
    o_peer, s_peer = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, cu, torch.bfloat16)
    assert_close_to_oracle(out, o_peer.to(torch.bfloat16), o64, f"chunked out {case}")
    assert_close_to_oracle(final, s_peer.float(), s64, f"chunked final_state {case}")


# The emulator is only evidence if a broken staging fails in it: the state kernel reading Q and
# P without waiting for their copies, refilling Q and P for the next chunk before every warp is
# done with this chunk's, the prep kernel computing P before Q has landed, and a tile read
# through another layout than the one it was staged with.
PLANTED_STAGING_BUGS = {
    "state_q_read_before_its_copy_lands": ("    cp_async_wait<1>();  // Q and P have landed\n", ""),
    "state_q_refilled_before_every_warp_read_it": (
        "    __syncthreads();     // every warp is done with Q, P, G and U\n"
        "    issue_g_u(c0 + kC, slot + 1);\n    issue_q_p(c0 + kC, slot + 1);\n",
        "    issue_g_u(c0 + kC, slot + 1);\n    issue_q_p(c0 + kC, slot + 1);\n    __syncthreads();\n"),
    "prep_q_read_before_its_copy_lands": ("    cp_async_wait<0>();  // Q has landed\n", ""),
    # tiles staged with one layout and read by ldmatrix with another: K in the prep kernel staged
    # unswizzled; -W in the state kernel staged unswizzled; the transposed views (the .trans
    # operands: V, S0, U, U_d) of 64-byte rows read with the 128-byte rows' swizzle
    "prep_k_staged_unswizzled": ("stage_tile<KTile>(sm.k, static_cast<const E*>(p.k)",
                                 "stage_tile<PlainRows<kC, kKt>>(sm.k, static_cast<const E*>(p.k)"),
    "state_w_staged_unswizzled": ("stage_tile<WTile>(sm.w,", "stage_tile<PlainRows<kC, kKt>>(sm.w,"),
    "transposed_views_read_with_another_swizzle": (
        "composition(Swz{}, cute::Layout<Shape<Int<kCols>, Int<kRows>>, Stride<_1, Int<kCols>>>{})",
        "composition(Swizzle<3, 3, kShift>{}, cute::Layout<Shape<Int<kCols>, Int<kRows>>, Stride<_1, Int<kCols>>>{})"),
}


# ... and in the state kernel's wgmma schedule: K^T's descriptor over the key blocks in the wrong
# order (the MN-major view tiled along the keys first), the products of O and S not waited for
# before their results are read, S0's copy read by wgmma before every warp has stored its part,
# the next chunk but one's K, Q and P copied over this chunk's stage before every warp is past
# its products, -W read as if staged in 256-byte rows (SmemTile<C, 128>, which wgmma cannot
# describe).
PLANTED_WGMMA_BUGS = {
    "keys_descriptor_in_the_wrong_block_order": (
        "Shape<Int<kKt>, Int<kC>>{},\n                                       Step<_2, _1>{}));",
        "Shape<Int<kKt>, Int<kC>>{}));"),
    "products_not_waited_for": ("    warpgroup_commit_batch();\n    warpgroup_wait<0>();\n    warpgroup_fence_operand(acc_s);",
                                "    warpgroup_commit_batch();\n    warpgroup_fence_operand(acc_s);"),
    "state_copy_read_before_every_warp_stored_it": (
        "    cp_async_wait<1>();\n    cutlass::arch::fence_view_async_shared();\n    __syncthreads();\n",
        "    cp_async_wait<1>();\n"),
    "stage_refilled_before_every_warp_is_past_its_products": (
        "    __syncthreads();  // every warp is done with this stage's K, Q, P, with U, U_d and S0's copy\n"
        "    x.copy_q_p(c0 + 2 * kC, slot + 2, stage);\n    x.copy_k(c0 + 2 * kC, stage);\n",
        "    x.copy_q_p(c0 + 2 * kC, slot + 2, stage);\n    x.copy_k(c0 + 2 * kC, stage);\n    __syncthreads();\n"),
    "w_staged_in_256_byte_rows": ("stage_tile<WTile>(sm.w,", "stage_tile<KTile>(sm.w,"),
}
PLANTED_FORWARD_BUGS = {**{name: ("chunked_forward", bug) for name, bug in PLANTED_STAGING_BUGS.items()},
                        **{name: ("chunked_forward_wgmma", bug) for name, bug in PLANTED_WGMMA_BUGS.items()}}


@pytest.mark.parametrize("bug", sorted(PLANTED_FORWARD_BUGS))
def test_emulator_catches_planted_staging_bug(tmp_path, bug):
    kernel, edit = PLANTED_FORWARD_BUGS[bug]
    exe = _build([edit], backward=False)
    q, k, v, beta, g, state = make_inputs(1, 1, 2, 133, 40, 48, torch.bfloat16, seed=5)
    try:
        out, final = _run(exe, tmp_path, kernel, q, k, v, beta, g, state, 0.3)
    except AssertionError as error:  # the run exits with 3 on an ordering hazard
        assert "shared-memory ordering hazard" in str(error), error
        return
    o64, s64 = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, None, torch.float64)
    o_peer, s_peer = ref.gated_delta_rule(q, k, v, beta, g, 0.3, state, None, torch.bfloat16)
    with pytest.raises(AssertionError):
        assert_close_to_oracle(out, o_peer.to(torch.bfloat16), o64, "out")
        assert_close_to_oracle(final, s_peer.float(), s64, "final_state")


# The chunked backward (chunked_backward.cu) against the same oracle as the recurrent one: torch
# autograd through the float64 recurrence, with twice the float32 recurrence's error as budget.
# (B, Hk, Hv, T, K, V, chunk_size, cu_seqlens, layout): one chunk, several with a partial last one,
# grouped heads, V over two 32-column slices, K and V not multiples of anything, varlen with empty
# and one-token sequences, the [B, T, H, X] layout, K = 128 with C = 64 (the largest shared memory)
# C = 40 (T's blocked inverse with a partial block).
CB_CASES = [(1, 1, 1, 16, 8, 8, 16, None, "bhtk"), (2, 1, 2, 37, 12, 40, 16, None, "bhtk"),
            (1, 2, 4, 70, 16, 12, 8, None, "bhtk"), (1, 1, 2, 93, 16, 8, 64, None, "bhtk"),
            (1, 2, 4, 57, 8, 8, 8, [0, 5, 5, 6, 40, 57], "bhtk"), (2, 1, 3, 29, 8, 36, 8, None, "bthk"),
            (1, 1, 2, 70, 128, 40, 64, None, "bhtk"),  # the largest tiles: K = 128, C = 64
            (1, 1, 2, 90, 16, 8, 40, None, "bhtk")]  # the blocked inverse's three blocks, the last partial


def _check_chunked_backward(exe, tmp_path, case, dtype, seed=7, decay=0.0, extreme=False, initial=True):
    B, Hk, Hv, T, K, V, C, cu, layout = case
    q, k, v, beta, g, state = make_inputs(B, Hk, Hv, T, K, V, dtype, seed=seed, decay=decay, cu_seqlens=cu,
                                          initial=initial)
    if extreme:
        g = g.clone()
        g[..., 1] = -30.0
        g[..., 5] = float("-inf")
        g[..., -1] = -200.0
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(v.shape, generator=gen).to(dtype)
    N = B if cu is None else len(cu) - 1
    dfinal = torch.randn((N, Hv, K, V), generator=gen)
    ours = _run(exe, tmp_path, "chunked_backward", q, k, v, beta, g, state, 0.3, cu, dout, dfinal,
                bthk=layout == "bthk", chunk_size=C)
    g64 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.3, cu, torch.float64)
    g32 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.3, cu, torch.float32)
    cpu = rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, dfinal, scale=0.3, chunk_size=C,
                                                cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.int32))
    for name, mine, o64, o32, peer, x in zip(["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"], ours, g64,
                                             g32, cpu, (q, k, v, beta, g, state)):
        if x is None:
            continue
        assert_close_to_oracle(mine, o32.to(x.dtype), o64, f"{name} {case}")
        assert_close_to_oracle(mine, peer, o64, f"{name} {case} (CPU backend as the peer)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CB_CASES, ids=lambda c: "x".join(map(str, c[:7])) + ("_varlen" if c[7] else "")
                         + "_" + c[8])
def test_chunked_backward_kernels(emulator, tmp_path, case, dtype):
    _check_chunked_backward(emulator, tmp_path, case, dtype)


def test_chunked_backward_kernels_minus_inf_log_decays_without_initial_state(emulator, tmp_path):
    _check_chunked_backward(emulator, tmp_path, (1, 1, 2, 40, 8, 8, 16, None, "bhtk"), torch.float32, seed=11,
                            extreme=True, initial=False)


# The state passes' staging plan (bwd_launch_plan) as the emulator's launch took it, and the
# results under it: on H100/H200 (the default: 232448 bytes a block may opt in to, 132 SMs) both
# passes hold two stages of 16-bit tiles, float32 only the forward's; on an A100 (166912) the 16-bit
# reverse pass and every float32 pass run one stage; on one SM the 16-bit forward pass's four CTAs
# run one stage (two CTAs per SM instead of one, the grid more than a wave); K = 12 16-bit rows (24
# bytes) and V = 12 16-bit dO rows cannot move as 16-byte pieces, so the passes that stage them keep
# one stage; the float32 workspace tiles always can at these K, V, C.
# (case, dtype, {EMU_...: value}, (forward stages, reverse stages, k q dout g w u p by cp.async))
STAGING_PLANS = [((1, 1, 2, 70, 128, 40, 64, None, "bhtk"), torch.bfloat16, {}, (2, 2, 1, 1, 1, 1, 1, 1, 1)),
                 ((1, 1, 2, 70, 128, 40, 64, None, "bhtk"), torch.bfloat16, {"MAX_SMEM": 166912},
                  (2, 1, 1, 1, 1, 1, 1, 1, 1)),
                 ((1, 1, 2, 70, 128, 40, 64, None, "bhtk"), torch.bfloat16, {"SM_COUNT": 1},
                  (1, 2, 1, 1, 1, 1, 1, 1, 1)),
                 ((1, 1, 2, 70, 128, 40, 64, None, "bhtk"), torch.float32, {"MAX_SMEM": 166912},
                  (1, 1, 1, 1, 1, 1, 1, 1, 1)),
                 ((2, 1, 2, 37, 12, 40, 16, None, "bhtk"), torch.bfloat16, {}, (1, 1, 0, 0, 1, 1, 1, 1, 1)),
                 ((1, 2, 4, 70, 16, 12, 8, None, "bhtk"), torch.bfloat16, {}, (2, 1, 1, 1, 0, 1, 1, 1, 1))]


@pytest.mark.parametrize("case, dtype, device, plan", [
    pytest.param(*plan, id="x".join(map(str, plan[0][:7])) + f"-{str(plan[1])[6:]}" +
                 "".join(f"-{k}{v}" for k, v in plan[2].items())) for plan in STAGING_PLANS])
def test_chunked_backward_state_pass_staging(emulator, tmp_path, monkeypatch, case, dtype, device, plan):
    for name, value in device.items():
        monkeypatch.setenv("EMU_" + name, str(value))
    _check_chunked_backward(emulator, tmp_path, case, dtype)
    forward_stages, reverse_stages, *copies = map(int, (tmp_path / "staging.txt").read_text().split())
    assert (forward_stages, reverse_stages, *copies) == plan


# The state passes' staging order, broken: the forward pass issuing chunk c + 1's copies before
# the barrier that ends chunk c - 1's reads of that stage, and the reverse pass reading a chunk's
# tiles without waiting for their copies. The ordering check must report each (exit 3), on a case
# with two stages and five chunks (a stage is refilled only from the third chunk on).
PLANTED_STATE_STAGING_BUGS = {
    "forward_refills_before_the_barrier": (
        "    __syncthreads();  // ss is complete; chunk ch - 1's stage (chunk ch + 1's with two) and wv are no longer read\n"
        "    bwd_issue_ring(st, ch, 0, ch + 1 < chunks ? ch + 1 : -1, issue);\n",
        "    bwd_issue_ring(st, ch, 0, ch + 1 < chunks ? ch + 1 : -1, issue);\n    __syncthreads();\n"),
    "reverse_reads_before_the_wait": (
        "    cp_async_wait<1>();  // chunk ch's tiles have landed (chunk ch - 1's may be in flight)\n", ""),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_STATE_STAGING_BUGS))
def test_emulator_catches_planted_state_pass_staging_bug(tmp_path, bug):
    exe = _build(cb_edits=[PLANTED_STATE_STAGING_BUGS[bug]])
    with pytest.raises(AssertionError, match="shared-memory ordering hazard"):
        _check_chunked_backward(exe, tmp_path, (1, 1, 2, 70, 32, 40, 16, None, "bhtk"), torch.bfloat16)


# Planted bugs in the chunked backward that the cases above must catch: the reverse pass
# forgetting the W^T dU term, the local kernel dropping the dS_C part of dk, dlog_decay missing
# e^(G_last) <dS_C, S0> or the E_ij pairs across t, and the local kernel skipping the second value
# head of a group.
PLANTED_CB_BUGS = {
    "reverse_without_w_du": ("bwd_staged(tl.w + i * ldw + x) * dus[i * kSliceLd + f];", "0.0f;"),
    "dk_without_ds_c": ("dka[e] += wv[i] * u - bs[i] * gam[i] * c;", "dka[e] += - bs[i] * gam[i] * c;"),
    "dg_without_state_term": ("const float state_term = expf(float(gs[C - 1])) * red[4];",
                              "const float state_term = 0.0f;"),
    "dg_without_cross_pairs": ("xg[t] = cross;", "xg[t] = 0.0f;"),
    "group_stops_after_first_head": ("for (i64 h = hk * p.group; h < (hk + 1) * p.group; ++h) {",
                                     "for (i64 h = hk * p.group; h < hk * p.group + 1; ++h) {"),
}


# The local kernel on tensor cores (bf16; float32 keeps the FMAs): its 16-bit tiles written
# row-major without the swizzle that ldmatrix reads them through, K K^T's accumulator stored at the
# wrong token pairs (columns shifted by 8: the other n8 atom), a dq/dk accumulator added at the
# wrong key column (adjacent columns swapped), dq's slice product reading dS_C instead of S0,
# dA^T Q computed as dA Q (the transposed operand read without .trans), and D + D^T as 2 D.
PLANTED_CB_MMA_BUGS = {
    "local_tiles_unswizzled": ("*reinterpret_cast<cute::uint128_t*>(&Tile::view(tile)(r, c)) = bits;",
                               "*reinterpret_cast<cute::uint128_t*>(tile + r * Tile::kCols + c) = bits;"),
    "local_kk_accumulator_columns_shifted": ("if (i < j && j < C) tm[i * C + j] = acc(e);",
                                             "if (i < (j ^ 8) && (j ^ 8) < C) tm[i * C + (j ^ 8)] = acc(e);"),
    "local_dqdk_accumulator_columns_swapped": ("if (i < C && x < K) tile[i * K + x] += acc(e);",
                                               "if (i < C && (x ^ 1) < K) tile[i * K + (x ^ 1)] += acc(e);"),
    "local_dq_slice_reads_ds_c": ("RowSliceTile::view(a_do), StateSliceTile::view(b_s0), acc);",
                                  "RowSliceTile::view(a_do), StateSliceTile::view(b_dsc), acc);"),
    "local_da_not_transposed": (
        "chunk_mma::mma_from_smem<chunk_mma::LdsmT, chunk_mma::LdsmT>(mma, PairTile::view_t(p_da), KqTile::view_t(qb), acc);",
        "chunk_mma::mma_from_smem<chunk_mma::LdsmN, chunk_mma::LdsmT>(mma, PairTile::view(p_da), KqTile::view_t(qb), acc);"),
    "local_d_plus_d_transposed_as_2d": ("dd[i * C + j] + dd[j * C + i] : 0.0f;", "2.0f * dd[i * C + j] : 0.0f;"),
    # The TF32 rows K S0, Q S0, K dS_C (bwd_row_terms_tf32).
    "local_rows_s0_lo_dropped": ("chunk_mma::mma_tf32(r.ks[j], ka, s_lo[0], s_lo[1]);", ""),
    "local_rows_ds_c_lo_dropped": ("chunk_mma::mma_tf32(r.kd[j], ka, d_lo[0], d_lo[1]);", ""),
    "local_rows_a_fragment_halves_swapped": ("const int i = row + 8 * (e % 2), x = x0 + t + 4 * (e / 2);",
                                             "const int i = row + 8 * (e / 2), x = x0 + t + 4 * (e % 2);"),
    "local_rows_b_fragment_halves_swapped": ("const int x = x0 + t + 4 * h;", "const int x = x0 + t + 4 * (1 - h);"),
    "local_rows_quad_sum_misses_a_lane": ("for (int step = 1; step <= 2; step *= 2) {",
                                          "for (int step = 1; step <= 1; step *= 2) {"),
}


# The TF32 slice products of the local kernel (bwd_dx_tf32, bwd_pair_block_tf32), on a case with
# C = 64 (at C = 16 their row blocks 1-3 are empty): dO U^T or dX U^T without U's lo part, the
# diagonal atom of each row block skipped, dX = T^T dU starting 8 tokens late or reading K K^T from
# tm's strict upper triangle as T. (Three more were caught when the code landed and were left out
# for CI time: dX's lo part dropped in dX U^T, the dense row stride, the wrong dU column;
# bench/NOTES.md.)
PLANTED_CB_TF32_BUGS = {
    "local_pair_u_lo_dropped": ("chunk_mma::mma_tf32(acc[j], a_hi, b_lo[0], b_lo[1]);", ""),
    "local_pair_diagonal_atom_missed": ("g = lane / 4, t = lane % 4, atoms = 2 * r + 2;",
                                        "g = lane / 4, t = lane % 4, atoms = 2 * r + 1;"),
    "local_dx_starts_late": ("for (int j0 = 16 * r; j0 < C; j0 += 8) {", "for (int j0 = 16 * r + 8; j0 < C; j0 += 8) {"),
    "local_dx_reads_upper_triangle": ("j >= i && j < C && i < C ? tm[j * C + i]", "j < C && i < C ? tm[j * C + i]"),
}


# The state passes and the prep on TF32 (bwd_forward_kernel, bwd_reverse_kernel, bwd_prep_kernel;
# bf16), on the K = 128, C = 64 case (every row block and column slice in use): U' - W S0 without
# S0's lo part, W^T dU without W's lo part, the second 16-row block of the key rows at the wrong
# offset, W without T's lo part. (Nine more were caught when the code landed and were left out for
# CI time: (w U)'s and P's lo parts, the dense stride for dS_C, Q K^T as K K^T, U' without T's lo
# part, W stopping short, W's slices stored at the first; bench/NOTES.md; and, dropped when the two
# staging bugs above came in, P^T dO starting 8 tokens late and K^T's second 32-key slice in prep
# read as the first.)
PLANTED_CB_STATE_BUGS = {
    "forward_s0_lo_dropped": ("bwd_slice_mma_tf32<1, true, true>(", "bwd_slice_mma_tf32<1, true, false>("),
    "reverse_w_lo_dropped": ("bwd_slice_mma_tf32<2, true, true>(", "bwd_slice_mma_tf32<2, false, true>("),
    "state_second_key_block_off": ("const int row0[2] = {16 * warp, 16 * warp + 64};",
                                   "const int row0[2] = {16 * warp, 16 * warp + 48};"),
    "prep_w_t_lo_dropped": ("bwd_slice_mma_tf32<1, true, false>(\n          acc, row0, C, 0, kdim, [&](int i, int j) { return i < C && j < C ? tm[i * ldc + j] * bg[j]",
                            "bwd_slice_mma_tf32<1, false, false>(\n          acc, row0, C, 0, kdim, [&](int i, int j) { return i < C && j < C ? tm[i * ldc + j] * bg[j]"),
}


# Each set of planted chunked-backward bugs with the case and dtype that run the code it breaks.
PLANTED_CB_RUNS = [(PLANTED_CB_BUGS, (1, 2, 4, 70, 16, 12, 8, None, "bhtk"), torch.float32),
                   (PLANTED_CB_MMA_BUGS, (1, 2, 4, 70, 16, 12, 16, None, "bhtk"), torch.bfloat16),
                   (PLANTED_CB_TF32_BUGS, (1, 1, 2, 93, 16, 8, 64, None, "bhtk"), torch.bfloat16),
                   (PLANTED_CB_STATE_BUGS, (1, 1, 2, 70, 128, 40, 64, None, "bhtk"), torch.bfloat16)]


@pytest.mark.parametrize("bug, case, dtype", [pytest.param(name, case, dtype, id=name)
                                              for bugs, case, dtype in PLANTED_CB_RUNS for name in sorted(bugs)])
def test_emulator_catches_planted_chunked_backward_bug(tmp_path, bug, case, dtype):
    edits = next(bugs for bugs, _, _ in PLANTED_CB_RUNS if bug in bugs)
    exe = _build(cb_edits=[edits[bug]])
    with pytest.raises(AssertionError):
        _check_chunked_backward(exe, tmp_path, case, dtype)
