// The sm90a (CUTLASS 3.x collective builder) implicit-GEMM fprop kernels, f16 and bf16
// (implicit_gemm_sm90.cuh).
#include "conv/implicit_gemm_sm90.cuh"

namespace rudnn::conv::ig {

bool fprop_sm90(const Call& c, std::string* why) {
  using cutlass::conv::Operator;
  return c.dtype == DType::bf16 ? sm90::run<Operator::kFprop, cutlass::bfloat16_t>(c, "conv", why)
                                : sm90::run<Operator::kFprop, cutlass::half_t>(c, "conv", why);
}

}  // namespace rudnn::conv::ig
