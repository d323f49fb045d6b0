// A tensor seen as a list of rows: its leading axes flattened in row-major order,
// each row a contiguous run of its last axis (or a single element for tensors of
// per-row statistics). Leading axes are collapsed where the strides allow, so the
// common cases cost one multiply per row; any strided view still works.
#pragma once

#include <cstdint>

#include "rudnn/tensor.hpp"

#if defined(__CUDACC__)
#define RUDNN_HD __host__ __device__ __forceinline__
#else
#define RUDNN_HD inline
#endif

namespace rudnn::core {

struct RowIndexer {
  int ndims = 0;  // collapsed leading axes (0: a single row at offset 0)
  std::int64_t sizes[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};

  // Element offset of row `row` from the tensor's data pointer.
  RUDNN_HD std::int64_t offset(std::int64_t row) const {
    if (ndims == 1) return row * strides[0];
    std::int64_t off = 0;
    for (int d = ndims - 1; d >= 0; --d) {
      off += (row % sizes[d]) * strides[d];
      row /= sizes[d];
    }
    return off;
  }
};

// Indexer over the first `lead_dims` axes of t.
inline RowIndexer make_row_indexer(const Tensor& t, int lead_dims) {
  RowIndexer r;
  for (int d = 0; d < lead_dims; ++d) {
    if (t.shape[d] == 1) continue;  // size-1 axes contribute nothing
    if (r.ndims > 0 && r.strides[r.ndims - 1] == t.strides[d] * t.shape[d]) {
      r.sizes[r.ndims - 1] *= t.shape[d];  // merges with the previous axis
      r.strides[r.ndims - 1] = t.strides[d];
    } else {
      r.sizes[r.ndims] = t.shape[d];
      r.strides[r.ndims] = t.strides[d];
      ++r.ndims;
    }
  }
  return r;
}

}  // namespace rudnn::core
