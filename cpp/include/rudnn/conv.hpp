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
// block, any groups (depthwise included), dtype, size, stride and dilation. implicit_gemm
// (CUTLASS) is not in this build: asking for it is an UnsupportedError; auto and autotune run
// direct. All sums are float32 in a fixed order (the weight and bias gradients too: a
// fixed-order reduction without atomics, bitwise deterministic run to run); values are rounded
// once to the output dtype. conv_last_algorithm() names what the last call on this thread ran.
//
// Every function validates all of its arguments before any work (throwing rudnn::Error), then
// runs the CPU reference backend or the CUDA backend according to the tensors' device. Outputs
// and workspaces are allocated by the caller (direct needs no workspace: its size is 0).
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

// Workspace bytes each call needs (0 for every strategy of this build); they run the checks.
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

// "cpu", "direct" or "none": the algorithm of this thread's last conv call.
const char* conv_last_algorithm();

}  // namespace rudnn
