"""The CTC CUDA kernels' own source (cpp/src/ctc/ctc_cuda.cu: the alpha, reduce and beta/gradient
kernels, with labels and rows in shared memory and in the workspace) run on the CPU by a host
emulator (tests/emulation/ctc_emu.cpp: std::threads for CUDA threads, fewer threads than states
and classes so that every loop wraps) and compared bitwise with the CPU backend, which
test_ctc.py checks against torch. Skipped when g++ (C++20) or the CUDA toolkit's headers are
missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "ctc", "ctc_cuda.cu")).read()
    start = src.index("constexpr int kThreads")
    end = src.index("// (tests/emulation/ctc_emu.cpp runs everything above this line on the CPU.)")
    body = src[start:end]
    edit = "extern __shared__ float smem[];"
    assert body.count(edit) == 2
    body = body.replace(edit, "float* smem = reinterpret_cast<float*>(emu_smem);")
    return "namespace rudnn::ctc {\nnamespace emu_k {\n" + body + "}\n}\n"


def test_ctc_kernels_match_the_cpu_backend():
    exe = build_emulator("ctc_emu.cpp", _kernels_source())
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and lines and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for path in ("shared", "global"):
        assert any(f"staged={path}" in line for line in lines), f"no case ran with the rows in {path} memory"
