// The (nn_accumulate, f16) instantiation of the sm90a ptr-array grouped GEMM: D = A · B + C with a
// float32 source C and D in f16 (the backward's dx = db · up_e + (da · gate_e)).
#include "moe/grouped_gemm_sm90.cuh"

namespace rudnn::moe::sm90::detail {

std::size_t workspace_bytes_nn_accumulate_f16(int groups, int device) {
  return workspace_bytes_impl<Layouts::nn_accumulate, cutlass::half_t>(groups, device);
}

void run_nn_accumulate_f16(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device,
                          cudaStream_t stream) {
  run_impl<Layouts::nn_accumulate, cutlass::half_t>(g, workspace, workspace_size, device, stream);
}

}  // namespace rudnn::moe::sm90::detail
