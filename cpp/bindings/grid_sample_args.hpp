// grid_sample's options from the bindings' plain values (Python ints, XLA FFI attributes) into
// libruDNN's GridSampleOptions, shared by grid_sample.cpp and grid_sample_ffi.cpp.
// Codes: mode 0 bilinear, 1 nearest, 2 bicubic; padding_mode 0 zeros, 1 border, 2 reflection;
// layout 0 channels-first, 1 channels-last (an unknown code is libruDNN's ArgumentError).
#pragma once

#include "rudnn/grid_sample.hpp"

namespace rudnn::bindings::grid_sample_args {

inline GridSampleOptions options(int mode, int padding_mode, bool align_corners, int layout) {
  GridSampleOptions o;
  o.mode = static_cast<GridSampleMode>(mode);
  o.padding_mode = static_cast<GridSamplePadding>(padding_mode);
  o.align_corners = align_corners;
  o.layout = static_cast<PoolLayout>(layout);
  return o;
}

}  // namespace rudnn::bindings::grid_sample_args
