// XLA FFI handlers of interpolate (rudnn.jax). Option codes as interpolate_args.hpp says; size and
// scale_factor arrive as arrays of the spatial dims' length with has_size / has_scale_factor
// saying which one is given (XLA attributes have no None).
//
// Targets (the same names on the "cpu" and "CUDA" platforms):
//   rudnn_interpolate_forward   (x) -> y
//   rudnn_interpolate_backward  (dy) -> dx
//   attributes of both: [mode, layout, has_size, size, has_scale_factor, scale_factor, align_corners,
//                        recompute_scale_factor, antialias]
// Trace-time checks and output shapes come from the eager bindings (rudnn.interpolate).
#include <cstdint>
#include <vector>

#include "interpolate_args.hpp"
#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/interpolate.hpp"

namespace rudnn::jax_ffi {

namespace {

using Sizes = ffi::Span<const std::int64_t>;
using Scales = ffi::Span<const double>;

InterpolateOptions options(std::int32_t mode, std::int32_t layout, bool has_size, Sizes size, bool has_scale_factor,
                           Scales scale_factor, std::int32_t align_corners, std::int32_t recompute_scale_factor,
                           bool antialias) {
  const std::vector<std::int64_t> sizes = has_size ? std::vector<std::int64_t>(size.begin(), size.end())
                                                   : std::vector<std::int64_t>();
  const std::vector<double> scales = has_scale_factor ? std::vector<double>(scale_factor.begin(), scale_factor.end())
                                                      : std::vector<double>();
  return bindings::interpolate_args::options(mode, layout, sizes, scales, align_corners, recompute_scale_factor,
                                             antialias);
}

ffi::Error forward(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, std::int32_t mode,
                   std::int32_t layout, bool has_size, Sizes size, bool has_scale_factor, Scales scale_factor,
                   std::int32_t align_corners, std::int32_t recompute_scale_factor, bool antialias) {
  return guarded([&] {
    InterpolateArgs a;
    a.options = options(mode, layout, has_size, size, has_scale_factor, scale_factor, align_corners,
                        recompute_scale_factor, antialias);
    a.x = view(x, place, "interpolate: x");
    a.y = view(*y, place, "interpolate: y");
    interpolate_forward(a, place.stream);
  });
}

ffi::Error backward(const Place& place, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx, std::int32_t mode,
                    std::int32_t layout, bool has_size, Sizes size, bool has_scale_factor, Scales scale_factor,
                    std::int32_t align_corners, std::int32_t recompute_scale_factor, bool antialias) {
  return guarded([&] {
    InterpolateBackwardArgs a;
    a.options = options(mode, layout, has_size, size, has_scale_factor, scale_factor, align_corners,
                        recompute_scale_factor, antialias);
    a.dy = view(dy, place, "interpolate_backward: dy");
    a.dx = view(*dx, place, "interpolate_backward: dx");
    interpolate_backward(a, place.stream);
  });
}

template <class B>
auto bind(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::int32_t>("mode")
      .template Attr<std::int32_t>("layout")
      .template Attr<bool>("has_size")
      .template Attr<Sizes>("size")
      .template Attr<bool>("has_scale_factor")
      .template Attr<Scales>("scale_factor")
      .template Attr<std::int32_t>("align_corners")
      .template Attr<std::int32_t>("recompute_scale_factor")
      .template Attr<bool>("antialias");
}

RUDNN_FFI_HANDLER(interpolate_forward_cpu, bind(cpu_binding()), on_cpu, forward)
RUDNN_FFI_HANDLER(interpolate_backward_cpu, bind(cpu_binding()), on_cpu, backward)
// Registered in every build: without the CUDA backend libruDNN itself reports UnsupportedError.
RUDNN_FFI_HANDLER(interpolate_forward_cuda, bind(cuda_binding()), on_cuda, forward)
RUDNN_FFI_HANDLER(interpolate_backward_cuda, bind(cuda_binding()), on_cuda, backward)

}  // namespace

void add_interpolate_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_interpolate_forward"] = capsule(interpolate_forward_cpu);
  cpu["rudnn_interpolate_backward"] = capsule(interpolate_backward_cpu);
  cuda["rudnn_interpolate_forward"] = capsule(interpolate_forward_cuda);
  cuda["rudnn_interpolate_backward"] = capsule(interpolate_backward_cuda);
}

}  // namespace rudnn::jax_ffi
