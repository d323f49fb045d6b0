"""Compile-time checks of the sm90a flash attention kernels (no GPU needed): ptxas's report for
sm_90a must not say that it serialized a kernel's wgmma (C7514, "wgmma.mma_async instructions are
serialized": then every wgmma waits for the previous one and nothing overlaps the tensor cores;
the warp-specialized forward had this until its next-block GEMM stopped being issued under a
branch) or had to inject a warpgroup.arrive (C7519: registers of a wgmma written after the
kernel's own fence); and at D = 128 the plain instantiations (kPlain: no mask, bias or softcap;
causal and window by position; what most calls run) must not spill registers (the 128-key blocks of the warp-specialized
forward hold 64 score floats per thread beside O's 64 and P's 32: a spill there would be paid in
every key block). Compiles one translation unit per kernel family at D = 128 (and the two-warpgroup
backward at D = 256, which may spill) the way the library's build does. Skipped without nvcc or
CUTLASS's headers."""

import os
import re
import shutil
import subprocess

import pytest

from util import ROOT, cutlass_include

FILES = ["flash_fwd_sm90_d128.cu", "flash_fwd_sm90ws_d128.cu", "flash_bwd_sm90_d128.cu", "flash_bwd_sm90_d256.cu",
         "flash_bwd_sm90ws_d128.cu"]


_REPORTS = {}  # file name -> ptxas report: each file is compiled once for all the tests here


def _ptxas_report(name, tmp_path_factory):
    if name in _REPORTS:
        return _REPORTS[name]
    nvcc, cutlass = shutil.which("nvcc"), cutlass_include()
    if not (nvcc and cutlass):
        pytest.skip("needs nvcc and CUTLASS's headers")
    tmp_path = tmp_path_factory.mktemp("ptxas")
    cmd = [nvcc, "-O3", "-DNDEBUG", "-std=c++17", "--generate-code=arch=compute_90a,code=[sm_90a]",
           "--expt-relaxed-constexpr", "-DRUDNN_WITH_CUDA=1", f"-I{os.path.join(ROOT, 'cpp', 'include')}",
           f"-I{os.path.join(ROOT, 'cpp', 'src')}", "-isystem", cutlass, "-Xptxas", "-v", "-c",
           os.path.join(ROOT, "cpp", "src", "attention", name), "-o", str(tmp_path / "kernel.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    _REPORTS[name] = result.stdout + result.stderr
    return _REPORTS[name]


@pytest.mark.parametrize("name", FILES)
def test_sm90_wgmma_pipeline_kept(name, tmp_path_factory):
    report = _ptxas_report(name, tmp_path_factory)
    assert "Compiling entry function" in report, "ptxas printed no report"
    losses = [line for line in report.splitlines()
              if any(code in line for code in ("C7514", "C7519", "Potential Performance Loss", "is injected"))]
    assert not losses, "\n".join(losses)


def _plain_spills(report):
    """{kernel: spill-store bytes} of the plain (kPlain = true) flash kernel instantiations: ptxas
    prints each entry's "Function properties for <mangled name>" line, then its stack and spills."""
    spills, lines = {}, report.splitlines()
    for line, stats in zip(lines, lines[1:]):
        name = re.search(r"Function properties for (\S+)", line)
        if name and "kernel" in name.group(1) and "Lb1E" in name.group(1):
            spills[name.group(1)] = int(re.search(r"(\d+) bytes spill stores", stats).group(1))
    return spills


@pytest.mark.parametrize("name", [f for f in FILES if "d128" in f])
def test_sm90_plain_kernels_do_not_spill(name, tmp_path_factory):
    spills = _plain_spills(_ptxas_report(name, tmp_path_factory))
    assert spills, "no plain kernel instantiation in the report"
    assert not any(spills.values()), spills
