// __syncthreads_or, and __shfl_xor_sync of an int, for the host emulators whose kernels use them
// (the MoE kernels: zero_uncovered_rows_kernel's and routing's votes, the block argmax's ids).
// Kept out of emu_runtime.hpp so that adding them rebuilt only the emulators that use them.
// __syncthreads_or keeps one flag for the process: right under emu_launch, which runs the blocks
// one after another, not under emu_launch_cluster.
#pragma once

#include <atomic>

#include "emu_runtime.hpp"

inline int __syncthreads_or(int predicate) {
  static std::atomic<int> any{0};
  __syncthreads();  // every thread has read the previous vote
  if (emu_thread_id() == 0) any.store(0);
  __syncthreads();
  if (predicate) any.store(1);
  __syncthreads();
  return any.load();
}

inline int __shfl_xor_sync(unsigned, int v, int lane_mask) {
  int r = 0;
  emu_warp_exchange(v, [&](auto lane_value) { r = lane_value(emu_lane ^ lane_mask); });
  return r;
}
