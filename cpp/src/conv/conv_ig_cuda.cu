// Runs an implicit-GEMM plan (implicit_gemm.hpp): tensors that are not packed channels-last
// are copied into the caller's workspace in packed NDHWC order (and the output back into the
// caller's layout afterwards), then the sm80 or sm90 kernel runs on packed operands.
//
// The copies move elements as bits (16-bit for f16/bf16, 32-bit for the TF32 plans of f32): one
// thread per element, in the packed tensor's order, so that the packed side is coalesced; the strided side
// reads or writes through the caller's strides (for NCHW that is the transposed order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "conv/implicit_gemm.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"

namespace rudnn::conv::ig {

namespace {

constexpr int kThreads = 256;

// The shape of one tensor as (lead, channels, *sizes): activations (n, c, d, h, w), weights
// (cout, cin, kd, kh, kw), the bias (1, cout, 1, 1, 1).
struct Grid {
  i64 lead = 1, channels = 1;
  i64 sizes[kAxes] = {1, 1, 1};
  i64 count() const { return lead * channels * sizes[0] * sizes[1] * sizes[2]; }
};

// to_packed: packed[t] = strided[offset(t)]; otherwise strided[offset(t)] = packed[t].
template <class Bits>
__global__ void repack_kernel(const Bits* from, Bits* to, Strides strided, Grid grid, bool to_packed) {
  const i64 total = grid.lead * grid.channels * grid.sizes[0] * grid.sizes[1] * grid.sizes[2];
  for (i64 t = i64(blockIdx.x) * kThreads + threadIdx.x; t < total; t += i64(gridDim.x) * kThreads) {
    const Decoded e = decode(t, grid.channels, grid.sizes, true);
    const i64 at = strided.offset(e.n, e.c, e.pos);
    if (to_packed)
      to[t] = from[at];
    else
      to[at] = from[t];
  }
}

// (tests/emulation/conv_emu.cpp runs everything above this line on the CPU.)

void repack(const void* from, void* to, const Strides& strided, const Grid& grid, bool to_packed, DType dtype,
            Stream stream) {
  const i64 total = grid.count();
  if (total == 0) return;
  const i64 max_blocks = i64(core::device_props(core::current_device()).sm_count) * 8;
  const int blocks = int(std::max<i64>(1, std::min<i64>((total + kThreads - 1) / kThreads, max_blocks)));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::f32)
    repack_kernel<std::uint32_t><<<blocks, kThreads, 0, s>>>(static_cast<const std::uint32_t*>(from),
                                                             static_cast<std::uint32_t*>(to), strided, grid, to_packed);
  else
    repack_kernel<std::uint16_t><<<blocks, kThreads, 0, s>>>(static_cast<const std::uint16_t*>(from),
                                                             static_cast<std::uint16_t*>(to), strided, grid, to_packed);
  RUDNN_CUDA_CHECK_LAUNCH(repack_kernel);
}

Grid activation(i64 batch, i64 channels, const i64 (&sizes)[kAxes]) {
  Grid g;
  g.lead = batch;
  g.channels = channels;
  for (int a = 0; a < kAxes; ++a) g.sizes[a] = sizes[a];
  return g;
}

}  // namespace

bool run(const Plan& plan, const Problem& p, Op op, DType dtype, const Operands& t, void* workspace, int device,
         Stream stream, std::string* why) {
  char* ws = static_cast<char*>(workspace);
  const Geometry& g = p.g;
  const Grid x_grid = activation(g.batch, g.in_channels, g.in), y_grid = activation(g.batch, g.out_channels, g.out);
  const Grid w_grid = activation(g.out_channels, g.in_channels, g.kernel);
  // An operand read by the kernel: in place, or packed into the workspace first.
  auto input = [&](bool copy, std::size_t at, const void* data, const Strides& s, const Grid& grid) -> const void* {
    if (!copy) return data;
    repack(data, ws + at, s, grid, true, dtype, stream);
    return ws + at;
  };
  Call c;
  c.s = plan.shape;
  c.dtype = dtype;
  c.device = device;
  c.stream = stream;
  const Strides* out_strides = nullptr;
  const Grid* out_grid = nullptr;
  bool copy_out = false;
  std::size_t out_at = 0;
  switch (op) {
    case Op::forward:
      c.a = input(plan.copy_x, plan.x_at, t.x, p.x, x_grid);
      c.b = input(plan.copy_w, plan.w_at, t.w, p.w, w_grid);
      if (t.bias) {
        Strides bias_strides;
        bias_strides.c = p.bias_stride;
        Grid bias_grid;
        bias_grid.channels = g.out_channels;
        c.bias = input(plan.copy_bias, plan.bias_at, t.bias, bias_strides, bias_grid);
      }
      copy_out = plan.copy_y, out_at = plan.y_at, out_strides = &p.y, out_grid = &y_grid;
      break;
    case Op::data_backward:
      c.a = input(plan.copy_y, plan.y_at, t.y, p.y, y_grid);
      c.b = input(plan.copy_w, plan.w_at, t.w, p.w, w_grid);
      copy_out = plan.copy_x, out_at = plan.x_at, out_strides = &p.x, out_grid = &x_grid;
      break;
    default:  // weight_backward
      c.a = input(plan.copy_y, plan.y_at, t.y, p.y, y_grid);
      c.b = input(plan.copy_x, plan.x_at, t.x, p.x, x_grid);
      copy_out = plan.copy_w, out_at = plan.w_at, out_strides = &p.w, out_grid = &w_grid;
      break;
  }
  c.d = copy_out ? static_cast<void*>(ws + out_at) : t.out;
  const bool sm90 = plan.kernel == Kernel::sm90;
  bool ran = false;
  switch (op) {
    case Op::forward: ran = sm90 ? fprop_sm90(c, why) : fprop_sm80(c, why); break;
    case Op::data_backward: ran = sm90 ? dgrad_sm90(c, why) : dgrad_sm80(c, why); break;
    default: ran = sm90 ? wgrad_sm90(c, why) : wgrad_sm80(c, why); break;
  }
  if (ran && copy_out) repack(ws + out_at, t.out, *out_strides, *out_grid, false, dtype, stream);
  return ran;
}

}  // namespace rudnn::conv::ig
