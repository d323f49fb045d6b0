// The (nt_swiglu, multicast, f16) instantiation of the sm90a ptr-array grouped GEMM: the fused
// gate/up GEMM (SwiGLU in the epilogue) on 128x128 cooperative tiles in 1x2 clusters sharing A by TMA
// multicast (built with -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON; chosen by RUDNN_MOE_GEMM_SCHEDULE=multicast).
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(nt_swiglu_multicast, f16, nt_swiglu, multicast, cutlass::half_t)
