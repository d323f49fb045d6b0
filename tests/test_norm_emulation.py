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

import pytest

from util import ROOT, build_emulator

MARK = "// (tests/emulation/norm_emu.cpp runs everything from"


def _between(path, start, end):
    src = open(os.path.join(ROOT, "cpp", "src", "norm", path)).read()
    return src[src.index(start):src.index(end)]


def _emulator():
    kernels = _between("norm_fwd_cuda.cu", "using namespace kern;", MARK)
    backward = _between("norm_bwd_cuda.cu", "using namespace kern;", MARK)
    # a cluster kernel's blocks run at once in the emulator, where __shared__ statics would be one
    # variable for all of them: the cluster kernels keep their shared memory in the dynamic buffer
    for text, name in ((kernels, "norm_forward_cluster("), (backward, "norm_backward_cluster(")):
        cluster = text[text.index(name):]
        cluster = cluster[:cluster.index("\n}\n")]
        assert cluster.count("__shared__") == 1 and "extern __shared__ float cluster_smem[];" in cluster, name
    cluster_smem = ("extern __shared__ float cluster_smem[];", "float* cluster_smem = reinterpret_cast<float*>(emu_smem);")
    kernels, backward = kernels.replace(*cluster_smem), backward.replace(*cluster_smem)
    # hooks for the planted ordering bugs of `norm_emu cluster_planted` (inactive without EMU_PLANT)
    assert kernels.count("share.allreduce(v);") == 1
    kernels = kernels.replace("share.allreduce(v);", "emu_planted_allreduce(share, v);")
    edit = "  cluster_barrier();  // no block leaves"
    assert kernels.count(edit) == 1
    kernels = kernels.replace(edit, '  if (!emu_planted("exit")) cluster_barrier();  // no block leaves')
    edit = "extern __shared__ float4 wgrad_smem[];"
    assert backward.count(edit) == 3  # the regs, pipelined and stream kernels' accumulators
    backward = backward.replace(edit, "float4* wgrad_smem = reinterpret_cast<float4*>(emu_smem);")
    softmax = _between("softmax_cuda.cu", "using namespace kern;", MARK)
    for name in ("softmax_forward_cluster(", "softmax_backward_cluster("):
        cluster = softmax[softmax.index(name):]
        cluster = cluster[:cluster.index("\n}\n")]
        assert cluster.count("__shared__") == 1 and "extern __shared__ float cluster_smem[];" in cluster, name
    softmax = softmax.replace(*cluster_smem)
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
    assert len(lines) == 19, lines  # 18 cases and the cluster plan's table
    for shape in ("[vec=8 cluster=3 row_groups=2]", "[vec=8 cluster=8 row_groups=1]", "[vec=8 cluster=2 row_groups=2]",
                  "[vec=4 cluster=2 row_groups=3]", "cluster plan table ok"):
        assert any(shape in line for line in lines), (shape, lines)  # the cluster kernel's launches
    for shape in ("stream", "regs]", "pipelined]", "vec=1", "team=2 ", "team=256", "team=512 block=512 grid=3"):
        assert any(shape in line for line in lines), (shape, lines)  # the cases cover these launches
    # every pipelined launch was also run by norm_forward_regs and gave the same bits
    pipelined = [line for line in lines if "pipelined]" in line]
    assert len(pipelined) >= 9 and all("bitwise as regs1024" in line for line in pipelined), lines


@pytest.mark.parametrize("plant,hazard", [
    ("parity", "a slot r"),  # rewritten in an epoch of its reads, or read before a barrier orders it
    ("exit", "a block exited with no cluster barrier after a peer's read of its memory"),
])
def test_cluster_ordering_check_catches_planted_bugs(plant, hazard):
    """The cluster kernel with an ordering bug planted (one exchange slot for every reduction; no
    cluster barrier before the blocks exit): the emulator's cluster ordering check reports it, and
    without a plant the same case reports nothing."""
    clean = subprocess.run([str(_emulator()), "cluster_planted"], capture_output=True, text=True, timeout=900)
    assert clean.returncode == 0 and "hazards 0" in clean.stdout and "ordering hazard" not in clean.stderr, (
        clean.stdout + clean.stderr)
    result = subprocess.run([str(_emulator()), "cluster_planted"], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "EMU_PLANT": plant})
    assert result.returncode == 0 and "hazards 0" not in result.stdout, result.stdout + result.stderr
    assert "cluster ordering hazard: " + hazard in result.stderr, result.stderr


def test_norm_backward_kernels_match_the_cpu_backend():
    lines = _run("backward")
    assert len(lines) == 15, lines
    # the cases cover these launches: the three dx kernels, fused weight gradients over one and
    # several splits, the column kernel with one split and with two (then the split reduction)
    for shape in ("regs, wgrad columns splits=1", "regs, wgrad columns splits=2", "vec=8 team=512 block=512 grid=3 "
                  "rows/block=2 smem=160000 stream, wgrad fused splits=3", "vec=1 team=512 block=512 grid=3 rows/block=1 "
                  "smem=136008 stream, wgrad fused splits=3", "regs, wgrad fused splits=4",
                  "pipelined, wgrad fused splits=6", "pipelined, wgrad fused splits=1", "pipelined, wgrad none", "vec=1",
                  "team=4 ", "team=512 block=512",
                  # the cluster dx kernel beside the column kernel, walking rows, and alone
                  "[vec=8 cluster=3 row_groups=2, wgrad columns splits=1]",
                  "[vec=8 cluster=2 row_groups=2, wgrad columns splits=1]", "[vec=4 cluster=4 row_groups=3, wgrad none"):
        assert any(shape in line for line in lines), (shape, lines)
    # every pipelined launch was also run by norm_backward_regs and gave the same dx bits
    pipelined = [line for line in lines if " pipelined, " in line]
    assert len(pipelined) == 6 and all("dx bitwise as regs1024" in line for line in pipelined), lines


def test_softmax_kernels_match_the_cpu_backend():
    lines = _run("softmax")
    assert len(lines) == 8, lines
    for shape in ("[forward vec=8 team=2 ", "[backward vec=8 team=4 ", "[forward vec=1", "[backward vec=1",
                  "[forward vec=8 team=512 block=512 grid=2 stream]", "[backward vec=8 team=512 block=512 grid=3 stream]",
                  "[forward vec=1 team=512 block=512 grid=3 stream]", "[backward vec=1 team=512 block=512 grid=2 stream]",
                  "[forward vec=8 team=1024 block=1024 grid=3 regs] [backward vec=8 team=512 block=512 grid=2 stream]",
                  "[forward vec=8 cluster=3 row_groups=3] [backward vec=8 cluster=5 row_groups=2]",
                  "[forward vec=4 cluster=2 row_groups=2] [backward vec=4 cluster=3 row_groups=2]"):
        assert any(shape in line for line in lines), (shape, lines)  # the cases cover these launches
