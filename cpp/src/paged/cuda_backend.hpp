// The CUDA backend of the paged family (forward_cuda.cu, prefill_cuda.cu, mla_decode_cuda.cu, backward_cuda.cu): what dispatch.cpp calls for CUDA
// tensors, with the device made current. Each returns the name of the kernel path it ran
// (paged_last_algorithm).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "paged/problem.hpp"

namespace rudnn::paged::cuda {

// Attention or MLA forward; `workspace` is the split workspace when p.splits > 1.
const char* forward_cuda(const Problem& p, const Tensor* workspace, cudaStream_t stream);
// The tensor-core prefill kernel (prefill_cuda.cu) over the rows of prefill runs (cuda_common.cuh),
// launched when it serves p; returns whether it was (the decode kernel must then skip those rows).
// part_out / part_lse: the split workspace's partials when p.splits > 1, else null.
bool prefill_cuda(const Problem& p, float* part_out, float* part_lse, cudaStream_t stream);
// The tensor-core MLA decode kernel (mla_decode_cuda.cu): whether it serves p (f16/bf16, R = 512,
// P = 64, 16-byte rows, sm_80+ with 162 KB of shared memory per CTA; the device current), its CTAs per query row and split, and its
// launch (every row of p; part_out / part_lse as for prefill_cuda; the caller merges splits).
bool mla_decode_serves_cuda(const Problem& p);
int mla_decode_head_blocks(const Problem& p);
void mla_decode_cuda(const Problem& p, float* part_out, float* part_lse, cudaStream_t stream);
// paged_attention_default_splits on CUDA (the device current).
int default_splits_cuda(const Problem& p, std::int64_t max_length);
// The append kernel. The duplicate-slot refusal happened before (the host plan's check).
const char* append_cuda(const PagedAppendArgs& a, const AppendProblem& p, cudaStream_t stream);
// The backward (backward_cuda.cu): atomic by default, ordered with p.ordered ("cuda_atomic",
// "cuda_ordered"); `workspace` is the atomic mode's float32 scratch of backward_workspace_bytes
// (0 bytes for float32 caches and in the ordered mode).
std::size_t backward_workspace_bytes(const BackwardProblem& p);
const char* backward_cuda(const BackwardProblem& p, const Tensor* workspace, cudaStream_t stream);

}  // namespace rudnn::paged::cuda
