// Convolution options from per-axis lists (a std::vector from Python, an ffi::Span attribute
// from XLA) into libruDNN's ConvOptions, shared by conv.cpp and conv_ffi.cpp.
#pragma once

#include <cstdint>

#include "rudnn/conv.hpp"
#include "rudnn/error.hpp"

namespace rudnn::bindings::conv_args {

inline ConvLayout layout(int code) { return code == 1 ? ConvLayout::channels_last : ConvLayout::channels_first; }

// Strategy codes of rudnn/conv.py: 0 auto, 1 direct, 2 implicit_gemm, 3 autotune.
inline ConvStrategy strategy(int code) {
  switch (code) {
    case 1: return ConvStrategy::direct;
    case 2: return ConvStrategy::implicit_gemm;
    case 3: return ConvStrategy::autotune;
    default: return ConvStrategy::automatic;
  }
}

// The callers give every list the spatial dims as its length (x's rank - 2).
template <class List>
ConvOptions options(const List& stride, const List& padding_before, const List& padding_after,
                    const List& dilation, std::int64_t groups, int layout_code, int strategy_code) {
  const std::size_t dims = stride.size();
  if (padding_before.size() != dims || padding_after.size() != dims || dilation.size() != dims || dims < 1 ||
      dims > std::size_t(kMaxConvDims))
    throw Error(ErrorKind::value, "conv: internal: stride, padding and dilation differ in length or are not 1-3 long");
  ConvOptions o;
  o.dims = int(dims);
  for (std::size_t i = 0; i < dims; ++i) {
    o.stride[i] = stride[i];
    o.padding_before[i] = padding_before[i];
    o.padding_after[i] = padding_after[i];
    o.dilation[i] = dilation[i];
  }
  o.groups = groups;
  o.layout = layout(layout_code);
  o.strategy = strategy(strategy_code);
  return o;
}

}  // namespace rudnn::bindings::conv_args
