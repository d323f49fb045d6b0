// Host-side check of the register and shared-memory layouts the sm80 flash kernel relies on
// (runs without a GPU): every score/output accumulator element is owned by exactly one
// thread, the rows of a thread are lane/4 (+8) of its warp's 16 and share a quad, the
// probabilities reinterpreted by acc_as_a() are exactly the A operand the P V MMA expects,
// the transposed V view reads V and the swizzled smem layouts are bijections (where the
// cp.async chunks land, TileLoader checks at compile time).
//   nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_80 -Icpp/include -Icpp/src \
//        -isystem <cutlass>/include cpp/tools/flash_sm80_layout_check.cu -o /tmp/check && /tmp/check
#include <cstdio>
#include <cute/tensor.hpp>
#include "attention/flash_bwd_sm80.cuh"
using namespace cute;
using namespace rudnn::attention::flash;

template <class Element, int D>
int check() {
  using Cfg = Sm80Config<Element, D>;
  typename Cfg::TiledMma mma;
  int errors = 0;
  static int cover[64][64];
  static int coverO[64][D];
  memset(cover, 0, sizeof(cover)); memset(coverO, 0, sizeof(coverO));
  for (int tid = 0; tid < 128; ++tid) {
    auto thr = mma.get_thread_slice(tid);
    auto tScS = thr.partition_C(make_identity_tensor(Shape<_64, _64>{}));
    auto acc_s = partition_fragment_C(mma, Shape<_64, _64>{});
    if (size(acc_s) != size(tScS)) { printf("size mismatch acc_s/tScS\n"); ++errors; }
    auto rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
    int lane = tid % 32, warp = tid / 32;
    for (int r = 0; r < size<0>(rc); ++r) {
      int row0 = get<0>(rc(r, 0));
      int expect = warp * 16 + lane / 4 + 8 * (r % 2);
      if (row0 != expect) { if (errors < 5) printf("tid %d r %d row %d expected %d\n", tid, r, row0, expect); ++errors; }
      for (int c = 0; c < size<1>(rc); ++c) {
        if (get<0>(rc(r, c)) != row0) { ++errors; }
        int col = get<1>(rc(r, c));
        if (col % 8 / 2 != lane % 4) { if (errors < 5) printf("col %d lane %d\n", col, lane); ++errors; }
        cover[get<0>(rc(r, c))][col]++;
      }
    }
    // O accumulator
    auto tOcO = thr.partition_C(make_identity_tensor(Shape<_64, Int<D>>{}));
    auto orc = make_tensor(tOcO.data(), rowcol(tOcO.layout()));
    for (int r = 0; r < size<0>(orc); ++r)
      for (int c = 0; c < size<1>(orc); ++c) {
        if (get<0>(orc(r, c)) != get<0>(rc(r, 0))) ++errors;  // same rows as the S accumulator
        coverO[get<0>(orc(r, c))][get<1>(orc(r, c))]++;
      }
    // P as the A operand of P @ V
    auto tPa = thr.partition_A(make_identity_tensor(Shape<_64, _64>{}));
    auto asA = make_tensor(tScS.data(), acc_as_a(tScS.layout()));
    if (size(tPa) != size(asA) || size<1>(tPa) != size<1>(asA) || size<2>(tPa) != size<2>(asA)) {
      printf("A shape mismatch\n"); print(tPa.layout()); printf("\n"); print(asA.layout()); printf("\n"); ++errors;
    } else {
      for (int v = 0; v < size<0>(tPa); ++v)
        for (int m = 0; m < size<1>(tPa); ++m)
          for (int k = 0; k < size<2>(tPa); ++k)
            if (!(tPa(v, m, k) == asA(v, m, k))) {
              if (errors < 5) { printf("A mismatch tid %d v %d m %d k %d: ", tid, v, m, k); print(tPa(v, m, k)); print(asA(v, m, k)); printf("\n"); }
              ++errors;
            }
    }
    // gemm 1 fragments: A from sQ (64 x D), B from sK (64 x D)
    if (tid == 0) { printf("D=%d acc_s ", D); print(acc_s.layout()); printf(" P as A "); print(asA.layout()); printf("\n"); }
  }
  for (int i = 0; i < 64; ++i) for (int j = 0; j < 64; ++j) if (cover[i][j] != 1) ++errors;
  for (int i = 0; i < 64; ++i) for (int j = 0; j < D; ++j) if (coverO[i][j] != 1) ++errors;
  // V transposed view
  typename Cfg::SmemLayoutK kv; typename Cfg::SmemLayoutVt vt;
  for (int d = 0; d < D; ++d) for (int n = 0; n < 64; ++n) if (vt(d, n) != kv(n, d)) ++errors;
  // swizzled layouts are bijections onto [0, 64*D)
  static int seen[64 * 256]; memset(seen, 0, sizeof(seen));
  for (int n = 0; n < 64; ++n) for (int d = 0; d < D; ++d) seen[kv(n, d)]++;
  for (int i = 0; i < 64 * D; ++i) if (seen[i] != 1) ++errors;
  // backward's transposed views: K^T, P^T / dS^T, Q^T / dO^T
  using Bwd = Sm80BwdConfig<Element, D, D>;
  typename Bwd::SmemLayoutKt kt; typename Bwd::SmemLayoutPdS pds; typename Bwd::SmemLayoutPdSt pdst;
  typename Bwd::SmemLayoutQt qt; typename Cfg::SmemLayoutQ lq;
  for (int d = 0; d < D; ++d) for (int n = 0; n < 64; ++n) if (kt(d, n) != kv(n, d)) ++errors;
  for (int n = 0; n < 64; ++n) for (int m = 0; m < 64; ++m) if (pdst(n, m) != pds(m, n)) ++errors;
  for (int d = 0; d < D; ++d) for (int m = 0; m < 64; ++m) if (qt(d, m) != lq(m, d)) ++errors;
  printf("D=%d errors %d\n", D, errors);
  return errors;
}

int main() {
  int e = check<cute::half_t, 64>() + check<cute::bfloat16_t, 96>() + check<cute::bfloat16_t, 128>();
  printf(e ? "FAIL\n" : "ALL OK\n");
  return e != 0;
}
