// The sm80 (CUTLASS 2.x) implicit-GEMM wgrad kernels, f16 and bf16 (implicit_gemm_sm80.cuh).
#include "conv/implicit_gemm_sm80.cuh"

namespace rudnn::conv::ig {

bool wgrad_sm80(const Call& c, std::string* why) {
  return c.dtype == DType::bf16 ? sm80::wgrad<cutlass::bfloat16_t>(c, why) : sm80::wgrad<cutlass::half_t>(c, why);
}

}  // namespace rudnn::conv::ig
