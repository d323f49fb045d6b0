// XLA FFI handlers for rudnn.jax (compiled only when jaxlib's FFI headers are found).
#pragma once

#include <nanobind/nanobind.h>

// Adds to `m`:
//   jax_ffi_targets() -> {platform: {target name: PyCapsule}} for jax.ffi.register_ffi_target
//   jax_validate_norm_forward / jax_validate_norm_backward /
//   jax_validate_softmax_forward / jax_validate_softmax_backward: the C++ argument checks,
//   run on shapes and dtype names at trace time so errors surface as rudnn exceptions.
void register_jax_ffi(nanobind::module_& m);
