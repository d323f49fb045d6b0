// The (nt_swiglu, ping-pong, bf16) instantiation of the sm90a ptr-array grouped GEMM: the fused
// gate/up GEMM (SwiGLU in the epilogue, swiglu_epilogue.hpp) on 64x128 tiles, one per consumer
// warpgroup, for experts that hold few rows (experts_tc_cuda.cu).
#include "moe/grouped_gemm_sm90.cuh"

namespace rudnn::moe::sm90::detail {

std::size_t workspace_bytes_nt_swiglu_pingpong_bf16(int groups, int device) {
  return workspace_bytes_impl<Layouts::nt_swiglu, cutlass::bfloat16_t, Schedule::pingpong>(groups, device);
}

void run_nt_swiglu_pingpong_bf16(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device,
                               cudaStream_t stream) {
  run_impl<Layouts::nt_swiglu, cutlass::bfloat16_t, Schedule::pingpong>(g, workspace, workspace_size, device, stream);
}

}  // namespace rudnn::moe::sm90::detail
