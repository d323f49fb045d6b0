// The (nt, ping-pong, bf16) instantiation of the sm90a ptr-array grouped GEMM: 64x128 tiles, one
// per consumer warpgroup, for the forward's GEMMs when experts hold few rows (experts_tc_cuda.cu).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nt_pingpong, bf16, nt, pingpong, cutlass::bfloat16_t)
