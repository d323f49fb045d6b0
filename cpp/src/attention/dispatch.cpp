// Public entry points of attention: validate once, then run the backend of the
// tensors' device (on CUDA, the strategy picks the kernels).
#include "attention/problem.hpp"
#include "core/check.hpp"
#if RUDNN_WITH_CUDA
#include "core/device.hpp"
#endif

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

template <class Cpu, class Cuda>
void on_device(const Device& device, const char* op, Cpu&& cpu, Cuda&& cuda) {
  if (!device.is_cuda()) return cpu();
#if RUDNN_WITH_CUDA
  (void)op;
  core::DeviceGuard guard(device.index);
  cuda();
#else
  (void)cuda;
  core::fail(ErrorKind::unsupported, std::string(op) + ": this libruDNN was built without CUDA (RUDNN_WITH_CUDA=OFF)");
#endif
}

void check_workspace(const Tensor* workspace, const Tensor& q, std::size_t need, const std::string& op) {
  const std::size_t have = workspace ? std::size_t(workspace->numel()) : 0;
  if (workspace) {
    core::expect_same_device(*workspace, q, op + ": workspace", "q");
    core::expect_dtype(*workspace, DType::u8, op + ": workspace");
  }
  if (have < need)
    core::fail(ErrorKind::value, op + ": workspace: expected at least " + std::to_string(need) + " bytes, got " +
                                     std::to_string(have));
}

}  // namespace

std::size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args) {
  const attention::Problem p = attention::validate_forward(args);
  std::size_t bytes = 0;
  on_device(args.q.device, "attention", [] {},
            [&] { bytes = attention::forward_workspace_bytes_cuda(p, args.options.strategy); });
  return bytes;
}

void attention_forward(const AttentionForwardArgs& args, const Tensor* workspace, Stream stream) {
  const attention::Problem p = attention::validate_forward(args);
  on_device(args.q.device, "attention",
            [&] {
              attention::forward_cpu(args, p);
              last_algorithm = "cpu";
            },
            [&] {
              check_workspace(workspace, args.q, attention::forward_workspace_bytes_cuda(p, args.options.strategy),
                              "attention");
              last_algorithm = attention::forward_cuda(args, p, workspace, stream);
            });
}

std::size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args) {
  const attention::BackwardProblem p = attention::validate_backward(args);
  std::size_t bytes = 0;
  on_device(args.q.device, "attention_backward", [] {},
            [&] { bytes = attention::backward_workspace_bytes_cuda(p, args.options.strategy); });
  return bytes;
}

void attention_backward(const AttentionBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const attention::BackwardProblem p = attention::validate_backward(args);
  on_device(args.q.device, "attention_backward",
            [&] {
              attention::backward_cpu(args, p);
              last_algorithm = "cpu";
            },
            [&] {
              check_workspace(workspace, args.q,
                              attention::backward_workspace_bytes_cuda(p, args.options.strategy),
                              "attention_backward");
              last_algorithm = attention::backward_cuda(args, p, workspace, stream);
            });
}

const char* attention_last_algorithm() { return last_algorithm; }

}  // namespace rudnn
