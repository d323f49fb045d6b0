// The (nt_swiglu, bf16) instantiation of the sm90a ptr-array grouped GEMM: gate and up in one
// GEMM over the interleaved gate_up weights, SwiGLU in the epilogue (swiglu_epilogue.hpp).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nt_swiglu, bf16, nt_swiglu, cooperative, cutlass::bfloat16_t)
