// The (nn_accumulate, bf16) instantiation of the sm90a ptr-array grouped GEMM: D = A · B + C with a
// float32 source C and D in bf16 (the backward's dx = db · up_e + (da · gate_e)).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nn_accumulate, bf16, nn_accumulate, cooperative, cutlass::bfloat16_t)
