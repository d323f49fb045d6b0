// __syncthreads_or for the host emulators whose kernels vote across a block (the MoE row kernels'
// zero_uncovered_rows_kernel). Kept out of emu_runtime.hpp so that adding it rebuilt only the
// emulators that use it. One flag for the process: right under emu_launch, which runs the blocks
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
