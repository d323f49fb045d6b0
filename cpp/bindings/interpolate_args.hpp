// interpolate's options from the bindings' plain values (Python lists, XLA FFI attributes) into
// libruDNN's InterpolateOptions, shared by interpolate.cpp and interpolate_ffi.cpp.
// Codes: mode 0..6 in InterpolateMode's order; layout 0 channels-first, 1 channels-last;
// align_corners and recompute_scale_factor -1 None, 0 False, 1 True.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rudnn/interpolate.hpp"

namespace rudnn::bindings::interpolate_args {

inline OptionalBool optional_bool(int code) {
  return code < 0 ? OptionalBool::unset : (code ? OptionalBool::yes : OptionalBool::no);
}

// size and scale_factor: empty for None; otherwise one entry per spatial axis. A length past 3 is
// reported as such by libruDNN's validation (dims) without copying the entries.
template <class Sizes, class Scales>
InterpolateOptions options(int mode, int layout, const Sizes& size, const Scales& scale_factor, int align_corners,
                           int recompute_scale_factor, bool antialias) {
  InterpolateOptions o;
  o.mode = static_cast<InterpolateMode>(mode);
  o.layout = layout == 1 ? PoolLayout::channels_last : PoolLayout::channels_first;
  o.has_size = size.size() > 0;
  o.has_scale_factor = scale_factor.size() > 0;
  o.dims = int(o.has_size ? size.size() : scale_factor.size());
  const bool fits = o.dims <= kMaxInterpolateDims;
  for (std::size_t i = 0; fits && i < size.size(); ++i) o.size[i] = size[i];
  for (std::size_t i = 0; fits && i < scale_factor.size(); ++i) o.scale_factor[i] = scale_factor[i];
  o.align_corners = optional_bool(align_corners);
  o.recompute_scale_factor = optional_bool(recompute_scale_factor);
  o.antialias = antialias;
  return o;
}

}  // namespace rudnn::bindings::interpolate_args
