// Grouped GEMM over expert segments for the "tensor_core" strategy: CUTLASS 3.x ptr-array
// grouped kernel (sm90a: TMA loads, wgmma, warp-specialized), built with the collective builders.
// One instantiation per (layouts, schedule, dtype), each in its own .cu file.
//
// A "segment GEMM" is one grouped launch over the experts (and up to three operand sets):
// for set s and expert e, D = A · B with fp32 accumulation, where each operand's base moves
// either along the expert's rows (Placement::segment: base + offsets[e] * ld) or by a fixed
// per-expert stride (Placement::expert: base + e * expert_stride), and each of M, N, K is
// fixed or the expert's row count (-1). Problem sizes, pointers and strides are written on
// the device by a small kernel from the device-side offsets, so nothing waits for the host.
// An expert without rows gets an empty problem (no tiles): its D is left untouched.
//
// Three operand layouts (CUTLASS terms: A is M x K, B is N x K, D is M x N row-major):
//   nt: A row-major, B K-contiguous, D in the input dtype   (forward: x · W^T)
//   nn: A row-major, B N-contiguous, D float32               (backward: dy · W)
//   tn: A M-contiguous, B N-contiguous, D float32            (weight gradients: da^T · x)
//   nn_accumulate: as nn, plus a float32 source C (row-major, beta = 1), D = A · B + C in the input
//              dtype, rounded once (backward: dx = db · up + (da · gate))
//   nt_swiglu: as nt, B the interleaved gate_up weights (N = 2I), D = h = silu(a) * b [M, I]
//              from the epilogue (swiglu_epilogue.hpp; N a multiple of 128)
//
// Four schedules (issue 25's configuration table; experts_tc_cuda.cu picks one per call):
//   cooperative: 128x128x64 tiles, both consumer warpgroups on one tile (every layout);
//   pingpong:    64x128x64 tiles, each consumer warpgroup on its own tile, the two alternating so
//                that one's epilogue runs under the other's mainloop (nt and nt_swiglu only: the
//                forward's GEMMs when experts hold few rows, where a 128-row tile would be mostly
//                padding);
//   multicast:   the cooperative tiles in 1x2 clusters: two CTAs on the same rows of one expert
//                and neighbouring N tiles, each A tile loaded once by TMA multicast for both (nt
//                and nt_swiglu only; chosen only by RUDNN_MOE_GEMM_SCHEDULE=multicast until a GPU
//                run measures it: A, the dispatched rows, is read N / 128 times per expert, the
//                weights M / 128 times, so A is most of the L2 traffic at every bench shape);
//   pingpong_wide: 128x128x64 tiles, each consumer warpgroup on its own tile, alternating (nt
//                only: the down projection, whose K = I is short, e.g. 768: its epilogue then runs
//                under the other tile's mainloop; RUDNN_MOE_GEMM_SCHEDULE=pingpong_wide).
// The last two ("variants") are built only with -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::moe::sm90 {

enum class Layouts { nt, nn, tn, nt_swiglu, nn_accumulate };
enum class Schedule { cooperative, pingpong, multicast, pingpong_wide };
enum class Placement : unsigned char { segment, expert };

struct Operand {
  const void* base = nullptr;
  std::int64_t ld = 0;                    // leading dimension (elements)
  Placement at = Placement::segment;
  std::int64_t expert_stride = 0;         // elements, for Placement::expert
};

struct OperandSet {
  Operand a, b, d;
  Operand c;                              // the source C of nn_accumulate (placed as d); else unused
  int m = -1, n = 0, k = 0;               // -1: the expert's row count
};

struct SegmentGemm {
  int experts = 0;
  int sets = 1;                           // 1..3 operand sets in one launch (sets * E groups)
  OperandSet set[3];
  const int* offsets = nullptr;           // [E + 1] on the device
  std::int64_t rows = 0;                  // dispatched rows (offsets are clamped to them)
};

namespace detail {  // one pair per instantiation (grouped_gemm_sm90_<name>_<dtype>.cu: RUDNN_SM90_GEMM_DEFINE)
#define RUDNN_SM90_GEMM_DECL(L, D)                                                                     \
  std::size_t workspace_bytes_##L##_##D(int groups, int device);                                       \
  void run_##L##_##D(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device,     \
                     cudaStream_t stream);
RUDNN_SM90_GEMM_DECL(nt, bf16)
RUDNN_SM90_GEMM_DECL(nt, f16)
RUDNN_SM90_GEMM_DECL(nt_pingpong, bf16)
RUDNN_SM90_GEMM_DECL(nt_pingpong, f16)
RUDNN_SM90_GEMM_DECL(nt_swiglu, bf16)
RUDNN_SM90_GEMM_DECL(nt_swiglu, f16)
RUDNN_SM90_GEMM_DECL(nt_swiglu_pingpong, bf16)
RUDNN_SM90_GEMM_DECL(nt_swiglu_pingpong, f16)
RUDNN_SM90_GEMM_DECL(nn, bf16)
RUDNN_SM90_GEMM_DECL(nn, f16)
RUDNN_SM90_GEMM_DECL(nn_accumulate, bf16)
RUDNN_SM90_GEMM_DECL(nn_accumulate, f16)
RUDNN_SM90_GEMM_DECL(tn, bf16)
RUDNN_SM90_GEMM_DECL(tn, f16)
#if RUDNN_WITH_MOE_GEMM_VARIANTS
RUDNN_SM90_GEMM_DECL(nt_multicast, bf16)
RUDNN_SM90_GEMM_DECL(nt_multicast, f16)
RUDNN_SM90_GEMM_DECL(nt_swiglu_multicast, bf16)
RUDNN_SM90_GEMM_DECL(nt_swiglu_multicast, f16)
RUDNN_SM90_GEMM_DECL(nt_pingpong_wide, bf16)
RUDNN_SM90_GEMM_DECL(nt_pingpong_wide, f16)
#endif
#undef RUDNN_SM90_GEMM_DECL

// The two functions of one instantiation.
struct Instantiation {
  std::size_t (*workspace_bytes)(int groups, int device);
  void (*run)(const SegmentGemm& g, void* workspace, std::size_t workspace_size, int device, cudaStream_t stream);
};

// The instantiation of (layouts, schedule, dtype): the forward's layouts (nt, nt_swiglu) have every
// schedule but pingpong_wide (nt only), the backward's are cooperative only. The variants (multicast,
// pingpong_wide) exist where libruDNN was configured with -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON
// (bench/gpu_check.sh does, to measure them; CMake defines RUDNN_WITH_MOE_GEMM_VARIANTS=1 for
// experts_tc_cuda.cu, the one file that picks a schedule).
inline constexpr const char* kVariantsNotBuilt = "this libruDNN was built without the MoE GEMM variants";

inline Instantiation instantiation(Layouts layouts, Schedule schedule, DType dtype) {
  const bool bf16 = dtype == DType::bf16;
#define RUDNN_SM90_GEMM_PICK(NAME)                                                   \
  (bf16 ? Instantiation{workspace_bytes_##NAME##_bf16, run_##NAME##_bf16}           \
        : Instantiation{workspace_bytes_##NAME##_f16, run_##NAME##_f16})
  if (schedule == Schedule::pingpong) {
    if (layouts == Layouts::nt) return RUDNN_SM90_GEMM_PICK(nt_pingpong);
    if (layouts == Layouts::nt_swiglu) return RUDNN_SM90_GEMM_PICK(nt_swiglu_pingpong);
    throw Error(ErrorKind::unsupported,
                "SwiGluExperts (tensor_core): the ping-pong grouped GEMM is built for the forward's layouts only");
  }
  if (schedule == Schedule::multicast || schedule == Schedule::pingpong_wide) {
#if RUDNN_WITH_MOE_GEMM_VARIANTS
    if (schedule == Schedule::pingpong_wide && layouts == Layouts::nt) return RUDNN_SM90_GEMM_PICK(nt_pingpong_wide);
    if (schedule == Schedule::multicast && layouts == Layouts::nt) return RUDNN_SM90_GEMM_PICK(nt_multicast);
    if (schedule == Schedule::multicast && layouts == Layouts::nt_swiglu)
      return RUDNN_SM90_GEMM_PICK(nt_swiglu_multicast);
    throw Error(ErrorKind::unsupported,
                "SwiGluExperts (tensor_core): this grouped-GEMM variant is not built for these layouts");
#else
    throw Error(ErrorKind::unsupported, std::string("SwiGluExperts (tensor_core): RUDNN_MOE_GEMM_SCHEDULE=") +
                                            (schedule == Schedule::multicast ? "multicast" : "pingpong_wide") + ": " +
                                            kVariantsNotBuilt + " (configure with -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON)");
#endif
  }
  switch (layouts) {
    case Layouts::nt: return RUDNN_SM90_GEMM_PICK(nt);
    case Layouts::nt_swiglu: return RUDNN_SM90_GEMM_PICK(nt_swiglu);
    case Layouts::nn: return RUDNN_SM90_GEMM_PICK(nn);
    case Layouts::nn_accumulate: return RUDNN_SM90_GEMM_PICK(nn_accumulate);
    default: return RUDNN_SM90_GEMM_PICK(tn);
  }
#undef RUDNN_SM90_GEMM_PICK
}
}  // namespace detail

// Device bytes one call with `groups` groups needs: argument arrays plus CUTLASS's workspace.
inline std::size_t workspace_bytes(Layouts layouts, DType dtype, int groups, int device,
                                   Schedule schedule = Schedule::cooperative) {
  return detail::instantiation(layouts, schedule, dtype).workspace_bytes(groups, device);
}

// Queues the grouped GEMM (inputs f16 or bf16) on `stream`. The caller has checked that the
// device is sm_90 and that every leading dimension and base pointer suits TMA (16 bytes).
inline void run(Layouts layouts, DType dtype, const SegmentGemm& g, void* workspace, std::size_t workspace_size,
                int device, cudaStream_t stream, Schedule schedule = Schedule::cooperative) {
  detail::instantiation(layouts, schedule, dtype).run(g, workspace, workspace_size, device, stream);
}

}  // namespace rudnn::moe::sm90
