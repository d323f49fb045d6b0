// Host emulator of the pooling CUDA kernels (tests/test_pooling_emulation.py builds and runs it).
// The kernels' own source (cpp/src/pooling/pooling_cuda.cu up to its launch code, extracted by
// the test into kernels.inc) runs on the CPU through emu_runtime.hpp, a std::thread per CUDA
// thread, on a small grid so that the grid-stride loops wrap. Each case runs the forward and
// the backward kernels on the path the CUDA backend would pick (vector or scalar) and compares
// them bitwise with the CPU backend (which tests/test_pooling.py checks against torch): the
// thread-to-element mapping, the 16-byte packs of channels, int32/int64 indices and the path
// selection are the real code. Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "pooling/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "pooling/cpu.cpp"
#include "pooling/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"
#include "pooling/lanes.cuh"

// namespace rudnn::pooling { namespace emu_k { ...the kernels of pooling_cuda.cu... } }
#include "kernels.inc"

#include "emu_arrays.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::pooling;

constexpr unsigned kEmuBlocks = 3;  // fewer blocks than elements: every thread loops

using emu::Array;
using emu::dims_of;
using emu::make;
using emu::same_bytes;

enum class Op { max, avg, adaptive_avg, adaptive_max };

struct Case {
  const char* name;
  Op op;
  DType dtype;
  PoolLayout layout;
  std::vector<i64> shape;
  PoolWindow window;
  AvgPoolDivisor divisor;
  std::vector<i64> output_size;  // adaptive
  DType index_dtype = DType::i64;
};

PoolWindow window(int dims, std::vector<i64> k, std::vector<i64> s, std::vector<i64> p, std::vector<i64> d,
                  bool ceil) {
  PoolWindow w;
  w.dims = dims;
  for (int i = 0; i < dims; ++i) {
    w.kernel[i] = k[i];
    w.stride[i] = s[i];
    w.padding[i] = p[i];
    w.dilation[i] = d[i];
  }
  w.ceil_mode = ceil;
  return w;
}

template <class F>
decltype(auto) device_types(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

template <class T, bool Max, int L>
void emu_forward(const ForwardProblem& p, const Tensor& x, const Tensor& y, const IndexArray& indices) {
  const i64 total = p.outputs() / L;
  emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
    emu_k::pool_forward_kernel<T, Max, L>(p, emu_k::forward_decoder<L>(p), x.ptr<T>(), y.ptr<T>(), indices, total);
  });
}

template <class T, bool Max, int L>
void emu_backward(const BackwardProblem& p, const Tensor& dy, const IndexArray& indices, const Tensor& dx) {
  const i64 total = p.inputs() / L;
  emu_launch(EmuDim3{kEmuBlocks, 1, 1}, emu_k::kThreads, 1, 0, [&] {
    emu_k::pool_backward_kernel<T, Max, L>(p, emu_k::backward_decoder<L>(p), dy.ptr<T>(), indices, dx.ptr<T>(),
                                           total);
  });
}

// Runs the forward kernel the CUDA backend would pick; returns whether it took the vector path.
bool run_forward_kernel(const ForwardProblem& p, const Tensor& x, const Tensor& y, const Tensor* indices) {
  return device_types(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int L = kVecLanes<T>;
    const IndexArray idx{indices ? indices->data : nullptr, p.indices_i32};
    const bool vector = emu_k::forward_vector_path<T>(p, x.data, y.data, idx);
    if (p.g.max) vector ? emu_forward<T, true, L>(p, x, y, idx) : emu_forward<T, true, 1>(p, x, y, idx);
    else vector ? emu_forward<T, false, L>(p, x, y, idx) : emu_forward<T, false, 1>(p, x, y, idx);
    return vector;
  });
}

bool run_backward_kernel(const BackwardProblem& p, const Tensor& dy, const Tensor* indices, const Tensor& dx) {
  return device_types(dx.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int L = kVecLanes<T>;
    const IndexArray idx{indices ? indices->data : nullptr, p.indices_i32};
    const bool vector = emu_k::backward_vector_path<T>(p, dy.data, dx.data, idx);
    if (p.g.max) vector ? emu_backward<T, true, L>(p, dy, idx, dx) : emu_backward<T, true, 1>(p, dy, idx, dx);
    else vector ? emu_backward<T, false, L>(p, dy, idx, dx) : emu_backward<T, false, 1>(p, dy, idx, dx);
    return vector;
  });
}

bool run_case(const Case& c) {
  const bool max = c.op == Op::max || c.op == Op::adaptive_max;
  const bool adaptive = c.op == Op::adaptive_avg || c.op == Op::adaptive_max;
  const int dims = adaptive ? int(c.output_size.size()) : c.window.dims;
  Array x = make(c.dtype, c.shape, 1);

  // The output shape and problem, from the C++ core's own validation.
  Tensor none;
  MaxPoolArgs max_args;
  AvgPoolArgs avg_args;
  AdaptivePoolArgs ad_args;
  PoolShape shape;
  if (adaptive) {
    ad_args.kind = max ? AdaptivePoolKind::max : AdaptivePoolKind::avg;
    ad_args.dims = dims;
    for (int i = 0; i < dims; ++i) ad_args.output_size[i] = c.output_size[i];
    ad_args.layout = c.layout;
    ad_args.x = x.t;
    shape = output_shape(x.t, validate_adaptive_pool(ad_args, false).g, dims, c.layout);
  } else if (max) {
    max_args = MaxPoolArgs{c.window, c.layout, x.t, none, nullptr};
    shape = output_shape(x.t, validate_max_pool(max_args, false).g, dims, c.layout);
  } else {
    avg_args = AvgPoolArgs{c.window, c.divisor, c.layout, x.t, none};
    shape = output_shape(x.t, validate_avg_pool(avg_args, false).g, dims, c.layout);
  }
  Array y_cpu = make(c.dtype, dims_of(shape), 0, false), y_emu = make(c.dtype, dims_of(shape), 0, false);
  Array i_cpu = make(c.index_dtype, dims_of(shape), 0, false), i_emu = make(c.index_dtype, dims_of(shape), 0, false);
  auto forward_problem = [&](const Tensor& y, const Tensor* indices) {
    if (adaptive) {
      ad_args.y = y;
      ad_args.indices = indices;
      return validate_adaptive_pool(ad_args);
    }
    if (max) {
      max_args.y = y;
      max_args.indices = indices;
      return validate_max_pool(max_args);
    }
    avg_args.y = y;
    return validate_avg_pool(avg_args);
  };
  const ForwardProblem fp = forward_problem(y_cpu.t, max ? &i_cpu.t : nullptr);
  forward_cpu(fp, x.t, y_cpu.t, max ? &i_cpu.t : nullptr);
  const ForwardProblem fp_emu = forward_problem(y_emu.t, max ? &i_emu.t : nullptr);
  const bool fwd_vector = run_forward_kernel(fp_emu, x.t, y_emu.t, max ? &i_emu.t : nullptr);
  bool ok = same_bytes(y_cpu.t, y_emu.t) && (!max || same_bytes(i_cpu.t, i_emu.t));

  // Backward from a random dy (and the forward's indices).
  Array dy = make(c.dtype, dims_of(shape), 2);
  Array dx_cpu = make(c.dtype, dims_of(x.t), 0, false), dx_emu = make(c.dtype, dims_of(x.t), 0, false);
  auto backward_problem = [&](const Tensor& dx) {
    if (adaptive) {
      AdaptivePoolBackwardArgs a;
      a.kind = ad_args.kind;
      a.dims = dims;
      a.layout = c.layout;
      a.dy = dy.t;
      a.x = max ? &x.t : nullptr;
      a.indices = max ? &i_cpu.t : nullptr;
      a.dx = dx;
      return validate_adaptive_pool_backward(a);
    }
    if (max) return validate_max_pool_backward(MaxPoolBackwardArgs{c.window, c.layout, dy.t, x.t, i_cpu.t, dx});
    return validate_avg_pool_backward(AvgPoolBackwardArgs{c.window, c.divisor, c.layout, dy.t, dx});
  };
  const BackwardProblem bp = backward_problem(dx_cpu.t);
  backward_cpu(bp, dy.t, max ? &i_cpu.t : nullptr, dx_cpu.t);
  const bool bwd_vector = run_backward_kernel(backward_problem(dx_emu.t), dy.t, max ? &i_cpu.t : nullptr, dx_emu.t);
  ok = ok && same_bytes(dx_cpu.t, dx_emu.t);
  std::printf("%s forward=%s backward=%s %s\n", c.name, fwd_vector ? "vector" : "scalar",
              bwd_vector ? "vector" : "scalar", ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  const auto cf = PoolLayout::channels_first, cl = PoolLayout::channels_last;
  AvgPoolDivisor incl, excl, by5;
  excl.count_include_pad = false;
  by5.has_divisor_override = true;
  by5.divisor_override = 5;
  std::vector<Case> cases = {
      {"max2d_nchw_f32", Op::max, DType::f32, cf, {2, 3, 9, 8}, window(2, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true), incl, {}},
      {"max2d_nhwc_bf16_c16", Op::max, DType::bf16, cl, {2, 7, 6, 16},
       window(2, {3, 2}, {2, 1}, {1, 1}, {1, 2}, false), incl, {}},
      {"max2d_nhwc_f32_c8_int32", Op::max, DType::f32, cl, {1, 5, 7, 8},
       window(2, {2, 3}, {1, 2}, {1, 1}, {2, 1}, true), incl, {}, DType::i32},
      {"max1d_nhwc_f16_c3", Op::max, DType::f16, cl, {2, 11, 3}, window(1, {3}, {2}, {1}, {2}, true), incl, {}},
      {"avg3d_nhwc_f16_c8_excl", Op::avg, DType::f16, cl, {1, 4, 5, 6, 8},
       window(3, {2, 3, 2}, {1, 2, 2}, {1, 1, 0}, {1, 1, 1}, true), excl, {}},
      {"avg2d_nhwc_bf16_c3", Op::avg, DType::bf16, cl, {2, 6, 7, 3}, window(2, {3, 3}, {2, 1}, {1, 1}, {1, 1}, false),
       incl, {}},
      {"avg1d_nchw_bf16_div5", Op::avg, DType::bf16, cf, {2, 3, 13}, window(1, {4}, {3}, {2}, {1}, true), by5, {}},
      {"adaptive_avg2d_nhwc_f32_c4", Op::adaptive_avg, DType::f32, cl, {2, 7, 9, 4}, PoolWindow{}, incl, {3, 4}},
      {"adaptive_avg3d_nchw_f16", Op::adaptive_avg, DType::f16, cf, {1, 2, 5, 6, 7}, PoolWindow{}, incl, {2, 3, 9}},
      {"adaptive_max3d_nchw_f32", Op::adaptive_max, DType::f32, cf, {1, 3, 5, 6, 5}, PoolWindow{}, incl, {2, 3, 2}},
      {"adaptive_max2d_nhwc_bf16_c8_int32", Op::adaptive_max, DType::bf16, cl, {2, 9, 7, 8}, PoolWindow{}, incl,
       {4, 3}, DType::i32},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
