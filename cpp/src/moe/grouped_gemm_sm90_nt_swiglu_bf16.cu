// The (nt_swiglu, bf16) instantiation of the sm90a ptr-array grouped GEMM: gate and up in one
// GEMM over the interleaved gate_up weights, SwiGLU in the epilogue (swiglu_epilogue.hpp).
#include "moe/grouped_gemm_sm90.cuh"

namespace rudnn::moe::sm90::detail {

std::size_t workspace_bytes_nt_swiglu_bf16(int groups, int device) {
  return workspace_bytes_impl<Layouts::nt_swiglu, cutlass::bfloat16_t>(groups, device);
}

void run_nt_swiglu_bf16(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device,
                      cudaStream_t stream) {
  run_impl<Layouts::nt_swiglu, cutlass::bfloat16_t>(g, workspace, workspace_size, device, stream);
}

}  // namespace rudnn::moe::sm90::detail
