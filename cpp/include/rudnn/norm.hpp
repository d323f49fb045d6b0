// LayerNorm, RMSNorm and softmax over the last axis (SPEC section 1).
//
// Every function validates all of its arguments first (throwing rudnn::Error
// before any work), then runs the CPU reference backend or the CUDA backend
// according to the tensors' device. Outputs and workspaces are allocated by the
// caller; libruDNN never allocates device memory.
#pragma once

#include <cstddef>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class NormKind { layer, rms };

// y = norm(h) * weight (+ bias), h = x (+ residual). Rows are x's leading axes.
struct NormForwardArgs {
  NormKind kind = NormKind::layer;
  Tensor x;                                // [..., H] f32/f16/bf16, last dim contiguous
  const Tensor* weight = nullptr;          // [H] f32 or x's dtype; optional (ones)
  const Tensor* bias = nullptr;            // [H] like weight; layer norm only; optional
  const Tensor* residual = nullptr;        // like x; optional: h = x + residual
  float eps = 1e-5f;                       // finite, > 0
  Tensor y;                                // like x (output)
  const Tensor* residual_out = nullptr;    // like x; required iff residual (receives h)
  const Tensor* mean = nullptr;            // f32 [x.shape[:-1]]; optional output, layer norm only
  const Tensor* rstd = nullptr;            // f32 [x.shape[:-1]]; optional output
};

void norm_forward(const NormForwardArgs& args, Stream stream = nullptr);

// Gradients of the forward above (with h in place of x when a residual was fused).
// dweight/dbias are float32 and reduced over rows in a fixed order.
struct NormBackwardArgs {
  NormKind kind = NormKind::layer;
  Tensor dy;                               // like x
  Tensor x;                                // [..., H] (the normalized input h)
  const Tensor* weight = nullptr;          // [H] optional
  const Tensor* mean = nullptr;            // f32 [x.shape[:-1]]; required for layer norm
  Tensor rstd;                             // f32 [x.shape[:-1]]
  Tensor dx;                               // like x (output)
  const Tensor* dweight = nullptr;         // f32 [H]; optional output (needs weight)
  const Tensor* dbias = nullptr;           // f32 [H]; optional output, layer norm only
  const Tensor* workspace = nullptr;       // u8, >= norm_backward_workspace_bytes(args)
};

// Bytes of scratch memory norm_backward needs on args' device (0 on the CPU).
std::size_t norm_backward_workspace_bytes(const NormBackwardArgs& args);
void norm_backward(const NormBackwardArgs& args, Stream stream = nullptr);

// y = softmax(x) over the last axis, statistics in float32.
void softmax_forward(const Tensor& x, const Tensor& y, Stream stream = nullptr);
// dx = y * (dy - sum(dy * y)) over the last axis.
void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx, Stream stream = nullptr);

}  // namespace rudnn
