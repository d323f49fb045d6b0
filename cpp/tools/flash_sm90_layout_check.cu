// Host-side check (no GPU needed) that the sm90a kernels' wgmma accumulators (S, O; dQ, dK) hold, register by
// register, the same (row, col) elements as the mma.sync accumulator the sm80 softmax/P V code
// expects, and that the GMMA smem layouts keep every 16-byte cp.async chunk contiguous and are
// bijections. Build: nvcc -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icpp/include -Icpp/src
//   -isystem <cutlass>/include cpp/tools/flash_sm90_layout_check.cu -o /tmp/check90 && /tmp/check90
#include <cstdio>
#include "attention/flash_sm90_ws.cuh"
using namespace cute;
using namespace rudnn::attention::flash;
// Cfg: Sm90Config (64 keys per block: the backward's), Sm90ForwardConfig (forward_keys_per_block)
// or Sm90WsConfig (its keys; Q of 128 rows).
template <class Cfg, class E, int D, int Dv>
int check_config() {
  constexpr int BN = Cfg::kBlockN;
  constexpr int QRows = decltype(size<0>(typename Cfg::SmemLayoutQ{}))::value;
  typename Cfg::TiledMmaS mma_s;
  typename Cfg::TiledMma mma;
  int errors = 0;
  for (int tid = 0; tid < 128; ++tid) {
    auto c90 = mma_s.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<_64, Int<BN>>{}));
    auto c80 = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<_64, Int<BN>>{}));
    auto acc90 = partition_fragment_C(mma_s, Shape<_64, Int<BN>>{});
    auto acc80 = partition_fragment_C(mma, Shape<_64, Int<BN>>{});
    if (tid == 0) { print(acc90.layout()); printf("  "); print(acc80.layout()); printf("\n"); print(c90.layout()); printf("\n"); }
    if (size(c90) != size(c80) || size(acc90) != size(acc80)) { ++errors; continue; }
    // the same register index must hold the same (row, col): compare via the fragment layouts
    for (int i = 0; i < size(acc80); ++i) {
      // register i of the wgmma fragment is element acc90.layout()^-1 ... compare coordinates of index i
      auto a = c90(i); auto b = c80(i);
      if (!(a == b)) { if (errors < 4) { printf("tid %d i %d: ", tid, i); print(a); print(b); printf("\n"); } ++errors; }
    }
    // fragments are compact column-major in the same order?
    for (int i = 0; i < size(acc80); ++i) if (acc90.layout()(i) != acc80.layout()(i)) { ++errors; break; }
  }
  // The P V accumulator (wgmma 64 x Dv) against the mma.sync one of the same shape.
  typename Cfg::TiledMmaO mma_o;
  for (int tid = 0; tid < 128; ++tid) {
    auto c90 = mma_o.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<_64, Int<Dv>>{}));
    auto c80 = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<_64, Int<Dv>>{}));
    if (size(c90) != size(c80)) { ++errors; continue; }
    for (int i = 0; i < size(c80); ++i) if (!(c90(i) == c80(i))) ++errors;
  }
  // The backward's dQ and dK accumulators (wgmma 64 x D, flash_bwd_sm90.cuh) likewise.
  TiledMmaRS<E, D> mma_d;
  for (int tid = 0; tid < 128; ++tid) {
    auto c90 = mma_d.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<_64, Int<D>>{}));
    auto c80 = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<_64, Int<D>>{}));
    if (size(c90) != size(c80)) { ++errors; continue; }
    for (int i = 0; i < size(c80); ++i) if (!(c90(i) == c80(i))) ++errors;
  }
  // V: the [BN, Dv] view used by the loads is the transpose of the [Dv, BN] MN-major wgmma operand,
  // with 8 contiguous elements per 16-byte chunk.
  typename Cfg::SmemLayoutV lv; typename Cfg::SmemLayoutVt lvt;
  for (int n = 0; n < BN; ++n) for (int d = 0; d < Dv; ++d) if (lv(n, d) != lvt(d, n)) ++errors;
  for (int n = 0; n < BN; ++n) for (int d = 0; d < Dv; d += 8)
    for (int v = 0; v < 8; ++v) if (int(lv(n, d + v)) != int(lv(n, d)) + v) ++errors;
  // Q and K: bijections with 8 contiguous elements per 16-byte chunk.
  typename Cfg::SmemLayoutQ lq; typename Cfg::SmemLayoutK lk;
  static int seen[128 * 256];
  for (int which = 0; which < 2; ++which) {
    const int rows = which ? BN : QRows;
    memset(seen, 0, sizeof(seen));
    for (int r = 0; r < rows; ++r) for (int c = 0; c < D; c += 8) {
      int base = which ? int(lk(r, c)) : int(lq(r, c));
      if (base % 8) ++errors;
      for (int v = 0; v < 8; ++v) { int o = which ? int(lk(r, c + v)) : int(lq(r, c + v)); if (o != base + v) ++errors; seen[o]++; }
    }
    for (int i = 0; i < rows * D; ++i) if (seen[i] != 1) ++errors;
  }
  // TMA boxes: element (row, col) of a Q, K or V tile of `rows` rows sits in the 64-column slab
  // col / 64 (rows * 128 bytes each) at row * 128 bytes + its column's bytes, 128-byte swizzled:
  // what the 64-row boxes with CU_TENSOR_MAP_SWIZZLE_128B write, box j of a slab at the slab's
  // address + j * 8 KB (1024-aligned). (The GMMA layouts' swizzle acts on byte addresses through
  // the smem pointer: applied here to the unswizzled offset's bytes.)
  // (Head dims of 64-column multiples only: D = 96 has 64-byte swizzled rows and no TMA kernel.)
  auto sw128 = [](int a) { return a ^ (((a >> 7) & 7) << 4); };
  auto tma_byte = [&](int rows, int row, int col) { return (col / 64) * rows * 128 + sw128(row * 128 + (col % 64) * 2); };
  if (D % 64 == 0) {
    for (int r = 0; r < BN; ++r) for (int c = 0; c < D; ++c)
      if (sw128(2 * int(lk.layout_b()(r, c))) != tma_byte(BN, r, c)) ++errors;
    for (int r = 0; r < QRows; ++r) for (int c = 0; c < D; ++c)
      if (sw128(2 * int(lq.layout_b()(r, c))) != tma_byte(QRows, r, c)) ++errors;
  }
  if (Dv % 64 == 0)
    for (int r = 0; r < BN; ++r) for (int c = 0; c < Dv; ++c)
      if (sw128(2 * int(lv.layout_b()(r, c))) != tma_byte(BN, r, c)) ++errors;
  printf("D=%d Dv=%d BN=%d Q rows %d: errors %d\n", D, Dv, BN, QRows, errors);
  return errors;
}
// The warp-specialized kernel's box offsets are the boxes above: box j of slab s of a tile.
template <class E, int D, int Dv>
int check_ws_boxes() {
  using Ws = Sm90WsConfig<E, D, Dv>;
  int errors = 0;
  for (int s = 0; s < Ws::kSlabsK; ++s) for (int j = 0; j < Ws::kBoxesPerSlab; ++j)
    if (Ws::box_offset(Ws::kTileBytesK, Ws::kSlabsK, s, j) != s * Ws::kBlockN * 128 + j * 8192) ++errors;
  for (int s = 0; s < Ws::kSlabsV; ++s) for (int j = 0; j < Ws::kBoxesPerSlab; ++j)
    if (Ws::box_offset(Ws::kTileBytesV, Ws::kSlabsV, s, j) != s * Ws::kBlockN * 128 + j * 8192) ++errors;
  for (int s = 0; s < Ws::kSlabsK; ++s) for (int j = 0; j < Ws::kConsumers; ++j)
    if (Ws::box_offset(Ws::kQBytes, Ws::kSlabsK, s, j) != s * Ws::kRowsPerCta * 128 + j * 8192) ++errors;
  return errors;
}
template <class E, int D, int Dv = D>
int check() {
  int errors = check_config<Sm90Config<E, D, Dv>, E, D, Dv>() + check_config<Sm90ForwardConfig<E, D, Dv>, E, D, Dv>();
  if constexpr (D % 64 == 0 && Dv % 64 == 0)
    errors += check_config<Sm90WsConfig<E, D, Dv>, E, D, Dv>() + check_ws_boxes<E, D, Dv>();
  return errors;
}
int main() {
  int e = check<cute::half_t, 64>() + check<cute::bfloat16_t, 96>() + check<cute::bfloat16_t, 128>() +
          check<cute::bfloat16_t, 192, 128>() + check<cute::half_t, 256, 256>();
  printf(e ? "FAIL\n" : "ALL OK\n"); return e; }
