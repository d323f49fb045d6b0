// Grouped GEMM over expert segments for the "tensor_core" strategy: CUTLASS 3.x ptr-array
// grouped kernel (sm90a: TMA loads, wgmma, warp-specialized cooperative schedule), built with
// the collective builders. One instantiation per dtype, each in its own .cu file.
//
// A "segment GEMM" runs, for every expert e (and up to two operand sets, e.g. gate and up),
//   D[rows of e] = A[rows of e] · B_e^T      A: [M_e, K] row-major (lda), B_e: [N, K] (ldb),
//                                           D: [M_e, N] row-major (ldd), fp32 accumulation,
// where rows of e come from the device-side offsets. Problem sizes, pointers and strides are
// written on the device by a small kernel, so nothing waits for the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "rudnn/tensor.hpp"

namespace rudnn::moe::sm90 {

struct SegmentOperands {
  const void* a = nullptr;            // row 0 of A
  std::int64_t lda = 0;
  const void* b = nullptr;            // B of expert 0; expert e at b + e * b_expert_stride
  std::int64_t b_expert_stride = 0;   // elements
  std::int64_t ldb = 0;
  void* d = nullptr;                  // row 0 of D
  std::int64_t ldd = 0;
};

struct SegmentGemm {
  int experts = 0;
  int sets = 1;                       // 1 or 2 operand sets in one launch (2 * E groups)
  SegmentOperands set[2];
  int n = 0, k = 0;
  const int* offsets = nullptr;       // [E + 1] on the device
  std::int64_t rows = 0;              // N of the dispatched rows (offsets are clamped to it)
};

namespace detail {  // one pair per instantiation (grouped_gemm_sm90_<dtype>.cu)
std::size_t workspace_bytes_bf16(int groups, int device);
std::size_t workspace_bytes_f16(int groups, int device);
void run_bf16(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device, cudaStream_t stream);
void run_f16(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device, cudaStream_t stream);
}  // namespace detail

// Device bytes one call with `groups` groups needs: argument arrays plus CUTLASS's workspace.
inline std::size_t workspace_bytes(DType dtype, int groups, int device) {
  return dtype == DType::bf16 ? detail::workspace_bytes_bf16(groups, device) : detail::workspace_bytes_f16(groups, device);
}

// Queues the grouped GEMM (dtype f16 or bf16) on `stream`. The caller has checked that the
// device is sm_90 and that every row stride and base pointer suits TMA (16-byte aligned).
inline void run(DType dtype, const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device,
                cudaStream_t stream) {
  if (dtype == DType::bf16)
    detail::run_bf16(g, workspace, workspace_size, device, stream);
  else
    detail::run_f16(g, workspace, workspace_size, device, stream);
}

}  // namespace rudnn::moe::sm90
