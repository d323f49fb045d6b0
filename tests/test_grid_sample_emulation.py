"""The grid_sample CUDA kernels' own source (cpp/src/grid_sample/grid_sample_cuda.cu: the forward,
the forward's 16-byte vector path for channels-last x, the per-point backward with its atomic dx, the deterministic per-plane dx and the store, and the
forward's channel split) run on the CPU by a host emulator (tests/emulation/grid_sample_emu.cpp:
std::threads for CUDA threads, a grid smaller than the work so the grid-stride loops wrap) and
compared with the CPU backend, which test_grid_sample.py checks against torch: y, dgrid and the
deterministic dx bitwise, the atomic dx within a few ulps. Skipped when g++ (C++20) or the CUDA
toolkit's headers are missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "grid_sample", "grid_sample_cuda.cu")).read()
    start = src.index("constexpr int kThreads")
    end = src.index("// (tests/emulation/grid_sample_emu.cpp runs everything above this line on the CPU.)")
    return "namespace rudnn::gs {\nnamespace emu_k {\n" + src[start:end] + "}\n}\n"


def test_grid_sample_kernels_match_the_cpu_backend():
    exe = build_emulator("grid_sample_emu.cpp", _kernels_source())
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 11 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for path in ("vector", "scalar"):
        assert any(f"forward={path}" in line for line in lines), f"no case ran the forward's {path} path"
