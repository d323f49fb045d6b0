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
NaN-guarded caches. Skipped when g++ (C++20), the CUDA toolkit's headers or CUTLASS's headers are
missing."""

import os
import subprocess

from util import ROOT, build_emulator

SRC = os.path.join(ROOT, "cpp", "src", "paged")
MARKER = "// ---- emulated from here (tests/test_paged_emulation.py) ----\n"

EDITS = [("cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<", "EmuCpAsyncZfill<"),
         ("cute::cp_async_fence()", "emu_cp_async_fence()"),
         ("cute::cp_async_wait<", "emu_cp_async_wait<"),
         ("extern __shared__ __align__(128) unsigned char smem_raw[];", "unsigned char* smem_raw = emu_smem;")]


def _kernels_source():
    common = open(os.path.join(SRC, "cuda_common.cuh")).read()
    common = common[common.index(MARKER) + len(MARKER):]  # ends with the namespace's closing brace
    fwd = open(os.path.join(SRC, "forward_cuda.cu")).read()
    start = fwd.index("namespace {\n") + len("namespace {\n")
    kernels = fwd[start:fwd.index("}  // namespace\n", start)]
    common = common[:common.rindex("}")] + "namespace emu_k {\n" + kernels + "}  // namespace emu_k\n}\n"
    text = "namespace rudnn::paged::cuda {\n" + common
    for old, new in EDITS:
        assert old in text, f"emulation edit no longer applies: {old}"
        text = text.replace(old, new)
    return text


def test_paged_kernels_match_the_cpu_backend():
    exe = build_emulator("paged_emu.cpp", _kernels_source(), needs_cutlass=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.strip().splitlines() if not line.startswith("  ")]
    assert result.returncode == 0 and lines and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for staging in ("cp.async", "scalar"):
        assert any(f"staging={staging}" in line for line in lines), f"no case staged with {staging}"
    assert sum(line.startswith("append") for line in lines) == 3 and len(lines) == 18, result.stdout
