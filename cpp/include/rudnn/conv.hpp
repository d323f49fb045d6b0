// Convolution over 1-3 spatial axes (SPEC section 6) and its three backward passes, with
// torch.nn.functional.conv1d/2d/3d's semantics: cross-correlation, zero padding, groups.
//
// Layouts. channels_first: x is (N, C, *spatial) and w (Cout, Cin / groups, *kernel), as in
// torch. channels_last: x is (N, *spatial, C) and w (Cout, *kernel, Cin / groups), as cuDNN and
// CUTLASS keep them. y, dy and dx follow x's layout. Any strides are accepted for every tensor
// (a torch channels_last tensor seen as (N, C, H, W) runs in place, without a layout copy);
// outputs must not have elements that share memory. The batch axis is required (the rank of x
// decides the spatial dims: 3, 4 or 5 axes).
//
// Padding is given per axis as (before, after), so that torch's padding="same" with an even
// kernel extent (one more after than before) is expressible; both must be >= 0.
//
// Strategies. direct: one output (fprop), input (dgrad) or weight (wgrad) element per thread or
// block, any groups (depthwise included), dtype, size, stride and dilation; all sums float32 in
// a fixed order. implicit_gemm: CUTLASS's implicit-GEMM convolution kernels (sm90a: the 3.x
// collective builder, TMA im2col, warp-specialized; sm80-class GPUs, and what the sm90 kernels
// refuse: the 2.x kernels) for f16/bf16 with float32 accumulation, groups == 1, Cin and Cout
// multiples of 8; the bias is added in the fprop epilogue; wgrad has no split-K (bitwise
// deterministic). float32 is not taken (no TF32 rounding: it runs direct). A case the kernels
// cannot take is an UnsupportedError that says why. auto (and autotune, which does not time
// anything yet) take implicit_gemm where it applies and direct otherwise. Values are rounded once
// to the output dtype; the weight and bias gradients never use atomics (deterministic run to
// run). conv_last_algorithm() names what the last call on this thread ran.
//
// Tensors that implicit_gemm cannot read in place (not packed channels-last: NCHW, other
// strides, bases not 16-byte aligned) are copied through the workspace (one transpose each way);
// packed NHWC / torch channels_last tensors run without copies.
//
// Every function validates all of its arguments before any work (throwing rudnn::Error), then
// runs the CPU reference backend or the CUDA backend according to the tensors' device. Outputs
// and workspaces are allocated by the caller: the *_workspace_bytes queries say how much (0 for
// direct and for implicit_gemm on packed channels-last tensors). "auto" given no workspace where
// the copies would need one runs direct.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class ConvLayout { channels_first, channels_last };
enum class ConvStrategy { automatic, direct, implicit_gemm, autotune };

constexpr int kMaxConvDims = 3;

// The options of one convolution; the first `dims` entries of each array are used.
struct ConvOptions {
  int dims = 2;                                            // spatial axes, 1..3 (x's rank - 2)
  std::int64_t stride[kMaxConvDims] = {1, 1, 1};           // >= 1
  std::int64_t padding_before[kMaxConvDims] = {0, 0, 0};   // >= 0
  std::int64_t padding_after[kMaxConvDims] = {0, 0, 0};    // >= 0
  std::int64_t dilation[kMaxConvDims] = {1, 1, 1};         // >= 1
  std::int64_t groups = 1;                                 // >= 1, divides Cin and Cout
  ConvLayout layout = ConvLayout::channels_first;
  ConvStrategy strategy = ConvStrategy::automatic;
};

// y = conv(x, w) + bias.
struct ConvForwardArgs {
  ConvOptions options;
  Tensor x;                       // f32/f16/bf16
  Tensor w;                       // x's dtype
  const Tensor* bias = nullptr;   // x's dtype, [Cout]; optional
  Tensor y;                       // x's dtype, the output shape (output)
};

// dx = d(loss)/dx given dy; dx supplies x's shape (its data is only written).
struct ConvDataBackwardArgs {
  ConvOptions options;
  Tensor dy;  // the forward's output shape
  Tensor w;   // dy's dtype
  Tensor dx;  // dy's dtype, x's shape (output)
};

// dw = d(loss)/dw given dy and x; dw supplies w's shape.
struct ConvWeightBackwardArgs {
  ConvOptions options;
  Tensor dy;
  Tensor x;   // dy's dtype
  Tensor dw;  // dy's dtype, w's shape (output)
};

// db = the sum of dy over every axis but the channels.
struct ConvBiasBackwardArgs {
  int dims = 2;
  ConvLayout layout = ConvLayout::channels_first;
  Tensor dy;
  Tensor db;  // dy's dtype, [Cout] (output)
};

struct ConvShape {
  int rank = 0;
  std::int64_t dims[kMaxRank] = {};
};

// The shape of y for x and w under the options (y and bias are not read); runs the forward's
// checks of x, w and the options.
ConvShape conv_output_shape(const ConvForwardArgs& args);

// Workspace bytes each call needs (all of the call's tensors are given, outputs included: their
// strides and addresses decide the copies); they run the checks and the strategy decision.
std::size_t conv_forward_workspace_bytes(const ConvForwardArgs& args);
std::size_t conv_data_backward_workspace_bytes(const ConvDataBackwardArgs& args);
std::size_t conv_weight_backward_workspace_bytes(const ConvWeightBackwardArgs& args);

// workspace: uint8 on the tensors' device, at least the bytes asked above (null when 0).
void conv_forward(const ConvForwardArgs& args, const Tensor* workspace = nullptr, Stream stream = nullptr);
void conv_data_backward(const ConvDataBackwardArgs& args, const Tensor* workspace = nullptr,
                        Stream stream = nullptr);
void conv_weight_backward(const ConvWeightBackwardArgs& args, const Tensor* workspace = nullptr,
                          Stream stream = nullptr);
void conv_bias_backward(const ConvBiasBackwardArgs& args, Stream stream = nullptr);

// The algorithm of this thread's last conv call: "cpu", "direct", "direct_packed" (the CUDA
// forward reading x and w in 16-byte packs of input channels), "implicit_gemm_sm80",
// "implicit_gemm_sm90" or "none".
const char* conv_last_algorithm();

}  // namespace rudnn
