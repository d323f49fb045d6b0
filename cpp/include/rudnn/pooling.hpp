// Max, average and adaptive pooling over 1-3 spatial axes, and their backward passes
// (SPEC section 7), with torch.nn.functional's semantics.
//
// Tensors are (N, C, *spatial) with layout channels_first, (N, *spatial, C) with
// channels_last; the batch axis may be absent (rank = spatial dims + 1), as torch allows.
// Any strides are accepted (a torch channels_last tensor seen as (N, C, H, W) works without a
// copy); outputs must not have elements that share memory. Every function validates all of
// its arguments before any work (throwing rudnn::Error), then runs the CPU reference backend or
// the CUDA backend according to the tensors' device. Outputs are allocated by the caller.
//
// Indices are flat per plane, as torch returns them: for an input plane of spatial shape
// (D, H, W) the element (d, h, w) has index (d * H + h) * W + w. They are int64 (torch's) or
// int32 (JAX's default integer; only when every index of a plane fits).
//
// Backward passes are gathers: each input element's gradient is summed, in float32 and in a
// fixed order, from the output windows that cover it (one writer per element, no atomics:
// bitwise run-to-run deterministic). The max backward adds dy[o] to the element that
// indices[o] names; an index that names no element of window o contributes nothing.
#pragma once

#include <cstdint>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class PoolLayout { channels_first, channels_last };

constexpr int kMaxPoolDims = 3;

// A pooling window per spatial axis; the first `dims` entries of each array are used.
struct PoolWindow {
  int dims = 2;                                         // spatial axes, 1..3
  std::int64_t kernel[kMaxPoolDims] = {1, 1, 1};        // > 0
  std::int64_t stride[kMaxPoolDims] = {1, 1, 1};        // > 0 (torch's default, = kernel, is the caller's)
  std::int64_t padding[kMaxPoolDims] = {0, 0, 0};       // 0 <= padding <= kernel / 2 (implicit -inf / 0)
  std::int64_t dilation[kMaxPoolDims] = {1, 1, 1};      // > 0; average pooling takes 1 only
  bool ceil_mode = false;  // round the output size up; the last window must start inside the
                           // input or its left padding
};

// Average pooling divisor: divisor_override when given (nonzero), else the window size
// including padding (count_include_pad) or the number of input elements in the window.
struct AvgPoolDivisor {
  bool count_include_pad = true;
  bool has_divisor_override = false;
  std::int64_t divisor_override = 0;  // != 0 when has_divisor_override
};

struct MaxPoolArgs {
  PoolWindow window;
  PoolLayout layout = PoolLayout::channels_first;
  Tensor x;                          // f32/f16/bf16
  Tensor y;                          // x's dtype, the pooled shape (output)
  const Tensor* indices = nullptr;   // int64 or int32, y's shape; optional output
};

struct AvgPoolArgs {
  PoolWindow window;
  AvgPoolDivisor divisor;
  PoolLayout layout = PoolLayout::channels_first;
  Tensor x;
  Tensor y;
};

enum class AdaptivePoolKind { avg, max };

// Output element o of an axis of input size I and output size O pools the input range
// [floor(o * I / O), ceil((o + 1) * I / O)).
struct AdaptivePoolArgs {
  AdaptivePoolKind kind = AdaptivePoolKind::avg;
  int dims = 2;
  std::int64_t output_size[kMaxPoolDims] = {1, 1, 1};  // >= 0
  PoolLayout layout = PoolLayout::channels_first;
  Tensor x;
  Tensor y;
  const Tensor* indices = nullptr;  // int64 or int32, y's shape; optional output, max only
};

// The shape of y for x under the options of each args struct (their y and indices are not
// read); runs the same checks as the forward functions.
struct PoolShape {
  int rank = 0;
  std::int64_t dims[kMaxRank] = {};
};
PoolShape max_pool_output_shape(const MaxPoolArgs& args);
PoolShape avg_pool_output_shape(const AvgPoolArgs& args);
PoolShape adaptive_pool_output_shape(const AdaptivePoolArgs& args);

void max_pool_forward(const MaxPoolArgs& args, Stream stream = nullptr);
void avg_pool_forward(const AvgPoolArgs& args, Stream stream = nullptr);
void adaptive_pool_forward(const AdaptivePoolArgs& args, Stream stream = nullptr);

// dx = d(loss)/dx of max_pool, given dy and the indices it returned. x supplies the shape,
// dtype and device only (its data is not read).
struct MaxPoolBackwardArgs {
  PoolWindow window;
  PoolLayout layout = PoolLayout::channels_first;
  Tensor dy;       // x's dtype, the pooled shape
  Tensor x;
  Tensor indices;  // int64 or int32, dy's shape
  Tensor dx;       // like x (output)
};

struct AvgPoolBackwardArgs {
  PoolWindow window;
  AvgPoolDivisor divisor;
  PoolLayout layout = PoolLayout::channels_first;
  Tensor dy;  // the pooled shape of dx
  Tensor dx;  // dy's dtype, the input's shape (output)
};

// The output size is dy's spatial shape; indices (int64 or int32, dy's shape) iff kind is max, and
// then x (shape, dtype, device only) too.
struct AdaptivePoolBackwardArgs {
  AdaptivePoolKind kind = AdaptivePoolKind::avg;
  int dims = 2;
  PoolLayout layout = PoolLayout::channels_first;
  Tensor dy;
  const Tensor* x = nullptr;        // max only
  const Tensor* indices = nullptr;  // max only
  Tensor dx;                        // dy's dtype, the input's shape (output)
};

void max_pool_backward(const MaxPoolBackwardArgs& args, Stream stream = nullptr);
void avg_pool_backward(const AvgPoolBackwardArgs& args, Stream stream = nullptr);
void adaptive_pool_backward(const AdaptivePoolBackwardArgs& args, Stream stream = nullptr);

}  // namespace rudnn
