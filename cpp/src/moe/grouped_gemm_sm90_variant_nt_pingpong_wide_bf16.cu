// The (nt, wide ping-pong, bf16) instantiation of the sm90a ptr-array grouped GEMM: 128x128 tiles, one
// per consumer warpgroup, the two alternating so that one's epilogue runs under the other's
// mainloop, for the down projection's short K (built with -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON; chosen
// by RUDNN_MOE_GEMM_SCHEDULE=pingpong_wide, experts_tc_cuda.cu).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nt_pingpong_wide, bf16, nt, pingpong_wide, cutlass::bfloat16_t)
