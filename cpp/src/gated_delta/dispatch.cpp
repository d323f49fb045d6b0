// Public entry points of the gated delta rule family: validate once, then run the backend
// of the tensors' device.
#include <string>

#include "core/check.hpp"
#include "gated_delta/problem.hpp"
#if RUDNN_WITH_CUDA
#include "core/device.hpp"
#endif

namespace rudnn {

namespace {

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

}  // namespace

std::size_t gated_delta_forward_workspace_bytes(const GatedDeltaForwardArgs& args) {
  const gated_delta::Problem p = gated_delta::validate_forward(args);
  std::size_t bytes = 0;
  on_device(args.q.device, "gated_delta_forward", [] {},
            [&] { bytes = gated_delta::forward_workspace_bytes_cuda(args, p); });
  return bytes;
}

void gated_delta_forward(const GatedDeltaForwardArgs& args, Stream stream) {
  const gated_delta::Problem p = gated_delta::validate_forward(args);
  on_device(args.q.device, "gated_delta_forward", [&] { gated_delta::forward_cpu(args, p); },
            [&] {
              const std::size_t need = gated_delta::forward_workspace_bytes_cuda(args, p);
              const std::size_t have = args.workspace ? std::size_t(args.workspace->numel()) : 0;
              if (have < need)
                core::fail(ErrorKind::value, "gated_delta_forward: workspace: expected at least " +
                                                 std::to_string(need) + " bytes, got " + std::to_string(have));
              gated_delta::forward_cuda(args, p, stream);
            });
}

std::size_t gated_delta_backward_workspace_bytes(const GatedDeltaBackwardArgs& args) {
  const gated_delta::Problem p = gated_delta::validate_backward(args);
  std::size_t bytes = 0;
  on_device(args.q.device, "gated_delta_backward", [] {},
            [&] { bytes = gated_delta::backward_workspace_bytes_cuda(p); });
  return bytes;
}

void gated_delta_backward(const GatedDeltaBackwardArgs& args, Stream stream) {
  const gated_delta::Problem p = gated_delta::validate_backward(args);
  on_device(args.q.device, "gated_delta_backward", [&] { gated_delta::backward_cpu(args, p); },
            [&] {
              const std::size_t need = gated_delta::backward_workspace_bytes_cuda(p);
              const std::size_t have = args.workspace ? std::size_t(args.workspace->numel()) : 0;
              if (have < need)
                core::fail(ErrorKind::value, "gated_delta_backward: workspace: expected at least " +
                                                 std::to_string(need) + " bytes, got " + std::to_string(have));
              gated_delta::backward_cuda(args, p, stream);
            });
}

}  // namespace rudnn
