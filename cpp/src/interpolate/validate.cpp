// Every check of interpolate and interpolate_backward, run once before either backend, in
// torch.nn.functional.interpolate's order of concerns: the input, the mode and the options that
// go with it, then the output size. Sizes are checked for int64 overflow as they are computed.
#include <cmath>
#include <cstdio>
#include <string>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "interpolate/problem.hpp"

namespace rudnn::interp {

using core::fail;

namespace {

const char* mode_name(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::nearest: return "nearest";
    case InterpolateMode::nearest_exact: return "nearest-exact";
    case InterpolateMode::linear: return "linear";
    case InterpolateMode::bilinear: return "bilinear";
    case InterpolateMode::trilinear: return "trilinear";
    case InterpolateMode::bicubic: return "bicubic";
    case InterpolateMode::area: return "area";
  }
  return "?";
}

bool is_linear(InterpolateMode m) {
  return m == InterpolateMode::linear || m == InterpolateMode::bilinear || m == InterpolateMode::trilinear;
}

// The number of spatial axes a mode is tied to (0: any of 1..3).
int mode_dims(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::linear: return 1;
    case InterpolateMode::bilinear: return 2;
    case InterpolateMode::trilinear: return 3;
    case InterpolateMode::bicubic: return 2;
    default: return 0;
  }
}

std::string axes_str(int dims, PoolLayout layout) {
  static const char* names[3][3] = {{"L"}, {"H", "W"}, {"D", "H", "W"}};
  std::string s = layout == PoolLayout::channels_first ? "[N, C, " : "[N, ";
  for (int i = 0; i < dims; ++i) s += std::string(i ? ", " : "") + names[dims - 1][i];
  return s + (layout == PoolLayout::channels_last ? ", C]" : "]");
}

std::string num_str(i64 v) { return std::to_string(v); }
std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

template <class T>
std::string list_str(const T* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + num_str(v[i]);
  return s + "]";
}

// The axis of a (N, C, *spatial) or (N, *spatial, C) tensor holding channel / spatial axis i.
int channel_axis(int rank, PoolLayout layout) { return layout == PoolLayout::channels_first ? 1 : rank - 1; }
int spatial_axis(int i, PoolLayout layout) { return layout == PoolLayout::channels_first ? 2 + i : 1 + i; }

Strides strides_of(const Tensor& t, int dims, PoolLayout layout) {
  Strides s;
  s.n = t.strides[0];
  s.c = t.strides[channel_axis(t.rank, layout)];
  for (int i = 0; i < dims; ++i) s.sp[kAxes - dims + i] = t.strides[spatial_axis(i, layout)];
  return s;
}

// x (or dx standing for x_shape): a float tensor of 3 to 5 axes, every axis but the batch >= 1.
void check_input(const Tensor& x, PoolLayout layout, const std::string& name) {
  core::expect_float(x, name);
  if (x.rank < 3 || x.rank > 5)
    fail(ErrorKind::shape, name + ": expected 3, 4 or 5 axes (" + axes_str(1, layout) + ", " + axes_str(2, layout) +
                               " or " + axes_str(3, layout) + "), got shape " + x.shape_str());
  for (int d = 1; d < x.rank; ++d)
    if (x.shape[d] < 1)
      fail(ErrorKind::shape, name + ": expected sizes >= 1 on every axis but the batch axis, got shape " +
                                 x.shape_str());
}

void check_mode_options(const InterpolateOptions& o, const Tensor& x, const std::string& op, const std::string& name) {
  if (int(o.mode) < int(InterpolateMode::nearest) || int(o.mode) > int(InterpolateMode::area))
    fail(ErrorKind::value, op + ": mode: unknown mode code " + std::to_string(int(o.mode)));
  const int dims = x.rank - 2;
  const int tied = mode_dims(o.mode);
  if (tied && tied != dims)
    fail(ErrorKind::shape, op + ": mode: '" + mode_name(o.mode) + "' takes " + std::to_string(tied + 2) + "-D input " +
                               axes_str(tied, o.layout) + ", got " + name + " of shape " + x.shape_str());
  if (o.align_corners != OptionalBool::unset && !is_linear(o.mode) && o.mode != InterpolateMode::bicubic)
    fail(ErrorKind::value, op + ": align_corners: only the linear, bilinear, trilinear and bicubic modes take "
                                "align_corners (None otherwise), got mode '" + mode_name(o.mode) + "'");
  if (o.antialias && o.mode != InterpolateMode::bilinear && o.mode != InterpolateMode::bicubic)
    fail(ErrorKind::value, op + ": antialias: only the bilinear and bicubic modes (4-D input) take antialias, got mode '" +
                               mode_name(o.mode) + "'");
  if (o.has_size == o.has_scale_factor)
    fail(ErrorKind::value, op + ": size, scale_factor: expected exactly one of them, got " +
                               (o.has_size ? "both" : "neither"));
  const std::string which = o.has_size ? "size" : "scale_factor";
  if (o.dims != dims)
    fail(ErrorKind::value, op + ": " + which + ": expected " + std::to_string(dims) + " entries (one per spatial axis of " +
                               name + " of shape " + x.shape_str() + "), got " + std::to_string(o.dims));
  if (o.recompute_scale_factor == OptionalBool::yes && o.has_size)
    fail(ErrorKind::value, op + ": recompute_scale_factor: not meaningful with an explicit size (give scale_factor)");
  for (int i = 0; i < dims; ++i) {
    if (o.has_size && o.size[i] < 1)
      fail(ErrorKind::value, op + ": size: expected values >= 1, got " + list_str(o.size, dims));
    if (o.has_scale_factor && !(std::isfinite(o.scale_factor[i]) && o.scale_factor[i] > 0))
      fail(ErrorKind::value, op + ": scale_factor: expected finite values > 0, got " + list_str(o.scale_factor, dims));
  }
}

Method method_of(const InterpolateOptions& o) {
  switch (o.mode) {
    case InterpolateMode::nearest: return Method::nearest;
    case InterpolateMode::nearest_exact: return Method::nearest_exact;
    case InterpolateMode::area: return Method::area;
    case InterpolateMode::bicubic: return o.antialias ? Method::aa_cubic : Method::cubic;
    case InterpolateMode::bilinear: return o.antialias ? Method::aa_linear : Method::linear;
    default: return Method::linear;
  }
}

// The output sizes (torch: floor(in * scale) in double) and each axis's coordinate mapping.
void read_axes(const InterpolateOptions& o, const Tensor& x, const std::string& op, Problem& p) {
  const int dims = x.rank - 2;
  const bool align = o.align_corners == OptionalBool::yes;
  // The given scale maps coordinates unless recomputed; area (adaptive pooling) never uses it.
  const bool use_scale =
      o.has_scale_factor && o.recompute_scale_factor != OptionalBool::yes && o.mode != InterpolateMode::area;
  for (int i = 0; i < dims; ++i) {
    Axis& a = p.ax[kAxes - dims + i];
    a.in = x.shape[spatial_axis(i, o.layout)];
    if (o.has_size) {
      a.out = o.size[i];
    } else {
      const double out = std::floor(double(a.in) * o.scale_factor[i]);
      if (!(out < 9223372036854775807.0))
        fail(ErrorKind::value, op + ": scale_factor: the output size along spatial axis " + std::to_string(i) +
                                   " (input size " + std::to_string(a.in) + " * " + num_str(o.scale_factor[i]) +
                                   ") overflows int64");
      a.out = i64(out);
      if (a.out < 1)
        fail(ErrorKind::value, op + ": scale_factor: the output size along spatial axis " + std::to_string(i) +
                                   " is floor(" + std::to_string(a.in) + " * " + num_str(o.scale_factor[i]) +
                                   ") = 0; expected >= 1");
    }
    a.align_corners = align;
    // torch's area_pixel_compute_scale, in float32.
    if (align) a.scale = a.out > 1 ? float(a.in - 1) / float(a.out - 1) : 0.0f;
    else if (use_scale) a.scale = float(1.0 / o.scale_factor[i]);
    else a.scale = float(a.in) / float(a.out);
    if (antialiased(p.method)) {  // downsampling widens the filter by the scale
      const float taps = p.method == Method::aa_cubic ? 4.0f : 2.0f;
      a.support = a.scale >= 1.0f ? taps * 0.5f * a.scale : taps * 0.5f;
      a.invscale = a.scale >= 1.0f ? 1.0f / a.scale : 1.0f;
    }
    // area's window bounds compute (o + 1) * in + out - 1 < (out + 1) * (in + 1).
    i64 bound;
    if (__builtin_mul_overflow(a.out + 1, a.in + 1, &bound))
      fail(ErrorKind::value, op + ": the output size times the input size along spatial axis " + std::to_string(i) +
                                 " overflows int64");
  }
  for (int a = 0; a < kAxes - dims; ++a) p.ax[a].unit = true;
}

// The same-size shortcuts of torch's kernels (torch 2.x CPU, matched by tests/test_interpolate.py):
// linear copies per axis in both passes; the forward of 2-D nearest copies (or halves) per axis,
// 1-D and 3-D nearest do not; antialias copies per axis. The backward of nearest copies (or halves)
// per axis, antialias's does not; bicubic's copies when every axis keeps its size.
void set_shortcuts(Problem& p, bool backward) {
  const bool cubic_copies = p.ax[0].in == p.ax[0].out && p.ax[1].in == p.ax[1].out && p.ax[2].in == p.ax[2].out;
  const int dims = int(!p.ax[0].unit) + int(!p.ax[1].unit) + 1;
  bool on = false;
  switch (p.method) {
    case Method::nearest: on = backward || dims == 2; break;
    case Method::linear: on = true; break;
    case Method::cubic: on = backward && cubic_copies; break;
    case Method::aa_linear:
    case Method::aa_cubic: on = !backward; break;
    default: break;
  }
  for (Axis& a : p.ax) a.shortcut = on;
}

i64 checked_count(i64 batch, i64 channels, const i64 (&sizes)[kAxes], const std::string& what) {
  i64 n = 0;
  bool overflow = __builtin_mul_overflow(batch, channels, &n);
  for (int a = 0; a < kAxes; ++a) overflow = overflow || __builtin_mul_overflow(n, sizes[a], &n);
  if (overflow) fail(ErrorKind::value, what + " overflows int64");
  return n;
}

Problem problem_for(const InterpolateOptions& o, const Tensor& x, const std::string& op, const std::string& name) {
  check_input(x, o.layout, op + ": " + name);
  check_mode_options(o, x, op, name);
  Problem p;
  p.method = method_of(o);
  p.batch = x.shape[0];
  p.channels = x.shape[channel_axis(x.rank, o.layout)];
  read_axes(o, x, op, p);
  const i64 out[kAxes] = {p.ax[0].out, p.ax[1].out, p.ax[2].out};
  checked_count(p.batch, p.channels, out, op + ": the number of output elements");
  return p;
}

// t: the resampled tensor (y or dy) of input x: x's dtype and device, output_shape's shape.
void check_resampled(const Tensor& t, const Tensor& x, const Problem& p, PoolLayout layout, const std::string& name,
                     const std::string& what) {
  core::expect_same_device(t, x, name, what);
  core::expect_dtype_of(t, x, name, what);
  const InterpolateShape shape = output_shape(x, p, layout);
  bool same = t.rank == shape.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == shape.dims[d];
  if (!same) {
    Tensor expected = x;
    for (int d = 0; d < shape.rank; ++d) expected.shape[d] = shape.dims[d];
    fail(ErrorKind::shape, name + ": expected shape " + expected.shape_str() + " (" + what + " resampled), got " +
                               t.shape_str());
  }
}

// An output: its data present, its elements distinct, apart from the input.
void check_output(const Tensor& t, const std::string& name, const Tensor& input, const std::string& input_name) {
  core::expect_data(t, name);
  core::expect_outputs_apart({{t, name}}, {{input, input_name}});
}

}  // namespace

InterpolateShape output_shape(const Tensor& x, const Problem& p, PoolLayout layout) {
  InterpolateShape s;
  s.rank = x.rank;
  for (int d = 0; d < x.rank; ++d) s.dims[d] = x.shape[d];
  const int dims = x.rank - 2;
  for (int i = 0; i < dims; ++i) s.dims[spatial_axis(i, layout)] = p.ax[kAxes - dims + i].out;
  return s;
}

Problem validate_forward(const InterpolateArgs& a, bool check_outputs) {
  const std::string op = "interpolate";
  Problem p = problem_for(a.options, a.x, op, "x");
  set_shortcuts(p, false);
  const int dims = a.x.rank - 2;
  p.src = strides_of(a.x, dims, a.options.layout);
  if (check_outputs) {
    check_resampled(a.y, a.x, p, a.options.layout, op + ": y", "x");
    check_output(a.y, op + ": y", a.x, op + ": x");
    p.dst = strides_of(a.y, dims, a.options.layout);
    p.channels_last = p.channels > 1 && p.dst.c == 1;
  }
  return p;
}

Problem validate_backward(const InterpolateBackwardArgs& a) {
  const std::string op = "interpolate_backward";
  core::expect_float(a.dy, op + ": dy");
  // dx carries x_shape; its dtype must be dy's.
  Problem p = problem_for(a.options, a.dx, op, "x_shape");
  set_shortcuts(p, true);
  check_resampled(a.dy, a.dx, p, a.options.layout, op + ": dy", "x_shape");
  check_output(a.dx, op + ": dx", a.dy, op + ": dy");
  const int dims = a.dx.rank - 2;
  p.src = strides_of(a.dy, dims, a.options.layout);
  p.dst = strides_of(a.dx, dims, a.options.layout);
  p.channels_last = p.channels > 1 && p.dst.c == 1;
  return p;
}

}  // namespace rudnn::interp
