// XLA FFI handlers of the pooling family (rudnn.jax). Window options are i64 array attributes
// of one length (the spatial dims); layout 0 is channels-first, 1 channels-last.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets):
//   rudnn_max_pool_forward        (x) -> (y, [indices])
//                                 [kernel, stride, padding, dilation, ceil_mode, layout, has_indices]
//   rudnn_avg_pool_forward        (x) -> y
//                                 [kernel, stride, padding, ceil_mode, count_include_pad,
//                                  has_divisor_override, divisor_override, layout]
//   rudnn_adaptive_pool_forward   (x) -> (y, [indices])   [kind: 0 avg 1 max, output_size, layout, has_indices]
//   rudnn_max_pool_backward       (dy, x, indices) -> dx  [kernel, stride, padding, dilation, ceil_mode, layout]
//   rudnn_avg_pool_backward       (dy) -> dx              [the avg forward's attributes]
//   rudnn_adaptive_pool_backward  (dy, [x, indices]) -> dx [kind, dims, layout]; x and indices iff max
// Trace-time checks and output shapes come from the eager bindings (rudnn.pooling).
#include <optional>
#include <string>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "pooling_args.hpp"
#include "rudnn/pooling.hpp"

namespace rudnn::jax_ffi {

namespace {

using Sizes = ffi::Span<const std::int64_t>;
namespace args = rudnn::bindings::pooling_args;

std::optional<std::int64_t> override_of(bool has, std::int64_t value) {
  return has ? std::optional<std::int64_t>(value) : std::nullopt;
}

// The optional indices result of a forward call (in `slot`), or null.
const Tensor* indices_output(const ffi::RemainingRets& rets, const Place& place, const char* op, bool has,
                             Tensor& slot) {
  Outputs out(rets, place, op);
  const Tensor* indices = has ? &(slot = out.next("indices")) : nullptr;
  out.finish();
  return indices;
}

ffi::Error max_pool_forward(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                            ffi::RemainingRets rets, Sizes kernel, Sizes stride, Sizes padding, Sizes dilation,
                            bool ceil_mode, std::int32_t layout, bool has_indices) {
  return guarded([&] {
    rudnn::MaxPoolArgs a;
    args::set_max_options(a, kernel, stride, padding, dilation, ceil_mode, layout);
    a.x = view(x, place, "max_pool: x");
    a.y = view(*y, place, "max_pool: y");
    Tensor indices;
    a.indices = indices_output(rets, place, "max_pool", has_indices, indices);
    rudnn::max_pool_forward(a, place.stream);
  });
}

ffi::Error avg_pool_forward(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, Sizes kernel,
                            Sizes stride, Sizes padding, bool ceil_mode, bool count_include_pad,
                            bool has_divisor_override, std::int64_t divisor_override, std::int32_t layout) {
  return guarded([&] {
    rudnn::AvgPoolArgs a;
    args::set_avg_options(a, kernel, stride, padding, ceil_mode, count_include_pad,
                          override_of(has_divisor_override, divisor_override), layout);
    a.x = view(x, place, "avg_pool: x");
    a.y = view(*y, place, "avg_pool: y");
    rudnn::avg_pool_forward(a, place.stream);
  });
}

ffi::Error adaptive_pool_forward(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                                 ffi::RemainingRets rets, std::int32_t kind, Sizes output_size, std::int32_t layout,
                                 bool has_indices) {
  return guarded([&] {
    rudnn::AdaptivePoolArgs a = args::adaptive(kind, output_size, layout);
    const char* op = kind == 1 ? "adaptive_max_pool" : "adaptive_avg_pool";
    a.x = view(x, place, std::string(op) + ": x");
    a.y = view(*y, place, std::string(op) + ": y");
    Tensor indices;
    a.indices = indices_output(rets, place, op, has_indices, indices);
    rudnn::adaptive_pool_forward(a, place.stream);
  });
}

ffi::Error max_pool_backward(const Place& place, ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer indices,
                             ffi::Result<ffi::AnyBuffer> dx, Sizes kernel, Sizes stride, Sizes padding,
                             Sizes dilation, bool ceil_mode, std::int32_t layout) {
  return guarded([&] {
    rudnn::MaxPoolBackwardArgs a;
    args::set_max_options(a, kernel, stride, padding, dilation, ceil_mode, layout);
    a.dy = view(dy, place, "max_pool_backward: dy");
    a.x = view(x, place, "max_pool_backward: x");
    a.indices = view(indices, place, "max_pool_backward: indices");
    a.dx = view(*dx, place, "max_pool_backward: dx");
    rudnn::max_pool_backward(a, place.stream);
  });
}

ffi::Error avg_pool_backward(const Place& place, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx, Sizes kernel,
                             Sizes stride, Sizes padding, bool ceil_mode, bool count_include_pad,
                             bool has_divisor_override, std::int64_t divisor_override, std::int32_t layout) {
  return guarded([&] {
    rudnn::AvgPoolBackwardArgs a;
    args::set_avg_options(a, kernel, stride, padding, ceil_mode, count_include_pad,
                          override_of(has_divisor_override, divisor_override), layout);
    a.dy = view(dy, place, "avg_pool_backward: dy");
    a.dx = view(*dx, place, "avg_pool_backward: dx");
    rudnn::avg_pool_backward(a, place.stream);
  });
}

ffi::Error adaptive_pool_backward(const Place& place, ffi::AnyBuffer dy, ffi::RemainingArgs rest,
                                  ffi::Result<ffi::AnyBuffer> dx, std::int32_t kind, std::int32_t dims,
                                  std::int32_t layout) {
  return guarded([&] {
    const char* op = kind == 1 ? "adaptive_max_pool_backward" : "adaptive_avg_pool_backward";
    rudnn::AdaptivePoolBackwardArgs a;
    a.kind = args::adaptive_kind(kind);
    a.dims = dims;
    a.layout = args::layout(layout);
    a.dy = view(dy, place, std::string(op) + ": dy");
    a.dx = view(*dx, place, std::string(op) + ": dx");
    Tensor x, indices;
    Inputs in(rest, place, op);
    if (kind == 1) {
      a.x = &(x = in.next("x"));
      a.indices = &(indices = in.next("indices"));
    }
    in.finish();
    rudnn::adaptive_pool_backward(a, place.stream);
  });
}

template <class B>
auto bind_max_pool_forward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .RemainingRets()
      .template Attr<Sizes>("kernel")
      .template Attr<Sizes>("stride")
      .template Attr<Sizes>("padding")
      .template Attr<Sizes>("dilation")
      .template Attr<bool>("ceil_mode")
      .template Attr<std::int32_t>("layout")
      .template Attr<bool>("has_indices");
}

// The average pooling attributes after the operands (forward and backward have the same).
template <class B>
auto avg_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<Sizes>("kernel")
      .template Attr<Sizes>("stride")
      .template Attr<Sizes>("padding")
      .template Attr<bool>("ceil_mode")
      .template Attr<bool>("count_include_pad")
      .template Attr<bool>("has_divisor_override")
      .template Attr<std::int64_t>("divisor_override")
      .template Attr<std::int32_t>("layout");
}

template <class B>
auto bind_avg_pool(B&& b) {
  return avg_attrs(std::forward<B>(b).template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>());
}

template <class B>
auto bind_adaptive_pool_forward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .RemainingRets()
      .template Attr<std::int32_t>("kind")
      .template Attr<Sizes>("output_size")
      .template Attr<std::int32_t>("layout")
      .template Attr<bool>("has_indices");
}

template <class B>
auto bind_max_pool_backward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<Sizes>("kernel")
      .template Attr<Sizes>("stride")
      .template Attr<Sizes>("padding")
      .template Attr<Sizes>("dilation")
      .template Attr<bool>("ceil_mode")
      .template Attr<std::int32_t>("layout");
}

template <class B>
auto bind_adaptive_pool_backward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::int32_t>("kind")
      .template Attr<std::int32_t>("dims")
      .template Attr<std::int32_t>("layout");
}

RUDNN_FFI_HANDLER(max_pool_forward_cpu, bind_max_pool_forward(cpu_binding()), on_cpu, max_pool_forward)
RUDNN_FFI_HANDLER(avg_pool_forward_cpu, bind_avg_pool(cpu_binding()), on_cpu, avg_pool_forward)
RUDNN_FFI_HANDLER(adaptive_pool_forward_cpu, bind_adaptive_pool_forward(cpu_binding()), on_cpu,
                  adaptive_pool_forward)
RUDNN_FFI_HANDLER(max_pool_backward_cpu, bind_max_pool_backward(cpu_binding()), on_cpu, max_pool_backward)
RUDNN_FFI_HANDLER(avg_pool_backward_cpu, bind_avg_pool(cpu_binding()), on_cpu, avg_pool_backward)
RUDNN_FFI_HANDLER(adaptive_pool_backward_cpu, bind_adaptive_pool_backward(cpu_binding()), on_cpu,
                  adaptive_pool_backward)
// Registered in every build: without the CUDA backend libruDNN itself reports UnsupportedError.
RUDNN_FFI_HANDLER(max_pool_forward_cuda, bind_max_pool_forward(cuda_binding()), on_cuda, max_pool_forward)
RUDNN_FFI_HANDLER(avg_pool_forward_cuda, bind_avg_pool(cuda_binding()), on_cuda, avg_pool_forward)
RUDNN_FFI_HANDLER(adaptive_pool_forward_cuda, bind_adaptive_pool_forward(cuda_binding()), on_cuda,
                  adaptive_pool_forward)
RUDNN_FFI_HANDLER(max_pool_backward_cuda, bind_max_pool_backward(cuda_binding()), on_cuda, max_pool_backward)
RUDNN_FFI_HANDLER(avg_pool_backward_cuda, bind_avg_pool(cuda_binding()), on_cuda, avg_pool_backward)
RUDNN_FFI_HANDLER(adaptive_pool_backward_cuda, bind_adaptive_pool_backward(cuda_binding()), on_cuda,
                  adaptive_pool_backward)

}  // namespace

void add_pooling_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_max_pool_forward"] = capsule(max_pool_forward_cpu);
  cpu["rudnn_avg_pool_forward"] = capsule(avg_pool_forward_cpu);
  cpu["rudnn_adaptive_pool_forward"] = capsule(adaptive_pool_forward_cpu);
  cpu["rudnn_max_pool_backward"] = capsule(max_pool_backward_cpu);
  cpu["rudnn_avg_pool_backward"] = capsule(avg_pool_backward_cpu);
  cpu["rudnn_adaptive_pool_backward"] = capsule(adaptive_pool_backward_cpu);
  cuda["rudnn_max_pool_forward"] = capsule(max_pool_forward_cuda);
  cuda["rudnn_avg_pool_forward"] = capsule(avg_pool_forward_cuda);
  cuda["rudnn_adaptive_pool_forward"] = capsule(adaptive_pool_forward_cuda);
  cuda["rudnn_max_pool_backward"] = capsule(max_pool_backward_cuda);
  cuda["rudnn_avg_pool_backward"] = capsule(avg_pool_backward_cuda);
  cuda["rudnn_adaptive_pool_backward"] = capsule(adaptive_pool_backward_cuda);
}

}  // namespace rudnn::jax_ffi
