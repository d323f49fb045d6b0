// The XLA FFI target table of rudnn.jax: every family adds its handlers here.
#include "jax_ffi.hpp"

#include "jax_ffi_common.hpp"

namespace {

nanobind::dict ffi_targets() {
  nanobind::dict cpu, cuda, all;
  rudnn::jax_ffi::add_norm_targets(cpu, cuda);
  rudnn::jax_ffi::add_attention_targets(cpu, cuda);
  rudnn::jax_ffi::add_moe_targets(cpu, cuda);
  rudnn::jax_ffi::add_gated_delta_targets(cpu, cuda);
  rudnn::jax_ffi::add_pooling_targets(cpu, cuda);
  rudnn::jax_ffi::add_ctc_targets(cpu, cuda);
  rudnn::jax_ffi::add_interpolate_targets(cpu, cuda);
  rudnn::jax_ffi::add_conv_targets(cpu, cuda);
  rudnn::jax_ffi::add_grid_sample_targets(cpu, cuda);
  all["cpu"] = cpu;
  all["CUDA"] = cuda;
  return all;
}

}  // namespace

void register_jax_ffi(nanobind::module_& m) {
  m.def("jax_ffi_targets", &ffi_targets,
        "XLA FFI handlers of rudnn.jax as {platform: {target name: PyCapsule}}, for jax.ffi.register_ffi_target.");
  rudnn::jax_ffi::add_norm_validation(m);
  rudnn::jax_ffi::add_attention_validation(m);
  rudnn::jax_ffi::add_moe_validation(m);
  rudnn::jax_ffi::add_gated_delta_validation(m);
}
