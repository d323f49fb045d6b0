"""The paged C++ API as a C++ program sees it (installed headers and libruDNN): a host schedule
validated and packed, decode attention over two pages, the error naming the table row."""

import os
import shutil
import subprocess

import pytest

import rudnn

PROGRAM = r"""
#include <rudnn/paged.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

using namespace rudnn;

static Tensor t1(void* p, DType d, std::int64_t n) { return Tensor::contiguous(p, d, Device{}, &n, 1); }

int main() {
  // One sequence of length 3 in pages {2, 0} of page_size 2; one decode query at position 2.
  std::int64_t tables[2] = {2, 0}, lengths[1] = {3}, seq[1] = {0}, pos[1] = {2};
  const std::int64_t tshape[2] = {1, 2};
  PagedScheduleArgs s;
  s.page_size = 2;
  s.pages = 3;
  s.tables = Tensor::contiguous(tables, DType::i64, Device{}, tshape, 2);
  s.lengths = t1(lengths, DType::i64, 1);
  s.sequence_ids = t1(seq, DType::i64, 1);
  s.positions = t1(pos, DType::i64, 1);
  std::int32_t pt[2], pl[1], ps[1], pp[1];
  PagedMetadata m;
  m.page_size = 2;
  m.tables = Tensor::contiguous(pt, DType::i32, Device{}, tshape, 2);
  m.lengths = t1(pl, DType::i32, 1);
  m.sequence_ids = t1(ps, DType::i32, 1);
  m.positions = t1(pp, DType::i32, 1);
  const PagedScheduleInfo info = paged_pack_schedule(s, m);
  if (info.max_pages != 2 || info.max_length != 3 || pt[0] != 2) return 1;

  // q = 0: uniform weights over the 3 keys; v[t] = t + 1 -> out = 2.
  float q[1] = {0.0f}, k[3 * 2] = {}, v[3 * 2] = {}, out[1] = {}, lse[1] = {};
  v[2 * 2 + 0] = 1;  // position 0: page 2 slot 0
  v[2 * 2 + 1] = 2;  // position 1: page 2 slot 1
  v[0 * 2 + 0] = 3;  // position 2: page 0 slot 0
  v[0 * 2 + 1] = 100;  // page 0 slot 1: past the sequence, never read
  const std::int64_t qshape[3] = {1, 1, 1}, cshape[4] = {3, 2, 1, 1};
  PagedAttentionArgs a;
  a.plan = m;
  a.q = Tensor::contiguous(q, DType::f32, Device{}, qshape, 3);
  a.k_cache = Tensor::contiguous(k, DType::f32, Device{}, cshape, 4);
  a.v_cache = Tensor::contiguous(v, DType::f32, Device{}, cshape, 4);
  a.scale = 1.0;
  a.causal = true;
  a.out = Tensor::contiguous(out, DType::f32, Device{}, qshape, 3);
  const std::int64_t lshape[2] = {1, 1};
  Tensor l = Tensor::contiguous(lse, DType::f32, Device{}, lshape, 2);
  a.lse = &l;
  paged_attention(a);
  if (std::fabs(out[0] - 2.0f) > 1e-6f || std::fabs(lse[0] - std::log(3.0f)) > 1e-6f) return 2;

  tables[1] = 7;  // out of range
  try {
    paged_validate_schedule(s);
  } catch (const Error& e) {
    std::printf("%s\n", e.what());
    return e.kind() == ErrorKind::value ? 0 : 3;
  }
  return 4;
}
"""


def test_paged_cpp_program(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    prefix = rudnn.cmake_prefix()
    src = tmp_path / "paged.cpp"
    src.write_text(PROGRAM)
    exe = tmp_path / "paged"
    libdir = os.path.join(prefix, "lib")
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{prefix}/include", str(src), f"-L{libdir}",
                    "-l:libruDNN.so.0", f"-Wl,-rpath,{libdir}", "-o", str(exe)], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result
    assert result.stdout.strip() == "HostPlan: tables[0][1] = 7 >= pages = 3"
