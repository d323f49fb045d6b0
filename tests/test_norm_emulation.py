"""The LayerNorm / RMSNorm CUDA kernels' own source (cpp/src/norm/norm_fwd_cuda.cu: the
register-resident, pipelined and two-read stream forward kernels, teams from 2 to 512 threads,
16-byte and single-element chunks, the fused residual add; cpp/src/norm/norm_bwd_cuda.cu: the
register, pipelined and two-read backward kernels with their fused weight gradients, the column
kernel and the split reduction; cpp/src/norm/softmax_cuda.cu: the register and two-read softmax
kernels, forward and backward) and the host planner (norm_cuda.cu) run on the CPU by a host
emulator (tests/emulation/norm_emu.cpp) and are compared with the CPU backend, which test_norm.py
checks against torch. Skipped when g++ (C++20) or the CUDA toolkit's headers are missing."""

import os
import subprocess

from util import ROOT, build_emulator

MARK = "// (tests/emulation/norm_emu.cpp runs everything from"


def _between(path, start, end):
    src = open(os.path.join(ROOT, "cpp", "src", "norm", path)).read()
    return src[src.index(start):src.index(end)]


def _emulator():
    kernels = _between("norm_fwd_cuda.cu", "using namespace kern;", MARK)
    backward = _between("norm_bwd_cuda.cu", "using namespace kern;", MARK)
    edit = "extern __shared__ float4 wgrad_smem[];"
    assert backward.count(edit) == 3  # the regs, pipelined and stream kernels' accumulators
    backward = backward.replace(edit, "float4* wgrad_smem = reinterpret_cast<float4*>(emu_smem);")
    softmax = _between("softmax_cuda.cu", "using namespace kern;", MARK)
    plan = _between("norm_cuda.cu", "namespace {", "// (tests/emulation/norm_emu.cpp runs the planning above")
    return build_emulator("norm_emu.cpp", kernels, needs_cutlass=True,
                          extra_includes={"plan.inc": plan, "kernels_bwd.inc": backward, "kernels_softmax.inc": softmax})


def _run(which):
    result = subprocess.run([str(_emulator()), which], capture_output=True, text=True, timeout=900)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0 and all(line.endswith(" ok") for line in lines), result.stdout + result.stderr
    return lines


def test_norm_forward_kernels_match_the_cpu_backend():
    lines = _run("forward")
    assert len(lines) == 14, lines
    for shape in ("stream", "regs]", "pipelined]", "vec=1", "team=2 ", "team=256", "team=512 block=512 grid=3"):
        assert any(shape in line for line in lines), (shape, lines)  # the cases cover these launches
    # every pipelined launch was also run by norm_forward_regs and gave the same bits
    pipelined = [line for line in lines if "pipelined]" in line]
    assert len(pipelined) >= 9 and all("bitwise as regs1024" in line for line in pipelined), lines


def test_norm_backward_kernels_match_the_cpu_backend():
    lines = _run("backward")
    assert len(lines) == 12, lines
    # the cases cover these launches: the three dx kernels, fused weight gradients over one and
    # several splits, the column kernel with one split and with two (then the split reduction)
    for shape in ("regs, wgrad columns splits=1", "regs, wgrad columns splits=2", "vec=8 team=512 block=512 grid=3 "
                  "rows/block=2 smem=160000 stream, wgrad fused splits=3", "vec=1 team=512 block=512 grid=3 rows/block=1 "
                  "smem=136008 stream, wgrad fused splits=3", "regs, wgrad fused splits=4",
                  "pipelined, wgrad fused splits=6", "pipelined, wgrad fused splits=1", "pipelined, wgrad none", "vec=1",
                  "team=4 ", "team=512 block=512"):
        assert any(shape in line for line in lines), (shape, lines)
    # every pipelined launch was also run by norm_backward_regs and gave the same dx bits
    pipelined = [line for line in lines if " pipelined, " in line]
    assert len(pipelined) == 6 and all("dx bitwise as regs1024" in line for line in pipelined), lines


def test_softmax_kernels_match_the_cpu_backend():
    lines = _run("softmax")
    assert len(lines) == 6, lines
    for shape in ("[forward vec=8 team=2 ", "[backward vec=8 team=4 ", "[forward vec=1", "[backward vec=1",
                  "[forward vec=8 team=512 block=512 grid=2 stream]", "[backward vec=8 team=512 block=512 grid=3 stream]",
                  "[forward vec=1 team=512 block=512 grid=3 stream]", "[backward vec=1 team=512 block=512 grid=2 stream]",
                  "[forward vec=8 team=1024 block=1024 grid=3 regs] [backward vec=8 team=512 block=512 grid=2 stream]"):
        assert any(shape in line for line in lines), (shape, lines)  # the cases cover these launches
