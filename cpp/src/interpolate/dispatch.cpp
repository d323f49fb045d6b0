// Public entry points of interpolate: validate once, then run the backend of the tensors' device.
#include "core/backend.hpp"
#include "interpolate/problem.hpp"

namespace rudnn {

InterpolateShape interpolate_output_shape(const InterpolateArgs& args) {
  return interp::output_shape(args.x, interp::validate_forward(args, false), args.options.layout);
}

void interpolate_forward(const InterpolateArgs& args, Stream stream) {
  const interp::Problem p = interp::validate_forward(args);
  if (p.batch * p.channels * p.out_plane() == 0) return;
  core::on_device(args.x.device, "interpolate", [&] { interp::forward_cpu(p, args.x, args.y); },
                  [&] { interp::forward_cuda(p, args.x, args.y, stream); });
}

// Every input element is written, even when dy is empty.
void interpolate_backward(const InterpolateBackwardArgs& args, Stream stream) {
  const interp::Problem p = interp::validate_backward(args);
  if (p.batch * p.channels * p.in_plane() == 0) return;
  core::on_device(args.dx.device, "interpolate_backward", [&] { interp::backward_cpu(p, args.dy, args.dx); },
                  [&] { interp::backward_cuda(p, args.dy, args.dx, stream); });
}

}  // namespace rudnn
