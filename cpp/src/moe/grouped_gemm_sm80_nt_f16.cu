// The f16 instantiation of the sm80 grouped GEMM (one per translation unit).
#include "moe/grouped_gemm_sm80.cuh"

namespace rudnn::moe::sm80::detail {

std::size_t workspace_bytes_nt_f16(int groups) { return workspace_bytes_impl<cutlass::half_t>(groups); }

void run_nt_f16(const sm90::SegmentGemm& g, void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  run_impl<cutlass::half_t>(g, workspace, workspace_size, stream);
}

}  // namespace rudnn::moe::sm80::detail
