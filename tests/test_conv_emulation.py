"""The conv CUDA direct kernels' own source (cpp/src/conv/conv_direct_cuda.cu: forward, the data
gradient gather, the block-reduced weight and bias gradients, the channels-last thread order, the
16-byte packed forward and its path choice) and the implicit-GEMM strategy's layout copies
(cpp/src/conv/conv_ig_cuda.cu: NCHW x and w and a strided bias to channels-last and back, 16- and
32-bit elements) run
on the CPU by a host emulator (tests/emulation/conv_emu.cpp: std::threads for CUDA threads, a grid
smaller than the work so the grid-stride loops wrap) and compared bitwise with the CPU backend,
which test_conv.py checks against torch. Skipped when g++ (C++20) or the CUDA toolkit's headers
are missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "conv", "conv_direct_cuda.cu")).read()
    start = src.index("constexpr int kThreads")
    end = src.index("// (tests/emulation/conv_emu.cpp runs everything above this line on the CPU.)")
    direct = "namespace rudnn::conv {\nnamespace emu_k {\n" + src[start:end] + "}\n}\n"
    src = open(os.path.join(ROOT, "cpp", "src", "conv", "conv_ig_cuda.cu")).read()
    start = src.index("constexpr int kThreads")
    end = src.index("// (tests/emulation/conv_emu.cpp runs everything above this line on the CPU.)")
    return direct + "namespace rudnn::conv::ig {\nnamespace emu_ig {\n" + src[start:end] + "}\n}\n"


def test_conv_kernels_match_the_cpu_backend():
    exe = build_emulator("conv_emu.cpp", _kernels_source())
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 16 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for path in ("packed", "scalar"):  # the cases are chosen to run both forward paths
        assert any(f"path={path}" in line for line in lines), f"no case ran the {path} forward"
