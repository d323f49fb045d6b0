// Pooling options from per-axis lists (a std::vector from Python, an ffi::Span attribute from
// XLA) into libruDNN's structs, shared by pooling.cpp and pooling_ffi.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rudnn/error.hpp"
#include "rudnn/pooling.hpp"

namespace rudnn::bindings::pooling_args {

inline PoolLayout layout(int code) { return code == 1 ? PoolLayout::channels_last : PoolLayout::channels_first; }
inline AdaptivePoolKind adaptive_kind(int code) { return code == 1 ? AdaptivePoolKind::max : AdaptivePoolKind::avg; }

// The callers give every list the same length, the spatial dims. A length outside 1..3 is
// copied as nothing: libruDNN's validation then reports the dims.
template <class List>
void copy_sizes(const List& from, std::int64_t (&to)[kMaxPoolDims]) {
  if (from.size() > std::size_t(kMaxPoolDims)) return;
  for (std::size_t i = 0; i < from.size(); ++i) to[i] = from[i];
}

template <class List>
PoolWindow window(const List& kernel, const List& stride, const List& padding, const List* dilation,
                  bool ceil_mode) {
  if (stride.size() != kernel.size() || padding.size() != kernel.size() ||
      (dilation && dilation->size() != kernel.size()))
    throw Error(ErrorKind::value, "pooling: internal: kernel, stride, padding and dilation differ in length");
  PoolWindow w;
  w.dims = int(kernel.size());
  copy_sizes(kernel, w.kernel);
  copy_sizes(stride, w.stride);
  copy_sizes(padding, w.padding);
  if (dilation) copy_sizes(*dilation, w.dilation);  // average pooling: ones
  w.ceil_mode = ceil_mode;
  return w;
}

inline AvgPoolDivisor divisor(bool count_include_pad, std::optional<std::int64_t> divisor_override) {
  AvgPoolDivisor d;
  d.count_include_pad = count_include_pad;
  d.has_divisor_override = divisor_override.has_value();
  d.divisor_override = divisor_override.value_or(0);
  return d;
}

// The window and layout of a max pooling args struct (forward or backward).
template <class Args, class List>
void set_max_options(Args& a, const List& kernel, const List& stride, const List& padding, const List& dilation,
                     bool ceil_mode, int layout_code) {
  a.window = window(kernel, stride, padding, &dilation, ceil_mode);
  a.layout = layout(layout_code);
}

// The window, divisor and layout of an average pooling args struct (forward or backward).
template <class Args, class List>
void set_avg_options(Args& a, const List& kernel, const List& stride, const List& padding, bool ceil_mode,
                     bool count_include_pad, std::optional<std::int64_t> divisor_override, int layout_code) {
  a.window = window(kernel, stride, padding, static_cast<const List*>(nullptr), ceil_mode);
  a.divisor = divisor(count_include_pad, divisor_override);
  a.layout = layout(layout_code);
}

template <class List>
AdaptivePoolArgs adaptive(int kind, const List& output_size, int layout_code) {
  AdaptivePoolArgs a;
  a.kind = adaptive_kind(kind);
  a.dims = int(output_size.size());
  copy_sizes(output_size, a.output_size);
  a.layout = layout(layout_code);
  return a;
}

}  // namespace rudnn::bindings::pooling_args
