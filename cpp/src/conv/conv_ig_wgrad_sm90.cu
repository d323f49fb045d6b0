// The sm90a (CUTLASS 3.x collective builder) implicit-GEMM wgrad kernels, f16 and bf16
// (implicit_gemm_sm90.cuh).
#include "conv/implicit_gemm_sm90.cuh"

namespace rudnn::conv::ig {

bool wgrad_sm90(const Call& c, std::string* why) {
  using cutlass::conv::Operator;
  return c.dtype == DType::bf16 ? sm90::run<Operator::kWgrad, cutlass::bfloat16_t>(c, "conv_weight_backward", why)
                                : sm90::run<Operator::kWgrad, cutlass::half_t>(c, "conv_weight_backward", why);
}

}  // namespace rudnn::conv::ig
