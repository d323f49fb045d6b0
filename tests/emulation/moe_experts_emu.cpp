// Host emulator of the "scalar" SwiGLU experts CUDA kernels (tests/test_moe_emulation.py builds
// and runs it): the anonymous namespace of cpp/src/moe/experts_scalar_cuda.cu (row_tiles_kernel,
// swiglu_forward_kernel, rows_gemm_kernel, swiglu_backward_kernel, weight_grad_kernel and the
// workspace carving), extracted by the test into kernels.inc, run on the CPU through
// emu_runtime.hpp in the launches experts_forward_cuda and experts_backward_cuda make (replayed
// below, surplus row-tile blocks included), against the CPU backend: y, a and b of the training
// forward, then dx and the three float32 weight gradients of the backward, within one rounding of
// the dtype relative to each row's (or weight matrix row's) largest value, the kernels adding the
// dx products in another order than the CPU. Cases: experts without rows, segments that end
// inside a 16-row tile, I and H that are not multiples of 16, one expert, all rows in the last
// of nine, every dtype; x and dy with padded rows. Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"
#include "emu_vote.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "moe/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "moe/cpu.cpp"
#include "moe/validate.cpp"

#include "emu_keywords.hpp"

// cuda_common.cuh without its CUDA headers (already included above, before the macros).
#include "moe/cuda_common.cuh"

// The device helpers whose names the CPU backend (moe/cpu.cpp) also defines, named here so that
// the kernels' calls are not ambiguous.
namespace rudnn::moe::emu_k {
using cuda::from_float;
using cuda::round_to;
using cuda::sigmoid;
using cuda::to_float;
}  // namespace rudnn::moe::emu_k

// namespace rudnn::moe { namespace emu_k { using namespace cuda; ...experts_scalar_cuda.cu's kernels... } }
#include "kernels.inc"

#include "emu_arrays.hpp"
#include "moe_emu_common.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::moe;
using i64 = std::int64_t;

using emu::device_types;

EmuDim3 grid_of(dim3 g) { return EmuDim3{g.x, g.y, g.z}; }

// experts_forward_cuda's launches (training: a and b kept).
template <class T>
void forward_emulated(const MoeExpertsForwardArgs& a, const ExpertsProblem& p) {
  namespace k = emu_k;
  const k::Workspace ws = k::carve(*a.workspace, p, a.x.dtype, 1);
  const int* offsets = a.offsets.ptr<int>();
  emu_launch(EmuDim3{1, 1, 1}, 32, 1, 0, [&] { k::row_tiles_kernel(offsets, p.experts, p.rows, ws.tile_offsets); });
  const k::RowTiles tiles{offsets, ws.tile_offsets, p.experts, p.rows};
  T* h = static_cast<T*>(ws.buffers[0]);
  emu_launch(grid_of(k::row_grid(p, p.inter)), k::kTileThreads, 1, 0, [&] {
    k::swiglu_forward_kernel<T>(a.x.ptr<T>(), p.x_stride, a.gate.ptr<T>(), a.up.ptr<T>(), p.hidden, p.inter, tiles, h,
                                a.gate_pre->ptr<T>(), a.up_pre->ptr<T>());
  });
  emu_launch(grid_of(k::row_grid(p, p.hidden)), k::kTileThreads, 1, 0, [&] {
    k::rows_gemm_kernel<T, true>(h, a.down.ptr<T>(), nullptr, nullptr, p.inter, p.inter, p.hidden, tiles,
                                 a.y.ptr<T>(), p.y_stride);
  });
}

// experts_backward_cuda's launches.
template <class T>
void backward_emulated(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p) {
  namespace k = emu_k;
  const k::Workspace ws = k::carve(*a.workspace, p, a.x.dtype, 3);
  const int* offsets = a.offsets.ptr<int>();
  emu_launch(EmuDim3{1, 1, 1}, 32, 1, 0, [&] { k::row_tiles_kernel(offsets, p.experts, p.rows, ws.tile_offsets); });
  const k::RowTiles tiles{offsets, ws.tile_offsets, p.experts, p.rows};
  const auto weight_grid = [&](i64 R, i64 C) {
    return EmuDim3{unsigned((C + k::kTile - 1) / k::kTile), unsigned((R + k::kTile - 1) / k::kTile),
                   unsigned(p.experts)};
  };
  T* h = static_cast<T*>(ws.buffers[0]);
  T* da = static_cast<T*>(ws.buffers[1]);
  T* db = static_cast<T*>(ws.buffers[2]);
  emu_launch(grid_of(k::row_grid(p, p.inter)), k::kTileThreads, 1, 0, [&] {
    k::swiglu_backward_kernel<T>(a.dy.ptr<T>(), p.dy_stride, a.down.ptr<T>(), a.gate_pre.ptr<T>(), a.up_pre.ptr<T>(),
                                 p.hidden, p.inter, tiles, h, da, db);
  });
  emu_launch(grid_of(k::row_grid(p, p.hidden)), k::kTileThreads, 1, 0, [&] {
    k::rows_gemm_kernel<T, false>(da, a.gate.ptr<T>(), db, a.up.ptr<T>(), p.inter, p.inter, p.hidden, tiles,
                                  a.dx.ptr<T>(), p.y_stride);
  });
  emu_launch(weight_grid(p.inter, p.hidden), k::kTileThreads, 1, 0, [&] {
    k::weight_grad_kernel<T>(da, p.inter, a.x.ptr<T>(), p.x_stride, p.inter, p.hidden, offsets, p.rows,
                             a.dgate.ptr<float>());
  });
  emu_launch(weight_grid(p.inter, p.hidden), k::kTileThreads, 1, 0, [&] {
    k::weight_grad_kernel<T>(db, p.inter, a.x.ptr<T>(), p.x_stride, p.inter, p.hidden, offsets, p.rows,
                             a.dup.ptr<float>());
  });
  emu_launch(weight_grid(p.hidden, p.inter), k::kTileThreads, 1, 0, [&] {
    k::weight_grad_kernel<T>(a.dy.ptr<T>(), p.dy_stride, h, p.inter, p.hidden, p.inter, offsets, p.rows,
                             a.ddown.ptr<float>());
  });
}

// [rows, cols] rows `stride` apart.
emu::Array rows_array(DType dtype, i64 rows, i64 cols, i64 stride, std::uint32_t seed, float scale = 1.0f) {
  emu::Array a = emu::make(dtype, {rows, stride}, seed, true, scale);
  a.t.shape[1] = cols;
  return a;
}

bool run_case(const char* name, DType dtype, std::vector<std::int32_t> offsets, i64 H, i64 I) {
  const int E = int(offsets.size()) - 1;
  const i64 N = offsets.back(), stride = H + 3;
  emu::Array x = rows_array(dtype, N, H, stride, 1), dy = rows_array(dtype, N, H, stride, 2);
  emu::Array gate = emu::make(dtype, {E, I, H}, 3, true, 0.25f), up = emu::make(dtype, {E, I, H}, 4, true, 0.25f);
  emu::Array down = emu::make(dtype, {E, H, I}, 5, true, 0.25f);
  const i64 e1[1] = {E + 1};
  Tensor off = Tensor::contiguous(offsets.data(), DType::i32, Device{}, e1, 1);
  struct Outputs {
    emu::Array y, a, b, dx, dgate, dup, ddown;
  };
  auto outputs = [&] {
    return Outputs{emu::make(dtype, {N, H}, 0, false), emu::make(dtype, {N, I}, 0, false),
                   emu::make(dtype, {N, I}, 0, false), emu::make(dtype, {N, H}, 0, false),
                   emu::make(DType::f32, {E, I, H}, 0, false), emu::make(DType::f32, {E, I, H}, 0, false),
                   emu::make(DType::f32, {E, H, I}, 0, false)};
  };
  Outputs cpu = outputs(), got = outputs();
  auto forward_args = [&](Outputs& o) {
    MoeExpertsForwardArgs f;
    f.x = x.t;
    f.offsets = off;
    f.gate = gate.t;
    f.up = up.t;
    f.down = down.t;
    f.y = o.y.t;
    f.gate_pre = &o.a.t;
    f.up_pre = &o.b.t;
    return f;
  };
  auto backward_args = [&](Outputs& o, const Outputs& pre) {
    MoeExpertsBackwardArgs b;
    b.dy = dy.t;
    b.x = x.t;
    b.offsets = off;
    b.gate = gate.t;
    b.up = up.t;
    b.down = down.t;
    b.gate_pre = pre.a.t;
    b.up_pre = pre.b.t;
    b.dx = o.dx.t;
    b.dgate = o.dgate.t;
    b.dup = o.dup.t;
    b.ddown = o.ddown.t;
    return b;
  };
  const MoeExpertsForwardArgs fc = forward_args(cpu);
  const ExpertsProblem p = validate_experts_forward(fc);
  experts_forward_cpu(fc, p);
  const MoeExpertsBackwardArgs bc = backward_args(cpu, cpu);  // the backward of the CPU's a and b for both
  const ExpertsProblem pb = validate_experts_backward(bc);
  experts_backward_cpu(bc, pb);

  std::vector<std::uint64_t> workspace((emu_k::workspace_bytes(p, dtype, 3) + 7) / 8 + 1);
  const i64 ws_shape[1] = {i64(workspace.size() * 8)};
  const Tensor ws = Tensor::contiguous(workspace.data(), DType::u8, Device{}, ws_shape, 1);
  MoeExpertsForwardArgs fg = forward_args(got);
  fg.workspace = &ws;
  MoeExpertsBackwardArgs bg = backward_args(got, cpu);
  bg.workspace = &ws;
  device_types(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    forward_emulated<D>(fg, p);
    backward_emulated<D>(bg, pb);
  });
  const bool ok = emu::close_rows(got.y.t, cpu.y.t, N, H, H, "y") &&
                  emu::close_rows(got.a.t, cpu.a.t, N, I, I, "a") && emu::close_rows(got.b.t, cpu.b.t, N, I, I, "b") &&
                  emu::close_rows(got.dx.t, cpu.dx.t, N, H, H, "dx") &&
                  emu::close_rows(got.dgate.t, cpu.dgate.t, E * I, H, H, "dgate") &&
                  emu::close_rows(got.dup.t, cpu.dup.t, E * I, H, H, "dup") &&
                  emu::close_rows(got.ddown.t, cpu.ddown.t, E * H, I, I, "ddown");
  std::printf("%s %s E=%d N=%lld H=%lld I=%lld %s\n", name, dtype_name(dtype), E, static_cast<long long>(N),
              static_cast<long long>(H), static_cast<long long>(I), ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool ok = true;
  ok = run_case("idle_and_partial_tiles", DType::f32, {0, 5, 5, 21, 37}, 40, 24) && ok;
  ok = run_case("idle_and_partial_tiles", DType::bf16, {0, 5, 5, 21, 37}, 40, 24) && ok;
  ok = run_case("one_expert", DType::f16, {0, 50}, 16, 32) && ok;
  ok = run_case("last_of_nine", DType::bf16, {0, 0, 0, 0, 0, 0, 0, 0, 0, 19}, 24, 8) && ok;
  return ok ? 0 : 1;
}
