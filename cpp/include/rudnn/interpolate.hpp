// Resampling over 1-3 spatial axes and its backward pass (SPEC section 7), with
// torch.nn.functional.interpolate's semantics.
//
// Tensors are (N, C, *spatial) with layout channels_first, (N, *spatial, C) with channels_last
// (the batch axis is required, as in torch); the number of spatial axes is x's rank minus 2. Any
// strides are accepted (a torch channels_last tensor seen as (N, C, H, W) works without a copy);
// outputs must not have elements that share memory. Every function validates all of its
// arguments before any work (throwing rudnn::Error), then runs the CPU reference backend or the
// CUDA backend according to the tensors' device. Outputs are allocated by the caller.
//
// Output size (torch's rules): `size` when given; else floor(input size * scale_factor). The
// coordinate mapping uses 1 / scale_factor when a scale factor was given and not recomputed,
// else input size / output size (align_corners: (in - 1) / (out - 1)). recompute_scale_factor
// (scale_factor only) drops the given scale after the output size is computed; area always does.
// Where torch's kernels copy an axis that keeps its size whatever the given scale (in some modes
// and passes only, so that torch's backward is then not its forward's transpose), rudnn gives
// what torch gives in each pass (cpp/src/interpolate/validate.cpp, set_shortcuts).
//
// The backward pass is a gather: each input element sums, in float32 and in a fixed order, the
// contributions of the output elements whose taps read it (one writer per element, no atomics:
// bitwise run-to-run deterministic).
#pragma once

#include <cstdint>

#include "rudnn/error.hpp"
#include "rudnn/pooling.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

// linear, bilinear and trilinear are one method on 1, 2 and 3 spatial axes (torch ties each name
// to its rank); bicubic takes 2 spatial axes; the others 1 to 3. area is adaptive average pooling.
enum class InterpolateMode { nearest, nearest_exact, linear, bilinear, trilinear, bicubic, area };

enum class OptionalBool : std::uint8_t { unset, no, yes };  // Python's None / False / True

constexpr int kMaxInterpolateDims = 3;

struct InterpolateOptions {
  InterpolateMode mode = InterpolateMode::nearest;
  PoolLayout layout = PoolLayout::channels_first;  // pooling's two layouts (rudnn/pooling.hpp)
  // Exactly one of size and scale_factor, each with `dims` entries (= x's spatial axes).
  bool has_size = false;
  bool has_scale_factor = false;
  int dims = 2;
  std::int64_t size[kMaxInterpolateDims] = {1, 1, 1};         // > 0
  double scale_factor[kMaxInterpolateDims] = {1.0, 1.0, 1.0};  // finite, > 0
  OptionalBool align_corners = OptionalBool::unset;            // linear, bilinear, trilinear, bicubic only
  OptionalBool recompute_scale_factor = OptionalBool::unset;   // yes only with scale_factor
  bool antialias = false;                                      // bilinear and bicubic (4-D x) only
};

struct InterpolateArgs {
  InterpolateOptions options;
  Tensor x;  // f32/f16/bf16
  Tensor y;  // x's dtype, the resampled shape (output)
};

struct InterpolateShape {
  int rank = 0;
  std::int64_t dims[kMaxRank] = {};
};

// The shape of y for x under args.options (args.y is not read); runs the forward's checks.
InterpolateShape interpolate_output_shape(const InterpolateArgs& args);

void interpolate_forward(const InterpolateArgs& args, Stream stream = nullptr);

// dx = d(loss)/dx of interpolate given dy; dx (the input's shape, dy's dtype) stands for x_shape.
struct InterpolateBackwardArgs {
  InterpolateOptions options;
  Tensor dy;  // the resampled shape of dx
  Tensor dx;  // output
};

void interpolate_backward(const InterpolateBackwardArgs& args, Stream stream = nullptr);

}  // namespace rudnn
