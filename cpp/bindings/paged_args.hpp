// The default split-KV choice of a paged forward call without a workspace, shared by paged.cpp
// (torch/CuPy/NumPy) and paged_ffi.cpp (JAX).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "rudnn/paged.hpp"

namespace rudnn::bindings::paged_args {

// For a call with splits 1 whose longest history is bounded by max_length (< 0: unknown): the
// split count paged_*_default_splits picks, set in `a`, and the bytes of its workspace (0: no
// split, nothing to allocate; always 0 on the CPU).
template <class Args>
std::size_t auto_split_bytes(Args& a, std::int64_t max_length) {
  if (a.splits != 1 || max_length < 0 || a.out.rank != 3) return 0;
  int splits = 1;
  if constexpr (std::is_same_v<Args, PagedAttentionArgs>)
    splits = paged_attention_default_splits(a, max_length);
  else
    splits = paged_mla_default_splits(a, max_length);
  if (splits < 2) return 0;
  a.splits = splits;
  return paged_split_workspace_bytes(a.out.shape[0], a.out.shape[1], a.out.shape[2], splits);
}

}  // namespace rudnn::bindings::paged_args
