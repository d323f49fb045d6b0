// The nanobind module rudnn._C: DLPack capsules -> rudnn::Tensor, stream ints ->
// cudaStream_t, rudnn::Error -> the matching rudnn.*Error. No logic beyond that.
// Each op family binds its functions in cpp/bindings/<family>.cpp.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "core/tune_cache.hpp"
#include "families.hpp"
#include "tensor_convert.hpp"
#if RUDNN_WITH_JAX
#include "jax_ffi.hpp"
#endif

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "libruDNN bindings (internal; use the rudnn package)";
  rudnn::bindings::register_error_translator();

#if RUDNN_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  // Whether libruDNN has the MoE forward's grouped-GEMM variants (-DRUDNN_WITH_MOE_GEMM_VARIANTS=ON:
  // RUDNN_MOE_GEMM_SCHEDULE=multicast|pingpong_wide; the bench times them only then).
#if RUDNN_WITH_MOE_GEMM_VARIANTS
  m.attr("has_moe_gemm_variants") = true;
#else
  m.attr("has_moe_gemm_variants") = false;
#endif
#if RUDNN_WITH_JAX
  m.attr("has_jax_ffi") = true;
  register_jax_ffi(m);
#else
  m.attr("has_jax_ffi") = false;
#endif

  // The on-disk autotune cache (core/tune_cache.hpp): the build's id, and for its tests the
  // lookup and store the autotuned ops use.
  m.def("build_id", &rudnn::core::build_id);
  m.def("_tune_cache_lookup", &rudnn::core::tune_cache_lookup);
  m.def("_tune_cache_store", &rudnn::core::tune_cache_store);

  rudnn::bindings::register_norm(m);
  rudnn::bindings::register_attention(m);
  rudnn::bindings::register_moe(m);
  rudnn::bindings::register_gated_delta(m);
  rudnn::bindings::register_pooling(m);
  rudnn::bindings::register_ctc(m);
  rudnn::bindings::register_interpolate(m);
  rudnn::bindings::register_conv(m);
  rudnn::bindings::register_grid_sample(m);
  rudnn::bindings::register_paged(m);
}
