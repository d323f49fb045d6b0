// The (tn, f16) instantiation of the sm90a ptr-array grouped GEMM.
#include "moe/grouped_gemm_sm90.cuh"

RUDNN_SM90_GEMM_DEFINE(tn, f16, tn, cooperative, cutlass::half_t)
