"""The paged backward CUDA kernels' own source (cpp/src/paged/backward_cuda.cu: the row pass with
its warp-per-head dot products and online softmax, the atomic history reduction, the ordered
history pass over the workspace's reader index, the float32-workspace store and the zero fill of
inactive pages) run on the CPU by a host emulator (tests/emulation/paged_backward_emu.cpp:
std::threads for CUDA threads) and compared with the C++ CPU backend, which test_paged_backward.py
and test_paged_ordered.py check against torch autograd: GQA 1/4, page sizes 1 and 16, causal and
not, D != Dv, MLA, need= subsets, dlse, a shared prefix page, a sequence without query rows, a
zero dout row (query pruning); the ordered mode bitwise identical over reruns and across its
options. Skipped when g++ (C++20), the CUDA toolkit's or CUTLASS's headers are missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "paged", "backward_cuda.cu")).read()
    start = src.index("// ---- emulated from here")
    end = src.index("// (tests/emulation/paged_backward_emu.cpp runs everything above this line on the CPU.)")
    body = src[start:end]
    assert body.count("extern __shared__ float smem[];") == 2
    body = body.replace("extern __shared__ float smem[];", "float* smem = reinterpret_cast<float*>(emu_smem);")
    return "namespace rudnn::paged::cuda {\nnamespace emu_k {\n" + body + "}\n}\n"


def test_paged_backward_kernels_match_the_cpu_backend():
    exe = build_emulator("paged_backward_emu.cpp", _kernels_source(), needs_cutlass=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 7 * 5 + 2 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    assert sum("ordered-bitwise-rerun" in line for line in lines) == 2
