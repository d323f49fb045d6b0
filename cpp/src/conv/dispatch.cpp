// Public entry points of the convolution family: validate once, pick the strategy (the
// implicit-GEMM plan of implicit_gemm.hpp, or the direct kernels), then run the backend of the
// tensors' device.
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "conv/implicit_gemm.hpp"
#include "conv/problem.hpp"
#include "core/backend.hpp"
#if RUDNN_WITH_CUDA
#include "core/device.hpp"
#include "core/tune_cache.hpp"
#endif

namespace rudnn {

namespace {

thread_local const char* last_algorithm = "none";

// The implicit-GEMM plan of a validated call (kernel == none: the direct kernels run), by the
// strategy: "direct" never plans; "auto" and "autotune" take the plan when there is one (but
// not for float32); "implicit_gemm" without one is an UnsupportedError that says why.
conv::ig::Plan choose(const conv::Problem& p, conv::Op op, ConvStrategy strategy, const Tensor& ref,
                      const conv::ig::Bases& bases, const char* name) {
  conv::ig::Plan plan;
  if (strategy == ConvStrategy::direct) return plan;
  int major = 0, minor = 0;
#if RUDNN_WITH_CUDA
  if (ref.device.is_cuda()) {
    const core::DeviceProps& props = core::device_props(ref.device.index);
    major = props.cc_major;
    minor = props.cc_minor;
  }
#else
  if (ref.device.is_cuda()) return plan;  // on_device reports that this build has no CUDA
#endif
  plan = conv::ig::plan(p, op, ref.dtype, major, minor, bases);
  // float32 takes the TF32 kernels only when asked for by name: "auto" and "autotune" keep it
  // exact (the direct kernels), since TF32 rounds the inputs to 10 mantissa bits.
  if (ref.dtype == DType::f32 && strategy != ConvStrategy::implicit_gemm) return conv::ig::Plan{};
  if (plan.kernel == conv::ig::Kernel::none && strategy == ConvStrategy::implicit_gemm)
    core::fail(ErrorKind::unsupported, std::string(name) + ": strategy 'implicit_gemm': " + plan.why);
  return plan;
}

// "auto" / "autotune" without a workspace (the JAX FFI path, a C++ caller passing none) for a
// plan that needs one: run direct rather than fail.
void drop_plan_without_workspace(conv::ig::Plan& plan, ConvStrategy strategy, const Tensor* workspace) {
  if (strategy != ConvStrategy::implicit_gemm && plan.workspace_bytes > 0 && !workspace) plan = conv::ig::Plan{};
}

// cuda() returns the algorithm it ran, or nothing for "direct".
template <class Cpu, class Cuda>
void run(const Device& device, const char* op, std::size_t need, const Tensor* workspace, const Tensor& ref,
         Cpu&& cpu, Cuda&& cuda) {
  core::expect_workspace(workspace, ref, "the arrays", need, op, 16, "operand copies read 16 bytes at a time");
  core::on_device(
      device, op,
      [&] {
        last_algorithm = "cpu";
        cpu();
      },
      [&] {
        last_algorithm = "direct";
        if constexpr (std::is_same_v<decltype(cuda()), const char*>) last_algorithm = cuda();
        else cuda();
      });
}

// Runs the plan on CUDA; false (nothing written) when CUTLASS's can_implement refused it, which
// is an UnsupportedError for "implicit_gemm" and the direct kernels for "auto".
bool run_plan(const conv::ig::Plan& plan, const conv::Problem& p, conv::Op op, ConvStrategy strategy,
              const Tensor& ref, const conv::ig::Operands& t, const Tensor* workspace, Stream stream,
              const char* name) {
#if RUDNN_WITH_CUDA
  if (plan.kernel == conv::ig::Kernel::none) return false;
  std::string why;
  if (conv::ig::run(plan, p, op, ref.dtype, t, workspace ? workspace->data : nullptr, ref.device.index, stream,
                    &why))
    return true;
  if (strategy == ConvStrategy::implicit_gemm)
    core::fail(ErrorKind::unsupported, std::string(name) + ": strategy 'implicit_gemm': " + why);
#else
  (void)plan, (void)p, (void)op, (void)strategy, (void)ref, (void)t, (void)workspace, (void)stream, (void)name;
#endif
  return false;
}

#if RUDNN_WITH_CUDA
// ---- "autotune": the plan's kernel or the direct kernels, whichever ran faster ----

std::mutex tune_mutex;
std::map<std::string, bool> tuned;  // key -> the implicit-GEMM kernel won

// Everything the choice depends on: this build, the device model, the op, the candidates, the
// dtype and the exact geometry (convolution layers repeat a few exact shapes), and whether the
// layouts need copies. The same string keys the in-process map and the on-disk cache.
std::string tune_key(const conv::ig::Plan& plan, const conv::Problem& p, conv::Op op, DType dtype, int device) {
  const conv::Geometry& g = p.g;
  const char* name = op == conv::Op::forward         ? "forward"
                     : op == conv::Op::data_backward ? "data_backward"
                                                     : "weight_backward";
  std::string k = std::string(core::build_id()) + " | conv " + name + " | " +
                  core::device_tune_key(device) + " | " + plan.name() + ",direct | dtype " +
                  std::to_string(int(dtype)) + " n " + std::to_string(g.batch) + " c " +
                  std::to_string(g.in_channels) + " k " + std::to_string(g.out_channels) + " copies " +
                  std::to_string(int(plan.workspace_bytes > 0)) + " bias " + std::to_string(int(p.has_bias));
  for (int a = 0; a < conv::kAxes; ++a)
    k += " [" + std::to_string(g.in[a]) + " " + std::to_string(g.kernel[a]) + " " + std::to_string(g.stride[a]) +
         " " + std::to_string(g.pad[a]) + " " + std::to_string(g.dilation[a]) + "]";
  return k;
}

// Whether "autotune" runs the plan's kernel: the recorded choice for this key (this process's,
// else RUDNN_AUTOTUNE_CACHE's), or both candidates timed now on the call's stream (3 runs each
// after a warm-up; one synchronization), the winner recorded in both caches. A kernel that
// refuses the problem loses. The candidates write the outputs, which the winner overwrites.
template <class Ig, class Direct>
bool implicit_gemm_wins(const conv::ig::Plan& plan, const conv::Problem& p, conv::Op op, const Tensor& ref,
                        Stream stream, Ig&& ig, Direct&& direct) {
  const std::string key = tune_key(plan, p, op, ref.dtype, ref.device.index);
  {
    std::lock_guard<std::mutex> lock(tune_mutex);
    if (auto it = tuned.find(key); it != tuned.end()) return it->second;
  }
  const std::string recorded = core::tune_cache_lookup(key);
  bool wins = recorded == "implicit_gemm";
  if (recorded != "implicit_gemm" && recorded != "direct") {
    bool refused = false;
    const float ig_ms = core::time_on_stream([&] { refused = refused || !ig(); }, stream, 3);
    wins = !refused && ig_ms <= core::time_on_stream([&] { direct(); }, stream, 3);
    core::tune_cache_store(key, wins ? "implicit_gemm" : "direct");
  }
  std::lock_guard<std::mutex> lock(tune_mutex);
  tuned.emplace(key, wins);
  return wins;
}
#endif

// The CUDA path of a call: the plan's kernel (ig() false: it refused, nothing written) or the
// direct kernels (direct() returns the algorithm it ran), as the strategy says; returns what ran.
template <class Ig, class Direct>
const char* run_cuda(const conv::ig::Plan& plan, const conv::Problem& p, conv::Op op, ConvStrategy strategy,
                     const Tensor& ref, Stream stream, Ig&& ig, Direct&& direct) {
#if RUDNN_WITH_CUDA
  if (strategy == ConvStrategy::autotune && plan.kernel != conv::ig::Kernel::none &&
      !implicit_gemm_wins(plan, p, op, ref, stream, ig, direct))
    return direct();
#else
  (void)p, (void)op, (void)strategy, (void)ref, (void)stream;
#endif
  return ig() ? plan.name() : direct();
}

conv::ig::Plan forward_plan(const ConvForwardArgs& a, const conv::Problem& p) {
  return choose(p, conv::Op::forward, a.options.strategy, a.x,
                {a.x.data, a.y.data, a.w.data, a.bias ? a.bias->data : nullptr}, "conv");
}

conv::ig::Plan data_backward_plan(const ConvDataBackwardArgs& a, const conv::Problem& p) {
  return choose(p, conv::Op::data_backward, a.options.strategy, a.dy, {a.dx.data, a.dy.data, a.w.data, nullptr},
                "conv_data_backward");
}

conv::ig::Plan weight_backward_plan(const ConvWeightBackwardArgs& a, const conv::Problem& p) {
  return choose(p, conv::Op::weight_backward, a.options.strategy, a.dy, {a.x.data, a.dy.data, a.dw.data, nullptr},
                "conv_weight_backward");
}

}  // namespace

ConvShape conv_output_shape(const ConvForwardArgs& args) {
  return conv::output_shape(conv::validate_forward(args, false).g, args.options.dims, args.options.layout);
}

// The queries plan with every tensor of the call (the output's strides and every base address
// decide which copies the workspace holds).
std::size_t conv_forward_workspace_bytes(const ConvForwardArgs& args) {
  const conv::Problem p = conv::validate_forward(args);
  return forward_plan(args, p).workspace_bytes;
}

std::size_t conv_data_backward_workspace_bytes(const ConvDataBackwardArgs& args) {
  const conv::Problem p = conv::validate_data_backward(args);
  return data_backward_plan(args, p).workspace_bytes;
}

std::size_t conv_weight_backward_workspace_bytes(const ConvWeightBackwardArgs& args) {
  const conv::Problem p = conv::validate_weight_backward(args);
  return weight_backward_plan(args, p).workspace_bytes;
}

void conv_forward(const ConvForwardArgs& args, const Tensor* workspace, Stream stream) {
  const conv::Problem p = conv::validate_forward(args);
  conv::ig::Plan plan = forward_plan(args, p);
  drop_plan_without_workspace(plan, args.options.strategy, workspace);
  run(args.x.device, "conv", plan.workspace_bytes, workspace, args.x,
      [&] { if (p.outputs()) conv::forward_cpu(p, args.x, args.w, args.bias, args.y); },
      [&] {
        return run_cuda(
            plan, p, conv::Op::forward, args.options.strategy, args.x, stream,
            [&] {
              return run_plan(plan, p, conv::Op::forward, args.options.strategy, args.x,
                              {args.x.data, args.w.data, nullptr, args.y.data, args.bias ? args.bias->data : nullptr},
                              workspace, stream, "conv");
            },
            [&] { return p.outputs() ? conv::forward_cuda(p, args.x, args.w, args.bias, args.y, stream) : "direct"; });
      });
}

// Every element of dx is written (zeros where no output reads it), even when dy is empty.
void conv_data_backward(const ConvDataBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const conv::Problem p = conv::validate_data_backward(args);
  conv::ig::Plan plan = data_backward_plan(args, p);
  drop_plan_without_workspace(plan, args.options.strategy, workspace);
  run(args.dy.device, "conv_data_backward", plan.workspace_bytes, workspace, args.dy,
      [&] { if (p.inputs()) conv::data_backward_cpu(p, args.dy, args.w, args.dx); },
      [&] {
        return run_cuda(
            plan, p, conv::Op::data_backward, args.options.strategy, args.dy, stream,
            [&] {
              return run_plan(plan, p, conv::Op::data_backward, args.options.strategy, args.dy,
                              {nullptr, args.w.data, args.dy.data, args.dx.data, nullptr}, workspace, stream,
                              "conv_data_backward");
            },
            [&] {
              if (p.inputs()) conv::data_backward_cuda(p, args.dy, args.w, args.dx, stream);
              return "direct";
            });
      });
}

void conv_weight_backward(const ConvWeightBackwardArgs& args, const Tensor* workspace, Stream stream) {
  const conv::Problem p = conv::validate_weight_backward(args);
  conv::ig::Plan plan = weight_backward_plan(args, p);
  drop_plan_without_workspace(plan, args.options.strategy, workspace);
  run(args.dy.device, "conv_weight_backward", plan.workspace_bytes, workspace, args.dy,
      [&] { conv::weight_backward_cpu(p, args.dy, args.x, args.dw); },
      [&] {
        return run_cuda(
            plan, p, conv::Op::weight_backward, args.options.strategy, args.dy, stream,
            [&] {
              return run_plan(plan, p, conv::Op::weight_backward, args.options.strategy, args.dy,
                              {args.x.data, nullptr, args.dy.data, args.dw.data, nullptr}, workspace, stream,
                              "conv_weight_backward");
            },
            [&] {
              conv::weight_backward_cuda(p, args.dy, args.x, args.dw, stream);
              return "direct";
            });
      });
}

void conv_bias_backward(const ConvBiasBackwardArgs& args, Stream stream) {
  const conv::Problem p = conv::validate_bias_backward(args);
  run(args.dy.device, "conv_bias_backward", 0, nullptr, args.dy, [&] { conv::bias_backward_cpu(p, args.dy, args.db); },
      [&] { conv::bias_backward_cuda(p, args.dy, args.db, stream); });
}

const char* conv_last_algorithm() { return last_algorithm; }

}  // namespace rudnn
