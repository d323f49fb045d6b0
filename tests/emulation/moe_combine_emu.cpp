// Host emulator of the MoE row gather and combine CUDA kernels (tests/test_moe_emulation.py
// builds and runs it). The kernels' own source (the "row gather and combine" section of
// cpp/src/moe/dispatch_cuda.cu, extracted by the test into kernels.inc) runs on the CPU through
// emu_runtime.hpp, a std::thread per CUDA thread, on the grid the CUDA backend launches, with the
// pack width it would pick (row_lanes: 16-byte packs for aligned dense rows, else single
// elements). Each case compares the gathered rows and the combined tokens bitwise with the CPU
// backend (which tests/test_moe.py checks against the naive reference): inputs are multiples of
// 1/64 and the weights small multiples of 1/8, so every float32 sum is exact and the order of the
// additions (and the fusing of multiply and add) cannot change a bit. Covers k > kSlotBatch (two
// batches of slot loads), a row index outside y (NaN token), no weights (dispatch_backward),
// padded row strides and odd hidden sizes (the scalar path). Each case also runs combine_backward's
// kernels (the row claims, the zeroing of unclaimed rows, the "serial" slot kernel) against the
// CPU backend (run_backward). Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"
#include "emu_vote.hpp"

#include <cstring>
#include <initializer_list>
#include <numeric>
#include <utility>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "moe/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "moe/cpu.cpp"
#include "moe/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"
#include "core/pack.cuh"

namespace rudnn::moe::emu_k {
using core::from_float;
using core::load_as_float;
using core::to_float;
constexpr float kNaN = __builtin_nanf("");
}  // namespace rudnn::moe::emu_k

// namespace rudnn::moe { namespace emu_k { ...the gather and combine section of dispatch_cuda.cu... } }
#include "kernels.inc"

#include "emu_arrays.hpp"
#include "moe_emu_common.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::moe;
using i64 = std::int64_t;

using emu::device_types;

// A [rows, hidden] array whose rows are `stride` elements apart (stride >= hidden).
emu::Array rows_array(DType dtype, i64 rows, i64 hidden, i64 stride, std::uint32_t seed, bool fill = true) {
  emu::Array a = emu::make(dtype, {rows, stride}, seed, fill);
  a.t.shape[1] = hidden;
  return a;
}

// Bitwise equal rows, except that any NaN matches any NaN (the host's float16 conversion and
// CUDA's encode NaN differently).
bool same_rows(const Tensor& a, const Tensor& b, i64 rows, i64 hidden, i64 stride) {
  const std::size_t e = dtype_size(a.dtype);
  for (i64 r = 0; r < rows; ++r)
    for (i64 h = 0; h < hidden; ++h) {
      const i64 i = r * stride + h;
      const char* pa = static_cast<const char*>(a.data) + i * e;
      const char* pb = static_cast<const char*>(b.data) + i * e;
      if (std::memcmp(pa, pb, e) == 0) continue;
      const float va = a.dtype == DType::f32 ? *reinterpret_cast<const float*>(pa)
                       : a.dtype == DType::f16 ? host::to_float(*reinterpret_cast<const host::f16*>(pa))
                                               : host::to_float(*reinterpret_cast<const host::bf16*>(pa));
      const float vb = a.dtype == DType::f32 ? *reinterpret_cast<const float*>(pb)
                       : a.dtype == DType::f16 ? host::to_float(*reinterpret_cast<const host::f16*>(pb))
                                               : host::to_float(*reinterpret_cast<const host::bf16*>(pb));
      if (!(std::isnan(va) && std::isnan(vb))) return false;
    }
  return true;
}

struct Case {
  const char* name;
  DType dtype;
  i64 tokens, k, hidden, stride;  // stride: of x, y and the outputs' rows
  bool weights;
  DType weight_dtype;
  bool bad_row;  // one row index of token 1 outside y
};

// combine_backward ("serial") on N + 3 rows of y, the last three pointed at by no slot: the
// claim, zero and slot launches of combine_backward_cuda against combine_backward_cpu, dy starting
// as garbage: extra row N holds the claim bits of slot 0 (a slot that points elsewhere), row N + 1
// those of a slot past the end, so an unchecked claim would leave garbage there.
bool run_backward(const Case& c, const std::vector<std::int32_t>& row_of_slot, const emu::Array& w) {
  const i64 T = c.tokens, k = c.k, N = T * k, H = c.hidden, rows = N + 3;
  const i64 tk[2] = {T, k};
  std::vector<std::int32_t> ros_copy(row_of_slot);
  Tensor ros = Tensor::contiguous(ros_copy.data(), DType::i32, Device{}, tk, 2);
  emu::Array y = rows_array(c.dtype, rows, H, c.stride, 3), dout = rows_array(c.dtype, T, H, c.stride, 4);
  emu::Array dy_cpu = rows_array(c.dtype, rows, H, c.stride, 5), dy_emu = rows_array(c.dtype, rows, H, c.stride, 5);
  emu::Array dw_cpu = emu::make(DType::f32, {T, k}, 6), dw_emu = emu::make(DType::f32, {T, k}, 6);
  const std::size_t e = dtype_size(c.dtype);
  char* dy_bytes = static_cast<char*>(dy_emu.t.data);
  const std::uint32_t fake[2] = {0u, std::uint32_t(N + 7)};
  for (int i = 0; i < 2; ++i)
    if (H * i64(e) >= 4) std::memcpy(dy_bytes + (N + i) * c.stride * i64(e), &fake[i], 4);

  MoeCombineBackwardArgs ba;
  ba.y = y.t;
  ba.dout = dout.t;
  ba.row_of_slot = ros;
  ba.weights = w.t;
  ba.dy = dy_cpu.t;
  ba.dweights = dw_cpu.t;
  CombineProblem bp;
  bp.tokens = T;
  bp.rows = rows;
  bp.hidden = H;
  bp.top_k = int(k);
  bp.y_stride = bp.dout_stride = bp.dy_stride = c.stride;
  bp.weight_stride = k;
  bp.has_weights = true;
  combine_backward_cpu(ba, bp);

  device_types(c.dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    const emu_k::CombineBackwardView b{{ros_copy.data(), w.t.data, c.weight_dtype, k}, rows, H, c.stride, c.stride,
                                       c.stride};
    D* dy = dy_emu.t.ptr<D>();
    const unsigned threads = unsigned(emu_k::row_threads(H));
    // combine_backward_cuda's launches
    if (H >= emu_k::kClaimElements<D>) {
      emu_launch(EmuDim3{unsigned((N + 255) / 256), 1, 1}, 256, 1, 0,
                 [&] { emu_k::claim_rows_kernel<D>(ros_copy.data(), N, rows, dy, c.stride); });
      emu_launch(EmuDim3{unsigned(rows), 1, 1}, threads, 1, 0,
                 [&] { emu_k::zero_unclaimed_rows_kernel<D, false>(dy, c.stride, H, ros_copy.data(), N); });
    } else {
      emu_launch(EmuDim3{unsigned(rows), 1, 1}, threads, 1, 0,
                 [&] { emu_k::zero_unclaimed_rows_kernel<D, true>(dy, c.stride, H, ros_copy.data(), N); });
    }
    emu_launch(EmuDim3{unsigned((N + 127) / 128), 1, 1}, 128, 1, 0, [&] {
      emu_k::combine_backward_serial_kernel<D>(y.t.ptr<D>(), dout.t.ptr<D>(), dy, dw_emu.t.ptr<float>(), b, N,
                                               int(k));
    });
  });
  return same_rows(dy_cpu.t, dy_emu.t, rows, H, c.stride) && same_rows(dw_cpu.t, dw_emu.t, T, k, k);
}

bool run_case(const Case& c) {
  const i64 T = c.tokens, k = c.k, N = T * k, H = c.hidden;
  // A stable routing: row r of the dispatched rows holds token perm(r) / k.
  std::vector<std::int32_t> token_of_row(N), row_of_slot(N);
  std::vector<i64> order(N);
  std::iota(order.begin(), order.end(), 0);
  for (i64 i = 0; i < N; ++i) std::swap(order[i], order[(i * 7 + 3) % N]);
  for (i64 r = 0; r < N; ++r) {
    token_of_row[r] = std::int32_t(order[r] / k);
    row_of_slot[order[r]] = std::int32_t(r);
  }
  token_of_row[N - 1] = -1;  // a row of no token: gathered as zeros
  if (c.bad_row) row_of_slot[1 * k + k / 2] = std::int32_t(N + 5);
  const i64 tk[2] = {T, k}, n1[1] = {N};
  Tensor tor = Tensor::contiguous(token_of_row.data(), DType::i32, Device{}, n1, 1);
  Tensor ros = Tensor::contiguous(row_of_slot.data(), DType::i32, Device{}, tk, 2);

  emu::Array x = rows_array(c.dtype, T, H, c.stride, 1);
  emu::Array g_cpu = rows_array(c.dtype, N, H, c.stride, 0, false), g_emu = rows_array(c.dtype, N, H, c.stride, 0, false);
  emu::Array w = emu::make(c.weight_dtype, {T, k}, 2, true, 0.125f);  // multiples of 1/512: exact products
  emu::Array o_cpu = rows_array(c.dtype, T, H, c.stride, 0, false), o_emu = rows_array(c.dtype, T, H, c.stride, 0, false);

  const GatherProblem gp{T, N, H, c.stride, c.stride};
  gather_rows_cpu(x.t, tor, g_cpu.t, gp);
  MoeCombineArgs ca;
  ca.y = g_cpu.t;
  ca.row_of_slot = ros;
  ca.weights = c.weights ? &w.t : nullptr;
  ca.out = o_cpu.t;
  CombineProblem cp;
  cp.tokens = T;
  cp.rows = N;
  cp.hidden = H;
  cp.top_k = int(k);
  cp.y_stride = cp.out_stride = c.stride;
  cp.weight_stride = k;
  cp.has_weights = c.weights;
  combine_cpu(ca, cp);

  int lanes = 1;
  device_types(c.dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    lanes = emu_k::row_lanes<D>(H, {{x.t.data, c.stride}, {g_emu.t.data, c.stride}});
    const unsigned slices = unsigned((H / lanes + emu_k::kRowThreads - 1) / emu_k::kRowThreads);
    const unsigned threads = unsigned(std::min<i64>(emu_k::kRowThreads, (H / lanes + 31) / 32 * 32));
    const D* xd = x.t.ptr<D>();
    D* gd = g_emu.t.ptr<D>();
    D* od = o_emu.t.ptr<D>();
    const emu_k::CombineView v{row_of_slot.data(), c.weights ? w.t.data : nullptr, c.weight_dtype, k};
    auto run = [&](auto L) {
      constexpr int kL = decltype(L)::value;
      emu_launch(EmuDim3{unsigned(N), slices, 1}, threads, 1, 0, [&] {
        emu_k::gather_rows_kernel<D, kL>(xd, c.stride, T, token_of_row.data(), gd, c.stride, H);
      });
      emu_launch(EmuDim3{unsigned(T), slices, 1}, threads, 1, 0, [&] {
        emu_k::combine_kernel<D, kL>(gd, c.stride, N, v, int(k), od, c.stride, H);
      });
    };
    if (lanes > 1)
      run(std::integral_constant<int, core::kVecLanes<D>>{});
    else
      run(std::integral_constant<int, 1>{});
  });
  const bool ok = same_rows(g_cpu.t, g_emu.t, N, H, c.stride) && same_rows(o_cpu.t, o_emu.t, T, H, c.stride);
  const bool backward_ok = run_backward(c, row_of_slot, w);
  std::printf("%s lanes=%d %s\n", c.name, lanes, ok && backward_ok ? "ok" : "MISMATCH");
  return ok && backward_ok;
}

// zero_uncovered_rows_kernel, launched as zero_uncovered_rows_cuda launches it, on three outputs
// of different element sizes, widths and row strides, every byte a sentinel first: a row no
// segment covers (segment_of, checked here on the host over every expert) must come out zero
// across its width, every other byte (covered rows, the padding between rows) untouched.
struct CoverCase {
  const char* name;
  std::vector<std::int32_t> offsets;
  i64 rows;
};

bool run_cover_case(const CoverCase& c) {
  constexpr unsigned char kSentinel = 0xA5;
  const int E = int(c.offsets.size()) - 1;
  const i64 N = c.rows;
  struct Out {
    i64 element, width, stride;
    std::vector<unsigned char> bytes;
  };
  std::vector<Out> outs = {{2, 7, 9, {}}, {4, 5, 5, {}}, {2, 3, 8, {}}};
  emu_k::CoverArrays arrays{};
  for (Out& o : outs) {
    o.bytes.assign(std::size_t(N * o.stride * o.element), kSentinel);
    arrays.base[arrays.count] = reinterpret_cast<char*>(o.bytes.data());
    arrays.stride_bytes[arrays.count] = o.stride * o.element;
    arrays.row_bytes[arrays.count] = o.width * o.element;
    ++arrays.count;
  }
  std::vector<std::int32_t> offsets(c.offsets);
  emu_launch(EmuDim3{emu_k::cover_blocks(N), 1, 1}, emu_k::kCoverThreads, 1, 0,
             [&] { emu_k::zero_uncovered_rows_kernel(arrays, offsets.data(), E, N); });
  bool ok = true;
  i64 zeroed = 0;
  for (i64 r = 0; r < N; ++r) {
    bool covered = false;
    for (int e = 0; e < E; ++e) {
      const Segment seg = segment_of(c.offsets.data(), e, N);
      covered = covered || (r >= seg.begin && r < seg.end);
    }
    zeroed += !covered;
    for (const Out& o : outs)
      for (i64 b = 0; b < o.stride * o.element; ++b) {
        const unsigned char want = !covered && b < o.width * o.element ? 0 : kSentinel;
        ok = ok && o.bytes[std::size_t(r * o.stride * o.element + b)] == want;
      }
  }
  std::printf("uncovered %s rows=%lld zeroed=%lld %s\n", c.name, static_cast<long long>(N),
              static_cast<long long>(zeroed), ok ? "ok" : "MISMATCH");
  return ok;
}

int run_cover_cases() {
  std::vector<std::int32_t> many(301);  // 300 experts, a dispatch-like tiling of 1000 rows with gaps cut in
  for (int e = 0; e <= 300; ++e) many[std::size_t(e)] = std::int32_t(e * 1000 / 300);
  std::vector<std::int32_t> holes(many);
  holes[50] = 990;   // expert 49 runs to row 990, expert 50 is empty: nothing lost
  holes[120] = 100;  // expert 119 empty, expert 120 starts back at row 100: rows of 119's gap covered again
  holes[300] = 977;  // the last rows owned by no one
  const std::vector<CoverCase> cases = {
      {"tiled", {0, 3, 3, 7, 10}, 10},
      {"tiled_past_end", {0, 4, 12}, 10},              // offsets[E] > N: clamped, every row covered
      {"tiled_negative_start", {-5, 4, 10}, 10},       // offsets[0] < 0: clamped to 0
      {"short_end", {0, 4, 6}, 10},                    // rows 6..9 of no expert
      {"late_start", {2, 5, 10}, 10},                  // rows 0, 1
      {"unordered_gap", {6, 8, 1, 3}, 10},             // [6, 8) and [1, 3): rows 0, 3-5, 8, 9
      {"unordered_covering", {0, 3, 1, 2, 10}, 10},    // not a tiling, yet every row covered
      {"no_experts_rows", {0, 0, 0}, 7},               // every row uncovered
      {"many_tiled", many, 1000},                      // 1000 rows over 128 blocks: several rows a block
      {"many_holes", holes, 1000},
  };
  bool ok = true;
  for (const CoverCase& c : cases) ok = run_cover_case(c) && ok;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "uncovered") == 0) return run_cover_cases();
  const std::vector<Case> cases = {
      {"bf16_packed", DType::bf16, 5, 3, 64, 64, true, DType::bf16, false},
      {"f16_packed_k10_bad_row", DType::f16, 4, 10, 24, 32, true, DType::f32, true},
      {"f16_packed_k10", DType::f16, 4, 10, 24, 32, true, DType::f32, false},
      {"f32_k10_bad_row", DType::f32, 4, 10, 24, 32, true, DType::f32, true},
      {"f32_packed_padded", DType::f32, 3, 2, 36, 40, true, DType::f32, false},
      {"bf16_scalar_odd_hidden", DType::bf16, 3, 4, 37, 37, true, DType::f16, false},
      {"f32_scalar_stride", DType::f32, 4, 2, 8, 9, false, DType::f32, false},
      {"f16_two_slices", DType::f16, 2, 2, 8 * 300, 8 * 300, true, DType::bf16, false},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
