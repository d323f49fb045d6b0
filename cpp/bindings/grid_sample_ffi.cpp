// XLA FFI handlers of grid_sample (rudnn.jax). Option codes as grid_sample_args.hpp says.
//
// Targets (the same names on the "cpu" and "CUDA" platforms):
//   rudnn_grid_sample_forward   (x, grid) -> y
//   rudnn_grid_sample_backward  (dy, x, grid) -> (dx, dgrid); CUDA: dx's float32 workspace from
//                               XLA's scratch allocator
//   attributes: [mode, padding_mode, align_corners, layout] (+ deterministic for the backward)
// Trace-time checks and output shapes come from the eager bindings (rudnn.grid_sample).
#include <cstdint>

#include "grid_sample_args.hpp"
#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/grid_sample.hpp"

namespace rudnn::jax_ffi {

namespace {

using bindings::grid_sample_args::options;

ffi::Error forward(const Place& place, ffi::AnyBuffer x, ffi::AnyBuffer grid, ffi::Result<ffi::AnyBuffer> y,
                   std::int32_t mode, std::int32_t padding_mode, bool align_corners, std::int32_t layout) {
  return guarded([&] {
    GridSampleArgs a;
    a.options = options(mode, padding_mode, align_corners, layout);
    a.x = view(x, place, "grid_sample: x");
    a.grid = view(grid, place, "grid_sample: grid");
    a.y = view(*y, place, "grid_sample: y");
    grid_sample_forward(a, place.stream);
  });
}

ffi::Error backward(const Place& place, ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer grid,
                    ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dgrid, std::int32_t mode,
                    std::int32_t padding_mode, bool align_corners, std::int32_t layout, bool deterministic) {
  return guarded([&] {
    const std::string op = "grid_sample_backward";
    GridSampleBackwardArgs a;
    a.options = options(mode, padding_mode, align_corners, layout);
    a.deterministic = deterministic;
    a.dy = view(dy, place, op + ": dy");
    a.x = view(x, place, op + ": x");
    a.grid = view(grid, place, op + ": grid");
    const Tensor dx_t = view(*dx, place, op + ": dx"), dgrid_t = view(*dgrid, place, op + ": dgrid");
    a.dx = &dx_t;
    a.dgrid = &dgrid_t;
    Tensor ws;
    a.workspace = scratch_workspace(place, grid_sample_backward_workspace_bytes(a), ws, op);
    grid_sample_backward(a, place.stream);
  });
}

template <class B>
auto with_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<std::int32_t>("mode")
      .template Attr<std::int32_t>("padding_mode")
      .template Attr<bool>("align_corners")
      .template Attr<std::int32_t>("layout");
}

template <class B>
auto bind_forward(B&& b) {
  return with_attrs(std::forward<B>(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>());
}

template <class B>
auto bind_backward(B&& b) {
  return with_attrs(std::forward<B>(b)
                        .template Arg<ffi::AnyBuffer>()
                        .template Arg<ffi::AnyBuffer>()
                        .template Arg<ffi::AnyBuffer>()
                        .template Ret<ffi::AnyBuffer>()
                        .template Ret<ffi::AnyBuffer>())
      .template Attr<bool>("deterministic");
}

RUDNN_FFI_HANDLER(grid_sample_forward_cpu, bind_forward(cpu_binding()), on_cpu, forward)
RUDNN_FFI_HANDLER(grid_sample_backward_cpu, bind_backward(cpu_binding()), on_cpu, backward)
// Registered in every build: without the CUDA backend libruDNN itself reports UnsupportedError.
RUDNN_FFI_HANDLER(grid_sample_forward_cuda, bind_forward(cuda_binding()), on_cuda, forward)
RUDNN_FFI_HANDLER(grid_sample_backward_cuda, bind_backward(cuda_binding()), on_cuda, backward)

}  // namespace

void add_grid_sample_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_grid_sample_forward"] = capsule(grid_sample_forward_cpu);
  cpu["rudnn_grid_sample_backward"] = capsule(grid_sample_backward_cpu);
  cuda["rudnn_grid_sample_forward"] = capsule(grid_sample_forward_cuda);
  cuda["rudnn_grid_sample_backward"] = capsule(grid_sample_backward_cuda);
}

}  // namespace rudnn::jax_ffi
