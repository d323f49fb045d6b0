// Public entry points of attention: validate once, then run the backend of the
// tensors' device (on CUDA, the strategy picks the kernels).
#include "attention/problem.hpp"
#include "core/backend.hpp"

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

}  // namespace

std::size_t attention_forward_workspace_bytes(const AttentionForwardArgs& args) {
  const attention::Problem p = attention::validate_forward(args);
  std::size_t bytes = 0;
  core::on_device(args.q.device, "attention", [] {},
            [&] { bytes = attention::forward_workspace_bytes_cuda(p, args.options.strategy); });
  return bytes;
}

void attention_forward(const AttentionForwardArgs& args, const Tensor* workspace, Stream stream) {
  const attention::Problem p = attention::validate_forward(args);
  core::on_device(args.q.device, "attention",
            [&] {
              attention::forward_cpu(args, p);
              last_algorithm = "cpu";
            },
            [&] {
              core::expect_workspace(workspace, args.q, "q", attention::forward_workspace_bytes_cuda(p, args.options.strategy),
                                     "attention");
              last_algorithm = attention::forward_cuda(args, p, workspace, stream);
            });
}

std::size_t attention_backward_workspace_bytes(const AttentionBackwardArgs& args) {
  const attention::BackwardProblem p = attention::validate_backward(args);
  std::size_t bytes = 0;
  core::on_device(args.q.device, "attention_backward", [] {},
            [&] { bytes = attention::backward_workspace_bytes_cuda(p, args.options.strategy); });
  return bytes;
}

void attention_backward(const AttentionBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const attention::BackwardProblem p = attention::validate_backward(args);
  core::on_device(args.q.device, "attention_backward",
            [&] {
              attention::backward_cpu(args, p);
              last_algorithm = "cpu";
            },
            [&] {
              core::expect_workspace(workspace, args.q, "q", attention::backward_workspace_bytes_cuda(p, args.options.strategy),
                                     "attention_backward");
              last_algorithm = attention::backward_cuda(args, p, workspace, stream);
            });
}

const char* attention_last_algorithm() { return last_algorithm; }

}  // namespace rudnn
