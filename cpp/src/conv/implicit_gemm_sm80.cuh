// The CUTLASS 2.x implicit-GEMM convolutions behind implicit_gemm.hpp's sm80 entry points
// (included by the per-op *_sm80.cu files, one kernel family per translation unit).
//
// One tile per element type for every op: f16/bf16 128x128x32 blocks of four 64x64x32 warps,
// 16x8x16 mma.sync, 8-element accesses; float (TF32) 128x64x16 blocks of four 64x32x16 warps,
// 16x8x8 mma.sync, 4-element accesses. Both: float32 accumulation, 16-byte accesses, 3 cp.async
// stages (at most 48 KiB of shared memory: fits the 100 KiB of sm_86/sm_89 as well as sm_80's
// 164 KiB), "optimized" iterators.
// ResNet-50, UNet/VAE and 3-D VAE layers all have Cin, Cout in 64..2048: 128-wide tiles fill them.
#pragma once

#include <string>

#include "cutlass/cutlass.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/conv3d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_dgrad.h"
#include "cutlass/conv/kernel/default_conv3d_dgrad.h"
#include "cutlass/conv/kernel/default_conv3d_fprop.h"
#include "cutlass/conv/kernel/default_conv3d_wgrad.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/layout/tensor.h"

#include "conv/implicit_gemm.hpp"
#include "core/cuda_check.hpp"

namespace rudnn::conv::ig::sm80 {

template <class Element>
constexpr int kAccess = int(16 / sizeof(Element));  // elements per 16-byte access

// The reduction step of a block and a warp: 64 bytes of each operand row per stage. TF32 blocks
// are 128x64 (warps 64x32): with 128x128 the strided data gradient spills 40 bytes.
template <class Element>
struct Tile {
  static constexpr bool kTf32 = sizeof(Element) == 4;
  static constexpr int kK = kAccess<Element> * 4;
  using Block = cutlass::gemm::GemmShape<128, kTf32 ? 64 : 128, kK>;
  using Warp = cutlass::gemm::GemmShape<64, kTf32 ? 32 : 64, kK>;
  using Mma = cutlass::gemm::GemmShape<16, 8, kAccess<Element> * 2>;  // 16x8x16 (16-bit), 16x8x8 (TF32)
  static constexpr int kStages = 3;
};

// D = acc + beta * C in float32, rounded once to the element type (beta = 1 adds the bias
// through a C tensor of stride 0: one value per output channel).
template <class Element>
using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kAccess<Element>, float, float>;

template <class Element>
using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>;

// The kernels, by op and rank. ND layouts: TensorNDHWC (rank 3) or TensorNHWC (rank 2).
template <class Element>
using Fprop3d = cutlass::conv::device::ImplicitGemmConvolution<typename cutlass::conv::kernel::DefaultConv3dFprop<
    Element, cutlass::layout::TensorNDHWC, Element, cutlass::layout::TensorNDHWC, Element,
    cutlass::layout::TensorNDHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    typename Tile<Element>::Block, typename Tile<Element>::Warp, typename Tile<Element>::Mma, Epilogue<Element>,
    Swizzle<Element>, Tile<Element>::kStages, cutlass::arch::OpMultiplyAdd,
    cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel>;

template <class Element>
using Wgrad3d = cutlass::conv::device::ImplicitGemmConvolution<typename cutlass::conv::kernel::DefaultConv3dWgrad<
    Element, cutlass::layout::TensorNDHWC, Element, cutlass::layout::TensorNDHWC, Element,
    cutlass::layout::TensorNDHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    typename Tile<Element>::Block, typename Tile<Element>::Warp, typename Tile<Element>::Mma, Epilogue<Element>,
    Swizzle<Element>, Tile<Element>::kStages, cutlass::arch::OpMultiplyAdd,
    cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel>;

// Stride-1 3-D data gradient.
template <class Element>
using Dgrad3d = cutlass::conv::device::ImplicitGemmConvolution<typename cutlass::conv::kernel::DefaultConv3dDgrad<
    Element, cutlass::layout::TensorNDHWC, Element, cutlass::layout::TensorNDHWC, Element,
    cutlass::layout::TensorNDHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    typename Tile<Element>::Block, typename Tile<Element>::Warp, typename Tile<Element>::Mma, Epilogue<Element>,
    Swizzle<Element>, Tile<Element>::kStages, cutlass::arch::OpMultiplyAdd,
    cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kUnity>::Kernel>;

// Any-stride 2-D data gradient (the strided kernel visits the stride phases of dx separately,
// with its own block swizzle).
template <class Element>
using Dgrad2d = cutlass::conv::device::ImplicitGemmConvolution<typename cutlass::conv::kernel::DefaultConv2dDgrad<
    Element, cutlass::layout::TensorNHWC, Element, cutlass::layout::TensorNHWC, Element,
    cutlass::layout::TensorNHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    typename Tile<Element>::Block, typename Tile<Element>::Warp, typename Tile<Element>::Mma, Epilogue<Element>,
    cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>, Tile<Element>::kStages,
    cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized, cutlass::conv::StrideSupport::kStrided,
    kAccess<Element>, kAccess<Element>>::Kernel>;

// The problem sizes (CUTLASS 2.x keeps one padding per axis, the lower one; the output size is
// given, so asymmetric padding needs nothing more). Mode: cross-correlation, as torch.
inline cutlass::conv::Conv3dProblemSize problem3d(const Extents& s) {
  return cutlass::conv::Conv3dProblemSize(
      s.n, s.in[0], s.in[1], s.in[2], s.c, s.k, s.kernel[0], s.kernel[1], s.kernel[2], s.out[0], s.out[1], s.out[2],
      s.pad_before[0], s.pad_before[1], s.pad_before[2], s.stride[0], s.stride[1], s.stride[2], s.dilation[0],
      s.dilation[1], s.dilation[2], cutlass::conv::Mode::kCrossCorrelation, 1, 1);
}

inline cutlass::conv::Conv2dProblemSize problem2d(const Extents& s) {
  return cutlass::conv::Conv2dProblemSize(s.n, s.in[1], s.in[2], s.c, s.k, s.kernel[1], s.kernel[2], s.out[1],
                                          s.out[2], s.pad_before[1], s.pad_before[2], s.stride[1], s.stride[2],
                                          s.dilation[1], s.dilation[2], cutlass::conv::Mode::kCrossCorrelation, 1, 1);
}

// Packed channels-last tensor refs of x (NDHWC), w (KTRSC) and y (NZPQK).
template <class Element, class Layout>
cutlass::TensorRef<Element, Layout> ref(const void* p, const Layout& layout) {
  return cutlass::TensorRef<Element, Layout>(static_cast<Element*>(const_cast<void*>(p)), layout);
}

inline cutlass::layout::TensorNDHWC packed3d(int n, const int (&sp)[kAxes], int c) {
  return cutlass::layout::TensorNDHWC::packed(cutlass::Tensor5DCoord(n, sp[0], sp[1], sp[2], c));
}

inline cutlass::layout::TensorNHWC packed2d(int n, const int (&sp)[kAxes], int c) {
  return cutlass::layout::TensorNHWC::packed(cutlass::Tensor4DCoord(n, sp[1], sp[2], c));
}

inline void check(cutlass::Status status, const char* what, const char* op) {
  if (status != cutlass::Status::kSuccess)
    throw Error(ErrorKind::cuda, std::string(op) + " (implicit_gemm, sm80): CUTLASS " + what + " failed: " +
                                     cutlassGetStatusString(status));
}

// can_implement, then initialize and run; the split-K-free kernels need no workspace.
template <class Conv>
bool launch(const typename Conv::Arguments& args, const char* op, Stream stream, std::string* why) {
  const cutlass::Status ok = Conv::can_implement(args);
  if (ok != cutlass::Status::kSuccess) {
    if (why) *why = std::string("CUTLASS can_implement refused the problem: ") + cutlassGetStatusString(ok);
    return false;
  }
  if (Conv::get_workspace_size(args) != 0)
    throw Error(ErrorKind::cuda, std::string(op) + " (implicit_gemm, sm80): internal: the kernel asks for a workspace");
  Conv conv;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  check(conv.initialize(args, nullptr, s), "initialize", op);
  check(conv.run(s), "run", op);
  RUDNN_CUDA_CHECK_LAUNCH(implicit_gemm_conv_sm80);
  return true;
}

template <class Element>
bool fprop(const Call& c, std::string* why) {
  using Conv = Fprop3d<Element>;
  const Extents& s = c.s;
  const auto y = ref<Element>(c.d, packed3d(s.n, s.out, s.k));
  // The bias as C: stride 0 along every axis but the channels.
  const auto bias = ref<Element>(c.bias ? c.bias : c.d,
                                 c.bias ? cutlass::layout::TensorNDHWC(cutlass::layout::TensorNDHWC::Stride(0))
                                        : packed3d(s.n, s.out, s.k));
  typename Conv::Arguments args(problem3d(s), ref<Element>(c.a, packed3d(s.n, s.in, s.c)),
                                ref<Element>(c.b, packed3d(s.k, s.kernel, s.c)), bias, y,
                                {1.0f, c.bias ? 1.0f : 0.0f});
  return launch<Conv>(args, "conv", c.stream, why);
}

template <class Element>
bool dgrad(const Call& c, std::string* why) {
  const Extents& s = c.s;
  if (s.deep()) {
    using Conv = Dgrad3d<Element>;
    const auto dx = ref<Element>(c.d, packed3d(s.n, s.in, s.c));
    typename Conv::Arguments args(problem3d(s), ref<Element>(c.a, packed3d(s.n, s.out, s.k)),
                                  ref<Element>(c.b, packed3d(s.k, s.kernel, s.c)), dx, dx, {1.0f, 0.0f});
    return launch<Conv>(args, "conv_data_backward", c.stream, why);
  }
  using Conv = Dgrad2d<Element>;
  const auto dx = ref<Element>(c.d, packed2d(s.n, s.in, s.c));
  typename Conv::Arguments args(problem2d(s), ref<Element>(c.a, packed2d(s.n, s.out, s.k)),
                                ref<Element>(c.b, packed2d(s.k, s.kernel, s.c)), dx, dx, {1.0f, 0.0f});
  return launch<Conv>(args, "conv_data_backward", c.stream, why);
}

template <class Element>
bool wgrad(const Call& c, std::string* why) {
  using Conv = Wgrad3d<Element>;
  const Extents& s = c.s;
  const auto dw = ref<Element>(c.d, packed3d(s.k, s.kernel, s.c));
  typename Conv::Arguments args(problem3d(s), ref<Element>(c.a, packed3d(s.n, s.out, s.k)),
                                ref<Element>(c.b, packed3d(s.n, s.in, s.c)), dw, dw, {1.0f, 0.0f});
  return launch<Conv>(args, "conv_weight_backward", c.stream, why);
}

}  // namespace rudnn::conv::ig::sm80
