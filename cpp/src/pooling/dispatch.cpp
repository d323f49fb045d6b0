// Public entry points of the pooling family: validate once, then run the backend of the
// tensors' device.
#include "core/backend.hpp"
#include "pooling/problem.hpp"

namespace rudnn {

namespace {

PoolShape shape_of(const Tensor& x, const pooling::ForwardProblem& p, int dims, PoolLayout layout) {
  return pooling::output_shape(x, p.g, dims, layout);
}

void run_forward(const pooling::ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices,
                 Stream stream, const char* op) {
  if (p.outputs() == 0) return;
  core::on_device(x.device, op, [&] { pooling::forward_cpu(p, x, y, indices); },
                  [&] { pooling::forward_cuda(p, x, y, indices, stream); });
}

// Every input element is written (zeros where no window covers it), even when dy is empty.
void run_backward(const pooling::BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx,
                  Stream stream, const char* op) {
  if (p.inputs() == 0) return;
  core::on_device(dx.device, op, [&] { pooling::backward_cpu(p, dy, indices, dx); },
                  [&] { pooling::backward_cuda(p, dy, indices, dx, stream); });
}

}  // namespace

PoolShape max_pool_output_shape(const MaxPoolArgs& args) {
  return shape_of(args.x, pooling::validate_max_pool(args, false), args.window.dims, args.layout);
}

PoolShape avg_pool_output_shape(const AvgPoolArgs& args) {
  return shape_of(args.x, pooling::validate_avg_pool(args, false), args.window.dims, args.layout);
}

PoolShape adaptive_pool_output_shape(const AdaptivePoolArgs& args) {
  return shape_of(args.x, pooling::validate_adaptive_pool(args, false), args.dims, args.layout);
}

void max_pool_forward(const MaxPoolArgs& args, Stream stream) {
  const pooling::ForwardProblem p = pooling::validate_max_pool(args);
  run_forward(p, args.x, args.y, args.indices, stream, "max_pool");
}

void avg_pool_forward(const AvgPoolArgs& args, Stream stream) {
  const pooling::ForwardProblem p = pooling::validate_avg_pool(args);
  run_forward(p, args.x, args.y, nullptr, stream, "avg_pool");
}

void adaptive_pool_forward(const AdaptivePoolArgs& args, Stream stream) {
  const pooling::ForwardProblem p = pooling::validate_adaptive_pool(args);
  run_forward(p, args.x, args.y, args.indices, stream,
              args.kind == AdaptivePoolKind::max ? "adaptive_max_pool" : "adaptive_avg_pool");
}

void max_pool_backward(const MaxPoolBackwardArgs& args, Stream stream) {
  const pooling::BackwardProblem p = pooling::validate_max_pool_backward(args);
  run_backward(p, args.dy, &args.indices, args.dx, stream, "max_pool_backward");
}

void avg_pool_backward(const AvgPoolBackwardArgs& args, Stream stream) {
  const pooling::BackwardProblem p = pooling::validate_avg_pool_backward(args);
  run_backward(p, args.dy, nullptr, args.dx, stream, "avg_pool_backward");
}

void adaptive_pool_backward(const AdaptivePoolBackwardArgs& args, Stream stream) {
  const pooling::BackwardProblem p = pooling::validate_adaptive_pool_backward(args);
  run_backward(p, args.dy, args.indices, args.dx, stream,
               args.kind == AdaptivePoolKind::max ? "adaptive_max_pool_backward" : "adaptive_avg_pool_backward");
}

}  // namespace rudnn
