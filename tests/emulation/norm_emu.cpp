// Host emulator of the LayerNorm / RMSNorm forward CUDA kernels (tests/test_norm_emulation.py
// builds and runs it). The kernels' own source (norm_fwd_cuda.cu from `using namespace kern;` to
// its emulation mark, with norm/kernels.cuh compiled for the host: RUDNN_HOST_EMULATOR turns its
// st.global pieces into plain stores) and the host planner's team shapes (norm_cuda.cu's
// row_shape) run on the CPU through emu_runtime.hpp, a std::thread per CUDA thread. The grid is
// spread as spread_rows does, for a device of kSms SMs holding one block each, so that blocks walk
// several rows and teams idle past the end. Each case compares y, mean, rstd and residual_out with
// the CPU backend: residual_out bitwise (one rounding of x + residual in both), the statistics to
// float32 rounding, y to 2 ulps of its dtype plus float32 sum error relative to the largest |y| (the
// kernels sum in float32 in a butterfly order, the CPU backend in double). Covers sub-warp and multi-warp teams, the two-read stream kernel, the
// 16-byte and the single-element paths, weight and bias present or absent, f32/f16/bf16 and f32
// parameters with 16-bit x. Where the planner picks norm_forward_regs_pipelined (16-byte chunks,
// teams of <= 256 threads), the case also runs norm_forward_regs on the same inputs and requires
// the same bits in every output. Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include <cmath>
#include <cstring>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "norm/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "norm/cpu.cpp"
#include "norm/validate.cpp"

#define RUDNN_HOST_EMULATOR 1
#include "emu_keywords.hpp"

// Device math the kernels call, on the host.
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float __fdividef(float a, float b) { return a / b; }

#include "norm/kernels.cuh"

namespace rudnn::norm::plan {
// norm_cuda.cu's planning helpers and row_shape (extracted by the test)
#include "plan.inc"
}  // namespace rudnn::norm::plan

// norm_fwd_cuda.cu's kernels (extracted by the test), outside rudnn::norm so that its CPU
// backend's host from_float does not meet kern's device one
namespace rudnn::norm_emu {
namespace kern = rudnn::norm::kern;
#include "kernels.inc"
}  // namespace rudnn::norm_emu

#include "emu_arrays.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::norm;
using i64 = std::int64_t;

constexpr int kSms = 3;  // blocks of the emulated device (one resident per SM)

struct Case {
  const char* name;
  NormKind kind;
  DType dtype, param_dtype;
  i64 rows, hidden;
  bool weight, bias, residual;
};

float ulp_of(DType dtype, float v) {
  const int bits = dtype == DType::bf16 ? 8 : dtype == DType::f16 ? 11 : 24;
  return std::ldexp(std::max(std::fabs(v), 1e-3f), 1 - bits);
}

// Which register kernel runs: the planner's choice, or norm_forward_regs whatever it chose.
enum class Pick { planner, regs1024 };

// Runs the forward kernels on args' arrays; returns whether the pipelined kernel ran.
template <class T, class P>
bool launch(const NormForwardArgs& args, const ForwardProblem& pr, Pick pick) {
  using namespace rudnn::norm_emu;
  const bool layer = args.kind == NormKind::layer;
  ForwardParams<T, P> p{};
  p.x = args.x.ptr<const T>();
  p.y = args.y.ptr<T>();
  p.residual = args.residual ? args.residual->ptr<const T>() : nullptr;
  p.residual_out = args.residual ? args.residual_out->ptr<T>() : nullptr;
  p.weight = args.weight ? args.weight->ptr<const P>() : nullptr;
  p.bias = layer && args.bias ? args.bias->ptr<const P>() : nullptr;
  p.mean = layer && args.mean ? args.mean->ptr<float>() : nullptr;
  p.rstd = args.rstd ? args.rstd->ptr<float>() : nullptr;
  p.x_rows = pr.x, p.residual_rows = pr.residual, p.y_rows = pr.y, p.residual_out_rows = pr.residual_out;
  p.mean_rows = pr.mean, p.rstd_rows = pr.rstd;
  p.rows = pr.rows, p.hidden = pr.hidden, p.eps = args.eps, p.layer = layer;
  constexpr int kVec = kern::kVec16<T>;
  const bool vec = pr.hidden % kVec == 0;  // the arrays here are dense and 16-byte aligned
  bool pipelined = false;
  auto run = [&](auto vec_tag) {
    constexpr int VEC = decltype(vec_tag)::value;
    plan::RowLaunch l = plan::row_shape(p.hidden / VEC, kern::kSlots, kern::kSlots);
    pipelined = pick == Pick::planner && plan::forward_pipelined(l, VEC, rows_collapsed(p));
    const i64 teams = l.block / l.team;
    const i64 groups = (p.rows + teams - 1) / teams;
    const i64 blocks = std::min<i64>(groups, kSms);
    p.team = l.team;
    p.rows_per_block = (groups + blocks - 1) / blocks * teams;
    const unsigned grid = unsigned((p.rows + p.rows_per_block - 1) / p.rows_per_block);
    if (pick == Pick::planner)
      std::printf("[vec=%d team=%d block=%d grid=%u rows/block=%lld %s] ", VEC, l.team, l.block, grid,
                  (long long)p.rows_per_block, l.stream ? "stream" : pipelined ? "pipelined" : "regs");
    emu_launch(EmuDim3{grid, 1, 1}, unsigned(l.block), 1, 0, [&] {
      if (l.stream) {
        norm_forward_stream<T, P, VEC>(p);
      } else if (pipelined) {
        if constexpr (VEC > 1) norm_forward_regs_pipelined<T, P, VEC>(p);
      } else {
        norm_forward_regs<T, P, VEC>(p);
      }
    });
  };
  if (vec)
    run(std::integral_constant<int, kVec>{});
  else
    run(std::integral_constant<int, 1>{});
  return pipelined;
}

bool run_case(const Case& c) {
  const i64 R = c.rows, H = c.hidden;
  emu::Array x = emu::make(c.dtype, {R, H}, 1), res = emu::make(c.dtype, {R, H}, 2);
  emu::Array w = emu::make(c.param_dtype, {H}, 3), b = emu::make(c.param_dtype, {H}, 4);
  auto outputs = [&] {
    return std::array<emu::Array, 4>{emu::make(c.dtype, {R, H}, 0, false), emu::make(DType::f32, {R}, 0, false),
                                     emu::make(DType::f32, {R}, 0, false), emu::make(c.dtype, {R, H}, 0, false)};
  };
  auto ref = outputs(), got = outputs(), regs = outputs();
  auto args_of = [&](std::array<emu::Array, 4>& o) {
    NormForwardArgs a;
    a.kind = c.kind;
    a.x = x.t;
    a.weight = c.weight ? &w.t : nullptr;
    a.bias = c.bias && c.kind == NormKind::layer ? &b.t : nullptr;
    a.residual = c.residual ? &res.t : nullptr;
    a.residual_out = c.residual ? &o[3].t : nullptr;
    a.y = o[0].t;
    a.mean = c.kind == NormKind::layer ? &o[1].t : nullptr;
    a.rstd = &o[2].t;
    a.eps = 1e-5f;
    return a;
  };
  const NormForwardArgs ra = args_of(ref), ga = args_of(got), na = args_of(regs);
  const ForwardProblem pr = validate_forward(ra);
  forward_cpu(ra, pr);
  const ForwardProblem pg = validate_forward(ga), pn = validate_forward(na);
  std::printf("%s ", c.name);
  bool pipelined = false;
  core::dispatch_float<__half, __nv_bfloat16>(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (pg.param_dtype == DType::f32) {
      pipelined = launch<T, float>(ga, pg, Pick::planner);
      if (pipelined) launch<T, float>(na, pn, Pick::regs1024);
    } else {
      pipelined = launch<T, T>(ga, pg, Pick::planner);
      if (pipelined) launch<T, T>(na, pn, Pick::regs1024);
    }
  });
  // The pipelined kernel must give norm_forward_regs's bits in every output (same reduction order
  // and arithmetic per row).
  bool identical = true;
  if (pipelined)
    for (int o = 0; o < 4; ++o) identical = identical && emu::same_bytes(got[o].t, regs[o].t);
  // y: 2 ulps of its dtype plus the float32 sums' error, relative to the largest |y| (an
  // element near zero after the mean's subtraction carries the mean's absolute error).
  float scale = 0;
  for (i64 i = 0; i < R * H; ++i) scale = std::max(scale, std::fabs(emu::value_at(ref[0].t, i)));
  bool ok = true;
  double worst = 0;
  for (i64 i = 0; i < R * H; ++i) {
    const float a = emu::value_at(got[0].t, i), e = emu::value_at(ref[0].t, i);
    const float d = std::fabs(a - e) / (ulp_of(c.dtype, e) + 4e-6f * scale);
    worst = std::max<double>(worst, d);
    ok = ok && d <= 2.0f;
  }
  for (int s : {1, 2}) {
    if (s == 1 && c.kind != NormKind::layer) continue;
    for (i64 r = 0; r < R; ++r) {
      const float a = emu::value_at(got[s].t, r), e = emu::value_at(ref[s].t, r);
      ok = ok && std::fabs(a - e) <= 4e-6f * std::max(1.0f, std::fabs(e));
    }
  }
  if (c.residual)
    ok = ok && std::memcmp(got[3].t.data, ref[3].t.data, std::size_t(R * H) * dtype_size(c.dtype)) == 0;
  if (pipelined) std::printf("%s ", identical ? "bitwise as regs1024" : "DIFFERS from regs1024");
  ok = ok && identical;
  std::printf("worst y %.2f of the budget %s\n", worst, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  const auto L = NormKind::layer, S = NormKind::rms;
  const auto f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
  const Case cases[] = {
      {"layer_bf16_subwarp_teams", L, bf16, bf16, 37, 64, true, true, false},
      {"rms_f16_residual_f32_weight", S, f16, f32, 21, 256, true, false, true},
      {"layer_f32_multiwarp_team", L, f32, f32, 9, 4096, true, true, true},
      {"layer_f16_scalar_path", L, f16, f16, 11, 1001, true, false, false},
      {"rms_bf16_no_weight", S, bf16, bf16, 13, 512, false, false, false},
      {"layer_bf16_stream", L, bf16, bf16, 4, 40000, true, true, true},
      {"rms_f32_stream_scalar", S, f32, f32, 3, 17001, true, false, false},
      // the pipelined kernel: several rows per team (the next row's loads cross rows), the last row
      // of a block, blocks whose rows do not divide by their teams, a partial last slot, one row
      {"layer_bf16_pipelined_rows", L, bf16, bf16, 29, 2048, true, true, true},
      {"rms_f16_pipelined_f32_weight", S, f16, f32, 100, 512, true, false, true},
      {"layer_f32_pipelined_partial_slot", L, f32, f32, 23, 1000, true, false, false},
      {"layer_bf16_pipelined_f32_params", L, bf16, f32, 50, 1024, true, true, false},
      {"rms_bf16_pipelined_subwarp_many_rows", S, bf16, bf16, 1000, 64, true, false, true},
      {"layer_f16_pipelined_one_row", L, f16, f16, 1, 1024, true, true, true},
      {"layer_bf16_team512_regs", L, bf16, bf16, 7, 16384, true, true, true},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
