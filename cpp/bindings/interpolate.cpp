// Bindings of interpolate (rudnn._C.interpolate_*); option codes as interpolate_args.hpp says.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "families.hpp"
#include "interpolate_args.hpp"
#include "rudnn/interpolate.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

using Sizes = std::vector<std::int64_t>;
using Scales = std::vector<double>;

InterpolateOptions options(int mode, int layout, const Sizes& size, const Scales& scale_factor, int align_corners,
                           int recompute_scale_factor, bool antialias) {
  return interpolate_args::options(mode, layout, size, scale_factor, align_corners, recompute_scale_factor,
                                   antialias);
}

}  // namespace

void register_interpolate(nb::module_& m) {
  m.def(
      "interpolate_output_shape",
      [](const In& x, int mode, int layout, const Sizes& size, const Scales& scale_factor, int align_corners,
         int recompute_scale_factor, bool antialias) {
        InterpolateArgs a;
        a.options = options(mode, layout, size, scale_factor, align_corners, recompute_scale_factor, antialias);
        a.x = to_tensor(x, "x");
        const InterpolateShape s = interpolate_output_shape(a);
        nb::list out;
        for (int d = 0; d < s.rank; ++d) out.append(s.dims[d]);
        return nb::tuple(out);
      },
      nb::arg("x"), nb::arg("mode"), nb::arg("layout"), nb::arg("size"), nb::arg("scale_factor"),
      nb::arg("align_corners"), nb::arg("recompute_scale_factor"), nb::arg("antialias"));

  m.def(
      "interpolate_forward",
      [](const In& x, const Out& y, int mode, int layout, const Sizes& size, const Scales& scale_factor,
         int align_corners, int recompute_scale_factor, bool antialias, std::uintptr_t stream) {
        InterpolateArgs a;
        a.options = options(mode, layout, size, scale_factor, align_corners, recompute_scale_factor, antialias);
        a.x = to_tensor(x, "x");
        a.y = to_tensor(y, "y");
        nb::gil_scoped_release release;
        interpolate_forward(a, as_stream(stream));
      },
      nb::arg("x"), nb::arg("y"), nb::arg("mode"), nb::arg("layout"), nb::arg("size"), nb::arg("scale_factor"),
      nb::arg("align_corners"), nb::arg("recompute_scale_factor"), nb::arg("antialias"), nb::arg("stream"));

  m.def(
      "interpolate_backward",
      [](const In& dy, const Out& dx, int mode, int layout, const Sizes& size, const Scales& scale_factor,
         int align_corners, int recompute_scale_factor, bool antialias, std::uintptr_t stream) {
        InterpolateBackwardArgs a;
        a.options = options(mode, layout, size, scale_factor, align_corners, recompute_scale_factor, antialias);
        a.dy = to_tensor(dy, "dy");
        a.dx = to_tensor(dx, "dx");
        nb::gil_scoped_release release;
        interpolate_backward(a, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("dx"), nb::arg("mode"), nb::arg("layout"), nb::arg("size"), nb::arg("scale_factor"),
      nb::arg("align_corners"), nb::arg("recompute_scale_factor"), nb::arg("antialias"), nb::arg("stream"));
}

}  // namespace rudnn::bindings
