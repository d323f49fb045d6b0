// Public entry points of the norm/softmax family: validate once, then run the
// backend of the tensors' device.
#include "core/check.hpp"
#include "norm/problem.hpp"
#if RUDNN_WITH_CUDA
#include "core/device.hpp"
#endif

namespace rudnn {

namespace {

// Runs `cpu()` or `cuda()` by device; CUDA work runs with the tensor's device current.
template <class Cpu, class Cuda>
void on_device(const Device& device, const char* op, Cpu&& cpu, Cuda&& cuda) {
  if (!device.is_cuda()) return cpu();
#if RUDNN_WITH_CUDA
  core::DeviceGuard guard(device.index);
  cuda();
#else
  (void)cuda;
  core::fail(ErrorKind::unsupported, std::string(op) + ": this libruDNN was built without CUDA (RUDNN_WITH_CUDA=OFF)");
#endif
}

}  // namespace

void norm_forward(const NormForwardArgs& args, Stream stream) {
  const norm::ForwardProblem p = norm::validate_forward(args);
  if (p.rows == 0) return;
  on_device(args.x.device, "norm_forward", [&] { norm::forward_cpu(args, p); },
            [&] { norm::forward_cuda(args, p, stream); });
}

std::size_t norm_backward_workspace_bytes(const NormBackwardArgs& args) {
  const norm::BackwardProblem p = norm::validate_backward(args);
  std::size_t bytes = 0;
  on_device(args.x.device, "norm_backward", [] {},
            [&] { bytes = norm::backward_workspace_bytes_cuda(p, args.x.device.index); });
  return bytes;
}

void norm_backward(const NormBackwardArgs& args, Stream stream) {
  const norm::BackwardProblem p = norm::validate_backward(args);
  on_device(args.x.device, "norm_backward", [&] { norm::backward_cpu(args, p); },
            [&] {
              const std::size_t need = norm::backward_workspace_bytes_cuda(p, args.x.device.index);
              const std::size_t have = args.workspace ? std::size_t(args.workspace->numel()) : 0;
              if (have < need)
                core::fail(ErrorKind::value, "norm_backward: workspace: expected at least " + std::to_string(need) +
                                                 " bytes, got " + std::to_string(have));
              norm::backward_cuda(args, p, stream);
            });
}

void softmax_forward(const Tensor& x, const Tensor& y, Stream stream) {
  const norm::SoftmaxProblem p = norm::validate_softmax_forward(x, y);
  if (p.rows == 0) return;
  on_device(x.device, "softmax", [&] { norm::softmax_forward_cpu(x, y, p); },
            [&] { norm::softmax_forward_cuda(x, y, p, stream); });
}

void softmax_backward(const Tensor& dy, const Tensor& y, const Tensor& dx, Stream stream) {
  const norm::SoftmaxProblem p = norm::validate_softmax_backward(dy, y, dx);
  if (p.rows == 0) return;
  on_device(y.device, "softmax_backward", [&] { norm::softmax_backward_cpu(dy, y, dx, p); },
            [&] { norm::softmax_backward_cuda(dy, y, dx, p, stream); });
}

}  // namespace rudnn
