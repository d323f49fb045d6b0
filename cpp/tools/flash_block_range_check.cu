// Host-side check (no GPU needed) of the block skipping in the flash kernels (key blocks per
// query block in the forward and dq kernels, query blocks per key block in the dkdv kernel): for many
// sequence lengths, causal flags and windows, every key visible to some query of a 64-row
// query block lies inside the [first, last) key blocks key_block_range() returns, and the
// blocks it returns are not wider than one block beyond the visible keys.
//   nvcc -std=c++17 --expt-relaxed-constexpr -Icpp/include -Icpp/src -isystem <cutlass>/include \
//        cpp/tools/flash_block_range_check.cu -o /tmp/range && /tmp/range
#include <cstdio>

#include "attention/flash_bwd_sm80.cuh"

int main() {
  using rudnn::attention::Problem;
  const int lens[] = {0, 1, 5, 63, 64, 65, 127, 128, 130, 200};
  const int windows[] = {-1, 0, 1, 3, 64, 100};
  long checked = 0, errors = 0;
  for (int lq : lens)
    for (int lk : lens)
      for (int causal = 0; causal < 2; ++causal)
        for (int wl : windows)
          for (int wr : windows) {
            Problem p;
            p.causal = causal;
            p.window_left = wl;
            p.window_right = wr;
            for (std::int64_t m0 = 0; m0 < lq; m0 += 64) {
              const std::int64_t rows = lq - m0 < 64 ? lq - m0 : 64;
              std::int64_t first, last;
              rudnn::attention::cuda::key_block_range(p, m0, rows, lq, lk, 64, first, last);
              std::int64_t lo = lk, hi = -1;  // visible keys of this query block
              for (std::int64_t i = m0; i < m0 + rows; ++i)
                for (std::int64_t j = 0; j < lk; ++j)
                  if (p.visible(i, j, lq, lk)) lo = j < lo ? j : lo, hi = j > hi ? j : hi;
              ++checked;
              if (hi >= 0 && (lo < first * 64 || hi >= last * 64)) {
                if (errors++ < 5)
                  printf("MISSED lq %d lk %d causal %d w (%d,%d) m0 %lld: visible [%lld, %lld], blocks [%lld, %lld)\n", lq, lk,
                         causal, wl, wr, (long long)m0, (long long)lo, (long long)hi, (long long)first, (long long)last);
              }
              if (hi >= 0 && (first < lo / 64 || last > hi / 64 + 1)) {
                if (errors++ < 5) printf("TOO WIDE lq %d lk %d causal %d w (%d,%d) m0 %lld\n", lq, lk, causal, wl, wr,
                                         (long long)m0);
              }
              if (hi < 0 && last > first && errors++ < 5) printf("blocks for no visible key lq %d lk %d\n", lq, lk);
            }
            // The backward's dkdv kernel: query blocks that see some key of a 64-key block.
            for (std::int64_t n0 = 0; n0 < lk; n0 += 64) {
              const std::int64_t cols = lk - n0 < 64 ? lk - n0 : 64;
              std::int64_t first, last;
              rudnn::attention::cuda::query_block_range(p, n0, cols, lq, lk, 64, first, last);
              std::int64_t lo = lq, hi = -1;
              for (std::int64_t i = 0; i < lq; ++i)
                for (std::int64_t j = n0; j < n0 + cols; ++j)
                  if (p.visible(i, j, lq, lk)) lo = i < lo ? i : lo, hi = i > hi ? i : hi;
              ++checked;
              if (hi >= 0 && (lo < first * 64 || hi >= last * 64 || first < lo / 64 || last > hi / 64 + 1)) {
                if (errors++ < 5)
                  printf("query range lq %d lk %d causal %d w (%d,%d) n0 %lld: visible [%lld, %lld], blocks [%lld, %lld)\n",
                         lq, lk, causal, wl, wr, (long long)n0, (long long)lo, (long long)hi, (long long)first,
                         (long long)last);
              }
              if (hi < 0 && last > first && errors++ < 5) printf("query blocks for no visible query lq %d lk %d\n", lq, lk);
            }
          }
  printf("%ld query blocks checked, %ld errors\n", checked, errors);
  return errors != 0;
}
