"""Shared test helpers: devices, dtypes and the FlashAttention-style error budget."""

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# Below these relative errors a result is as good as float32/f16/bf16 arithmetic allows,
# whatever the same-dtype torch result happened to get.
FLOOR = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_close_to_oracle(ours, torch_same_dtype, oracle64, what="result", dtype=None, scale=None):
    """Our error against the float64 oracle is at most twice that of torch computing
    in the same dtype (plus a floor of a few ulps of `dtype`, default ours.dtype,
    relative to `scale`, default max|oracle|; pass the size of the terms that cancel when
    the result is much smaller than its inputs)."""
    assert ours.shape == oracle64.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(oracle64.shape)}"
    if ours.numel() == 0:
        return
    ours_c = ours.detach().cpu()
    scale = max(scale if scale is not None else oracle64.abs().max().item(), 1e-30)
    err = max_abs(ours_c, oracle64)
    torch_err = max_abs(torch_same_dtype.detach().cpu(), oracle64)
    budget = 2 * torch_err + FLOOR[dtype or ours.dtype] * scale
    assert err <= budget, f"{what}: max error {err:.3g} > budget {budget:.3g} (torch same-dtype error {torch_err:.3g})"


def rand(shape, dtype, device="cpu", seed=0, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype).to(device)


# ---- host emulators of CUDA kernels (tests/emulation/) --------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_include():
    """The CUDA toolkit's include directory (for cuda_fp16.h & co. on the host), or None."""
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        inc = os.path.join(root, "include") if root else ""
        if inc and os.path.exists(os.path.join(inc, "cuda_fp16.h")):
            return inc
    nvcc = shutil.which("nvcc")
    if nvcc:
        inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include")
        if os.path.exists(os.path.join(inc, "cuda_fp16.h")):
            return inc
    return None


def cutlass_include():
    """CUTLASS/CuTe headers of the pinned nvidia-cutlass wheel, or None."""
    try:
        import cutlass_library
    except ImportError:
        return None
    inc = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    return inc if os.path.exists(os.path.join(inc, "cute", "tensor.hpp")) else None


def build_emulator(source, kernels_inc, build_dir, needs_cutlass=False, defines=()):
    """Compiles tests/emulation/<source> with the extracted kernel text `kernels_inc` and the
    preprocessor `defines` ("NAME=VALUE"); skips the test when g++ (C++20), the CUDA headers or
    (if needed) CUTLASS's headers are missing."""
    cxx, cuda_inc = shutil.which("g++"), cuda_include()
    cutlass_inc = cutlass_include() if needs_cutlass else None
    if not (cxx and cuda_inc and (cutlass_inc or not needs_cutlass)):
        pytest.skip("needs g++, the CUDA toolkit headers" + (" and CUTLASS headers" if needs_cutlass else ""))
    (build_dir / "kernels.inc").write_text(kernels_inc)
    exe = build_dir / os.path.splitext(source)[0]
    cmd = [cxx, "-std=c++20", "-O1", "-pthread", "-w", f"-I{build_dir}", f"-I{os.path.join(ROOT, 'cpp', 'src')}",
           f"-I{os.path.join(ROOT, 'cpp', 'include')}", f"-I{cuda_inc}", f"-I{os.path.join(cuda_inc, 'cccl')}"]
    cmd += [f"-I{cutlass_inc}"] if cutlass_inc else []
    cmd += [f"-D{d}" for d in defines]
    cmd += [os.path.join(ROOT, "tests", "emulation", source), os.path.join(ROOT, "cpp", "src", "core", "tensor.cpp"),
            "-o", str(exe)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return exe


def emu_array_bits(t):
    """A tensor as the emulators' raw files hold it: bfloat16 as its 16-bit patterns, else float32."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().float().numpy()


def emu_array_from_file(path, shape, dtype):
    """The inverse of emu_array_bits for an emulator's output file."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.fromfile(path, np.uint16).astype(np.int16)).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(np.fromfile(path, np.float32)).reshape(shape)
