// XLA FFI handlers for rudnn.jax (compiled only when jaxlib's FFI headers are found).
#pragma once

#include <nanobind/nanobind.h>

// Adds to `m`: jax_ffi_targets() -> {platform: {target name: PyCapsule}} for
// jax.ffi.register_ffi_target, and each family's jax_validate_* functions, which run the
// C++ argument checks on (shape, dtype name) specs at trace time so that errors surface
// as rudnn exceptions.
void register_jax_ffi(nanobind::module_& m);

namespace rudnn::jax_ffi {

// Two per family (<family>_ffi.cpp): its handlers into the {name: capsule} tables of
// the "cpu" and "CUDA" platforms, and its jax_validate_* functions into the module.
void add_norm_targets(nanobind::dict& cpu, nanobind::dict& cuda);
void add_norm_validation(nanobind::module_& m);
void add_attention_targets(nanobind::dict& cpu, nanobind::dict& cuda);
void add_attention_validation(nanobind::module_& m);
void add_moe_targets(nanobind::dict& cpu, nanobind::dict& cuda);
void add_moe_validation(nanobind::module_& m);
void add_gated_delta_targets(nanobind::dict& cpu, nanobind::dict& cuda);
void add_gated_delta_validation(nanobind::module_& m);
// Pooling has no jax_validate_* functions: rudnn.jax.pooling checks through the eager bindings.
void add_pooling_targets(nanobind::dict& cpu, nanobind::dict& cuda);
// CTC: the CUDA handlers copy targets and lengths to the host (libruDNN reads them there); no jax_validate_*.
void add_ctc_targets(nanobind::dict& cpu, nanobind::dict& cuda);
void add_interpolate_targets(nanobind::dict& cpu, nanobind::dict& cuda);  // checks through rudnn.interpolate too
void add_conv_targets(nanobind::dict& cpu, nanobind::dict& cuda);         // checks through rudnn.conv too
void add_grid_sample_targets(nanobind::dict& cpu, nanobind::dict& cuda);  // checks through rudnn.grid_sample too
void add_paged_targets(nanobind::dict& cpu, nanobind::dict& cuda);

}  // namespace rudnn::jax_ffi
