// Every check of grid_sample and grid_sample_backward, run once before either backend, in
// torch's order of concerns (check_grid_sampler_common / _2d / _3d): the input, the grid against
// it, the mode and padding, then the outputs. Sizes are checked for int64 overflow.
#include <cstdint>
#include <string>

#include "core/aliasing.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"
#include "grid_sample/problem.hpp"

namespace rudnn::gs {

using core::fail;

namespace {

std::string axes_str(int dims, PoolLayout layout) {
  const char* sp = dims == 2 ? "H, W" : "D, H, W";
  return layout == PoolLayout::channels_first ? std::string("[N, C, ") + sp + "]" : std::string("[N, ") + sp + ", C]";
}

int channel_axis(int rank, PoolLayout layout) { return layout == PoolLayout::channels_first ? 1 : rank - 1; }
int spatial_axis(int i, PoolLayout layout) { return layout == PoolLayout::channels_first ? 2 + i : 1 + i; }

Strides strides_of(const Tensor& t, int dims, PoolLayout layout) {
  Strides s;
  s.n = t.strides[0];
  s.c = t.strides[channel_axis(t.rank, layout)];
  for (int i = 0; i < dims; ++i) s.sp[kAxes - dims + i] = t.strides[spatial_axis(i, layout)];
  return s;
}

GridStrides grid_strides_of(const Tensor& g, int dims) {
  GridStrides s;
  s.n = g.strides[0];
  for (int i = 0; i < dims; ++i) s.sp[kAxes - dims + i] = g.strides[1 + i];
  s.k = g.strides[g.rank - 1];
  return s;
}

i64 checked_product(const Tensor& t, const std::string& what) {
  i64 n = 1;
  for (int d = 0; d < t.rank; ++d)
    if (__builtin_mul_overflow(n, t.shape[d], &n)) fail(ErrorKind::value, what + " overflows int64");
  return n;
}

void check_mode(const GridSampleOptions& o, const std::string& op) {
  if (int(o.mode) < int(GridSampleMode::bilinear) || int(o.mode) > int(GridSampleMode::bicubic))
    fail(ErrorKind::value, op + ": mode: unknown mode code " + std::to_string(int(o.mode)));
  if (int(o.padding_mode) < int(GridSamplePadding::zeros) || int(o.padding_mode) > int(GridSamplePadding::reflection))
    fail(ErrorKind::value, op + ": padding_mode: unknown padding code " + std::to_string(int(o.padding_mode)));
  if (int(o.layout) != int(PoolLayout::channels_first) && int(o.layout) != int(PoolLayout::channels_last))
    fail(ErrorKind::value, op + ": layout: unknown layout code " + std::to_string(int(o.layout)));
}

// x and grid (torch's checks), then the mode against x's rank.
Problem problem_for(const GridSampleOptions& o, const Tensor& x, const Tensor& grid, const std::string& op) {
  check_mode(o, op);
  core::expect_float(x, op + ": x");
  if (x.rank != 4 && x.rank != 5)
    fail(ErrorKind::shape, op + ": x: expected 4 or 5 axes (" + axes_str(2, o.layout) + " or " + axes_str(3, o.layout) +
                               "), got shape " + x.shape_str());
  const int dims = x.rank - 2;
  for (int i = 0; i < dims; ++i)
    if (x.shape[spatial_axis(i, o.layout)] < 1)
      fail(ErrorKind::shape, op + ": x: expected non-empty spatial axes, got shape " + x.shape_str() + " (layout " +
                                 axes_str(dims, o.layout) + ")");
  core::expect_same_device(grid, x, op + ": grid", "x");
  core::expect_dtype_of(grid, x, op + ": grid", "x");
  const std::string want = dims == 2 ? "[N, H_out, W_out, 2]" : "[N, D_out, H_out, W_out, 3]";
  if (grid.rank != x.rank || grid.shape[0] != x.shape[0] || grid.shape[grid.rank - 1] != dims)
    fail(ErrorKind::shape, op + ": grid: expected shape " + want + " with N = " + std::to_string(x.shape[0]) +
                               " (x of shape " + x.shape_str() + "), got " + grid.shape_str());
  if (o.mode == GridSampleMode::bicubic && dims != 2)
    fail(ErrorKind::shape, op + ": mode: 'bicubic' takes 4-D input " + axes_str(2, o.layout) + ", got x of shape " +
                               x.shape_str());
  checked_product(x, op + ": the number of elements of x");
  checked_product(grid, op + ": the number of elements of grid");
  Problem p;
  p.mode = o.mode;
  p.padding = o.padding_mode;
  p.align_corners = o.align_corners;
  p.dims = dims;
  p.batch = x.shape[0];
  p.channels = x.shape[channel_axis(x.rank, o.layout)];
  for (int i = 0; i < dims; ++i) {
    p.in[kAxes - dims + i] = x.shape[spatial_axis(i, o.layout)];
    p.out[kAxes - dims + i] = grid.shape[1 + i];
  }
  i64 count = 0;
  bool overflow = __builtin_mul_overflow(p.batch, p.channels, &count);
  overflow = overflow || __builtin_mul_overflow(count, p.out_plane(), &count);
  if (overflow) fail(ErrorKind::value, op + ": the number of output elements overflows int64");
  p.x = strides_of(x, dims, o.layout);
  p.grid = grid_strides_of(grid, dims);
  p.channels_last = p.channels > 1 && p.x.c == 1;
  return p;
}

// t: a tensor of `shape`, x's dtype and device.
void check_like(const Tensor& t, const Tensor& x, const GridSampleShape& shape, const std::string& name,
                const std::string& what) {
  core::expect_same_device(t, x, name, "x");
  core::expect_dtype_of(t, x, name, "x");
  bool same = t.rank == shape.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == shape.dims[d];
  if (!same) {
    Tensor expected = x;
    expected.rank = shape.rank;
    for (int d = 0; d < shape.rank; ++d) expected.shape[d] = shape.dims[d];
    fail(ErrorKind::shape, name + ": expected shape " + expected.shape_str() + " (" + what + "), got " + t.shape_str());
  }
}

GridSampleShape shape_of(const Tensor& t) {
  GridSampleShape s;
  s.rank = t.rank;
  for (int d = 0; d < t.rank; ++d) s.dims[d] = t.shape[d];
  return s;
}


}  // namespace

GridSampleShape output_shape(const Tensor& x, const Problem& p, PoolLayout layout) {
  GridSampleShape s;
  s.rank = x.rank;
  for (int d = 0; d < x.rank; ++d) s.dims[d] = x.shape[d];
  for (int i = 0; i < p.dims; ++i) s.dims[spatial_axis(i, layout)] = p.out[kAxes - p.dims + i];
  return s;
}

i64 workspace_elements(const Problem& p, bool want_dx, bool on_cuda) {
  return want_dx && on_cuda ? p.batch * p.channels * p.in_plane() : 0;
}

Problem validate_forward(const GridSampleArgs& a, bool check_outputs) {
  const std::string op = "grid_sample";
  Problem p = problem_for(a.options, a.x, a.grid, op);
  if (check_outputs) {
    check_like(a.y, a.x, output_shape(a.x, p, a.options.layout), op + ": y", "x sampled at the grid");
    core::expect_data(a.y, op + ": y");
    core::expect_outputs_apart({{a.y, op + ": y"}}, {{a.x, op + ": x"}, {a.grid, op + ": grid"}});
    p.y = strides_of(a.y, p.dims, a.options.layout);
  }
  return p;
}

Problem validate_backward(const GridSampleBackwardArgs& a, bool check_outputs) {
  const std::string op = "grid_sample_backward";
  Problem p = problem_for(a.options, a.x, a.grid, op);
  check_like(a.dy, a.x, output_shape(a.x, p, a.options.layout), op + ": dy", "y's shape: x sampled at the grid");
  p.y = strides_of(a.dy, p.dims, a.options.layout);
  if (!check_outputs) return p;
  if (a.dx) {
    check_like(*a.dx, a.x, shape_of(a.x), op + ": dx", "x's shape");
    core::expect_data(*a.dx, op + ": dx");
  }
  if (a.dgrid) {
    check_like(*a.dgrid, a.x, shape_of(a.grid), op + ": dgrid", "grid's shape");
    core::expect_data(*a.dgrid, op + ": dgrid");
    p.dgrid = grid_strides_of(*a.dgrid, p.dims);
  }
  const bool cuda = a.x.device.is_cuda();
  const i64 ws = workspace_elements(p, a.dx != nullptr, cuda);
  if (cuda)
    core::expect_workspace(a.workspace, a.x, "x", std::size_t(ws) * sizeof(float), op, alignof(float), "float32 sums");
  const Tensor* workspace = cuda && ws > 0 ? a.workspace : nullptr;  // the CPU never touches one
  core::expect_outputs_apart({{a.dx, op + ": dx"}, {a.dgrid, op + ": dgrid"}, {workspace, op + ": workspace"}},
                             {{a.dy, op + ": dy"}, {a.x, op + ": x"}, {a.grid, op + ": grid"}});
  if (a.dx) {
    p.dx = strides_of(*a.dx, p.dims, a.options.layout);
    // The workspace: dense float32 (n, d, h, w, c), channels innermost whatever x's layout: the
    // plane owners of the deterministic path (adjacent channels) then read and write it coalesced.
    p.ws.c = 1;
    p.ws.sp[2] = p.channels;
    p.ws.sp[1] = p.channels * p.in[2];
    p.ws.sp[0] = p.channels * p.in[2] * p.in[1];
    p.ws.n = p.channels * p.in_plane();
  }
  return p;
}

}  // namespace rudnn::gs
