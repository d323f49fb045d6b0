// One registration function per op family, each in cpp/bindings/<family>.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace rudnn::bindings {

void register_norm(nanobind::module_& m);
void register_attention(nanobind::module_& m);
void register_moe(nanobind::module_& m);
void register_gated_delta(nanobind::module_& m);
void register_pooling(nanobind::module_& m);
void register_ctc(nanobind::module_& m);
void register_interpolate(nanobind::module_& m);
void register_conv(nanobind::module_& m);
void register_grid_sample(nanobind::module_& m);
void register_paged(nanobind::module_& m);

}  // namespace rudnn::bindings
