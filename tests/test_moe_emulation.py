"""The MoE row gather and combine CUDA kernels' own source (the "row gather and combine" section of
cpp/src/moe/dispatch_cuda.cu: 16-byte packs or single elements, the batched slot loads of combine)
run on the CPU by a host emulator (tests/emulation/moe_combine_emu.cpp) and compared bitwise with
the CPU backend, which test_moe.py checks against the naive reference. Skipped when g++ (C++20) or
the CUDA toolkit's headers are missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _kernels_source():
    src = open(os.path.join(ROOT, "cpp", "src", "moe", "dispatch_cuda.cu")).read()
    start = src.index("// ---- row gather and combine (tests/emulation/moe_combine_emu.cpp")
    end = src.index("// (tests/emulation/moe_combine_emu.cpp runs everything from the section mark above")
    return "namespace rudnn::moe {\nnamespace emu_k {\n" + src[start:end] + "}\n}\n"


def test_gather_and_combine_kernels_match_the_cpu_backend():
    exe = build_emulator("moe_combine_emu.cpp", _kernels_source())
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 8 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for lanes in ("lanes=1", "lanes=8", "lanes=4"):  # both paths ran, for 16- and 32-bit types
        assert any(lanes in line for line in lines), result.stdout
