"""Compile-time checks of the sm90a flash attention kernels (no GPU needed): ptxas's report for
sm_90a must not say that it serialized a kernel's wgmma (C7514, "wgmma.mma_async instructions are
serialized": then every wgmma waits for the previous one and nothing overlaps the tensor cores;
the warp-specialized forward had this until its next-block GEMM stopped being issued under a
branch) or had to inject a warpgroup.arrive (C7519: registers of a wgmma written after the
kernel's own fence); and at D = 128 the plain instantiations (kPlain: no mask, bias or softcap;
causal and window by position; what most calls run) must not spill registers (the 128-key blocks of the warp-specialized
forward hold 64 score floats per thread beside O's 64 and P's 32: a spill there would be paid in
every key block). Compiles one translation unit per kernel family at D = 128 (and the two-warpgroup
backward at D = 256, which may spill) the way the library's build does. Skipped without nvcc or
CUTLASS's headers.

The same objects' SASS (cuobjdump) must show the products on Hopper's tensor-core instructions:
every sm90a kernel issues HGMMA and no HMMA (mma.sync), and the forwards' P·V and the dk/dv
kernels' Pᵀ·dO and dSᵀ·Q take their A operand from registers (HGMMA R, R, gdesc) as designed."""

import os
import re
import shutil
import subprocess

import pytest

from util import ROOT, build_lock, ccache_env, cutlass_include, nvidia_tool

FILES = ["flash_fwd_sm90_d128.cu", "flash_fwd_sm90ws_d128.cu", "flash_bwd_sm90_d128.cu", "flash_bwd_sm90_d256.cu",
         "flash_bwd_sm90ws_d128.cu"]


_REPORTS = {}  # file name -> ptxas report: each file is compiled once for all the tests here


def _ptxas_report(name, family="attention", arch="90a"):
    key = (family, name, arch)
    if key in _REPORTS:
        return _REPORTS[key]
    nvcc, cutlass = shutil.which("nvcc"), cutlass_include()
    if not (nvcc and cutlass):
        pytest.skip("needs nvcc and CUTLASS's headers")
    # in the clone's build/ (not a temporary folder): ccache hashes where the object goes when a
    # dependency file is written, and a path relative to the clone is the same in a fresh clone
    os.makedirs(os.path.join(ROOT, "build", "ptxas"), exist_ok=True)
    obj = os.path.join(ROOT, "build", "ptxas", name.replace(".cu", "" if arch == "90a" else f"_sm{arch}") + ".o")
    launcher, depfile, env = ccache_env(obj)  # ptxas's report is the compile's stderr, which ccache keeps too
    cutlass_util = os.path.join(cutlass, "..", "tools", "util", "include")  # cutlass/util/packed_stride.hpp
    cmd = launcher + [nvcc, "-O3", "-DNDEBUG", "-std=c++17", f"--generate-code=arch=compute_{arch},code=[sm_{arch}]",
                      "--expt-relaxed-constexpr", "-DRUDNN_WITH_CUDA=1", f"-I{os.path.join(ROOT, 'cpp', 'include')}",
                      f"-I{os.path.join(ROOT, 'cpp', 'src')}", "-isystem", cutlass, "-isystem", cutlass_util, "-Xptxas",
                      "-v", *depfile, "-c", os.path.join(ROOT, "cpp", "src", family, name), "-o", obj]
    with build_lock(obj):  # another test worker may compile the same file
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
        assert result.returncode == 0, result.stderr[-4000:]
        sass = _sass_of(obj)
    _REPORTS[key] = (result.stdout + result.stderr, sass)
    return _REPORTS[key]


def _sass_of(obj):
    # cuobjdump is installed by requirements-dev.txt: its absence is a broken install, not a skip
    cuobjdump = nvidia_tool("cuobjdump")
    assert cuobjdump, "cuobjdump not found: requirements-dev.txt installs it (nvidia-cuda-cuobjdump)"
    sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, timeout=300)
    assert sass.returncode == 0, sass.stderr[-4000:]
    return sass.stdout


@pytest.mark.parametrize("name", FILES)
def test_sm90_wgmma_pipeline_kept(name):
    report, _ = _ptxas_report(name)
    assert "Compiling entry function" in report, "ptxas printed no report"
    losses = [line for line in report.splitlines()
              if any(code in line for code in ("C7514", "C7519", "Potential Performance Loss", "is injected"))]
    assert not losses, "\n".join(losses)


def _plain_spills(report):
    """{kernel: spill-store bytes} of the plain (kPlain = true) flash kernel instantiations: ptxas
    prints each entry's "Function properties for <mangled name>" line, then its stack and spills.
    kPlain is the first bool after the two head dims (a later one, kSoftcap, may be true too)."""
    spills, lines = {}, report.splitlines()
    for line, stats in zip(lines, lines[1:]):
        name = re.search(r"Function properties for (\S+)", line)
        if name and "kernel" in name.group(1) and re.search(r"ELi\d+ELi\d+ELb1E", name.group(1)):
            spills[name.group(1)] = int(re.search(r"(\d+) bytes spill stores", stats).group(1))
    return spills


@pytest.mark.parametrize("name", [f for f in FILES if "d128" in f])
def test_sm90_plain_kernels_do_not_spill(name):
    spills = _plain_spills(_ptxas_report(name)[0])
    assert spills, "no plain kernel instantiation in the report"
    assert not any(spills.values()), spills


def _tensor_core_instructions(sass):
    """{kernel: (HGMMA with both operands in shared memory, HGMMA with A in registers, HMMA)}
    counted in cuobjdump's listing, where each kernel starts with a "Function : <mangled name>"
    line. The shared-memory form reads "HGMMA.<shape>.<types> Rd, gdesc[..], ..."; the register
    form "HGMMA.<shape>.<types> Rd, Ra, gdesc[..], ..."."""
    counts, kernel = {}, None
    for line in sass.splitlines():
        function = re.search(r"Function : (\S+)", line)
        if function:
            kernel = function.group(1)
            counts[kernel] = [0, 0, 0]
        elif kernel is None:
            continue
        elif re.search(r"\bHGMMA\.\S+ R\d+, gdesc", line):
            counts[kernel][0] += 1
        elif re.search(r"\bHGMMA\.\S+ R\d+, R\d+, gdesc", line):
            counts[kernel][1] += 1
        elif re.search(r"\bHMMA\.", line):
            counts[kernel][2] += 1
    return counts


@pytest.mark.parametrize("name", FILES)
def test_sm90_kernels_run_on_hgmma(name):
    counts = _tensor_core_instructions(_ptxas_report(name)[1])
    # the flash kernels; the files also hold helpers without products (the backward's delta_kernel)
    kernels = {kernel: c for kernel, c in counts.items() if re.search(r"_sm90(ws)?(_split)?_kernel", kernel)}
    assert kernels, "no sm90 flash kernel in the SASS listing"
    for kernel, (shared, registers, hmma) in kernels.items():
        assert shared > 0 and hmma == 0, (kernel, shared, registers, hmma)
        # P·V in the forwards, Pᵀ·dO and dSᵀ·Q in the dk/dv kernels: A is the softmax's registers
        if "forward" in kernel or "dkdv" in kernel:
            assert registers > 0, (kernel, shared, registers, hmma)


# The warp-specialized forward's hot loop (the key-block loop: the narrowest conditional backward
# branch whose body holds HGMMA, since the persistent kernel's item loop holds it and the whole
# item; the last block and the waits' retry paths lie outside it) in its
# plain instantiation and its softcap one (kSoftcap: Gemma-style models cap every call): no CALL
# (bc8dffd's loops called the out-of-line score transform once per score), no local memory (a
# spill there is paid every 128 keys), both products on HGMMA, and at most 32 KB of code, inside the
# instruction cache (bc8dffd's loops were 140-152 KB, which matched its measured time). The
# softcap instantiation's ptxas report shows no spill either. At D = 128, both dtypes.
SM90WS_LOOP_BUDGET_BYTES = 32 * 1024


def _hot_loop(lines):
    """The SASS lines of the narrowest loop closed by a predicated backward branch whose body holds
    an HGMMA (cuobjdump lines: "/*0a40*/ @!P0 BRA 0x6d90 ;")."""
    code = []
    for line in lines:
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    best = None
    for pc, text in code:
        targets = re.findall(r"0x([0-9a-f]+)", text) if text.startswith("@") and " BRA " in text else []
        if targets and int(targets[-1], 16) < pc:
            body = [t for at, t in code if int(targets[-1], 16) <= at <= pc]
            if any("HGMMA" in t for t in body) and (best is None or len(body) < len(best)):
                best = body
    return best or []


def _sm90ws_hot_loops(sass, name):
    """{kernel: (instructions, HGMMA, CALL, local-memory instructions)} of the hot loop of each of
    sm90ws kernel `name`'s plain and softcap instantiations (kPlain, kSoftcap = 1, 0 or 0, 1), both
    dtypes: four kernels."""
    kernels = {k: lines for k, lines in _sass_by_kernel(sass).items()
               if name in k and ("Lb1ELb0E" in k or "Lb0ELb1E" in k)}
    assert len(kernels) == 4, sorted(_sass_by_kernel(sass))  # plain and softcap, bf16 and f16
    counts = {}
    for kernel, lines in kernels.items():
        ops = [t.split()[1] if t.startswith("@") else t.split()[0] for t in _hot_loop(lines)]
        counts[kernel] = (len(ops), sum(op.startswith("HGMMA") for op in ops), sum(op.startswith("CALL") for op in ops),
                          sum(op.startswith(("STL", "LDL")) for op in ops))
    return counts


def test_sm90ws_forward_hot_loops_fit_and_call_nothing():
    report, sass = _ptxas_report("flash_fwd_sm90ws_d128.cu")
    spills = {k: v for k, v in _spills(report).items() if "forward_sm90ws_kernel" in k}
    softcap = {k: v for k, v in spills.items() if "Lb0ELb1E" in k}
    assert len(softcap) == 2 and not any(softcap.values()), spills
    for kernel, (length, hgmma, calls, local) in _sm90ws_hot_loops(sass, "forward_sm90ws_kernel").items():
        assert hgmma > 0 and calls == 0 and local == 0, (kernel, length, hgmma, calls, local)
        assert length * 16 <= SM90WS_LOOP_BUDGET_BYTES, (kernel, length * 16)


# The sm90ws dk/dv kernel's visit loop at D = 128 (key halves: each consumer warpgroup runs every
# product on its own 64 keys and holds dK and dV, 128 floats per thread, beside the 64 x 64 S^T and
# dP^T): in its plain instantiation, both dtypes, the five products of a visit on HGMMA (S^T and
# dP^T 8 k-steps each, dV += P^T dO and dK += dS^T Q 4 each, dQ_part = dS K over both halves' 128
# keys for the warpgroup's 64 columns 8: 32), no local memory (a spill there is paid every query
# block), and inside the instruction-cache budget. The same for the softcap instantiation (the
# transform inline: no call per score either; ptxas reports 8 bytes of spill for it, in the
# producer warp's code under its 24 registers, not in this loop).
def test_sm90ws_backward_visit_loop():
    _, sass = _ptxas_report("flash_bwd_sm90ws_d128.cu")
    for kernel, (length, hgmma, calls, local) in _sm90ws_hot_loops(sass, "dkdv_sm90ws_kernel").items():
        assert hgmma == 32 and calls == 0 and local == 0, (kernel, length, hgmma, calls, local)
        assert length * 16 <= SM90WS_LOOP_BUDGET_BYTES, (kernel, length * 16)


# The sm90ws backward with deterministic=False adds each 64 x D dQ tile into the float32
# accumulator from its dk/dv kernel (at D = 128 each consumer warpgroup of 128 threads its 64
# columns, over the CTA's 128 keys): 64/4 vector reductions per thread and visit
# (red.global.add.v2.f32: two floats, no return value). A regression to scalar reductions (twice
# the instructions), to ATOMG (a round trip per add), to each warpgroup adding all 128 columns
# or to reductions in any other kernel of the file fails here.
def test_sm90ws_backward_accumulates_dq_with_vector_reductions():
    _, sass = _ptxas_report("flash_bwd_sm90ws_d128.cu")
    kernels = _sass_by_kernel(sass)
    dkdv = {k: v for k, v in kernels.items() if "dkdv_sm90ws_kernel" in k}
    assert len(dkdv) == 6, sorted(kernels)  # bf16 and f16; plain, softcap and general scores
    for kernel, lines in kernels.items():
        ops = [m.group(0) for line in lines for m in [re.search(r"\b(RED|ATOM)G?\.[\w.]+", line)] if m]
        if kernel in dkdv:
            vector = [op for op in ops if op.startswith("REDG.E.ADD.F32x2")]
            assert len(vector) == 64 // 4 and len(ops) == len(vector), (kernel, ops)
        else:
            assert not ops, (kernel, ops)


# The conv family's CUTLASS implicit-GEMM convolutions (strategy="implicit_gemm"), compiled for the
# architecture the library's build gives each file: no kernel spills; the sm80 (CUTLASS 2.x) kernels
# multiply on mma.sync (HMMA) and load with cp.async (LDGSTS), the sm90a (CUTLASS 3.x builder) ones
# on wgmma (HGMMA, no HMMA) fed by TMA im2col loads of the activation.
CONV_FILES = [f"conv_ig_{op}_{gen}.cu" for op in ("fprop", "dgrad", "wgrad") for gen in ("sm80", "sm90")]


def _spills(report):
    """{kernel: spill-store bytes} of every entry function in a ptxas report."""
    spills, lines = {}, report.splitlines()
    for line, stats in zip(lines, lines[1:]):
        name = re.search(r"Function properties for (\S+)", line)
        found = re.search(r"(\d+) bytes spill stores", stats)
        if name and found:
            spills[name.group(1)] = int(found.group(1))
    return spills


@pytest.mark.parametrize("name", CONV_FILES)
def test_conv_implicit_gemm_kernels(name):
    sm90 = "_sm90" in name
    report, sass = _ptxas_report(name, family="conv", arch="90a" if sm90 else "80")
    spills = _spills(report)
    kernels = {k: v for k, v in spills.items() if "ImplicitGemm" in k or "ConvUniversal" in k or "GemmUniversal" in k}
    # one per dtype (sm90: bf16, f16; sm80: those and f32 as TF32); the sm80 dgrad has one per dtype
    # and rank (NHWC any stride, NDHWC stride 1)
    assert len(kernels) == {"conv_ig_dgrad_sm80.cu": 6}.get(name, 2 if sm90 else 3), spills
    assert not any(spills.values()), spills
    counts = _tensor_core_instructions(sass)
    assert counts, "no kernel in the SASS listing"
    for kernel, (shared, registers, hmma) in counts.items():
        if sm90:
            assert shared > 0 and hmma == 0, (kernel, shared, registers, hmma)
        else:
            assert hmma > 0 and shared == registers == 0, (kernel, shared, registers, hmma)
    if sm90:
        assert "UTMALDG.5D.IM2COL" in sass
    else:
        assert "LDGSTS" in sass


# ---- MoE ------------------------------------------------------------------------------------
# The memory-bound kernels (cpp/src/moe/dispatch_cuda.cu: dispatch plan, row gather, combine and
# its backward; experts_tc_cuda.cu: the tensor_core path's elementwise kernels), compiled for
# both architectures: no kernel spills, and the packed instantiations move rows in 128-bit global
# accesses (a regression to 2-byte loads or to split stores fails here, on the CPU). The grouped
# GEMMs (one bf16 file per operand layout; the f16 files are the same template): no spills, no
# serialized wgmma on sm90a, HGMMA and no HMMA there; the sm80 grouped kernel on HMMA + cp.async.


def _sass_by_kernel(sass):
    """{kernel: its SASS instruction lines} of a cuobjdump listing."""
    kernels, kernel = {}, None
    for line in sass.splitlines():
        function = re.search(r"Function : (\S+)", line)
        if function:
            kernel = function.group(1)
            kernels[kernel] = []
        elif kernel is not None and "/*" in line:
            kernels[kernel].append(line)
    return kernels


def _global_accesses(lines):
    """The LDG/STG opcodes (with their width suffixes) of a kernel's SASS lines."""
    return [m.group(0) for line in lines for m in [re.search(r"\b(LDG|STG)\.[\w.]+", line)] if m]


@pytest.mark.parametrize("arch", ["80", "90a"])
def test_moe_memory_bound_kernels(arch):
    report, sass = _ptxas_report("dispatch_cuda.cu", family="moe", arch=arch)
    spills = _spills(report)
    for kernel in ("walk_chunks_kernel", "scan_chunks_kernel", "scan_totals_kernel", "single_chunk_plan_kernel",
                   "gather_rows_kernel", "combine_kernel", "claim_rows_kernel", "zero_unclaimed_rows_kernel",
                   "zero_uncovered_rows_kernel"):
        assert any(kernel in k for k in spills), (kernel, sorted(spills))
    assert not any(spills.values()), spills
    kernels = _sass_by_kernel(sass)
    # the uncovered-rows check indexes its parameter's arrays by unrolled constants: no local copy
    # of them (a rolled loop gave an 80-byte stack frame, touched on every call)
    cover = [lines for k, lines in kernels.items() if "zero_uncovered_rows_kernel" in k]
    assert len(cover) == 1 and not any(re.search(r"\b(STL|LDL)\b", line) for line in cover[0])
    # the 16-byte pack instantiations: L = 8 lanes of f16/bf16, 4 of float
    packed = {k: v for k, v in kernels.items() if re.search(r"(gather_rows|combine)_kernelI\w+?Li[48]EE", k)}
    assert len(packed) == 6, sorted(kernels)
    for kernel, lines in packed.items():
        accesses = _global_accesses(lines)
        assert any(a.startswith("LDG.E.128") for a in accesses), (kernel, accesses)
        stores = [a for a in accesses if a.startswith("STG")]
        assert stores and all(a.startswith("STG.E.128") for a in stores), (kernel, stores)  # whole packs only


@pytest.mark.parametrize("arch", ["80", "90a"])
def test_moe_tensor_core_elementwise_kernels(arch):
    report, sass = _ptxas_report("experts_tc_cuda.cu", family="moe", arch=arch)
    spills = _spills(report)
    assert any("zero_idle_expert_grads_kernel" in k for k in spills), sorted(spills)
    assert not any(spills.values()), spills
    kernels = _sass_by_kernel(sass)
    checked = 0
    for kernel, lines in kernels.items():
        if "zero_idle_expert_grads_kernel" not in kernel:
            continue
        checked += 1
        stores = [a for a in _global_accesses(lines) if a.startswith("STG")]
        assert stores and all(a.startswith("STG.E.128") for a in stores), (kernel, stores)
        assert not any(re.search(r"\b(STL|LDL)\b", line) for line in lines), kernel  # no local memory
    assert checked == 1, sorted(kernels)  # (dx is summed by the second GEMM's epilogue: no kernel of ours)


MOE_GEMM_SM90 = [f"grouped_gemm_sm90_{layouts}_bf16.cu"
                 for layouts in ("nt", "nt_pingpong", "nn", "nn_accumulate", "tn", "nt_swiglu", "nt_swiglu_pingpong",
                                 "variant_nt_multicast", "variant_nt_swiglu_multicast", "variant_nt_pingpong_wide")]


@pytest.mark.parametrize("name", MOE_GEMM_SM90)
def test_moe_grouped_gemm_sm90(name):
    report, sass = _ptxas_report(name, family="moe", arch="90a")
    losses = [line for line in report.splitlines()
              if any(code in line for code in ("C7514", "C7519", "Potential Performance Loss", "is injected"))]
    assert not losses, "\n".join(losses)
    spills = _spills(report)
    assert any("GemmUniversal" in k or "device_kernel" in k for k in spills), sorted(spills)
    assert not any(spills.values()), spills
    counts = {k: c for k, c in _tensor_core_instructions(sass).items() if "build_group_arrays" not in k}
    assert counts, "no GEMM kernel in the SASS listing"
    for kernel, (shared, registers, hmma) in counts.items():
        assert shared > 0 and hmma == 0, (kernel, shared, registers, hmma)
    # the 1x2 clusters (a variant: -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON builds them): A's TMA loads
    # multicast to both CTAs, B's (each CTA its own N tile) plain; no multicast anywhere else
    multicast = sass.count("UTMALDG.2D.MULTICAST")
    assert (multicast > 0) == ("_multicast_" in name), (name, multicast)


@pytest.mark.parametrize("schedule", ["", "_pingpong", "_multicast"])
def test_moe_fused_swiglu_epilogue_stores_h_only(schedule):
    """The gate/up GEMM with SwiGLU in its epilogue (swiglu_epilogue.hpp): its GEMM kernel stores
    h from registers as 32-bit global stores (two h values each; a generic ST would mean the
    pointer lost its state space), 16 per tile and thread (32 h values per thread: a 128 x 64 h
    tile over 256 threads, cooperative and multicast, or a 64 x 64 one over a warpgroup, ping-pong), one exp per
    h value, and no shared-memory epilogue (no TMA store)."""
    variant = "variant_" if schedule == "_multicast" else ""
    _, sass = _ptxas_report(f"grouped_gemm_sm90_{variant}nt_swiglu{schedule}_bf16.cu", family="moe", arch="90a")
    gemm = {k: v for k, v in _sass_by_kernel(sass).items() if "SwigluEpilogueArray" in k}
    assert len(gemm) == 1, sorted(_sass_by_kernel(sass))
    lines = next(iter(gemm.values()))
    stores = [m.group(0) for line in lines for m in [re.search(r"\b(STG|ST|UTMASTG)(\.[\w.]+)?", line)] if m]
    assert stores.count("STG.E") == 16, stores
    assert not any(st.startswith(("ST.", "UTMASTG")) for st in stores), stores
    assert sum("MUFU.EX2" in line for line in lines) == 32


def test_moe_grouped_gemm_sm80():
    report, sass = _ptxas_report("grouped_gemm_sm80_nt_bf16.cu", family="moe", arch="80")
    spills = _spills(report)
    assert spills and not any(spills.values()), spills
    counts = {k: c for k, c in _tensor_core_instructions(sass).items() if "build_group_arrays" not in k}
    assert counts, "no GEMM kernel in the SASS listing"
    for kernel, (shared, registers, hmma) in counts.items():
        assert hmma > 0 and shared == registers == 0, (kernel, shared, registers, hmma)
    assert "LDGSTS" in sass


# ---- gated delta ------------------------------------------------------------------------------
# The chunked forward (cpp/src/gated_delta/chunked_forward.cu) for Hopper: its kernels, one per
# dtype, stage their tiles with 16-byte cp.async (LDGSTS ... .128 in the SASS) and spill nothing.
# The prep kernel and the state kernel's mma.sync path (kWgmma = false, "Lb0E") multiply on
# mma.sync (HMMA) and load every MMA operand with ldmatrix from the swizzled tiles, not element by
# element (before ldmatrix: 0 LDSM and 612-807 LDS in each kernel; the LDS that remain are the
# triangular solve's float32 work, the decays and the U' reads at the accumulator elements). One
# ldmatrix.x4 per warp, k step of 16 and 16-row (A) or 16-column (B) operand block: in prep K K^T
# and Q K^T take 2 x 8 A and 2 x 8 B blocks each, T X and T V 2 x 4 A (all without .trans), T X
# 4 x 4 and T V 1 x 4 B (.trans): 80 LDSM and 20 LDSM.T; in the state kernel W S0 and Q S0 2 x 8 A
# and 1 x 8 B each, P U 2 x 4 A and 1 x 4 B, K^T U_d 4 x 4 A and 1 x 4 B, the B operands and K^T
# .trans: 40 and 40 (fewer means a product lost its ldmatrix path). The state kernel's wgmma
# schedule ("Lb1E") issues every product as HGMMA 64x32x16 from shared-memory descriptors: W S0
# and Q S0 8 k steps each, P U 4, K^T U_d 4 k steps x 2 key blocks: 28, no HMMA, no ldmatrix,
# three barriers (a chunk's; the mma.sync schedule has four), and ptxas keeps the wgmma
# asynchronous (no C7514/C7519 serialization).
def test_gated_delta_chunked_kernels_stage_with_cp_async():
    report, sass = _ptxas_report("chunked_forward.cu", family="gated_delta")
    spills = {k: v for k, v in _spills(report).items() if "chunk_prep_kernel" in k or "chunk_state_kernel" in k}
    assert len(spills) == 6 and not any(spills.values()), spills
    assert not [line for line in report.splitlines() if "C7514" in line or "C7519" in line]
    kernels = _sass_by_kernel(sass)
    assert set(kernels) == set(spills), (sorted(kernels), spills)
    for kernel, lines in kernels.items():
        count = lambda pattern: sum(bool(re.search(pattern, line)) for line in lines)
        ldgsts, hmma, hgmma = count(r"\bLDGSTS\.\S*\.128\b"), count(r"\bHMMA\."), count(r"\bHGMMA\.64x32x16\.")
        ldsm, ldsm_t, lds = count(r"\bLDSM\.16\.M88\.4\b"), count(r"\bLDSM\.16\.MT88\.4\b"), count(r"\bLDS(\.|\s)")
        assert ldgsts > 0, (kernel, ldgsts)
        if "chunk_state_kernel" in kernel and "Lb1E" in kernel:
            bars = count(r"\bBAR\.SYNC")
            assert (hgmma, hmma, ldsm + ldsm_t, bars) == (28, 0, 0, 3), (kernel, hgmma, hmma, ldsm, ldsm_t, bars)
            continue
        assert hmma > 0 and hgmma == 0, (kernel, hmma, hgmma)
        want = (80, 20) if "chunk_prep_kernel" in kernel else (40, 40)
        assert ldsm >= want[0] and ldsm_t >= want[1], (kernel, ldsm, ldsm_t, want)
        assert lds < 400, (kernel, lds)


# The chunked backward (cpp/src/gated_delta/chunked_backward.cu), for both architectures: its four
# kernels, one per dtype, spill nothing (an earlier version of the local kernel kept dX rows in a
# register array and spilled on sm_80; a version holding dq and dk in registers for the whole CTA
# spilled 148 B on sm_80). For f16 and bf16 the local kernel runs K K^T and the seven dq/dk
# products on mma.sync with ldmatrix operands from swizzled 16-bit tiles; float32 inputs keep
# float32 FMAs (no HMMA, no LDSM). Per warp, with 2 x 2 warps of 32 x 32 per k step of 16 (one
# ldmatrix.x4 per 16-row A block or 16-column B block and k step; 2 x 2 HMMA m16n8k16 per block pair):
#   K K^T         64 x 64, k 128:  A 16, B 16 (no .trans),        64 HMMA
#   dO S0^T       64 x 128, k 32:  A 4, B 8 (no .trans),           32
#   U dS_C^T, dX S0^T: twice that,                                 64
#   dA K          64 x 128, k 64:  A 8 (no .trans), B 16 (.trans), 64
#   dA^T Q        A 8 (.trans), B 16 (.trans),                     64
#   (D + D^T) K   A 8 (no .trans), B 16 (.trans),                  64
# = 84 LDSM.16.M88.4, 56 LDSM.16.MT88.4 and 352 HMMA.16816, each product's code once (a product
# falling back to FMAs, or its code duplicated, changes the counts). The rows K S0, Q S0 and
# K dS_C run on TF32 (HMMA.1688.F32.TF32; 4 warps of 16 rows, 4 atoms of 8 columns, 2 MMAs per
# product for the hi and lo parts of S0 or dS_C): 24 in a k-step loop of 8 kept rolled. The slice
# products run on TF32 too: dX = T^T dU (3xTF32, 2 atoms per warp in a rolled k-step loop: 6) and
# dO U^T / dX U^T (3 MMAs per atom in the code, the third skipped at run time for dO; the 32 slice
# columns unrolled as 4 k steps; one 16-row block of up to 4 atoms, one of up to 8: 4 x 12 x 3 =
# 144), 174 in all. The state passes run their products on TF32 too (bwd_slice_mma_tf32, each in
# a rolled k-step loop, 4 atoms, 1-3 MMAs per atom as its operands are split): the forward pass
# U' - W S0 (1 row block, 3 MMAs: 12) and K^T diag(w) U (2 row blocks, 2 MMAs: 16), 28; the
# reverse pass P^T dO and K dS_C (1 block, 2 MMAs each: 16), Q^T (gamma dO) (2 blocks, 2: 16) and
# W^T dU (2 blocks, 3: 24), 56; the prep kernel K K^T and Q K^T (exact operands, 1 MMA: 4 each)
# and (T diag(beta gamma)) K, (T diag(beta)) V (T split, 2 MMAs: 8 each), 24. The state passes
# stage each chunk's tiles with 16-byte cp.async (LDGSTS ... .128), every dtype: a regression to
# element loads into shared memory fails here. The local kernel asks L2 for the next slice's rows
# (prefetch.global.L2: CCTL.E.PF2), no other kernel does.
@pytest.mark.parametrize("arch", ["80", "90a"])
def test_gated_delta_chunked_backward_does_not_spill(arch):
    report, sass = _ptxas_report("chunked_backward.cu", family="gated_delta", arch=arch)
    spills = {k: v for k, v in _spills(report).items() if "bwd_" in k}
    assert len(spills) == 12 and not any(spills.values()), spills
    kernels = _sass_by_kernel(sass)
    assert set(kernels) == set(spills), (sorted(kernels), spills)
    for kernel, lines in kernels.items():
        hmma = sum(bool(re.search(r"\bHMMA\.", line)) for line in lines)
        hmma_tf32 = sum(bool(re.search(r"\bHMMA\.1688\.F32\.TF32\b", line)) for line in lines)
        ldsm = sum(bool(re.search(r"\bLDSM\.16\.M88\.4\b", line)) for line in lines)
        ldsm_t = sum(bool(re.search(r"\bLDSM\.16\.MT88\.4\b", line)) for line in lines)
        sixteen_bit = "kernelIfE" not in kernel
        ldgsts = sum(bool(re.search(r"\bLDGSTS\.\S*\.128\b", line)) for line in lines)
        state_pass = "bwd_forward_kernel" in kernel or "bwd_reverse_kernel" in kernel
        assert (ldgsts > 0) == state_pass, (kernel, ldgsts)
        prefetches = sum(bool(re.search(r"\bCCTL\.E\.PF2\b", line)) for line in lines)
        assert (prefetches > 0) == ("bwd_local_kernel" in kernel), (kernel, prefetches)
        if sixteen_bit and "bwd_local_kernel" in kernel:
            assert (hmma - hmma_tf32, hmma_tf32, ldsm, ldsm_t) == (352, 174, 84, 56), (kernel, hmma, hmma_tf32, ldsm,
                                                                                      ldsm_t)
        elif sixteen_bit:
            expected = 24 if "bwd_prep_kernel" in kernel else 28 if "bwd_forward_kernel" in kernel else 56
            assert (hmma, hmma_tf32, ldsm, ldsm_t) == (expected, expected, 0, 0), (kernel, hmma, hmma_tf32, ldsm, ldsm_t)
        else:
            assert hmma == 0 and ldsm == 0 and ldsm_t == 0, (kernel, hmma, ldsm, ldsm_t)


# ---- paged ------------------------------------------------------------------------------------
# The tensor-core MLA decode kernel (cpp/src/paged/mla_decode_cuda.cu, compiled for both
# architectures: mma.sync runs on Hopper too): for f16 and bf16 on sm_80 and sm_90a it gathers its
# tiles with 16-byte cp.async (LDGSTS ... .128), multiplies on mma.sync (HMMA, no HGMMA), and spills
# nothing (its 64 x 512 float32 accumulator is 128 registers of each of 256 threads).
@pytest.mark.parametrize("arch", ["80", "90a"])
def test_paged_mla_decode_kernel_on_tensor_cores(arch):
    report, sass = _ptxas_report("mla_decode_cuda.cu", family="paged", arch=arch)
    spills = {k: v for k, v in _spills(report).items() if "paged_mla_decode_kernel" in k}
    assert len(spills) == 2 and not any(spills.values()), spills
    kernels = {k: v for k, v in _sass_by_kernel(sass).items() if "paged_mla_decode_kernel" in k}
    assert set(kernels) == set(spills), (sorted(kernels), spills)
    for kernel, lines in kernels.items():
        ldgsts = sum(bool(re.search(r"\bLDGSTS\.\S*\.128\b", line)) for line in lines)
        hmma = sum(bool(re.search(r"\bHMMA\.", line)) for line in lines)
        hgmma = sum(bool(re.search(r"\bHGMMA\.", line)) for line in lines)
        assert ldgsts > 0 and hmma > 0 and hgmma == 0, (kernel, ldgsts, hmma, hgmma)
        assert not any(re.search(r"\b(STL|LDL)\b", line) for line in lines), kernel  # no local memory


# ---- norm ---------------------------------------------------------------------------------------
# The LayerNorm / RMSNorm forward kernels (cpp/src/norm/norm_fwd_cuda.cu), for both architectures:
# no kernel spills, and the 16-byte instantiations move rows in 128-bit accesses (LDG.E.128; every
# row store STG.E.128, the only narrower stores being the per-row mean and rstd), so a regression to
# 2-byte accesses or split stores fails here. The pipelined kernel (teams of <= 256 threads: weight
# and bias in registers, the next row's loads issued before the current row's reductions) is checked
# in its row loop, the backward branch spanning the most code: 128-bit loads (the next row) before
# the first reduction shuffle, 128-bit stores, no local memory, and where a parameter chunk is one
# 16-byte piece (16-bit parameters, or float32 ones with float32 rows) no global load after the
# reductions, since the parameters were loaded once before the loop (norm_forward_regs loads them
# there, per row and slot).


def _row_loop(lines):
    """The lines of a kernel's outermost loop: from the target of the backward branch that spans
    the most code to that branch."""
    def address(line):
        return int(re.search(r"/\*([0-9a-f]{4,})\*/", line).group(1), 16)

    lines = [line for line in lines if re.search(r"/\*[0-9a-f]{4,}\*/", line)]  # instructions, not encodings
    best = None
    for i, line in enumerate(lines):
        branch = re.search(r"\bBRA (?:!?U?P\d, )?0x([0-9a-f]+)", line)
        if branch and int(branch.group(1), 16) < address(line):
            span = address(line) - int(branch.group(1), 16)
            if best is None or span > best[0]:
                best = (span, int(branch.group(1), 16), i)
    assert best, "no backward branch"
    _, target, end = best
    start = next(i for i, line in enumerate(lines) if address(line) == target)
    return lines[start:end + 1]


@pytest.mark.parametrize("arch", ["80", "90a"])
def test_norm_forward_kernels(arch):
    report, sass = _ptxas_report("norm_fwd_cuda.cu", family="norm", arch=arch)
    spills = _spills(report)
    # regs and stream: 5 dtype pairs x 2 chunk widths; pipelined and cluster: 5 each (16-byte chunks)
    assert len(spills) == 30, sorted(spills)
    assert not any(spills.values()), spills
    kernels = _sass_by_kernel(sass)
    # the 16-byte chunk instantiations: 8 elements of f16/bf16, 4 of float (the cluster kernel has
    # its own test below)
    wide = {k: v for k, v in kernels.items()
            if re.search(r"norm_forward_\w+?I\w+?Li[48]EE", k) and "cluster" not in k}
    assert len(wide) == 15, sorted(kernels)
    for kernel, lines in wide.items():
        accesses = _global_accesses(lines)
        assert sum(a.startswith("LDG.E.128") for a in accesses) >= 4, (kernel, accesses)
        stores = [a for a in accesses if a.startswith("STG")]
        assert sum(a == "STG.E.128" for a in stores) >= 4, (kernel, stores)
        assert all(a in ("STG.E.128", "STG.E") for a in stores), (kernel, stores)  # whole chunks, 32-bit stats
    pipelined = {k: v for k, v in wide.items() if "pipelined" in k}
    assert len(pipelined) == 5, sorted(wide)
    for kernel, lines in pipelined.items():
        loop = _row_loop(lines)
        first_shuffle = next(i for i, line in enumerate(loop) if "SHFL.BFLY" in line)
        before, after = _global_accesses(loop[:first_shuffle]), _global_accesses(loop[first_shuffle:])
        assert sum(a == "LDG.E.128" for a in before) >= 4, (kernel, before)  # the next row's chunks
        assert sum(a == "STG.E.128" for a in after) >= 4, (kernel, after)  # this row's y
        assert not any(re.search(r"\b(STL|LDL)\b", line) for line in loop), kernel
        cached = re.search(r"I(13__nv_bfloat16S3_|6__halfS3_|ffLi4)", kernel)  # P is T (or both float)
        if cached:
            assert not any(a.startswith("LDG") for a in after), (kernel, after)
        else:  # float32 parameters of 16-bit rows: loaded per row, after the reductions
            assert any(a == "LDG.E.128" for a in after), (kernel, after)


@pytest.mark.parametrize("arch", ["80", "90a"])
@pytest.mark.parametrize("name, kernel, count, loads, stores, barriers", [
    ("norm_fwd_cuda.cu", "norm_forward_cluster", 5, 4, 4, 3),   # x: kSlots chunks; 2 reductions + the exit
    ("norm_bwd_cuda.cu", "norm_backward_cluster", 5, 4, 2, 2),  # dy, x: kPairSlots each; 1 reduction + the exit
    ("softmax_cuda.cu", "softmax_forward_cluster", 3, 4, 4, 3),   # max, sum + the exit
    ("softmax_cuda.cu", "softmax_backward_cluster", 3, 4, 2, 2),  # dy, y; the dot product + the exit
])
def test_norm_cluster_kernels(arch, name, kernel, count, loads, stores, barriers):
    """The cluster kernels of the norm family (few long rows shared by a cluster of blocks, sm_90):
    on sm_90a no spill and no local memory, the rows read and written in 128-bit pieces, one
    cluster barrier (UCGABAR_ARV / UCGABAR_WAIT) per reduction and the final one (the layer and rms
    norms share the code), and the peers' partial results read through distributed shared memory
    (generic LD after the barrier); on sm_80, where clusters do not exist, the body is a trap (so it
    costs no compile time there and can never run)."""
    report, sass = _ptxas_report(name, family="norm", arch=arch)
    spills = {k: v for k, v in _spills(report).items() if kernel in k}
    assert len(spills) == count and not any(spills.values()), spills  # one per dtype (pair), 16-byte chunks
    kernels = {k: v for k, v in _sass_by_kernel(sass).items() if kernel in k}
    assert len(kernels) == count, sorted(kernels)
    for entry, lines in kernels.items():
        if arch == "80":
            assert any("BPT.TRAP" in line for line in lines) and not _global_accesses(lines), entry
            continue
        accesses = _global_accesses(lines)
        assert sum(a == "LDG.E.128" for a in accesses) >= loads, (entry, accesses)
        written = [a for a in accesses if a.startswith("STG")]
        assert sum(a == "STG.E.128" for a in written) >= stores, (entry, written)
        assert all(a in ("STG.E.128", "STG.E") for a in written), (entry, written)  # whole chunks, 32-bit stats
        assert sum("UCGABAR_ARV" in line for line in lines) == barriers, entry
        assert sum("UCGABAR_WAIT" in line for line in lines) == barriers, entry
        first_wait = next(i for i, line in enumerate(lines) if "UCGABAR_WAIT" in line)
        assert any(re.search(r"\bLD\.E\b", line) for line in lines[first_wait:]), entry  # ld.shared::cluster
        assert not any(re.search(r"\b(STL|LDL)\b", line) for line in lines), entry


@pytest.mark.parametrize("arch", ["80", "90a"])
def test_norm_backward_pipelined_kernels(arch):
    """The pipelined norm backward (norm_backward_regs_pipelined, cpp/src/norm/norm_bwd_cuda.cu: teams
    of <= 256 threads, the weight in registers, the team's next row loaded before the current row's
    reductions), for both architectures: no spills; in its row loop, 128-bit loads (the next row's
    dy and x, two slots each) before the first reduction shuffle, dx stored in 128-bit pieces after
    it, no local memory, and where a weight chunk is one 16-byte piece (16-bit weights, or float32
    ones with float32 rows) no global load after the reductions (norm_backward_regs loads the
    weight there twice per slot: for the row sums and for dx)."""
    report, sass = _ptxas_report("norm_bwd_cuda.cu", family="norm", arch=arch)
    spills = {k: v for k, v in _spills(report).items() if "pipelined" in k}
    assert len(spills) == 5 and not any(spills.values()), spills  # one per dtype pair, 16-byte chunks only
    kernels = {k: v for k, v in _sass_by_kernel(sass).items() if "pipelined" in k}
    assert len(kernels) == 5, sorted(kernels)
    for kernel, lines in kernels.items():
        loop = _row_loop(lines)
        first_shuffle = next(i for i, line in enumerate(loop) if "SHFL.BFLY" in line)
        before, after = _global_accesses(loop[:first_shuffle]), _global_accesses(loop[first_shuffle:])
        assert sum(a == "LDG.E.128" for a in before) >= 4, (kernel, before)  # the next row's dy and x
        assert sum(a == "STG.E.128" for a in after) >= 2, (kernel, after)  # this row's dx
        assert all(a == "STG.E.128" for a in after if a.startswith("STG")), (kernel, after)
        assert not any(re.search(r"\b(STL|LDL)\b", line) for line in loop), kernel
        cached = re.search(r"I(13__nv_bfloat16S3_|6__halfS3_|ffLi4)", kernel)  # P is T (or both float)
        if cached:
            assert not any(a.startswith("LDG") for a in after), (kernel, after)
        else:  # float32 weights of 16-bit rows: loaded per slot, after the reductions
            assert any(a == "LDG.E.128" for a in after), (kernel, after)


def _ptx_entries(name, family):
    """{entry: its PTX body} of one translation unit compiled to PTX for compute_90a (the source has
    no architecture-dependent paths in the kernels checked with it)."""
    nvcc, cutlass = shutil.which("nvcc"), cutlass_include()
    if not (nvcc and cutlass):
        pytest.skip("needs nvcc and CUTLASS's headers")
    os.makedirs(os.path.join(ROOT, "build", "ptxas"), exist_ok=True)
    out = os.path.join(ROOT, "build", "ptxas", name.replace(".cu", ".ptx"))
    cmd = [nvcc, "-O3", "-DNDEBUG", "-std=c++17", "-arch=compute_90a", "--expt-relaxed-constexpr", "-DRUDNN_WITH_CUDA=1",
           f"-I{os.path.join(ROOT, 'cpp', 'include')}", f"-I{os.path.join(ROOT, 'cpp', 'src')}", "-isystem", cutlass,
           "-ptx", os.path.join(ROOT, "cpp", "src", family, name), "-o", out]
    with build_lock(out):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-4000:]
        ptx = open(out).read()
    parts = re.split(r"\.entry\s+(\S+?)\(", ptx)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_norm_stream_forward_l2_hints():
    """The two-read forward (norm_forward_stream) keeps what its second pass reads again in L2:
    pass 1 loads x alone with an evict_last policy and, with a residual, x and residual (read once)
    evict_first and stores residual_out evict_last; pass 2 re-reads evict_first. The register
    kernels read each row once and carry no hint."""
    entries = _ptx_entries("norm_fwd_cuda.cu", "norm")
    stream = {k: v for k, v in entries.items() if "norm_forward_stream" in k}
    assert len(stream) == 10, sorted(entries)
    for kernel, body in stream.items():
        # U = 4 chunks a step: pass 1 x alone evict_last; with a residual x and residual evict_first,
        # residual_out stored evict_last; pass 2's re-read evict_first
        hinted = _l2_hinted_accesses(kernel, body)
        assert hinted == {("ld", "evict_last"): 4, ("ld", "evict_first"): 12, ("st", "evict_last"): 4}, (kernel, hinted)
        plain = re.findall(r"ld\.global\.(?!L2::cache_hint)\S+", body)
        assert len(plain) <= 16, (kernel, plain)  # parameter chunks only: w, b of one step's 4 chunks
    for kernel, body in entries.items():
        if "norm_forward_regs" in kernel:
            assert "cache_hint" not in body and "createpolicy" not in body, kernel


def _l2_hinted_accesses(kernel, body):
    """{(ld or st, evict_*): count} of a PTX body's L2::cache_hint accesses, each traced back to the
    createpolicy that made its policy register; 16-byte chunk kernels (VEC 4 or 8) must move whole
    128-bit pieces."""
    policy = {m.group(2): m.group(1) for m in re.finditer(r"createpolicy\.fractional\.L2::(evict_\w+)\.b64\s+(%rd\d+)", body)}
    hinted = {}
    for m in re.finditer(r"(ld|st)\.global\.L2::cache_hint(\S*)\s+[^;]*,\s*(%rd\d+);", body):
        key = (m.group(1), policy.get(m.group(3), "unknown"))
        hinted[key] = hinted.get(key, 0) + 1
        if re.search(r"Li[48]EE", kernel):
            assert m.group(2) == ".v4.u32", (kernel, m.group(0))
    return hinted


@pytest.mark.parametrize("name, stream_kernels, regs_kernel", [
    ("softmax_cuda.cu", ("softmax_forward_stream", "softmax_backward_stream"), "_regs"),
    ("norm_bwd_cuda.cu", ("norm_backward_stream",), "norm_backward_regs"),
])
def test_norm_family_two_read_kernels_l2_hints(name, stream_kernels, regs_kernel):
    """The other two-read kernels (softmax forward and backward, the norm backward) keep their first
    pass's rows in L2 for the second: pass 1 loads evict_last, pass 2's re-reads evict_first (4
    chunks a step of one row tensor, or 2 chunks of each of two), no hinted store; the register
    kernels read once and carry no hint."""
    entries = _ptx_entries(name, "norm")
    stream = {k: v for k, v in entries.items() if any(s in k for s in stream_kernels)}
    assert len(stream) >= 2 * len(stream_kernels), sorted(entries)
    for kernel, body in stream.items():
        assert _l2_hinted_accesses(kernel, body) == {("ld", "evict_last"): 4, ("ld", "evict_first"): 4}, kernel
    regs = [k for k in entries if regs_kernel in k]
    assert regs, sorted(entries)
    for kernel in regs:
        assert "cache_hint" not in entries[kernel] and "createpolicy" not in entries[kernel], kernel
