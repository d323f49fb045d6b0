// Public entry points of grid_sample: validate once, then run the backend of the tensors' device.
#include "core/backend.hpp"
#include "grid_sample/problem.hpp"

namespace rudnn {

GridSampleShape grid_sample_output_shape(const GridSampleArgs& args) {
  return gs::output_shape(args.x, gs::validate_forward(args, false), args.options.layout);
}

void grid_sample_forward(const GridSampleArgs& args, Stream stream) {
  const gs::Problem p = gs::validate_forward(args);
  if (p.batch * p.channels * p.out_plane() == 0) return;
  core::on_device(args.x.device, "grid_sample", [&] { gs::forward_cpu(p, args.x, args.grid, args.y); },
                  [&] { gs::forward_cuda(p, args.x, args.grid, args.y, stream); });
}

std::size_t grid_sample_backward_workspace_bytes(const GridSampleBackwardArgs& args) {
  const gs::Problem p = gs::validate_backward(args, false);
  return std::size_t(gs::workspace_elements(p, args.dx != nullptr, args.x.device.is_cuda())) * sizeof(float);
}

// Every element of dx and dgrid is written, even when dy is empty.
void grid_sample_backward(const GridSampleBackwardArgs& args, Stream stream) {
  const gs::Problem p = gs::validate_backward(args);
  const bool dx = args.dx && p.batch * p.channels * p.in_plane() > 0;
  const bool dgrid = args.dgrid && p.batch * p.out_plane() > 0;
  if (!dx && !dgrid) return;
  const Tensor* dx_t = dx ? args.dx : nullptr;
  const Tensor* dgrid_t = dgrid ? args.dgrid : nullptr;
  core::on_device(args.x.device, "grid_sample_backward",
                  [&] { gs::backward_cpu(p, args.dy, args.x, args.grid, dx_t, dgrid_t); },
                  [&] {
                    gs::backward_cuda(p, args.dy, args.x, args.grid, dx_t, dgrid_t, args.workspace,
                                      args.deterministic, stream);
                  });
}

}  // namespace rudnn
