// The launches of dispatch_plan_cuda (cpp/src/moe/dispatch_cuda.cu), replayed on the host
// emulator: one for slots that fit one chunk, else count, scan each expert's counts over the
// chunks, scan the experts' totals into the offsets, place. Include after the extracted
// dispatch-plan section (namespace rudnn::moe::emu_k).
#pragma once

#include <algorithm>
#include <cstddef>

#include "emu_runtime.hpp"
#include "moe/problem.hpp"

template <class Idx>
void dispatch_plan_emulated(const Idx* indices, const rudnn::moe::DispatchPlanProblem& p, int* workspace,
                            int* offsets, int* token_of_row, int* row_of_slot) {
  namespace k = rudnn::moe::emu_k;
  const k::Chunks c = k::chunks_of(p);
  if (c.count == 0) {
    std::fill(offsets, offsets + p.experts + 1, 0);  // dispatch_plan_cuda's cudaMemsetAsync
    return;
  }
  const std::size_t smem = std::size_t(p.experts) * sizeof(int);
  if (k::single_chunk(c)) {
    emu_launch(EmuDim3{1, 1, 1}, unsigned(k::totals_threads(p.experts)), 1, smem, [&] {
      k::single_chunk_plan_kernel<Idx>(indices, p.index_stride, c.slots, p.top_k, p.experts, offsets, token_of_row,
                                       row_of_slot);
    });
    return;
  }
  int* counts = workspace;
  int* totals = counts + c.count * p.experts;
  emu_launch(EmuDim3{unsigned(c.count), 1, 1}, 32, 1, smem, [&] {
    k::walk_chunks_kernel<Idx, false>(indices, p.index_stride, c.slots, p.top_k, p.experts, c.size, c.count,
                                      counts, offsets, token_of_row, row_of_slot);
  });
  emu_launch(EmuDim3{unsigned(p.experts), 1, 1}, unsigned(k::scan_threads(c.count)), 1, 0,
             [&] { k::scan_chunks_kernel(counts, c.count, totals); });
  emu_launch(EmuDim3{1, 1, 1}, unsigned(k::totals_threads(p.experts)), 1, 0,
             [&] { k::scan_totals_kernel(totals, p.experts, offsets); });
  emu_launch(EmuDim3{unsigned(c.count), 1, 1}, 32, 1, smem, [&] {
    k::walk_chunks_kernel<Idx, true>(indices, p.index_stride, c.slots, p.top_k, p.experts, c.size, c.count, counts,
                                     offsets, token_of_row, row_of_slot);
  });
}
