// The forward's grouped GEMM on sm_80-class GPUs (Ampere, Ada; also runs on Hopper): a
// CUTLASS 2.x grouped kernel (mma.sync tensor cores, cp.async multistage mainloop) whose
// problem visitor reads the problem sizes on the device (GroupScheduleMode::kDeviceOnly), so
// the segment GEMMs of grouped_gemm_sm90.hpp (layouts "nt" only, D in the input dtype) run
// without host synchronization here too. One instantiation per dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "moe/grouped_gemm_sm90.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::moe::sm80 {

namespace detail {
std::size_t workspace_bytes_nt_bf16(int groups);
std::size_t workspace_bytes_nt_f16(int groups);
void run_nt_bf16(const sm90::SegmentGemm& g, void* workspace, std::size_t workspace_size, cudaStream_t stream);
void run_nt_f16(const sm90::SegmentGemm& g, void* workspace, std::size_t workspace_size, cudaStream_t stream);
}  // namespace detail

inline std::size_t workspace_bytes(DType dtype, int groups) {
  return dtype == DType::bf16 ? detail::workspace_bytes_nt_bf16(groups) : detail::workspace_bytes_nt_f16(groups);
}

// D = A · B^T per group (A row-major, B the [N, K] expert weights, D row-major), f16/bf16.
inline void run(DType dtype, const sm90::SegmentGemm& g, void* workspace, std::size_t workspace_size,
                cudaStream_t stream) {
  if (dtype == DType::bf16)
    detail::run_nt_bf16(g, workspace, workspace_size, stream);
  else
    detail::run_nt_f16(g, workspace, workspace_size, stream);
}

}  // namespace rudnn::moe::sm80
