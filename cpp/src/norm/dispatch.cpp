// Public entry points of the norm/softmax family: validate once, then run the
// backend of the tensors' device.
#include "core/backend.hpp"
#include "norm/problem.hpp"

namespace rudnn {

namespace {

// Runs `cpu()` or `cuda()` by device; CUDA work runs with the tensor's device current.
}  // namespace

void norm_forward(const NormForwardArgs& args, Stream stream) {
  const norm::ForwardProblem p = norm::validate_forward(args);
  if (p.rows == 0) return;
  core::on_device(args.x.device, "norm_forward", [&] { norm::forward_cpu(args, p); },
            [&] { norm::forward_cuda(args, p, stream); });
}

std::size_t norm_backward_workspace_bytes(const NormBackwardArgs& args) {
  const norm::BackwardProblem p = norm::validate_backward(args);
  std::size_t bytes = 0;
  core::on_device(args.x.device, "norm_backward", [] {},
            [&] { bytes = norm::backward_workspace_bytes_cuda(p, args.x.device.index); });
  return bytes;
}

void norm_backward(const NormBackwardArgs& args, Stream stream) {
  const norm::BackwardProblem p = norm::validate_backward(args);
  core::on_device(args.x.device, "norm_backward", [&] { norm::backward_cpu(args, p); },
            [&] {
              core::expect_workspace(args.workspace, args.x, "x", norm::backward_workspace_bytes_cuda(p, args.x.device.index), "norm_backward");
              norm::backward_cuda(args, p, stream);
            });
}

void softmax_forward(const Tensor& x, const Tensor& y, Stream stream) {
  const norm::SoftmaxProblem p = norm::validate_softmax_forward(x, y);
  if (p.rows == 0) return;
  core::on_device(x.device, "softmax", [&] { norm::softmax_forward_cpu(x, y, p); },
            [&] { norm::softmax_forward_cuda(x, y, p, stream); });
}

void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx, Stream stream) {
  const norm::SoftmaxProblem p = norm::validate_softmax_backward(dy, y, dx);
  if (p.rows == 0) return;
  core::on_device(y.device, "softmax_backward", [&] { norm::softmax_backward_cpu(dy, y, dx, p); },
            [&] { norm::softmax_backward_cuda(dy, y, dx, p, stream); });
}

}  // namespace rudnn
