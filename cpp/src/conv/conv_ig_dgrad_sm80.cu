// The sm80 (CUTLASS 2.x) implicit-GEMM dgrad kernels, f16, bf16 and f32 as TF32: NHWC (any stride) and
// NDHWC (stride 1) (implicit_gemm_sm80.cuh).
#include "conv/implicit_gemm_sm80.cuh"

namespace rudnn::conv::ig {

bool dgrad_sm80(const Call& c, std::string* why) {
  switch (c.dtype) {
    case DType::bf16: return sm80::dgrad<cutlass::bfloat16_t>(c, why);
    case DType::f32: return sm80::dgrad<float>(c, why);  // TF32 tensor cores
    default: return sm80::dgrad<cutlass::half_t>(c, why);
  }
}

}  // namespace rudnn::conv::ig
