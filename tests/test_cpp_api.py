"""The installed C++ headers and libruDNN work for a C++ consumer that brings its own dlpack.h."""

import os
import shutil
import subprocess

import pytest

import rudnn

PROGRAM = r"""
#include <ATen/dlpack.h>
#include <rudnn/dlpack.hpp>
#include <rudnn/norm.hpp>
#include <cmath>
#include <cstdio>

int main() {
  // softmax over a DLPack view of a strided [2, 3] window of a [2, 4] buffer.
  float in[8] = {0, 1, 2, 99, 3, 3, 3, 99}, out[6] = {};
  int64_t shape[2] = {2, 3}, in_strides[2] = {4, 1};
  DLTensor x{in, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, in_strides, 0};
  DLTensor y{out, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, nullptr, 0};
  rudnn::softmax_forward(rudnn::from_dlpack(x), rudnn::from_dlpack(y));
  const double e0 = 1.0 / (1.0 + std::exp(1.0) + std::exp(2.0));
  if (std::fabs(out[0] - e0) > 1e-6 || std::fabs(out[4] - 1.0 / 3.0) > 1e-6) return 1;
  DLTensor bad{in, {kDLCPU, 0}, 2, {kDLFloat, 64, 1}, shape, nullptr, 0};
  try {
    rudnn::from_dlpack(bad);
  } catch (const rudnn::Error& e) {
    std::printf("%s\n", e.what());
    return e.kind() == rudnn::ErrorKind::dtype ? 0 : 2;
  }
  return 3;
}
"""


def test_dlpack_consumer_program(tmp_path):
    torch = pytest.importorskip("torch")  # provides a dlpack.h (ATen/dlpack.h)
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    prefix = rudnn.cmake_prefix()
    src = tmp_path / "consumer.cpp"
    src.write_text(PROGRAM)
    exe = tmp_path / "consumer"
    torch_include = os.path.join(os.path.dirname(torch.__file__), "include")
    libdir = os.path.join(prefix, "lib")
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{prefix}/include", f"-I{torch_include}", str(src),
                    f"-L{libdir}", "-l:libruDNN.so.0", f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result
    assert "unsupported DLPack dtype" in result.stdout


def test_package_holds_one_library_file():
    """A wheel cannot hold symlinks: the package must hold libruDNN once, under the SONAME that
    rudnn._C links against (not .so, .so.0 and .so.0.1.0 as three full copies)."""
    lib_dir = os.path.join(rudnn.cmake_prefix(), "lib")
    libs = sorted(f for f in os.listdir(lib_dir) if f.startswith("libruDNN"))
    assert libs == ["libruDNN.so.0"], libs
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf (binutils)")
    dynamic = subprocess.run([readelf, "-d", rudnn._C.__file__], capture_output=True, text=True, check=True).stdout
    assert "[libruDNN.so.0]" in dynamic, dynamic


# Mangled names of libstdc++'s own machinery (streams, locales, the exception runtime). A build
# whose toolchain links libstdc++ statically (the GPU machine's /opt/gcc does) must keep these
# local: exported, they interpose on the process's libstdc++.so and crash torch or rudnn in
# iostream code (seen on the H200 on 2026-11-30; CMakeLists.txt links with --exclude-libs,ALL).
STDLIB_INTERNALS = ("_ZNSt6locale", "_ZNSt8ios_base", "_ZNSo", "_ZNSi", "_ZSt4cout", "__cxa_throw",
                    "__cxa_allocate_exception", "_ZNSt7codecvt", "_ZTVNSt7__cxx1119basic_ostringstream")


@pytest.mark.parametrize("which", ["libruDNN", "_C"])
def test_no_exported_stdlib_internals(which):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils)")
    if which == "libruDNN":
        lib_dir = os.path.join(rudnn.cmake_prefix(), "lib")
        path = next(os.path.join(lib_dir, f) for f in sorted(os.listdir(lib_dir)) if f.startswith("libruDNN.so"))
    else:
        path = rudnn._C.__file__
    symbols = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    exported = [line.split()[-1] for line in symbols.splitlines() if line.split()]
    leaked = [s for s in exported if s.startswith(STDLIB_INTERNALS)]
    assert not leaked, f"{path} exports libstdc++ internals: {leaked[:10]}"
