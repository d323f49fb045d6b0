// XLA FFI handlers of the conv family (rudnn.jax). Options are i64 array attributes of the
// spatial dims' length; layout 0 is channels-first, 1 channels-last; strategy codes are those of
// conv_args.hpp.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets):
//   rudnn_conv_forward          (x, w, [bias]) -> y  [stride, pad_before, pad_after, dilation, groups, layout,
//                                                     strategy]; bias iff given
//   rudnn_conv_data_backward    (dy, w) -> dx        [the forward's]
//   rudnn_conv_weight_backward  (dy, x) -> dw        [the forward's]
//   rudnn_conv_bias_backward    (dy) -> db           [dims, layout]
// Trace-time checks and output shapes come from the eager bindings (rudnn.conv).
#include <string>

#include "conv_args.hpp"
#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/conv.hpp"

namespace rudnn::jax_ffi {

namespace {

using Sizes = ffi::Span<const std::int64_t>;
namespace args = rudnn::bindings::conv_args;

ffi::Error conv_forward(const Place& place, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::RemainingArgs rest,
                        ffi::Result<ffi::AnyBuffer> y, Sizes stride, Sizes pad_before, Sizes pad_after,
                        Sizes dilation, std::int64_t groups, std::int32_t layout, std::int32_t strategy) {
  return guarded([&] {
    rudnn::ConvForwardArgs a;
    a.options = args::options(stride, pad_before, pad_after, dilation, groups, layout, strategy);
    a.x = view(x, place, "conv: x");
    a.w = view(w, place, "conv: w");
    a.y = view(*y, place, "conv: y");
    Tensor bias;
    Inputs in(rest, place, "conv");
    if (rest.size() > 0) a.bias = &(bias = in.next("bias"));
    in.finish();
    rudnn::conv_forward(a, nullptr, place.stream);
  });
}

ffi::Error conv_data_backward(const Place& place, ffi::AnyBuffer dy, ffi::AnyBuffer w,
                              ffi::Result<ffi::AnyBuffer> dx, Sizes stride, Sizes pad_before, Sizes pad_after,
                              Sizes dilation, std::int64_t groups, std::int32_t layout, std::int32_t strategy) {
  return guarded([&] {
    rudnn::ConvDataBackwardArgs a;
    a.options = args::options(stride, pad_before, pad_after, dilation, groups, layout, strategy);
    a.dy = view(dy, place, "conv_data_backward: dy");
    a.w = view(w, place, "conv_data_backward: w");
    a.dx = view(*dx, place, "conv_data_backward: dx");
    rudnn::conv_data_backward(a, nullptr, place.stream);
  });
}

ffi::Error conv_weight_backward(const Place& place, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                                ffi::Result<ffi::AnyBuffer> dw, Sizes stride, Sizes pad_before, Sizes pad_after,
                                Sizes dilation, std::int64_t groups, std::int32_t layout, std::int32_t strategy) {
  return guarded([&] {
    rudnn::ConvWeightBackwardArgs a;
    a.options = args::options(stride, pad_before, pad_after, dilation, groups, layout, strategy);
    a.dy = view(dy, place, "conv_weight_backward: dy");
    a.x = view(x, place, "conv_weight_backward: x");
    a.dw = view(*dw, place, "conv_weight_backward: dw");
    rudnn::conv_weight_backward(a, nullptr, place.stream);
  });
}

ffi::Error conv_bias_backward(const Place& place, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> db,
                              std::int32_t dims, std::int32_t layout) {
  return guarded([&] {
    rudnn::ConvBiasBackwardArgs a;
    a.dims = dims;
    a.layout = args::layout(layout);
    a.dy = view(dy, place, "conv_bias_backward: dy");
    a.db = view(*db, place, "conv_bias_backward: db");
    rudnn::conv_bias_backward(a, place.stream);
  });
}

template <class B>
auto option_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<Sizes>("stride")
      .template Attr<Sizes>("pad_before")
      .template Attr<Sizes>("pad_after")
      .template Attr<Sizes>("dilation")
      .template Attr<std::int64_t>("groups")
      .template Attr<std::int32_t>("layout")
      .template Attr<std::int32_t>("strategy");
}

template <class B>
auto bind_forward(B&& b) {
  return option_attrs(std::forward<B>(b)
                          .template Arg<ffi::AnyBuffer>()
                          .template Arg<ffi::AnyBuffer>()
                          .RemainingArgs()
                          .template Ret<ffi::AnyBuffer>());
}

template <class B>
auto bind_backward(B&& b) {
  return option_attrs(
      std::forward<B>(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>());
}

template <class B>
auto bind_bias_backward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::int32_t>("dims")
      .template Attr<std::int32_t>("layout");
}

RUDNN_FFI_HANDLER(conv_forward_cpu, bind_forward(cpu_binding()), on_cpu, conv_forward)
RUDNN_FFI_HANDLER(conv_data_backward_cpu, bind_backward(cpu_binding()), on_cpu, conv_data_backward)
RUDNN_FFI_HANDLER(conv_weight_backward_cpu, bind_backward(cpu_binding()), on_cpu, conv_weight_backward)
RUDNN_FFI_HANDLER(conv_bias_backward_cpu, bind_bias_backward(cpu_binding()), on_cpu, conv_bias_backward)
// Registered in every build: without the CUDA backend libruDNN itself reports UnsupportedError.
RUDNN_FFI_HANDLER(conv_forward_cuda, bind_forward(cuda_binding()), on_cuda, conv_forward)
RUDNN_FFI_HANDLER(conv_data_backward_cuda, bind_backward(cuda_binding()), on_cuda, conv_data_backward)
RUDNN_FFI_HANDLER(conv_weight_backward_cuda, bind_backward(cuda_binding()), on_cuda, conv_weight_backward)
RUDNN_FFI_HANDLER(conv_bias_backward_cuda, bind_bias_backward(cuda_binding()), on_cuda, conv_bias_backward)

}  // namespace

void add_conv_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_conv_forward"] = capsule(conv_forward_cpu);
  cpu["rudnn_conv_data_backward"] = capsule(conv_data_backward_cpu);
  cpu["rudnn_conv_weight_backward"] = capsule(conv_weight_backward_cpu);
  cpu["rudnn_conv_bias_backward"] = capsule(conv_bias_backward_cpu);
  cuda["rudnn_conv_forward"] = capsule(conv_forward_cuda);
  cuda["rudnn_conv_data_backward"] = capsule(conv_data_backward_cuda);
  cuda["rudnn_conv_weight_backward"] = capsule(conv_weight_backward_cuda);
  cuda["rudnn_conv_bias_backward"] = capsule(conv_bias_backward_cuda);
}

}  // namespace rudnn::jax_ffi
