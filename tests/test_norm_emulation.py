"""The LayerNorm / RMSNorm forward CUDA kernels' own source (cpp/src/norm/norm_fwd_cuda.cu: the
register-resident and the two-read stream kernels, teams from 2 to 512 threads, 16-byte and
single-element chunks, the fused residual add) and the host planner's team shapes run on the CPU
by a host emulator (tests/emulation/norm_emu.cpp) and are compared with the CPU backend, which
test_norm.py checks against torch. Skipped when g++ (C++20) or the CUDA toolkit's headers are
missing."""

import os
import subprocess

from util import ROOT, build_emulator


def _between(path, start, end):
    src = open(os.path.join(ROOT, "cpp", "src", "norm", path)).read()
    return src[src.index(start):src.index(end)]


def test_norm_forward_kernels_match_the_cpu_backend():
    kernels = _between("norm_fwd_cuda.cu", "using namespace kern;",
                       "// (tests/emulation/norm_emu.cpp runs everything from")
    plan = _between("norm_cuda.cu", "namespace {", "// (tests/emulation/norm_emu.cpp runs the planning above")
    exe = build_emulator("norm_emu.cpp", kernels, needs_cutlass=True, extra_includes={"plan.inc": plan})
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and len(lines) == 14 and all(line.endswith(" ok") for line in lines), \
        result.stdout + result.stderr
    for shape in ("stream", "regs]", "pipelined]", "vec=1", "team=2 ", "team=256", "team=512 block=512 grid=3"):
        assert any(shape in line for line in lines), (shape, result.stdout)  # the cases cover these launches
    # every pipelined launch was also run by norm_forward_regs and gave the same bits
    pipelined = [line for line in lines if "pipelined]" in line]
    assert len(pipelined) >= 9 and all("bitwise as regs1024" in line for line in pipelined), result.stdout
