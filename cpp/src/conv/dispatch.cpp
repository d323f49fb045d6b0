// Public entry points of the convolution family: validate once, pick the strategy (direct is
// the only one of this build), then run the backend of the tensors' device.
#include "conv/problem.hpp"
#include "core/backend.hpp"

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

// The bytes of workspace a validated call needs: none for the direct kernels.
std::size_t workspace_need(const conv::Problem&) { return 0; }

template <class Cpu, class Cuda>
void run(const Device& device, const char* op, const conv::Problem& p, const Tensor* workspace, const Tensor& ref,
         Cpu&& cpu, Cuda&& cuda) {
  core::expect_workspace(workspace, ref, "the arrays", workspace_need(p), op);
  core::on_device(
      device, op,
      [&] {
        last_algorithm = "cpu";
        cpu();
      },
      [&] {
        last_algorithm = "direct";
        cuda();
      });
}

}  // namespace

ConvShape conv_output_shape(const ConvForwardArgs& args) {
  return conv::output_shape(conv::validate_forward(args, false).g, args.options.dims, args.options.layout);
}

std::size_t conv_forward_workspace_bytes(const ConvForwardArgs& args) {
  return workspace_need(conv::validate_forward(args, false));
}

std::size_t conv_data_backward_workspace_bytes(const ConvDataBackwardArgs& args) {
  return workspace_need(conv::validate_data_backward(args));
}

std::size_t conv_weight_backward_workspace_bytes(const ConvWeightBackwardArgs& args) {
  return workspace_need(conv::validate_weight_backward(args));
}

void conv_forward(const ConvForwardArgs& args, const Tensor* workspace, Stream stream) {
  const conv::Problem p = conv::validate_forward(args);
  run(args.x.device, "conv", p, workspace, args.x, [&] { if (p.outputs()) conv::forward_cpu(p, args.x, args.w, args.bias, args.y); },
      [&] { if (p.outputs()) conv::forward_cuda(p, args.x, args.w, args.bias, args.y, stream); });
}

// Every element of dx is written (zeros where no output reads it), even when dy is empty.
void conv_data_backward(const ConvDataBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const conv::Problem p = conv::validate_data_backward(args);
  run(args.dy.device, "conv_data_backward", p, workspace, args.dy,
      [&] { if (p.inputs()) conv::data_backward_cpu(p, args.dy, args.w, args.dx); },
      [&] { if (p.inputs()) conv::data_backward_cuda(p, args.dy, args.w, args.dx, stream); });
}

void conv_weight_backward(const ConvWeightBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const conv::Problem p = conv::validate_weight_backward(args);
  run(args.dy.device, "conv_weight_backward", p, workspace, args.dy,
      [&] { conv::weight_backward_cpu(p, args.dy, args.x, args.dw); },
      [&] { conv::weight_backward_cuda(p, args.dy, args.x, args.dw, stream); });
}

void conv_bias_backward(const ConvBiasBackwardArgs& args, Stream stream) {
  const conv::Problem p = conv::validate_bias_backward(args);
  run(args.dy.device, "conv_bias_backward", p, nullptr, args.dy, [&] { conv::bias_backward_cpu(p, args.dy, args.db); },
      [&] { conv::bias_backward_cuda(p, args.dy, args.db, stream); });
}

const char* conv_last_algorithm() { return last_algorithm; }

}  // namespace rudnn
