// The (nn, bf16) instantiation of the sm90a ptr-array grouped GEMM (one per translation unit:
// CUTLASS 3.x kernels compile slowly, and separate files build in parallel).
#include "moe/grouped_gemm_sm90.cuh"

namespace rudnn::moe::sm90::detail {

std::size_t workspace_bytes_nn_bf16(int groups, int device) {
  return workspace_bytes_impl<Layouts::nn, cutlass::bfloat16_t>(groups, device);
}

void run_nn_bf16(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device, cudaStream_t stream) {
  run_impl<Layouts::nn, cutlass::bfloat16_t>(g, workspace, workspace_size, device, stream);
}

}  // namespace rudnn::moe::sm90::detail
