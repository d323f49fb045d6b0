// Public entry points of the gated delta rule family: validate once, then run the backend
// of the tensors' device.
#include <string>

#include "core/backend.hpp"
#include "gated_delta/problem.hpp"

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

}  // namespace

std::size_t gated_delta_forward_workspace_bytes(const GatedDeltaForwardArgs& args) {
  const gated_delta::Problem p = gated_delta::validate_forward(args);
  std::size_t bytes = 0;
  core::on_device(args.q.device, "gated_delta_forward", [] {},
            [&] { bytes = gated_delta::forward_workspace_bytes_cuda(args, p); });
  return bytes;
}

void gated_delta_forward(const GatedDeltaForwardArgs& args, Stream stream) {
  const gated_delta::Problem p = gated_delta::validate_forward(args);
  core::on_device(
      args.q.device, "gated_delta_forward",
      [&] {
        gated_delta::forward_cpu(args, p);
        last_algorithm = "cpu";
      },
      [&] {
        core::expect_workspace(args.workspace, args.q, "q", gated_delta::forward_workspace_bytes_cuda(args, p),
                               "gated_delta_forward");
        last_algorithm = gated_delta::forward_cuda(args, p, stream);
      });
}

std::size_t gated_delta_backward_workspace_bytes(const GatedDeltaBackwardArgs& args) {
  const gated_delta::Problem p = gated_delta::validate_backward(args);
  std::size_t bytes = 0;
  core::on_device(args.q.device, "gated_delta_backward", [] {},
            [&] { bytes = gated_delta::backward_workspace_bytes_cuda(args, p); });
  return bytes;
}

void gated_delta_backward(const GatedDeltaBackwardArgs& args, Stream stream) {
  const gated_delta::Problem p = gated_delta::validate_backward(args);
  core::on_device(
      args.q.device, "gated_delta_backward",
      [&] {
        gated_delta::backward_cpu(args, p);
        last_algorithm = "cpu";
      },
      [&] {
        core::expect_workspace(args.workspace, args.q, "q", gated_delta::backward_workspace_bytes_cuda(args, p),
                               "gated_delta_backward");
        last_algorithm = gated_delta::backward_cuda(args, p, stream);
      });
}

const char* gated_delta_last_algorithm() { return last_algorithm; }

}  // namespace rudnn
