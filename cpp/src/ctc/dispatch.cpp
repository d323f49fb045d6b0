// Public entry points of the CTC family: validate once, then run the backend of log_probs'
// device.
#include "core/backend.hpp"
#include "ctc/problem.hpp"

namespace rudnn {

std::size_t ctc_loss_workspace_bytes(const CtcLossArgs& args) { return ctc::validate_forward(args, false).ws.total; }

std::size_t ctc_loss_backward_workspace_bytes(const CtcLossBackwardArgs& args) {
  return ctc::validate_backward(args, false).ws.total;
}

void ctc_loss_forward(const CtcLossArgs& args, Stream stream) {
  const ctc::Problem p = ctc::validate_forward(args);
  core::on_device(args.log_probs.device, "ctc_loss", [&] { ctc::forward_cpu(p, args); },
                  [&] {
#if RUDNN_WITH_CUDA
                    ctc::forward_cuda(p, args, stream);
#endif
                  });
  (void)stream;
}

void ctc_loss_backward(const CtcLossBackwardArgs& args, Stream stream) {
  const ctc::Problem p = ctc::validate_backward(args);
  if (args.dlog_probs.numel() == 0) return;
  core::on_device(args.log_probs.device, "ctc_loss_backward", [&] { ctc::backward_cpu(p, args); },
                  [&] {
#if RUDNN_WITH_CUDA
                    ctc::backward_cuda(p, args, stream);
#endif
                  });
  (void)stream;
}

}  // namespace rudnn
