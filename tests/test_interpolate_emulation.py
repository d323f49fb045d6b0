"""The interpolate CUDA kernels' own source (cpp/src/interpolate/interpolate_cuda.cu: the forward
and the gather backward kernels, their 16-byte channel packs and the choice between the vector and
the scalar path) run on the CPU by a host emulator (tests/emulation/interpolate_emu.cpp:
std::threads for CUDA threads, a grid smaller than the work so the grid-stride loops wrap) and
compared bitwise with the CPU backend, which test_interpolate.py checks against torch. Skipped when
g++ (C++20) or the CUDA toolkit's headers are missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "interpolate", "interpolate_cuda.cu")).read()
    start = src.index("constexpr int kThreads")
    end = src.index("// (tests/emulation/interpolate_emu.cpp runs everything above this line on the CPU.)")
    return "namespace rudnn::interp {\nnamespace emu_k {\n" + src[start:end] + "}\n}\n"


def test_interpolate_kernels_match_the_cpu_backend():
    exe = build_emulator("interpolate_emu.cpp", _kernels_source())
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 12 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for pass_ in ("forward", "backward"):
        for path in ("vector", "scalar"):
            assert any(f"{pass_}={path}" in line for line in lines), f"no case ran the {pass_} {path} path"
