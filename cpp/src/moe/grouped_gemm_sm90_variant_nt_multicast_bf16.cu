// The (nt, multicast, bf16) instantiation of the sm90a ptr-array grouped GEMM: 128x128 cooperative
// tiles in 1x2 clusters sharing A by TMA multicast (built with -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON; chosen
// by RUDNN_MOE_GEMM_SCHEDULE=multicast, experts_tc_cuda.cu).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nt_multicast, bf16, nt, multicast, cutlass::bfloat16_t)
