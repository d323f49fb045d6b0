"""The paged family's CUDA kernels' own source (cpp/src/paged/cuda_common.cuh from its marker line,
the anonymous namespace of cpp/src/paged/forward_cuda.cu: the decode kernel of attention and MLA,
the split merge and the append kernel) run on the CPU by a host emulator
(tests/emulation/paged_emu.cpp: std::threads for CUDA threads, barriers for __syncthreads and the
warp shuffles, the cp.async stand-ins of emu_sm80_atoms.hpp, which land a copy only when its
group is waited for and report shared-memory ordering hazards) and compared with the CPU backend,
which test_paged.py checks against the float64 reference: GQA 1/4/8 and MQA over two head blocks,
page sizes 1/16/64, decode and prefill rows, causal, D != Dv, D = Dv = 1024, MLA (DeepSeek's
R = 512, P = 64 included), splits 2..32 (empty chunks included), lse, the 16-byte and the scalar
staging, append, and corrupted device metadata (page ids, sequence ids, a length) staying inside
NaN-guarded caches. The tensor-core prefill kernel (cpp/src/paged/prefill_cuda.cu, with the text
of attention/flash_sm80.cuh it builds on and the MMA, ldmatrix and cp.async stand-ins of
emu_sm80_atoms.hpp, written from the PTX ISA) runs in the same calls as forward_cuda launches it:
prefill-only and mixed batches (the decode kernel skipping the prefill runs' rows), D = 64 and
128, f16 and bf16, page sizes 1/16/64, GQA 1/2/4/8, causal by absolute position (chunked
prefill: the last rows of a longer history), splits, and corrupted page tables, sequence ids
and lengths. The tensor-core MLA decode kernel (cpp/src/paged/mla_decode_cuda.cu, R = 512,
P = 64; with gather_sm80.cuh, the page gather it shares with the prefill kernel) runs where
forward_cuda sends MLA calls: f16 and bf16, H = 16/20/64/128 (one, a partial and two 64-head
blocks), page sizes 1/16/64, histories no multiple of its 32-slot tile and an empty one, several
rows of one sequence, causal and not, splits 2/3/32 through the merge kernel, a corrupted page
table. Skipped when g++ (C++20), the CUDA toolkit's headers or CUTLASS's headers are missing."""

import os
import subprocess

from util import FLASH_SM80_EDITS, ROOT, build_emulator

SRC = os.path.join(ROOT, "cpp", "src", "paged")
MARKER = "// ---- emulated from here (tests/test_paged_emulation.py) ----\n"

EDITS = [("cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<", "EmuCpAsyncZfill<"),
         ("cute::cp_async_fence()", "emu_cp_async_fence()"),
         ("cute::cp_async_wait<", "emu_cp_async_wait<"),
         ("extern __shared__ __align__(128) unsigned char smem_raw[];", "unsigned char* smem_raw = emu_smem;")]


# ... and those of the prefill kernel's own ldmatrix copies (the rest of its atoms are flash_sm80.cuh's).
PREFILL_EDITS = [("cute::SM75_U32x4_LDSM_N", "EmuLdsmN"), ("cute::SM75_U16x8_LDSM_T", "EmuLdsmT")]


def _anonymous_namespace(name):
    text = open(os.path.join(SRC, name)).read()
    start = text.index("namespace {\n") + len("namespace {\n")
    return text[start:text.index("}  // namespace\n", start)]


def _kernels_source():
    """flash_sm80.cuh's kernels (atoms renamed), then cuda_common.cuh and gather_sm80.cuh from
    their markers with the anonymous namespaces of forward_cuda.cu, prefill_cuda.cu and
    mla_decode_cuda.cu in namespace emu_k."""
    flash = open(os.path.join(ROOT, "cpp", "src", "attention", "flash_sm80.cuh")).read()
    flash = flash[flash.index("namespace rudnn::attention::flash {"):flash.index('#include "core/cuda_check.hpp"')]
    for old, new in FLASH_SM80_EDITS:  # (the plain cp.async atom is the backward's, not here)
        assert old in flash or old == "SM80_CP_ASYNC_CACHEGLOBAL<", f"emulation edit no longer applies: {old}"
        flash = flash.replace(old, new)
    common = open(os.path.join(SRC, "cuda_common.cuh")).read()
    common = common[common.index(MARKER) + len(MARKER):]  # ends with the namespace's closing brace
    gather = open(os.path.join(SRC, "gather_sm80.cuh")).read()
    gather = gather[gather.index(MARKER) + len(MARKER):]
    kernels = "".join(_anonymous_namespace(name) for name in ("forward_cuda.cu", "prefill_cuda.cu",
                                                               "mla_decode_cuda.cu"))
    common = (common[:common.rindex("}")] + gather[:gather.rindex("}")] + "namespace emu_k {\n" + kernels +
              "}  // namespace emu_k\n}\n")
    text = "namespace rudnn::paged::cuda {\n" + common
    for old, new in EDITS + PREFILL_EDITS:
        assert old in text, f"emulation edit no longer applies: {old}"
        text = text.replace(old, new)
    return flash + text


def test_paged_kernels_match_the_cpu_backend():
    exe = build_emulator("paged_emu.cpp", _kernels_source(), needs_cutlass=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.strip().splitlines() if not line.startswith("  ")]
    assert result.returncode == 0 and lines and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for staging in ("cp.async", "scalar"):
        assert any(f"staging={staging}" in line for line in lines), f"no case staged with {staging}"
    for groups in (2, 16):  # both accumulator variants of the decode kernel ran
        assert any(f"acc_groups={groups} " in line for line in lines), f"no case ran with {groups} groups"
    # The prefill kernel ran: rows of prefill runs only (prefill_rows=queries), and mixed with the
    # decode kernel in one call; at both head dims, with splits and on corrupted tables.
    def field(line, key):
        return next(int(w.split("=")[1]) for w in line.split() if w.startswith(key + "="))
    prefill = [line for line in lines if " prefill_rows=" in line and field(line, "prefill_rows") > 0]
    assert any(field(line, "prefill_rows") == field(line, "queries") for line in prefill), result.stdout
    assert sum(0 < field(line, "prefill_rows") < field(line, "queries") for line in prefill) >= 4, result.stdout
    for d in (64, 128):
        assert any(field(line, "d") == d for line in prefill), f"no prefill case with D = {d}"
    assert any(field(line, "splits") > 1 for line in prefill), "no prefill case with splits"
    assert sum(line.startswith("corrupt") for line in prefill) >= 3, "the prefill kernel met no corrupted table"
    # The tensor-core MLA decode kernel ran: f16 and bf16, causal and not, with splits (3 and 32),
    # over two head blocks and a partial one, on a corrupted table.
    mla = [line for line in lines if " mla_tc=1 " in line]
    assert len(mla) == 6, result.stdout
    assert any(line.startswith("mla_tc_f16") for line in mla) and any("_bf16_" in line for line in mla)
    assert {field(line, "splits") for line in mla} >= {1, 3, 32}, result.stdout
    assert any(line.startswith("corrupt") for line in mla) and any("causal" in line for line in mla)
    assert sum(line.startswith("append") for line in lines) == 3 and len(lines) == 30, result.stdout
