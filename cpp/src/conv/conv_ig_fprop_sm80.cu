// The sm80 (CUTLASS 2.x) implicit-GEMM fprop kernels, f16, bf16 and f32 as TF32 (implicit_gemm_sm80.cuh).
#include "conv/implicit_gemm_sm80.cuh"

namespace rudnn::conv::ig {

bool fprop_sm80(const Call& c, std::string* why) {
  switch (c.dtype) {
    case DType::bf16: return sm80::fprop<cutlass::bfloat16_t>(c, why);
    case DType::f32: return sm80::fprop<float>(c, why);  // TF32 tensor cores
    default: return sm80::fprop<cutlass::half_t>(c, why);
  }
}

}  // namespace rudnn::conv::ig
