// Sampling an input at grid points and its backward pass (SPEC section 7), with
// torch.nn.functional.grid_sample's semantics.
//
// x is (N, C, H, W) or (N, C, D, H, W) with layout channels_first, (N, H, W, C) or (N, D, H, W, C)
// with channels_last; grid is (N, H_out, W_out, 2) or (N, D_out, H_out, W_out, 3) whatever the
// layout, its last axis holding (x, y[, z]) in [-1, 1] (x indexes W, y H, z D); y is x's layout
// with the grid's spatial sizes. x and grid share dtype (f32/f16/bf16) and device; the math is
// float32. Any strides are accepted (a torch channels_last tensor seen as (N, C, H, W) works
// without a copy); outputs must not have elements that share memory. Every function validates
// all of its arguments before any work (throwing rudnn::Error), then runs the CPU reference
// backend or the CUDA backend according to the tensors' device. Outputs are allocated by the caller.
//
// Coordinates follow torch's shared (CUDA, and CPU 5-D) code operation by operation in float32:
// unnormalize ((g + 1) / 2 * (size - 1) with align_corners, else ((g + 1) * size - 1) / 2), then
// border (clip to [0, size - 1]) or reflection (reflect about the borders: the pixel edges, or
// the corner pixels' centres with align_corners, then clip). bilinear weighs the 4 (8) corners
// around the point, nearest takes the one at round-half-to-even (nearbyint), bicubic (4-D only)
// runs Keys' cubic (A = -0.75) over 4 x 4 taps, padding applied to each tap's position. zeros
// padding reads 0 outside the input. (torch's vectorized 4-D float32 CPU kernel rounds its
// unnormalization differently, by an ulp at most, and folds coordinates beyond ~1e7 less exactly.)
// Huge grid values are safe (index conversions are bounded); a NaN coordinate samples nothing
// under bilinear and nearest (0, whatever the padding), and gives NaN under bicubic, as in torch.
//
// Backward: dgrid is the gradient of each grid point summed over the channels in order (one
// writer per point); nearest's dgrid is zero, as in torch. dx on the CPU sums each sample's
// contributions in the order (n, c, grid point, tap): deterministic. On CUDA dx accumulates in a
// float32 workspace: by default with atomicAdd (fast; the order of the float additions, and so
// the last bits, can vary run to run), with deterministic = true in that same fixed order as the
// CPU (one thread owns each (n, c) plane of dx: bitwise run-to-run deterministic, no atomics).
#pragma once

#include <cstddef>
#include <cstdint>

#include "rudnn/error.hpp"
#include "rudnn/pooling.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class GridSampleMode { bilinear, nearest, bicubic };
enum class GridSamplePadding { zeros, border, reflection };

struct GridSampleOptions {
  GridSampleMode mode = GridSampleMode::bilinear;
  GridSamplePadding padding_mode = GridSamplePadding::zeros;
  bool align_corners = false;
  PoolLayout layout = PoolLayout::channels_first;  // x's, y's, dy's and dx's layout (pooling's two)
};

struct GridSampleArgs {
  GridSampleOptions options;
  Tensor x;     // f32/f16/bf16, 4-D or 5-D
  Tensor grid;  // x's dtype and device: (N, *out_spatial, x.rank - 2)
  Tensor y;     // x's dtype, (N, C, *out_spatial) in x's layout (output)
};

struct GridSampleShape {
  int rank = 0;
  std::int64_t dims[kMaxRank] = {};
};

// The shape of y for x and grid under args.options (args.y is not read); runs the forward's checks.
GridSampleShape grid_sample_output_shape(const GridSampleArgs& args);

void grid_sample_forward(const GridSampleArgs& args, Stream stream = nullptr);

// dx = d(loss)/dx (x's shape and dtype) and dgrid = d(loss)/dgrid (grid's shape and dtype) given dy
// (y's shape, x's dtype); either may be null (not computed).
struct GridSampleBackwardArgs {
  GridSampleOptions options;
  bool deterministic = false;  // CUDA dx: the fixed-order accumulation instead of atomics
  Tensor dy;
  Tensor x;
  Tensor grid;
  const Tensor* dx = nullptr;        // output
  const Tensor* dgrid = nullptr;     // output
  const Tensor* workspace = nullptr;  // uint8 on x's device, grid_sample_backward_workspace_bytes(args) bytes
};

// The workspace the call needs (0 on the CPU or without dx); validates like the call (outputs
// and workspace are not read).
std::size_t grid_sample_backward_workspace_bytes(const GridSampleBackwardArgs& args);

void grid_sample_backward(const GridSampleBackwardArgs& args, Stream stream = nullptr);

}  // namespace rudnn
