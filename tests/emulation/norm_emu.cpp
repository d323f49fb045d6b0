// Host emulator of the LayerNorm / RMSNorm CUDA kernels (tests/test_norm_emulation.py builds and
// runs it: `norm_emu forward` or `norm_emu backward`). The kernels' own source (norm_fwd_cuda.cu and
// norm_bwd_cuda.cu, each from `using namespace kern;` to its emulation mark, with norm/kernels.cuh
// compiled for the host: RUDNN_HOST_EMULATOR turns its st.global pieces into plain stores) and the
// host planner (norm_cuda.cu's row_shape, regs_pipelined, spread_rows_over, wgrad_plan,
// fused_wgrad_launch) run on the CPU through emu_runtime.hpp, a std::thread per CUDA thread, for a
// device of kSms SMs holding one block each (the grid spread as spread_rows does), so that blocks
// walk several rows and teams idle past the end.
//
// Forward: each case compares y, mean, rstd and residual_out with the CPU backend: residual_out
// bitwise (one rounding of x + residual in both), the statistics to float32 rounding, y to 2 ulps
// of its dtype plus float32 sum error relative to the largest |y| (the kernels sum in float32 in a
// butterfly order, the CPU backend in double). Covers sub-warp and multi-warp teams, the two-read
// stream kernel, the 16-byte and the single-element paths, weight and bias present or absent,
// f32/f16/bf16 and f32 parameters with 16-bit x. Where the planner picks norm_forward_regs_pipelined
// (16-byte chunks, teams of <= 256 threads), the case also runs norm_forward_regs on the same inputs
// and requires the same bits in every output.
//
// Softmax (`norm_emu softmax`; softmax_cuda.cu's kernels): y and dx against the CPU backend, to 2
// ulps of the dtype plus float32 error relative to the row's largest value (the kernels' exp is
// ex2.approx for 16-bit rows, their sums float32 in a butterfly order; the CPU's double), over the
// register and two-read kernels of both directions, 16-byte and single-element chunks, rows of
// -inf (NaN, as torch) and rows holding -inf among finite values, and the cluster kernels.
//
// Backward: dx against the CPU backend (2 ulps plus float32 sum error relative to the largest |dx|),
// dweight and dbias to float32 accumulation error relative to the sum of the terms' magnitudes
// (the kernels' order: per team in row order, teams in order, splits in order). Covers the fused
// weight gradients (one and several splits), the column kernel and its split reduction (rows too
// long for the shared-memory accumulators), the register, pipelined and two-read kernels, the
// single-element path, weight absent, float32 weights of 16-bit rows. Where the planner picks
// norm_backward_regs_pipelined, the case also runs norm_backward_regs and requires dx's bits.
// Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include <cmath>
#include <cstring>
#include <limits>

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

// The planted bugs of `norm_emu cluster_planted`, chosen by EMU_PLANT (the test edits the cluster
// kernel's text to call these): "parity" makes every reduction use exchange slot 0, "exit" drops
// the cluster barrier before the blocks exit.
inline bool emu_planted(const char* which) {
  const char* plant = std::getenv("EMU_PLANT");
  return plant != nullptr && std::strcmp(plant, which) == 0;
}
template <class Share, int K>
void emu_planted_allreduce(Share& share, float (&v)[K]) {
  if (emu_planted("parity")) share.parity = 0;
  share.allreduce(v);
}

// norm_fwd_cuda.cu's and norm_bwd_cuda.cu's kernels (extracted by the test), outside rudnn::norm so
// that its CPU backend's host from_float does not meet kern's device one
namespace rudnn::norm_emu {
namespace kern = rudnn::norm::kern;
#include "kernels.inc"
}  // namespace rudnn::norm_emu
namespace rudnn::norm_bwd_emu {
namespace kern = rudnn::norm::kern;
namespace plan = rudnn::norm::plan;
using rudnn::norm::BackwardProblem;
#include "kernels_bwd.inc"
}  // namespace rudnn::norm_bwd_emu
namespace rudnn::softmax_emu {
namespace kern = rudnn::norm::kern;
#include "kernels_softmax.inc"
}  // namespace rudnn::softmax_emu

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
  int sms = kSms;            // SMs the cluster plan is made for (plan::cluster_blocks)
  unsigned row_groups = 0;   // the cluster kernel's grid.y (0: one per row, as the library launches it)
};

float ulp_of(DType dtype, float v) {
  const int bits = dtype == DType::bf16 ? 8 : dtype == DType::f16 ? 11 : 24;
  return std::ldexp(std::max(std::fabs(v), 1e-3f), 1 - bits);
}

// Which register kernel runs: the planner's choice, or norm_forward_regs whatever it chose.
enum class Pick { planner, regs1024 };

// Runs the forward kernels on args' arrays; returns whether the pipelined kernel ran. Where the
// cluster plan (for a device of `sms` SMs of sm_90) takes norm_forward_cluster, it runs that, its
// clusters' blocks at the same time, on `row_groups` row groups (0: one per row).
template <class T, class P>
bool launch(const NormForwardArgs& args, const ForwardProblem& pr, Pick pick, int sms = kSms, unsigned row_groups = 0) {
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
  const int cluster =
      vec && pick == Pick::planner ? plan::cluster_blocks(p.rows, p.hidden / kVec, sms, true, kern::kSlots) : 0;
  if (cluster > 0) {
    const unsigned groups = row_groups > 0 ? row_groups : unsigned(std::min<i64>(p.rows, kern::kMaxGridY));
    std::printf("[vec=%d cluster=%d row_groups=%u] ", kVec, cluster, groups);
    emu_launch_cluster(EmuDim3{unsigned(cluster), groups, 1}, unsigned(cluster), kern::kClusterThreads, 1,
                       kern::kClusterSmem, [&] { norm_forward_cluster<T, P, kVec>(p); });
    return false;
  }
  auto run = [&](auto vec_tag) {
    constexpr int VEC = decltype(vec_tag)::value;
    plan::RowLaunch l = plan::row_shape(p.hidden / VEC, kern::kSlots, kern::kSlots);
    pipelined = pick == Pick::planner && plan::regs_pipelined(l, VEC, rows_collapsed(p));
    plan::spread_rows_over(l, p.rows, kSms);
    p.team = l.team;
    p.rows_per_block = l.rows_per_block;
    const unsigned grid = unsigned(l.grid);
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
      pipelined = launch<T, float>(ga, pg, Pick::planner, c.sms, c.row_groups);
      if (pipelined) launch<T, float>(na, pn, Pick::regs1024);
    } else {
      pipelined = launch<T, T>(ga, pg, Pick::planner, c.sms, c.row_groups);
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

// plan::cluster_blocks on the shapes it is for and against (H100/H200: 132 SMs; chunks of 16 bytes).
bool cluster_plan_table() {
  struct Row {
    i64 rows, chunks;
    int sms;
    bool capable;
    int slots, blocks;
  };
  constexpr int F = kern::kSlots, B = kern::kPairSlots;  // the forward's and the backward's
  const Row table[] = {
      {8, 65536 / 8, 132, true, F, 8},     // 8 x 65536 bf16: 8 blocks a row (16 fill the wave; 8 at most)
      {64, 32768 / 8, 132, true, F, 2},    // 64 x 32768 bf16: 2 a row (one wave)
      {100, 65536 / 8, 132, true, F, 4},   // stream-length rows, <= 132 of them: the blocks the row needs
      {100, 65536 / 8, 132, true, B, 8},   // the same in the backward (2 chunks a thread)
      {100, 4096 / 8, 132, true, B, 0},    // short rows in the backward too
      {100, 20480 / 8, 132, true, B, 3},   // a stream-length row of the backward only
      {100, 20480 / 8, 132, true, F, 0},   // which the forward keeps in one block's registers
      {200, 65536 / 8, 132, false, F, 0},  // below sm_90
      {200, 65536 / 8, 132, true, F, 0},   // more rows than SMs: the stream kernel
      {100, 4096 / 8, 132, true, F, 0},    // short rows: the register kernels' teams
      {1, 20000, 132, true, F, 0},         // longer than 8 blocks hold: the stream kernel
      {1, 10000, 132, true, B, 0},         // the same in the backward
      {64, 2048, 132, true, F, 0},         // rows one cluster block holds (decode sizes): the register kernels
      {1, 2049, 132, true, F, 5},          // just over one block's: as many blocks as hold a chunk a thread
  };
  bool ok = true;
  for (const Row& r : table) {
    const int got = plan::cluster_blocks(r.rows, r.chunks, r.sms, r.capable, r.slots);
    if (got != r.blocks) {
      std::printf("cluster plan: rows %lld chunks %lld sms %d capable %d slots %d: %d blocks, expected %d MISMATCH\n",
                  (long long)r.rows, (long long)r.chunks, r.sms, int(r.capable), r.slots, got, r.blocks);
      ok = false;
    }
  }
  if (ok) std::printf("cluster plan table ok\n");
  return ok;
}

// ---- backward ----

constexpr std::size_t kOptin = 232448;  // opt-in shared memory per block of the emulated device (H100/H200)

struct BackwardCase {
  const char* name;
  NormKind kind;
  DType dtype, param_dtype;
  i64 rows, hidden;
  bool weight, dweight, dbias;
  int plan_sms = kSms;  // SMs the weight-gradient plan is made for (the kernels run on kSms either way)
  std::size_t optin = kOptin;  // the plan's opt-in shared memory: a smaller one sends shorter rows to the
                               // column kernel (fewer emulated blocks than rows of ~30K columns need)
  int sms = kSms;              // SMs the cluster plan is made for (plan::cluster_blocks)
  unsigned row_groups = 0;     // the cluster kernel's grid.y (0: one per row, as the library launches it)
};

// Runs the backward kernels on args' arrays as launch_backward does (the column kernel, the dx
// kernel, the split reduction); returns whether the pipelined kernel ran.
template <class T, class P>
bool launch_backward(const NormBackwardArgs& args, const BackwardProblem& pr, Pick pick, int plan_sms,
                     std::size_t optin, int sms = kSms, unsigned row_groups = 0) {
  using namespace rudnn::norm_bwd_emu;
  const plan::WgradPlan wgrad = plan::wgrad_plan(pr.rows, pr.hidden, plan_sms, optin);
  std::vector<float> workspace(wgrad.workspace_bytes / sizeof(float), std::nanf(""));
  const WgradTargets targets = wgrad_targets(args, wgrad, pr.hidden, workspace.data());
  const bool want_wgrad = targets.wanted();
  if (want_wgrad && !wgrad.fused) {
    const WgradParams<T> w = wgrad_params<T>(args, pr, wgrad, targets);
    const EmuDim3 grid{unsigned((pr.hidden + kern::kWgradColumns - 1) / kern::kWgradColumns), unsigned(wgrad.splits), 1};
    emu_launch(grid, kern::kWgradColumns * kern::kWgradRowLanes, 1, 0, [&] { norm_wgrad_columns<T>(w); });
  }

  BackwardParams<T, P> p = backward_params<T, P>(args, pr, wgrad, targets);
  const bool accumulate = p.dweight_part != nullptr || p.dbias_part != nullptr;
  constexpr int kVec = kern::kVec16<T>;
  bool pipelined = false;
  const int cluster = p.hidden % kVec == 0 && !accumulate && pick == Pick::planner
                          ? plan::cluster_blocks(p.rows, p.hidden / kVec, sms, true, kern::kPairSlots)
                          : 0;
  auto run = [&](auto vec_tag) {
    constexpr int VEC = decltype(vec_tag)::value;
    if constexpr (VEC > 1)
      if (cluster > 0) {
        const unsigned groups = row_groups > 0 ? row_groups : unsigned(std::min<i64>(p.rows, kern::kMaxGridY));
        std::printf("[vec=%d cluster=%d row_groups=%u, wgrad %s splits=%lld] ", VEC, cluster, groups,
                    !want_wgrad ? "none" : "columns", want_wgrad ? (long long)wgrad.splits : 0LL);
        emu_launch_cluster(EmuDim3{unsigned(cluster), groups, 1}, unsigned(cluster), kern::kClusterThreads, 1,
                           kern::kClusterSmem, [&] { norm_backward_cluster<T, P, VEC>(p); });
        return;
      }
    plan::RowLaunch l = plan::row_shape(p.hidden / VEC, kern::kPairSlots, kern::kPairSlots);
    pipelined = VEC > 1 && pick == Pick::planner && plan::regs_pipelined(l, VEC, rows_collapsed(p));
    if (accumulate) {
      plan::fused_wgrad_launch(l, wgrad, p.hidden, pipelined ? kern::kRegsBlockTarget : kern::kFusedBlockMax);
    } else {
      plan::spread_rows_over(l, p.rows, kSms);
    }
    p.team = l.team;
    p.rows_per_block = l.rows_per_block;
    if (pick == Pick::planner)
      std::printf("[vec=%d team=%d block=%d grid=%d rows/block=%lld smem=%zu %s, wgrad %s splits=%lld] ", VEC, l.team,
                  l.block, l.grid, (long long)p.rows_per_block, l.smem,
                  l.stream ? "stream" : pipelined ? "pipelined" : "regs",
                  !want_wgrad ? "none" : wgrad.fused ? "fused" : "columns", want_wgrad ? (long long)wgrad.splits : 0LL);
    emu_launch(EmuDim3{unsigned(l.grid), 1, 1}, unsigned(l.block), 1, l.smem, [&] {
      if (l.stream) {
        norm_backward_stream<T, P, VEC>(p);
      } else if (pipelined) {
        if constexpr (VEC > 1) norm_backward_regs_pipelined<T, P, VEC>(p);
      } else {
        norm_backward_regs<T, P, VEC>(p);
      }
    });
  };
  if (p.hidden % kVec == 0)  // the arrays here are dense and 16-byte aligned
    run(std::integral_constant<int, kVec>{});
  else
    run(std::integral_constant<int, 1>{});
  if (want_wgrad && wgrad.splits > 1) {
    const unsigned blocks = unsigned((pr.hidden + kern::kReduceThreads - 1) / kern::kReduceThreads);
    emu_launch(EmuDim3{blocks, 1, 1}, kern::kReduceThreads, 1, 0, [&] {
      norm_wgrad_reduce(targets.dweight_part, targets.dbias_part, wgrad.splits, pr.hidden, targets.dweight,
                        targets.dbias);
    });
  }
  return pipelined;
}

bool run_backward_case(const BackwardCase& c) {
  const i64 R = c.rows, H = c.hidden;
  emu::Array x = emu::make(c.dtype, {R, H}, 11), dy = emu::make(c.dtype, {R, H}, 12);
  emu::Array w = emu::make(c.param_dtype, {H}, 13);
  // The statistics of x, as the forward leaves them.
  emu::Array y = emu::make(c.dtype, {R, H}, 0, false), mean = emu::make(DType::f32, {R}, 0, false),
             rstd = emu::make(DType::f32, {R}, 0, false);
  {
    NormForwardArgs f;
    f.kind = c.kind;
    f.x = x.t;
    f.y = y.t;
    f.mean = c.kind == NormKind::layer ? &mean.t : nullptr;
    f.rstd = &rstd.t;
    f.eps = 1e-5f;
    forward_cpu(f, validate_forward(f));
  }
  auto outputs = [&] {
    return std::array<emu::Array, 3>{emu::make(c.dtype, {R, H}, 0, false), emu::make(DType::f32, {H}, 0, false),
                                     emu::make(DType::f32, {H}, 0, false)};
  };
  auto ref = outputs(), got = outputs(), regs = outputs();
  auto args_of = [&](std::array<emu::Array, 3>& o) {
    NormBackwardArgs a;
    a.kind = c.kind;
    a.dy = dy.t;
    a.x = x.t;
    a.weight = c.weight ? &w.t : nullptr;
    a.mean = c.kind == NormKind::layer ? &mean.t : nullptr;
    a.rstd = rstd.t;
    a.dx = o[0].t;
    a.dweight = c.dweight ? &o[1].t : nullptr;
    a.dbias = c.dbias ? &o[2].t : nullptr;
    return a;
  };
  const NormBackwardArgs ra = args_of(ref), ga = args_of(got), na = args_of(regs);
  backward_cpu(ra, validate_backward(ra));
  const BackwardProblem pg = validate_backward(ga), pn = validate_backward(na);
  std::printf("%s ", c.name);
  bool pipelined = false;
  core::dispatch_float<__half, __nv_bfloat16>(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (pg.param_dtype == DType::f32) {
      pipelined = launch_backward<T, float>(ga, pg, Pick::planner, c.plan_sms, c.optin, c.sms, c.row_groups);
      if (pipelined) launch_backward<T, float>(na, pn, Pick::regs1024, c.plan_sms, c.optin);
    } else {
      pipelined = launch_backward<T, T>(ga, pg, Pick::planner, c.plan_sms, c.optin, c.sms, c.row_groups);
      if (pipelined) launch_backward<T, T>(na, pn, Pick::regs1024, c.plan_sms, c.optin);
    }
  });
  // The pipelined kernel must give norm_backward_regs's dx bits (same arithmetic and order per row).
  const bool identical = !pipelined || emu::same_bytes(got[0].t, regs[0].t);
  float scale = 0;
  for (i64 i = 0; i < R * H; ++i) scale = std::max(scale, std::fabs(emu::value_at(ref[0].t, i)));
  bool ok = true;
  double worst_dx = 0, worst_wgrad = 0;
  for (i64 i = 0; i < R * H; ++i) {
    const float a = emu::value_at(got[0].t, i), e = emu::value_at(ref[0].t, i);
    const double d = std::fabs(a - e) / (ulp_of(c.dtype, e) + 4e-6f * scale);
    worst_dx = std::max(worst_dx, d);
    ok = ok && d <= 2.0;
  }
  // dweight[j] = sum_r dy * xhat, dbias[j] = sum_r dy: float32 sums of R terms against double sums,
  // to 1e-5 of the terms' magnitudes.
  for (int g = 1; g <= 2; ++g) {
    if ((g == 1 && !c.dweight) || (g == 2 && !c.dbias)) continue;
    for (i64 j = 0; j < H; ++j) {
      double magnitude = 0;
      for (i64 r = 0; r < R; ++r) {
        const double xhat = (double(emu::value_at(x.t, r * H + j)) - (c.kind == NormKind::layer ? emu::value_at(mean.t, r) : 0.0)) *
                            emu::value_at(rstd.t, r);
        magnitude += std::fabs(emu::value_at(dy.t, r * H + j) * (g == 1 ? xhat : 1.0));
      }
      const double d = std::fabs(double(emu::value_at(got[g].t, j)) - emu::value_at(ref[g].t, j)) / (1e-5 * magnitude + 1e-30);
      worst_wgrad = std::max(worst_wgrad, d);
      ok = ok && d <= 1.0;
    }
  }
  if (pipelined) std::printf("%s ", identical ? "dx bitwise as regs1024" : "dx DIFFERS from regs1024");
  ok = ok && identical;
  std::printf("worst dx %.2f, dweight/dbias %.3f of the budget %s\n", worst_dx, worst_wgrad, ok ? "ok" : "MISMATCH");
  return ok;
}

// ---- softmax ----

struct SoftmaxCase {
  const char* name;
  DType dtype;
  i64 rows, hidden;
  int sms = kSms;           // SMs the cluster plan is made for (plan::cluster_blocks)
  unsigned row_groups = 0;  // the cluster kernels' grid.y (0: one per row, as the library launches them)
};

// Runs the softmax kernels as run_softmax does (forward: a = x, out = y; backward: a = dy, b = y,
// out = dx), the cluster kernels where the cluster plan for a device of `sms` SMs takes them.
template <class T, bool Backward>
void launch_softmax(const Tensor& a, const Tensor* b, const Tensor& out, const SoftmaxProblem& pr, int sms,
                    unsigned row_groups) {
  using namespace rudnn::softmax_emu;
  SoftmaxParams<T> p{};
  p.a = a.ptr<const T>();
  p.b = b != nullptr ? b->ptr<const T>() : nullptr;
  p.out = out.ptr<T>();
  p.a_rows = pr.a, p.b_rows = pr.b, p.out_rows = pr.out;
  p.rows = pr.rows, p.hidden = pr.hidden;
  auto run = [&](auto vec_tag) {
    constexpr int VEC = decltype(vec_tag)::value;
    const int cluster =
        VEC > 1 ? plan::cluster_blocks(p.rows, p.hidden / VEC, sms, true, Backward ? kern::kPairSlots : kern::kSlots) : 0;
    if constexpr (VEC > 1)
      if (cluster > 0) {
        const unsigned groups = row_groups > 0 ? row_groups : unsigned(std::min<i64>(p.rows, kern::kMaxGridY));
        std::printf("[%s vec=%d cluster=%d row_groups=%u] ", Backward ? "backward" : "forward", VEC, cluster, groups);
        emu_launch_cluster(EmuDim3{unsigned(cluster), groups, 1}, unsigned(cluster), kern::kClusterThreads, 1,
                           kern::kClusterSmem, [&] {
                             if constexpr (Backward) softmax_backward_cluster<T, VEC>(p); else softmax_forward_cluster<T, VEC>(p);
                           });
        return;
      }
    plan::RowLaunch l = Backward ? plan::row_shape(p.hidden / VEC, kern::kPairSlots, kern::kPairSlots)
                                 : plan::row_shape(p.hidden / VEC, kern::kSlots, kern::kSlots);
    plan::spread_rows_over(l, p.rows, kSms);
    p.team = l.team;
    p.rows_per_block = l.rows_per_block;
    std::printf("[%s vec=%d team=%d block=%d grid=%d %s] ", Backward ? "backward" : "forward", VEC, l.team, l.block,
                l.grid, l.stream ? "stream" : "regs");
    emu_launch(EmuDim3{unsigned(l.grid), 1, 1}, unsigned(l.block), 1, 0, [&] {
      if constexpr (Backward) {
        if (l.stream) softmax_backward_stream<T, VEC>(p); else softmax_backward_regs<T, VEC>(p);
      } else {
        if (l.stream) softmax_forward_stream<T, VEC>(p); else softmax_forward_regs<T, VEC>(p);
      }
    });
  };
  if (p.hidden % kern::kVec16<T> == 0)  // the arrays here are dense and 16-byte aligned
    run(std::integral_constant<int, kern::kVec16<T>>{});
  else
    run(std::integral_constant<int, 1>{});
}

// |got - expected| within 2 ulps of the dtype plus 4e-6 of the row's largest |expected|; NaN where
// expected is NaN.
bool softmax_close(const Tensor& got, const Tensor& expected, DType dtype, i64 rows, i64 hidden, double& worst) {
  bool ok = true;
  for (i64 r = 0; r < rows; ++r) {
    float scale = 0;
    for (i64 j = 0; j < hidden; ++j) {
      const float e = emu::value_at(expected, r * hidden + j);
      if (!std::isnan(e)) scale = std::max(scale, std::fabs(e));
    }
    for (i64 j = 0; j < hidden; ++j) {
      const float a = emu::value_at(got, r * hidden + j), e = emu::value_at(expected, r * hidden + j);
      if (std::isnan(e) || std::isnan(a)) {
        ok = ok && std::isnan(e) && std::isnan(a);
        continue;
      }
      const double d = std::fabs(a - e) / (ulp_of(dtype, e) + 4e-6f * scale);
      worst = std::max(worst, d);
      ok = ok && d <= 2.0;
    }
  }
  return ok;
}

bool run_softmax_case(const SoftmaxCase& c) {
  const i64 R = c.rows, H = c.hidden;
  emu::Array x = emu::make(c.dtype, {R, H}, 21, true, 4.0f), dy = emu::make(c.dtype, {R, H}, 22);
  // row 0 all -inf (y NaN, as torch gives); row 1 -inf in every third column
  const float minus_inf = -std::numeric_limits<float>::infinity();
  auto set = [&](i64 i, float v) {
    switch (c.dtype) {
      case DType::f32: x.t.ptr<float>()[i] = v; break;
      case DType::f16: x.t.ptr<host::f16>()[i] = host::from_float<host::f16>(v); break;
      default: x.t.ptr<host::bf16>()[i] = host::from_float<host::bf16>(v); break;
    }
  };
  for (i64 j = 0; j < H; ++j) set(j, minus_inf);
  if (R > 1)
    for (i64 j = 0; j < H; j += 3) set(H + j, minus_inf);
  emu::Array y_ref = emu::make(c.dtype, {R, H}, 0, false), y = emu::make(c.dtype, {R, H}, 0, false);
  emu::Array dx_ref = emu::make(c.dtype, {R, H}, 0, false), dx = emu::make(c.dtype, {R, H}, 0, false);
  softmax_forward_cpu(x.t, y_ref.t, validate_softmax_forward(x.t, y_ref.t));
  std::printf("%s ", c.name);
  core::dispatch_float<__half, __nv_bfloat16>(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_softmax<T, false>(x.t, nullptr, y.t, validate_softmax_forward(x.t, y.t), c.sms, c.row_groups);
  });
  // the backward from the reference y (rows after the NaN one), so both backends see the same y
  const i64 skip = 1;
  emu::Array y_in = emu::make(c.dtype, {R - skip, H}, 0, false), dy_in = emu::make(c.dtype, {R - skip, H}, 0, false);
  const std::size_t bytes = std::size_t((R - skip) * H) * dtype_size(c.dtype);
  std::memcpy(y_in.t.data, static_cast<const char*>(y_ref.t.data) + std::size_t(skip * H) * dtype_size(c.dtype), bytes);
  std::memcpy(dy_in.t.data, static_cast<const char*>(dy.t.data) + std::size_t(skip * H) * dtype_size(c.dtype), bytes);
  emu::Array gx_ref = emu::make(c.dtype, {R - skip, H}, 0, false), gx = emu::make(c.dtype, {R - skip, H}, 0, false);
  softmax_backward_cpu(dy_in.t, y_in.t, gx_ref.t, validate_softmax_backward(dy_in.t, y_in.t, gx_ref.t));
  core::dispatch_float<__half, __nv_bfloat16>(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_softmax<T, true>(dy_in.t, &y_in.t, gx.t, validate_softmax_backward(dy_in.t, y_in.t, gx.t), c.sms,
                            c.row_groups);
  });
  double worst_y = 0, worst_dx = 0;
  const bool ok = softmax_close(y.t, y_ref.t, c.dtype, R, H, worst_y) &&
                  softmax_close(gx.t, gx_ref.t, c.dtype, R - skip, H, worst_dx);
  std::printf("worst y %.2f, dx %.2f of the budget %s\n", worst_y, worst_dx, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  const auto L = NormKind::layer, S = NormKind::rms;
  const auto f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
  bool ok = true;
  if (which == "forward") {
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
        // the cluster kernel (few long rows on sm_90): a row too long for one block's registers in a
        // cluster of 3 (rows of the stream kernel, each thread's last slot partly past the row);
        // one row over 8 blocks, one chunk per thread; 5 rows of 2-block clusters on 2 row groups
        // (a cluster walks rows, its exchange slots reused across them), float32 weight
        {"layer_bf16_cluster_stream_row", L, bf16, bf16, 2, 40960, true, true, true},
        {"rms_f16_cluster_of_8", S, f16, f16, 1, 32768, true, false, false, 16},
        {"layer_f16_cluster_rows_f32_weight", L, f16, f32, 5, 24576, true, false, true, 12, 2},
        {"rms_f32_cluster_residual", S, f32, f32, 3, 12288, true, false, true, 8},
    };
    for (const Case& c : cases) ok = run_case(c) && ok;
    ok = cluster_plan_table() && ok;
  } else if (which == "backward") {
    const BackwardCase cases[] = {
        // pipelined (teams <= 256, 16-byte chunks), fused weight gradients over 6 splits
        {"layer_bf16_pipelined_fused", L, bf16, bf16, 50, 1024, true, true, true},
        // float32 weights of 16-bit rows: loaded per slot in the pipelined kernel
        {"rms_f16_pipelined_f32_weight", S, f16, f32, 100, 512, true, true, false},
        // float32 rows (4-element chunks), a partial last slot, dbias only
        {"layer_f32_pipelined_partial_slot", L, f32, f32, 23, 1000, true, false, true},
        // sub-warp teams walking many rows, no weight gradients (rows spread over the SMs)
        {"rms_bf16_pipelined_subwarp_dx_only", S, bf16, bf16, 1000, 64, true, false, false},
        // no weight at all
        {"layer_f16_pipelined_no_weight", L, f16, f16, 37, 256, false, false, true},
        // one row: one split, the gradients written directly
        {"layer_bf16_pipelined_one_row", L, bf16, f32, 1, 2048, true, true, true},
        // the single-element path (H not a multiple of 8): norm_backward_regs
        {"layer_f16_scalar_path", L, f16, f16, 11, 1001, true, true, true},
        // teams of 512 threads: norm_backward_regs, fused
        {"layer_bf16_team512_regs_fused", L, bf16, bf16, 7, 8192, true, true, true},
        // rows too long for registers: the two-read kernel, its accumulators fused (one block per SM)
        {"layer_bf16_stream_fused", L, bf16, bf16, 6, 20000, true, true, true},
        // rows too long for the shared-memory accumulators of a 48 KB opt-in: the column kernel (one
        // split), and with a 132-SM plan two splits and their reduction
        {"layer_bf16_columns", L, bf16, bf16, 40, 8192, true, true, true, kSms, 48 * 1024},
        {"layer_f16_column_splits", L, f16, f16, 70, 8192, true, true, true, 132, 48 * 1024},
        // float32 rows of the single-element path, too long for registers, short enough for the fused sums
        {"rms_f32_stream_scalar_fused", S, f32, f32, 3, 17001, true, true, false},
        // the cluster dx kernel (few long rows on sm_90, weight gradients by the column kernel or
        // none): stream-length rows in clusters of 3 with both gradients (a 48 KB opt-in plan sends
        // them to the column kernel); 5 rows of 2-block clusters on 2 row groups, float32 weight,
        // dweight only; float32 rows, dx only, clusters of 4
        {"layer_bf16_cluster_columns", L, bf16, bf16, 2, 20480, true, true, true, kSms, 48 * 1024, 4},
        {"rms_f16_cluster_rows_f32_weight", S, f16, f32, 5, 16384, true, true, false, kSms, 48 * 1024, 12, 2},
        {"layer_f32_cluster_dx_only", L, f32, f32, 3, 8192, true, false, false, kSms, kOptin, 16},
    };
    for (const BackwardCase& c : cases) ok = run_backward_case(c) && ok;
  } else if (which == "softmax") {
    const SoftmaxCase cases[] = {
        {"softmax_bf16_subwarp_teams", bf16, 40, 64},       // teams of 2 (forward), 4 (backward)
        {"softmax_f16_multiwarp_team", f16, 9, 4096},
        {"softmax_f32_scalar_path", f32, 11, 1001},        // single-element chunks
        {"softmax_bf16_stream", bf16, 4, 40000, 2},         // two-read kernels, both directions (a 2-SM
                                                            // cluster plan: none for the backward's 3 rows)
        {"softmax_f32_stream_scalar", f32, 3, 17001},
        {"softmax_f16_regs_fwd_stream_bwd", f16, 5, 24576}, // register forward, two-read backward
        // the cluster kernels (few long rows on sm_90): stream-length rows, the all -inf row included,
        // in clusters of 3 (forward) and 5 (backward); float32 rows walked by 2 row groups
        {"softmax_bf16_cluster", bf16, 3, 40960},
        {"softmax_f32_cluster_rows", f32, 5, 12288, 12, 2},
    };
    for (const SoftmaxCase& c : cases) ok = run_softmax_case(c) && ok;
  } else if (which == "cluster_planted") {
    // A planted ordering bug in the cluster kernel (EMU_PLANT selects it): the ordering check must
    // report it, whatever numbers the run gives.
    run_case({"layer_bf16_cluster_planted", L, bf16, bf16, 3, 24576, true, true, false, 8, 2});
    std::printf("hazards %ld\n", emu_hazards.load());
    return 0;
  } else {
    std::fprintf(stderr, "usage: norm_emu forward|backward|softmax|cluster_planted\n");
    return 2;
  }
  return ok && emu_hazards.load() == 0 ? 0 : 1;
}
