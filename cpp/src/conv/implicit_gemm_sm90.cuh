// The CUTLASS 3.x implicit-GEMM convolutions behind implicit_gemm.hpp's sm90 entry points
// (included by the per-op *_sm90.cu files, compiled for sm_90a only).
//
// The convolution collective builder: TMA im2col loads of the activation (TMA tiled loads of
// the filter; the other way round for wgrad), wgmma, a warp-specialized kernel (one producer
// warp group feeding one consumer warp group per 128x128x64 tile; CUTLASS 4.2 has no
// persistent or cooperative schedule for convolutions), no cluster, as many pipeline stages
// as the shared memory left by the epilogue holds. One NDHWC kernel per op and dtype serves
// 1-D, 2-D and 3-D problems (leading axes of size 1).
// float32 accumulation, the output in the input dtype; fprop adds a per-output-channel bias
// (a row broadcast in GEMM terms: the GEMM's N mode is the output channels) in its epilogue.
#pragma once

#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "conv/implicit_gemm.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"

namespace rudnn::conv::ig::sm90 {

using namespace cute;
using cutlass::conv::Operator;

constexpr int kAccess = 8;  // f16/bf16 elements per 16 bytes (TMA alignment)

// The output tensor's layout tag: NZPQK / NDHWC activations, KTRSC filters (wgrad).
template <Operator Op> struct OutputLayout { using type = cutlass::layout::TensorNDHWC; };
template <> struct OutputLayout<Operator::kWgrad> { using type = cutlass::layout::TensorKCSRT; };

// D = acc (+ bias[channel] for fprop), float32, rounded once to Element.
template <Operator Op, class Element>
struct FusionOf {
  using type = cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>;
};
template <class Element>
struct FusionOf<Operator::kFprop, Element> {
  using type = cutlass::epilogue::fusion::LinCombPerColBias<Element, float, Element, void, float, kAccess>;
};

// The block tile (M, N, K): K, the reduction, is a hierarchical mode in every op ((C, S, R, T) for
// fprop, (K, S, R, T) for dgrad, the linearized (Q, P, Z, N) for wgrad) and so is wgrad's N
// ((C, S, R, T)): those tile extents are wrapped in a Shape, as CUTLASS's own instances do.
template <Operator Op> struct TileOf { using type = cute::Shape<_128, _128, cute::Shape<_64>>; };
template <> struct TileOf<Operator::kWgrad> { using type = cute::Shape<_128, cute::Shape<_128>, cute::Shape<_64>>; };

template <Operator Op, class Element>
struct ConvConfig {
  using TileShape = typename TileOf<Op>::type;
  using ClusterShape = cute::Shape<_1, _1, _1>;
  using LayoutAct = cutlass::layout::TensorNDHWC;
  using LayoutOut = typename OutputLayout<Op>::type;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutOut, kAccess,  // no source C
      Element, LayoutOut, kAccess, cutlass::epilogue::TmaWarpSpecialized,
      typename FusionOf<Op, Element>::type>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, Element, LayoutAct, kAccess, Element, LayoutAct,
      kAccess, float, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<Op, CollectiveMainloop::DispatchPolicy::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

// The problem: activation [n, d, h, w, c], filter [k, t, r, s, c], both paddings, stride,
// dilation; packed strides (CUTLASS's default for these constructors).
template <class ProblemShape>
ProblemShape problem(const Extents& s) {
  return ProblemShape(cutlass::conv::Mode::kCrossCorrelation, {s.n, s.in[0], s.in[1], s.in[2], s.c},
                      {s.k, s.kernel[0], s.kernel[1], s.kernel[2], s.c},
                      {s.pad_before[0], s.pad_before[1], s.pad_before[2]},
                      {s.pad_after[0], s.pad_after[1], s.pad_after[2]}, {s.stride[0], s.stride[1], s.stride[2]},
                      {s.dilation[0], s.dilation[1], s.dilation[2]}, 1);
}

// The epilogue's stride of the packed output: for fprop and dgrad the M mode is the
// activation's (w, h, d, n) (innermost first, as CUTLASS linearizes it), for wgrad the output
// is the flat [k, (t r s c)] filter.
template <Operator Op, class Stride, class ProblemShape>
Stride output_stride(const ProblemShape& shape) {
  if constexpr (Op == Operator::kWgrad) {
    return cutlass::make_cute_packed_stride(Stride{}, shape.shape_C, shape.stride_C, Op);
  } else {
    Stride stride{};
    cute::for_each(cute::make_seq<cute::rank<0>(Stride{})>{},
                   [&](auto i) { cute::get<0, i>(stride) = shape.stride_C[ProblemShape::RankT - 2 - i]; });
    return stride;
  }
}

inline void check(cutlass::Status status, const char* what, const char* op) {
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorKind::cuda, std::string(op) + " (implicit_gemm, sm90): CUTLASS " + what + " failed: " +
                                     cutlassGetStatusString(status));
}

template <Operator Op, class Element>
bool run(const Call& c, const char* op_name, std::string* why) {
  using Config = ConvConfig<Op, Element>;
  using Conv = typename Config::Conv;
  using Kernel = typename Config::Kernel;
  const auto shape = problem<typename Config::ProblemShape>(c.s);
  typename Conv::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = shape;
  args.mainloop.ptr_A = static_cast<const Element*>(c.a);
  args.mainloop.ptr_B = static_cast<const Element*>(c.b);
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = output_stride<Op, typename Kernel::StrideC>(shape);
  args.epilogue.ptr_D = static_cast<Element*>(c.d);
  args.epilogue.dD = output_stride<Op, typename Kernel::StrideD>(shape);
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  if constexpr (Op == Operator::kFprop) args.epilogue.thread.bias_ptr = static_cast<const Element*>(c.bias);
  args.hw_info.device_id = c.device;
  args.hw_info.sm_count = core::device_props(c.device).sm_count;

  const cutlass::Status ok = Conv::can_implement(args);
  if (ok != cutlass::Status::kSuccess) {
    if (why) *why = std::string("CUTLASS can_implement refused the problem: ") + cutlassGetStatusString(ok);
    return false;
  }
  if (Conv::get_workspace_size(args) != 0)
    throw Error(ErrorKind::cuda, std::string(op_name) + " (implicit_gemm, sm90): internal: the kernel asks for a "
                                                        "workspace");
  Conv conv;
  const cudaStream_t stream = static_cast<cudaStream_t>(c.stream);
  check(conv.initialize(args, nullptr, stream), "initialize", op_name);
  check(conv.run(stream), "run", op_name);
  RUDNN_CUDA_CHECK_LAUNCH(implicit_gemm_conv_sm90);
  return true;
}

}  // namespace rudnn::conv::ig::sm90
