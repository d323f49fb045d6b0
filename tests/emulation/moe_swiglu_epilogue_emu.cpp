// Host run of the fused SwiGLU epilogue's tile store (cpp/src/moe/swiglu_epilogue.hpp, extracted by
// tests/test_moe_emulation.py into kernels.inc, possibly with a planted bug) for every consumer
// thread of the two TiledMmas the sm90a kernels run: the cooperative one (128-row tiles, 256
// threads) and the ping-pong one (64-row tiles, one warpgroup of 128 threads per tile;
// grouped_gemm_sm90.cuh static_asserts that the collective builder chose these). Checks, for bf16
// and f16 and both tiles of R rows:
//   layout   each thread's accumulator i < half is column-paired as the store assumes: i + 1 is the
//            next column (i even), i + half the same row 64 columns on (b of the same h column),
//            and the threads' (row, column < 64) cover the R x 64 half tile exactly once;
//   values   an R x 128 tile of accumulators (a in columns < 64, b in the rest) stored through
//            store_swiglu_tile gives h = silu(round(a)) * round(b), rounded, at [row * ld + column]
//            for rows < `rows` (full and partial tiles), and leaves every other element of the
//            output (rows past `rows`, columns past 64 of a wider row) untouched.
// Prints one line per case; exits 1 on a failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cutlass/bfloat16.h"
#include "cutlass/half.h"

// namespace rudnn::moe::sm90 { SwigluTile, SwigluTiledMma, swiglu_of, store_swiglu_tile }
#include "kernels.inc"

namespace {

using namespace cute;
using rudnn::moe::sm90::SwigluTiledMma;

constexpr int kCols = 128, kHalfCols = 64;

template <class Element, int kRows>
bool check_layout(const char* name) {
  SwigluTiledMma<Element, kRows> mma;
  static_assert(decltype(size(mma))::value == kRows * 2, "a warpgroup (128 threads) per 64 rows");
  std::vector<int> seen(kRows * kHalfCols, 0);
  bool ok = true;
  for (int t = 0; t < int(size(mma)) && ok; ++t) {
    auto coords = mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<kRows>, _128>{}));
    const int n = int(size(coords)), half = n / 2;
    for (int i = 0; i < half && ok; ++i) {
      const int r = get<0>(coords(i)), c = get<1>(coords(i));
      const bool pair_ok = get<0>(coords(i + half)) == r && get<1>(coords(i + half)) == c + kHalfCols &&
                           c < kHalfCols &&
                           (i % 2 == 1 || (get<0>(coords(i + 1)) == r && get<1>(coords(i + 1)) == c + 1 && c % 2 == 0));
      if (!pair_ok) {
        std::printf("%s %d-row layout: thread %d element %d at (%d, %d) is not paired as the store assumes\n", name,
                    kRows, t, i, r, c);
        ok = false;
      } else {
        ++seen[r * kHalfCols + c];
      }
    }
  }
  for (int k = 0; k < kRows * kHalfCols && ok; ++k)
    if (seen[k] != 1) {
      std::printf("%s %d-row layout: (%d, %d) held by %d threads\n", name, kRows, k / kHalfCols, k % kHalfCols,
                  seen[k]);
      ok = false;
    }
  if (ok) std::printf("%s %d-row layout ok\n", name, kRows);
  return ok;
}

// h of one element, from the documented math: a and b rounded to the element type, then
// silu(a) * b = a * sigmoid(a) * b in float, rounded.
template <class Element>
Element expected_h(float acc_a, float acc_b) {
  const float a = float(Element(acc_a)), b = float(Element(acc_b));
  const float sigmoid = 1.0f / (1.0f + std::exp(-a));
  return Element(a * sigmoid * b);
}

template <class Element, int kRows>
bool check_values(const char* name, int rows, std::int64_t ld, std::uint32_t seed) {
  SwigluTiledMma<Element, kRows> mma;
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, 3.0f);
  std::vector<float> tile(kRows * kCols);
  for (float& v : tile) v = value(rng);
  const Element poison = Element(-12345.0f);
  std::vector<Element> out(std::size_t(kRows + 3) * std::size_t(ld), poison);
  for (int t = 0; t < int(size(mma)); ++t) {
    auto thr = mma.get_thread_slice(t);
    auto coords = thr.partition_C(make_identity_tensor(Shape<Int<kRows>, _128>{}));
    auto acc = partition_fragment_C(mma, Shape<Int<kRows>, _128>{});
    for (int i = 0; i < int(size(acc)); ++i) acc(i) = tile[get<0>(coords(i)) * kCols + get<1>(coords(i))];
    rudnn::moe::sm90::store_swiglu_tile<Element>(mma, t, acc, out.data(), ld, rows, kHalfCols);
  }
  int bad = 0;
  for (int r = 0; r < kRows + 3; ++r)
    for (std::int64_t c = 0; c < ld; ++c) {
      const Element got = out[std::size_t(r) * std::size_t(ld) + std::size_t(c)];
      const bool written = r < rows && c < kHalfCols;
      const Element want =
          written ? expected_h<Element>(tile[r * kCols + c], tile[r * kCols + c + kHalfCols]) : poison;
      if (got.raw() != want.raw() && bad++ < 5)
        std::printf("%s %d-row tile, rows=%d ld=%lld: h[%d, %lld] = %g, expected %g%s\n", name, kRows, rows,
                    (long long)ld, r, (long long)c, float(got), float(want), written ? "" : " (must stay untouched)");
    }
  std::printf("%s %d-row tile, rows=%d ld=%lld %s\n", name, kRows, rows, (long long)ld, bad ? "MISMATCH" : "ok");
  return bad == 0;
}

template <class Element, int kRows>
bool run_tile(const char* name) {
  bool ok = check_layout<Element, kRows>(name);
  ok &= check_values<Element, kRows>(name, kRows, kHalfCols, 1);       // a full tile, h rows of 64
  ok &= check_values<Element, kRows>(name, kRows * 3 / 5, 192, 2);     // partial tile, wider rows (I = 192)
  ok &= check_values<Element, kRows>(name, 1, 64 + 8, 3);              // one row
  return ok;
}

template <class Element>
bool run_all(const char* name) {
  const bool cooperative = run_tile<Element, 128>(name);
  const bool pingpong = run_tile<Element, 64>(name);
  return cooperative && pingpong;
}

}  // namespace

int main() {
  bool ok = run_all<cutlass::bfloat16_t>("bf16");
  ok &= run_all<cutlass::half_t>("f16");
  return ok ? 0 : 1;
}
