"""Shared test helpers: devices, dtypes and the FlashAttention-style error budget."""

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# Below these relative errors a result is as good as float32/f16/bf16 arithmetic allows,
# whatever the same-dtype torch result happened to get.
FLOOR = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def jax_gpu():
    """JAX's first GPU device, where JAX has a GPU backend and rudnn was built with CUDA; else None."""
    import rudnn

    if not rudnn.has_cuda:
        return None
    try:
        import jax

        return jax.devices("gpu")[0]
    except (ImportError, RuntimeError):
        return None


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


def nvidia_tool(name):
    """Path of the CUDA binary tool `name` (cuobjdump, nvdisasm): from NVIDIA's wheels that
    requirements-dev.txt installs (site-packages/nvidia/cu13/bin), else from PATH; None if neither."""
    try:
        import nvidia
        for root in nvidia.__path__:
            exe = os.path.join(root, "cu13", "bin", name)
            if os.access(exe, os.X_OK):
                return exe
    except ImportError:
        pass
    return shutil.which(name)


def ccache_env(obj):
    """(launcher, flags, env) for a compile made by the tests into `obj`: ccache with paths hashed
    relative to the clone, in depend mode (the headers from the compiler's -MD file), as
    scripts/install.sh sets it, so a fresh clone reuses what an earlier one compiled;
    ([], [], None) without ccache. RUDNN_TEST_NO_CCACHE=1 compiles without it."""
    ccache = shutil.which("ccache")
    if not ccache or os.environ.get("RUDNN_TEST_NO_CCACHE") == "1":
        return [], [], None
    env = dict(os.environ, CCACHE_BASEDIR=ROOT, CCACHE_NOHASHDIR="1", CCACHE_DEPEND="1")
    return [ccache], ["-MD", "-MF", f"{obj}.d"], env


@contextlib.contextmanager
def build_lock(path):
    """Holds an exclusive lock on `path` + ".lock" while the caller compiles into `path`: the tests
    run in parallel (.ci/run: pytest-xdist), and two workers may build the same emulator or ptxas
    object at once; the second waits, then compiles again through ccache (a hit) instead of
    writing the same files beside the first."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cutlass_include():
    """CUTLASS/CuTe headers of the pinned nvidia-cutlass wheel, or None."""
    try:
        import cutlass_library
    except ImportError:
        return None
    inc = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    return inc if os.path.exists(os.path.join(inc, "cute", "tensor.hpp")) else None


# The hardware atoms' names in the kernel text and their host stand-ins (emu_sm80_atoms.hpp), applied to
# flash_sm80.cuh's text by the emulators that run it (attention's and the paged prefill kernel's).
FLASH_SM80_EDITS = [("extern __shared__ __align__(128) unsigned char smem_raw[];", "unsigned char* smem_raw = emu_smem;"),
                    ("SM80_16x8x16_F32F16F16F32_TN", "EmuMmaF16"), ("SM80_16x8x16_F32BF16BF16F32_TN", "EmuMmaBF16"),
                    ("SM75_U32x4_LDSM_N", "EmuLdsmN"), ("SM75_U16x8_LDSM_T", "EmuLdsmT"),
                    ("SM80_CP_ASYNC_CACHEGLOBAL_ZFILL", "EmuCpAsyncZfill"),
                    ("SM80_CP_ASYNC_CACHEGLOBAL<", "EmuCpAsync<"), ("cp_async_fence()", "emu_cp_async_fence()"),
                    ("cp_async_wait<", "emu_cp_async_wait<")]


def build_emulator(source, kernels_inc, needs_cutlass=False, defines=(), extra_includes=None):
    """Compiles tests/emulation/<source> with the extracted kernel text `kernels_inc` (and more
    extracted texts `extra_includes`: {file name: text}, beside kernels.inc) and the
    preprocessor `defines` ("NAME=VALUE"); skips the test when g++ (C++20), the CUDA headers or
    (if needed) CUTLASS's headers are missing. The build lives in build/emu/<digest of its
    inputs> inside the clone and compiles through ccache (ccache_env), so a later run, in this
    clone or a fresh one, recompiles only what changed: the emulators are most of the
    emulation tests' time."""
    cxx, cuda_inc = shutil.which("g++"), cuda_include()
    cutlass_inc = cutlass_include() if needs_cutlass else None
    if not (cxx and cuda_inc and (cutlass_inc or not needs_cutlass)):
        pytest.skip("needs g++, the CUDA toolkit headers" + (" and CUTLASS headers" if needs_cutlass else ""))
    stem = os.path.splitext(source)[0]
    extra = sorted((extra_includes or {}).items())
    digest = hashlib.sha256("\0".join([source, kernels_inc, *defines, *(n + "\0" + t for n, t in extra)])
                            .encode()).hexdigest()[:16]
    build_dir = os.path.join(ROOT, "build", "emu", f"{stem}-{digest}")
    with build_lock(build_dir):
        return _build_emulator_in(build_dir, source, stem, cxx, cuda_inc, cutlass_inc, defines,
                                  [("kernels.inc", kernels_inc), *extra])


def _build_emulator_in(build_dir, source, stem, cxx, cuda_inc, cutlass_inc, defines, texts):
    os.makedirs(build_dir, exist_ok=True)
    for name, text in texts:
        inc = os.path.join(build_dir, name)
        if not os.path.exists(inc) or open(inc).read() != text:
            with open(inc + ".tmp", "w") as f:
                f.write(text)
            os.replace(inc + ".tmp", inc)
    flags = ["-std=c++20", "-O1", "-pthread", "-w", f"-I{build_dir}", f"-I{os.path.join(ROOT, 'cpp', 'src')}",
             f"-I{os.path.join(ROOT, 'cpp', 'include')}", f"-I{cuda_inc}", f"-I{os.path.join(cuda_inc, 'cccl')}"]
    flags += [f"-I{cutlass_inc}"] if cutlass_inc else []
    flags += [f"-D{d}" for d in defines]
    objects = []
    core = os.path.join(ROOT, "cpp", "src", "core")
    # the validate steps the emulators compile in call core's out-of-line checks
    for src in (os.path.join(ROOT, "tests", "emulation", source), os.path.join(core, "tensor.cpp"),
                os.path.join(core, "aliasing.cpp")):
        obj = os.path.join(build_dir, os.path.splitext(os.path.basename(src))[0] + ".o")
        launcher, depfile, env = ccache_env(obj)
        result = subprocess.run(launcher + [cxx, *flags, *depfile, "-c", src, "-o", obj], capture_output=True,
                                text=True, cwd=ROOT, env=env)
        assert result.returncode == 0, result.stderr[-4000:]
        objects.append(obj)
    exe = os.path.join(build_dir, stem)
    # linked beside it, then renamed: another worker may be running the previous link of the same exe
    result = subprocess.run([cxx, "-pthread", *objects, "-o", f"{exe}.{os.getpid()}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    os.replace(f"{exe}.{os.getpid()}", exe)
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


def run_with_autotune_cache(code, path):
    """Runs Python `code` in a fresh process with RUDNN_AUTOTUNE_CACHE=<path>; its stdout, stripped
    (the tests of the on-disk autotune cache: what one process records, the next reads)."""
    env = {**os.environ, "RUDNN_AUTOTUNE_CACHE": str(path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
