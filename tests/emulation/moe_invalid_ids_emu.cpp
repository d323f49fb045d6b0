// Host emulator of the MoE dispatch chain on CUDA with expert ids outside [0, E) (tests/
// test_moe_emulation.py builds and runs it). Device ids are not read on the host, so the CUDA
// kernels themselves define what such an id does; this runs their own source (both sections of
// cpp/src/moe/dispatch_cuda.cu: the dispatch plan as kernels.inc, the row gather and combine as
// combine.inc) on the CPU through emu_runtime.hpp, in the launches dispatch_plan_cuda,
// gather_rows_cuda, combine_cuda and combine_backward_cuda make, and checks the documented result
// (the docstrings of RoutingPlan.dispatch and DispatchedTokens.combine):
//   - the plan gives every valid slot its row (the CPU backend's counting sort, bitwise) and an
//     invalid slot none (row_of_slot -1); offsets[E] counts the valid slots; the rows past it
//     belong to no token (token_of_row -1) and are gathered as zeros;
//   - combine: every token with an invalid slot is NaN in every column; every other token is
//     the weighted sum of its rows (exact here: inputs are multiples of 1/64, weights of 1/8);
//   - dispatch_backward (combine without weights): the same NaN tokens, the others the sum;
//   - combine_backward: dweights NaN exactly at the invalid slots, dy of every valid slot's row
//     w * dout, the rows past offsets[E] zero.
// Outputs and workspaces start as garbage, so anything left unwritten fails. Prints one line per
// case; exits 1 on a mismatch.
#include "emu_runtime.hpp"
#include "emu_vote.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "moe/problem.hpp"

// The C++ core's CPU backend (the dispatch plan's reference), compiled into the emulator.
#include "moe/cpu.cpp"
#include "moe/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"
#include "core/pack.cuh"

namespace rudnn::moe::emu_k {
using core::from_float;
using core::load_as_float;
using core::to_float;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kNaN = __builtin_nanf("");
}  // namespace rudnn::moe::emu_k

// namespace rudnn::moe { namespace emu_k { ...the dispatch plan section... } }
#include "kernels.inc"
// namespace rudnn::moe { namespace emu_k { ...the row gather and combine section... } }
#include "combine.inc"
#include "moe_plan_launches.hpp"

#include "emu_arrays.hpp"
#include "moe_emu_common.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::moe;
using i64 = std::int64_t;

constexpr std::int32_t kGarbage = 0x5a5a5a5a;

using emu::device_types;

struct Case {
  const char* name;
  DType index_dtype, dtype;
  i64 tokens;
  int k, experts;
  i64 hidden;
  std::vector<i64> invalid_slots;  // slots given an id outside [0, E)
};

bool fail(const Case& c, const char* what, i64 i) {
  std::printf("%s MISMATCH (%s at %lld)\n", c.name, what, (long long)i);
  return false;
}

template <class Idx, class D>
bool run_typed(const Case& c) {
  const i64 T = c.tokens, k = c.k, N = T * k, E = c.experts, H = c.hidden;
  // ids: a stable pseudo-random routing; the planted slots get -1 (signed types), E or a large id
  std::vector<Idx> ids(std::size_t(std::max<i64>(N, 1)));
  std::uint32_t state = std::uint32_t(T * 131 + E);
  std::vector<bool> invalid(std::size_t(std::max<i64>(N, 1)), false);
  for (i64 s = 0; s < N; ++s) {
    state = state * 1664525u + 1013904223u;
    ids[s] = Idx((state >> 8) % std::uint32_t(E));
  }
  for (std::size_t i = 0; i < c.invalid_slots.size(); ++i) {
    const i64 s = c.invalid_slots[i];
    const i64 bad = i % 3 == 0 ? E : i % 3 == 1 && std::is_signed_v<Idx> ? -1 : E + 1000 + i64(i);
    ids[s] = Idx(bad);
    invalid[s] = true;
  }
  std::vector<bool> bad_token(std::size_t(std::max<i64>(T, 1)), false);
  i64 valid = 0;
  for (i64 s = 0; s < N; ++s) {
    if (invalid[s]) bad_token[s / k] = true;
    else ++valid;
  }

  // ---- the plan: CPU backend (reference) and the emulated kernels ----
  DispatchPlanProblem p;
  p.tokens = T;
  p.top_k = c.k;
  p.experts = c.experts;
  p.index_stride = k;
  const i64 idx_shape[2] = {T, k}, off_shape[1] = {E + 1}, rows_shape[1] = {N};
  std::vector<std::int32_t> off_cpu(E + 1, kGarbage), tor_cpu(N, kGarbage), ros_cpu(N, kGarbage);
  MoeDispatchPlanArgs a;
  a.expert_indices = Tensor::contiguous(ids.data(), c.index_dtype, Device{}, idx_shape, 2);
  a.num_experts = c.experts;
  a.offsets = Tensor::contiguous(off_cpu.data(), DType::i32, Device{}, off_shape, 1);
  a.token_of_row = Tensor::contiguous(tor_cpu.data(), DType::i32, Device{}, rows_shape, 1);
  a.row_of_slot = Tensor::contiguous(ros_cpu.data(), DType::i32, Device{}, idx_shape, 2);
  dispatch_plan_cpu(a, p);

  std::vector<std::int32_t> ws(std::size_t(std::max<i64>(emu_k::workspace_ints(p), 1)), kGarbage);
  std::vector<std::int32_t> off(E + 1, kGarbage), tor(N, kGarbage), ros(N, kGarbage);
  dispatch_plan_emulated<Idx>(ids.data(), p, ws.data(), off.data(), tor.data(), ros.data());
  if (!(off == off_cpu && tor == tor_cpu && ros == ros_cpu)) return fail(c, "plan differs from the CPU backend", 0);
  if (off[E] != valid) return fail(c, "offsets[E] is not the count of valid slots", off[E]);
  for (i64 s = 0; s < N; ++s) {
    if (invalid[s] != (ros[s] == -1)) return fail(c, "row_of_slot of an (in)valid slot", s);
    if (!invalid[s] && tor[ros[s]] != s / k) return fail(c, "token_of_row of a valid slot's row", s);
  }
  for (i64 r = valid; r < N; ++r)
    if (tor[r] != -1) return fail(c, "a row past offsets[E] names a token", r);

  // ---- gather, combine, dispatch_backward, combine_backward (the CUDA launches) ----
  emu::Array x = emu::make(c.dtype, {T, H}, 11);
  emu::Array rows = emu::make(c.dtype, {N, H}, 12);  // garbage, overwritten by the gather
  emu::Array w = emu::make(DType::f32, {T, k}, 13, true, 0.125f);
  emu::Array out = emu::make(c.dtype, {T, H}, 14), sum = emu::make(c.dtype, {T, H}, 15);
  emu::Array dout = emu::make(c.dtype, {T, H}, 16), dy = emu::make(c.dtype, {N, H}, 17);
  emu::Array dw = emu::make(DType::f32, {T, k}, 18);
  const int lanes = emu_k::row_lanes<D>(H, {{x.t.data, H}, {rows.t.data, H}});
  const unsigned slices = unsigned((H / lanes + emu_k::kRowThreads - 1) / emu_k::kRowThreads);
  const unsigned threads = unsigned(std::min<i64>(emu_k::kRowThreads, (H / lanes + 31) / 32 * 32));
  auto run = [&](auto L) {
    constexpr int kL = decltype(L)::value;
    emu_launch(EmuDim3{unsigned(N), slices, 1}, threads, 1, 0, [&] {
      emu_k::gather_rows_kernel<D, kL>(x.t.ptr<D>(), H, T, tor.data(), rows.t.ptr<D>(), H, H);
    });
    // the experts are the identity here: y = the dispatched rows
    const emu_k::CombineView weighted{ros.data(), w.t.data, DType::f32, k}, plain{ros.data(), nullptr, DType::f32, k};
    emu_launch(EmuDim3{unsigned(T), slices, 1}, threads, 1, 0, [&] {
      emu_k::combine_kernel<D, kL>(rows.t.ptr<D>(), H, N, weighted, c.k, out.t.ptr<D>(), H, H);
    });
    emu_launch(EmuDim3{unsigned(T), slices, 1}, threads, 1, 0, [&] {
      emu_k::combine_kernel<D, kL>(rows.t.ptr<D>(), H, N, plain, c.k, sum.t.ptr<D>(), H, H);
    });
  };
  if (lanes > 1)
    run(std::integral_constant<int, core::kVecLanes<D>>{});
  else
    run(std::integral_constant<int, 1>{});
  {  // combine_backward_cuda: claims, zeroing of unclaimed rows, the "serial" slot kernel
    const emu_k::CombineBackwardView b{{ros.data(), w.t.data, DType::f32, k}, N, H, H, H, H};
    D* dyp = dy.t.ptr<D>();
    const unsigned rt = unsigned(emu_k::row_threads(H));
    if (H >= emu_k::kClaimElements<D>) {
      emu_launch(EmuDim3{unsigned((N + 255) / 256), 1, 1}, 256, 1, 0,
                 [&] { emu_k::claim_rows_kernel<D>(ros.data(), N, N, dyp, H); });
      emu_launch(EmuDim3{unsigned(N), 1, 1}, rt, 1, 0,
                 [&] { emu_k::zero_unclaimed_rows_kernel<D, false>(dyp, H, H, ros.data(), N); });
    } else {
      emu_launch(EmuDim3{unsigned(N), 1, 1}, rt, 1, 0,
                 [&] { emu_k::zero_unclaimed_rows_kernel<D, true>(dyp, H, H, ros.data(), N); });
    }
    emu_launch(EmuDim3{unsigned((N + 127) / 128), 1, 1}, 128, 1, 0, [&] {
      emu_k::combine_backward_serial_kernel<D>(rows.t.ptr<D>(), dout.t.ptr<D>(), dyp, dw.t.ptr<float>(), b, N,
                                               c.k);
    });
  }

  auto as_dtype = [](float v) { return host::to_float(host::from_float<typename std::conditional_t<
                                    std::is_same_v<D, float>, float, std::conditional_t<std::is_same_v<D, __half>,
                                    host::f16, host::bf16>>>(v)); };
  for (i64 r = 0; r < N; ++r)
    for (i64 h = 0; h < H; ++h) {
      const float g = emu::value_at(rows.t, r * H + h);
      const float want = tor[r] >= 0 ? emu::value_at(x.t, tor[r] * H + h) : 0.0f;
      if (g != want || std::signbit(g) != std::signbit(want)) return fail(c, "gathered row", r);
    }
  for (i64 t = 0; t < T; ++t) {
    float wsum = 0.0f, ones = 0.0f;
    for (i64 j = 0; j < k; ++j) {
      wsum += w.t.ptr<float>()[t * k + j];
      ones += 1.0f;
    }
    for (i64 h = 0; h < H; ++h) {
      const float o = emu::value_at(out.t, t * H + h), s = emu::value_at(sum.t, t * H + h);
      if (bad_token[t]) {
        if (!std::isnan(o) || !std::isnan(s)) return fail(c, "a token with an invalid slot is not NaN", t);
        continue;
      }
      const float xv = emu::value_at(x.t, t * H + h);
      if (o != as_dtype(wsum * xv) || s != as_dtype(ones * xv)) return fail(c, "a valid token's combine", t);
    }
  }
  for (i64 s = 0; s < N; ++s) {
    const float d = dw.t.ptr<float>()[s];
    if (invalid[s] != std::isnan(d)) return fail(c, "dweights NaN exactly at the invalid slots", s);
    if (invalid[s]) continue;
    const i64 t = s / k, r = ros[s];
    for (i64 h = 0; h < H; ++h)
      if (emu::value_at(dy.t, r * H + h) != as_dtype(w.t.ptr<float>()[s] * emu::value_at(dout.t, t * H + h)))
        return fail(c, "dy of a valid slot's row", s);
  }
  for (i64 r = valid; r < N; ++r)
    for (i64 h = 0; h < H; ++h)
      if (emu::value_at(dy.t, r * H + h) != 0.0f) return fail(c, "dy of a row past offsets[E] is not zero", r);

  i64 bad = 0;
  for (i64 t = 0; t < T; ++t) bad += bad_token[t];
  std::printf("%s T=%lld k=%d E=%d H=%lld invalid_slots=%zu nan_tokens=%lld lanes=%d ok\n", c.name, (long long)T,
              c.k, c.experts, (long long)H, c.invalid_slots.size(), (long long)bad, lanes);
  return true;
}

template <class Idx>
bool run_index(const Case& c) {
  return device_types(c.dtype, [&](auto tag) { return run_typed<Idx, typename decltype(tag)::type>(c); });
}

bool run_case(const Case& c) {
  switch (c.index_dtype) {
    case DType::u32: return run_index<std::uint32_t>(c);
    case DType::i32: return run_index<std::int32_t>(c);
    default: return run_index<std::int64_t>(c);
  }
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::vector<Case> cases = {
      // one invalid slot (id E) in the middle of a token's slots; 16-byte packs
      {"i32_bf16_one_high", DType::i32, DType::bf16, 6, 2, 4, 16, {5}},
      // ids -1, E and E + 1001 across several tokens, two of them in one token; odd hidden (single elements)
      {"i64_f32_mixed_odd_hidden", DType::i64, DType::f32, 9, 3, 5, 7, {0, 4, 5, 13, 26}},
      // unsigned ids (a negative id reads as a large one); a whole token invalid; f16 packs
      {"u32_f16_whole_token", DType::u32, DType::f16, 5, 4, 6, 24, {8, 9, 10, 11, 19}},
      // every slot invalid: offsets all 0, every token NaN, every dy row zero
      {"i32_f32_all_invalid", DType::i32, DType::f32, 3, 2, 3, 4, {0, 1, 2, 3, 4, 5}},
      // more slots than one chunk (600 slots: three 256-slot chunks), invalid ids across chunk edges
      {"i32_bf16_chunks", DType::i32, DType::bf16, 200, 3, 7, 8, {0, 255, 256, 300, 511, 512, 599}},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
