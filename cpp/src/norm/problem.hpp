// The validated form of a norm/softmax call, shared by the CPU and CUDA backends.
// validate.cpp builds it after every check has passed; backends assume it is valid.
#pragma once

#include <cstdint>

#include "core/rows.hpp"
#include "rudnn/norm.hpp"

namespace rudnn::norm {

// Forward of layer/rms norm. Tensors are read from the NormForwardArgs; each
// (optional) tensor has a row indexer here. Parameters (weight/bias) are dense [H].
struct ForwardProblem {
  std::int64_t rows = 0;    // product of x's leading axes (may be 0)
  std::int64_t hidden = 0;  // H >= 1
  DType param_dtype = DType::f32;  // dtype of weight and bias (f32 when both absent)
  core::RowIndexer x, residual, y, residual_out, mean, rstd;
};

struct BackwardProblem {
  std::int64_t rows = 0;
  std::int64_t hidden = 0;
  DType param_dtype = DType::f32;
  core::RowIndexer dy, x, dx, mean, rstd;
};

struct SoftmaxProblem {
  std::int64_t rows = 0;
  std::int64_t hidden = 0;
  core::RowIndexer a, b, out;  // forward: a = x, out = y; backward: a = dy, b = y, out = dx
};

ForwardProblem validate_forward(const NormForwardArgs& args);
BackwardProblem validate_backward(const NormBackwardArgs& args);
SoftmaxProblem validate_softmax_forward(const Tensor& x, const Tensor& y);
SoftmaxProblem validate_softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx);

// CPU reference backend (cpu.cpp).
void forward_cpu(const NormForwardArgs& args, const ForwardProblem& p);
void backward_cpu(const NormBackwardArgs& args, const BackwardProblem& p);
void softmax_forward_cpu(const Tensor& x, const Tensor& y, const SoftmaxProblem& p);
void softmax_backward_cpu(const Tensor& dy, const Tensor& y, const Tensor& dx, const SoftmaxProblem& p);

// CUDA backend (norm_cuda.cu). The caller has made the tensors' device current.
std::size_t backward_workspace_bytes_cuda(const BackwardProblem& p, int device);
void forward_cuda(const NormForwardArgs& args, const ForwardProblem& p, Stream stream);
void backward_cuda(const NormBackwardArgs& args, const BackwardProblem& p, Stream stream);
void softmax_forward_cuda(const Tensor& x, const Tensor& y, const SoftmaxProblem& p, Stream stream);
void softmax_backward_cuda(const Tensor& dy, const Tensor& y, const Tensor& dx, const SoftmaxProblem& p,
                           Stream stream);

}  // namespace rudnn::norm
