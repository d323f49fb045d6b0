// Bindings of grid_sample (rudnn._C.grid_sample_*); option codes as grid_sample_args.hpp says.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "families.hpp"
#include "grid_sample_args.hpp"
#include "rudnn/grid_sample.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

using grid_sample_args::options;

struct Backward {
  GridSampleBackwardArgs a;
  std::optional<Tensor> dx, dgrid, workspace;
  std::optional<Out> held;  // a workspace allocated through workspace_alloc
};

void fill(Backward& b, const In& dy, const In& x, const In& grid, const OptOut& dx, const OptOut& dgrid,
          const OptOut& workspace, const nb::object& workspace_alloc, int mode, int padding_mode, bool align_corners,
          int layout, bool deterministic) {
  b.a.options = options(mode, padding_mode, align_corners, layout);
  b.a.deterministic = deterministic;
  b.a.dy = to_tensor(dy, "dy");
  b.a.x = to_tensor(x, "x");
  b.a.grid = to_tensor(grid, "grid");
  b.a.dx = opt_tensor(dx, "dx", b.dx);
  b.a.dgrid = opt_tensor(dgrid, "dgrid", b.dgrid);
  b.a.workspace = workspace_from(workspace, workspace_alloc, [&] { return grid_sample_backward_workspace_bytes(b.a); },
                                 b.held, b.workspace);
}

}  // namespace

void register_grid_sample(nb::module_& m) {
  m.def(
      "grid_sample_output_shape",
      [](const In& x, const In& grid, int mode, int padding_mode, bool align_corners, int layout) {
        GridSampleArgs a;
        a.options = options(mode, padding_mode, align_corners, layout);
        a.x = to_tensor(x, "x");
        a.grid = to_tensor(grid, "grid");
        const GridSampleShape s = grid_sample_output_shape(a);
        nb::list out;
        for (int d = 0; d < s.rank; ++d) out.append(s.dims[d]);
        return nb::tuple(out);
      },
      nb::arg("x"), nb::arg("grid"), nb::arg("mode"), nb::arg("padding_mode"), nb::arg("align_corners"),
      nb::arg("layout"));

  m.def(
      "grid_sample_forward",
      [](const In& x, const In& grid, const Out& y, int mode, int padding_mode, bool align_corners, int layout,
         std::uintptr_t stream) {
        GridSampleArgs a;
        a.options = options(mode, padding_mode, align_corners, layout);
        a.x = to_tensor(x, "x");
        a.grid = to_tensor(grid, "grid");
        a.y = to_tensor(y, "y");
        nb::gil_scoped_release release;
        grid_sample_forward(a, as_stream(stream));
      },
      nb::arg("x"), nb::arg("grid"), nb::arg("y"), nb::arg("mode"), nb::arg("padding_mode"),
      nb::arg("align_corners"), nb::arg("layout"), nb::arg("stream"));

  m.def(
      "grid_sample_backward_workspace_bytes",
      [](const In& dy, const In& x, const In& grid, bool want_dx, int mode, int padding_mode, bool align_corners,
         int layout) {
        GridSampleBackwardArgs a;
        a.options = options(mode, padding_mode, align_corners, layout);
        a.dy = to_tensor(dy, "dy");
        a.x = to_tensor(x, "x");
        a.grid = to_tensor(grid, "grid");
        Tensor stand_in = a.x;  // only its presence is read
        a.dx = want_dx ? &stand_in : nullptr;
        return grid_sample_backward_workspace_bytes(a);
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("grid"), nb::arg("want_dx"), nb::arg("mode"), nb::arg("padding_mode"),
      nb::arg("align_corners"), nb::arg("layout"));

  m.def(
      "grid_sample_backward",
      [](const In& dy, const In& x, const In& grid, const OptOut& dx, const OptOut& dgrid, const OptOut& workspace,
         int mode, int padding_mode, bool align_corners, int layout, bool deterministic, std::uintptr_t stream,
         const nb::object& workspace_alloc) {
        Backward b;
        fill(b, dy, x, grid, dx, dgrid, workspace, workspace_alloc, mode, padding_mode, align_corners, layout,
             deterministic);
        nb::gil_scoped_release release;
        grid_sample_backward(b.a, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("grid"), nb::arg("dx").none(), nb::arg("dgrid").none(),
      nb::arg("workspace").none(), nb::arg("mode"), nb::arg("padding_mode"), nb::arg("align_corners"),
      nb::arg("layout"), nb::arg("deterministic"), nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());
}

}  // namespace rudnn::bindings
