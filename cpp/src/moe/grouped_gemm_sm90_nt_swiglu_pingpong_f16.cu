// The (nt_swiglu, ping-pong, f16) instantiation of the sm90a ptr-array grouped GEMM: the fused
// gate/up GEMM (SwiGLU in the epilogue, swiglu_epilogue.hpp) on 64x128 tiles, one per consumer
// warpgroup, for experts that hold few rows (experts_tc_cuda.cu).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nt_swiglu_pingpong, f16, nt_swiglu, pingpong, cutlass::half_t)
