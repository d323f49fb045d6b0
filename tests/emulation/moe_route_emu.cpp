// Host emulator of the MoE routing CUDA kernels (tests/test_moe_emulation.py builds and runs it).
// The kernels' own source (the anonymous namespace of cpp/src/moe/route_cuda.cu, extracted by the
// test into kernels.inc) runs on the CPU through emu_runtime.hpp, a std::thread per CUDA thread,
// on the grid the CUDA backend launches (one block of kThreads per token): route_softmax_kernel,
// route_sigmoid_grouped_kernel, selected_router_kernel and selected_router_backward_kernel, each
// against the CPU backend (which tests/test_moe*.py check against the naive reference). The
// chosen experts must be the same ids in the same slots (the same keys, ties to the lower id);
// weights and dlogits agree within a rounding of their dtype relative to the row's largest
// magnitude (the kernels sum a row in a tree, the CPU in order; a row whose reference is all
// zeros, like the gradient of one renormalized slot, must be exactly zero); NaN where the CPU
// has NaN. Rows cover ties, NaN, +inf and all -inf logits, idle groups, repeated and invalid
// indices. Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"
#include "emu_vote.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "moe/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "moe/cpu.cpp"
#include "moe/validate.cpp"

#include "emu_keywords.hpp"

// cuda_common.cuh without its CUDA headers (already included above, before the macros).
#include "moe/cuda_common.cuh"

// The device helpers whose names the CPU backend (moe/cpu.cpp) also defines, named here so that
// the kernels' calls are not ambiguous.
namespace rudnn::moe::emu_k {
using cuda::kInf;
using cuda::kNaN;
using cuda::sigmoid;
using cuda::from_float;
using cuda::load_as_float;
using cuda::to_float;
using std::isnan;  // CUDA's device isnan
}  // namespace rudnn::moe::emu_k

// namespace rudnn::moe { namespace emu_k { using namespace cuda; ...route_cuda.cu's kernels... } }
#include "kernels.inc"

#include "emu_arrays.hpp"
#include "moe_emu_common.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::moe;
using i64 = std::int64_t;

using emu::device_types;

bool same_ids(const std::vector<std::uint32_t>& got, const std::vector<std::uint32_t>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      std::printf("  slot %zu: expert %u, the CPU backend %u\n", i, got[i], want[i]);
      return false;
    }
  return true;
}

void set_value(Tensor& t, i64 i, float v) {
  switch (t.dtype) {
    case DType::f32: t.ptr<float>()[i] = v; break;
    case DType::f16: t.ptr<host::f16>()[i] = host::from_float<host::f16>(v); break;
    default: t.ptr<host::bf16>()[i] = host::from_float<host::bf16>(v); break;
  }
}

// [T, E] logits `stride` apart (stride > E: padded rows), multiples of 1/64 (ties), with planted
// rows: 1 all equal, 2 a NaN, 3 a +inf, 4 all -inf, 5 some -inf.
emu::Array logits_of(DType dtype, i64 T, i64 E, i64 stride, std::uint32_t seed) {
  emu::Array a = emu::make(dtype, {T, stride}, seed);
  a.t.shape[1] = E;
  const float inf = __builtin_huge_valf();
  for (i64 e = 0; e < E; ++e) {
    if (T > 1) set_value(a.t, 1 * stride + e, 0.25f);
    if (T > 4) set_value(a.t, 4 * stride + e, -inf);
    if (T > 5 && e % 3 == 0) set_value(a.t, 5 * stride + e, -inf);
  }
  if (T > 2) set_value(a.t, 2 * stride + E / 2, std::nanf(""));
  if (T > 3) set_value(a.t, 3 * stride + E - 1, inf);
  return a;
}

bool report(const std::string& name, bool ok) {
  std::printf("%s %s\n", name.c_str(), ok ? "ok" : "MISMATCH");
  return ok;
}

bool run_softmax(DType dtype, i64 E, int k, bool renormalize) {
  const i64 T = 7, stride = E + 3;
  emu::Array logits = logits_of(dtype, T, E, stride, 11);
  std::vector<std::uint32_t> idx_cpu(T * k), idx_emu(T * k, 0xdeadbeefu);
  emu::Array w_cpu = emu::make(dtype, {T, k}, 0, false), w_emu = emu::make(dtype, {T, k}, 0, false);
  const i64 tk[2] = {T, k};
  MoeRouteArgs a;
  a.logits = logits.t;
  a.top_k = k;
  a.renormalize = renormalize;
  a.expert_indices = Tensor::contiguous(idx_cpu.data(), DType::u32, Device{}, tk, 2);
  a.weights = w_cpu.t;
  const RouteProblem p = validate_route(a);
  route_cpu(a, p);
  device_types(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    emu_launch(EmuDim3{unsigned(T), 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::route_softmax_kernel<D>(logits.t.ptr<D>(), p.logits_stride, p.experts, p.top_k, p.renormalize,
                                     idx_emu.data(), w_emu.t.ptr<D>());
    });
  });
  const bool ok = same_ids(idx_emu, idx_cpu) && emu::close_rows(w_emu.t, w_cpu.t, T, k, k, "weights");
  return report("softmax " + std::string(dtype_name(dtype)) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
                    (renormalize ? " renormalized" : ""),
                ok);
}

bool run_sigmoid_grouped(DType dtype, i64 E, int k, int groups, int selected_groups, bool top_two, bool with_bias,
                         bool renormalize, float scale) {
  const i64 T = 5, stride = E;
  emu::Array logits = logits_of(dtype, T, E, stride, 12);
  emu::Array bias = emu::make(DType::f32, {E}, 13, true, 1.0f / 8);
  std::vector<std::uint32_t> idx_cpu(T * k), idx_emu(T * k, 0xdeadbeefu);
  emu::Array w_cpu = emu::make(dtype, {T, k}, 0, false), w_emu = emu::make(dtype, {T, k}, 0, false);
  const i64 tk[2] = {T, k};
  MoeRouteSigmoidGroupedArgs a;
  a.logits = logits.t;
  a.bias = with_bias ? &bias.t : nullptr;
  a.top_k = k;
  a.groups = groups;
  a.selected_groups = selected_groups;
  a.group_top_two = top_two;
  a.renormalize = renormalize;
  a.scale = scale;
  a.expert_indices = Tensor::contiguous(idx_cpu.data(), DType::u32, Device{}, tk, 2);
  a.weights = w_cpu.t;
  const RouteProblem p = validate_route_sigmoid_grouped(a);
  route_sigmoid_grouped_cpu(a, p);
  device_types(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    emu_launch(EmuDim3{unsigned(T), 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::route_sigmoid_grouped_kernel<D>(logits.t.ptr<D>(), p.logits_stride,
                                             with_bias ? bias.t.ptr<float>() : nullptr, p.experts, p.top_k, p.groups,
                                             p.selected_groups, p.group_top_two, p.renormalize, p.scale,
                                             idx_emu.data(), w_emu.t.ptr<D>());
    });
  });
  const bool ok = same_ids(idx_emu, idx_cpu) && emu::close_rows(w_emu.t, w_cpu.t, T, k, k, "weights");
  return report("sigmoid_grouped " + std::string(dtype_name(dtype)) + " E=" + std::to_string(E) + " k=" +
                    std::to_string(k) + " groups=" + std::to_string(selected_groups) + "/" + std::to_string(groups) +
                    (top_two ? " top_two" : "") + (with_bias ? " bias" : ""),
                ok);
}

// Indices of selected_router(_backward): row 0 distinct ids, row 1 a repeated id, row 2 an id
// outside [0, E) (NaN row), the rest drawn; stride k + 1.
template <class Idx>
std::vector<Idx> selection_of(i64 T, int k, i64 E) {
  std::vector<Idx> ids(std::size_t(T * (k + 1)), Idx(0));
  std::uint32_t state = 7;
  for (i64 t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      state = state * 1664525u + 1013904223u;
      ids[std::size_t(t * (k + 1) + j)] = Idx(t == 0 ? (j * 5) % E : (state >> 8) % std::uint32_t(E));
    }
  if (T > 1 && k > 1) ids[std::size_t(1 * (k + 1) + k - 1)] = ids[std::size_t(1 * (k + 1))];
  if (T > 2) ids[std::size_t(2 * (k + 1) + k / 2)] = std::is_signed_v<Idx> ? Idx(-1) : Idx(E);
  return ids;
}

template <class Idx>
bool run_selected(DType dtype, DType index_dtype, DType grad_dtype, i64 E, int k, MoeScoring scoring,
                  bool renormalize, float scale) {
  const i64 T = 6, stride = E + 1;
  emu::Array logits = logits_of(dtype, T, E, stride, 14);
  // rows 1, 3, 4 and 5 of logits_of are for routing's checks; here only row 1 (ties) and finite rows
  for (i64 e = 0; e < E; ++e)
    for (i64 t : {3, 4, 5}) set_value(logits.t, t * stride + e, float(int((e * 37 + t * 11) % 128) - 64) / 64.0f);
  std::vector<Idx> ids = selection_of<Idx>(T, k, E);
  const i64 ishape[2] = {T, k + 1};
  Tensor indices = Tensor::contiguous(ids.data(), index_dtype, Device{}, ishape, 2);
  indices.shape[1] = k;
  emu::Array grad = emu::make(grad_dtype, {T, k}, 15, true, 0.5f);
  emu::Array w_cpu = emu::make(DType::f32, {T, k}, 0, false), w_emu = emu::make(DType::f32, {T, k}, 0, false);
  emu::Array d_cpu = emu::make(dtype, {T, E}, 0, false), d_emu = emu::make(dtype, {T, E}, 0, false);

  MoeSelectedRouterArgs a;
  a.logits = logits.t;
  a.indices = indices;
  a.scoring = scoring;
  a.renormalize = renormalize;
  a.scale = scale;
  a.weights = w_cpu.t;
  const SelectedRouterProblem p = validate_selected_router(a);
  selected_router_cpu(a, p);
  MoeSelectedRouterBackwardArgs b;
  b.logits = logits.t;
  b.indices = indices;
  b.grad_weights = grad.t;
  b.scoring = scoring;
  b.renormalize = renormalize;
  b.scale = scale;
  b.dlogits = d_cpu.t;
  const SelectedRouterProblem pb = validate_selected_router_backward(b);
  selected_router_backward_cpu(b, pb);

  device_types(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    const D* l = logits.t.ptr<D>();
    emu_launch(EmuDim3{unsigned(T), 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::selected_router_kernel<D, Idx>(l, p.logits_stride, ids.data(), p.index_stride, p.experts, p.top_k,
                                            scoring, renormalize, scale, w_emu.t.ptr<float>());
    });
    emu_launch(EmuDim3{unsigned(T), 1, 1}, emu_k::kThreads, 1, 0, [&] {
      emu_k::selected_router_backward_kernel<D, Idx>(l, pb.logits_stride, ids.data(), pb.index_stride, grad.t.data,
                                                     grad_dtype, pb.grad_stride, pb.experts, pb.top_k, scoring,
                                                     renormalize, scale, d_emu.t.ptr<D>(), pb.dlogits_stride);
    });
  });
  const bool ok = emu::close_rows(w_emu.t, w_cpu.t, T, k, k, "weights") &&
                  emu::close_rows(d_emu.t, d_cpu.t, T, E, E, "dlogits");
  return report(std::string("selected ") + (scoring == MoeScoring::softmax ? "softmax " : "sigmoid ") +
                    dtype_name(dtype) + " " + dtype_name(index_dtype) + " grad=" + dtype_name(grad_dtype) +
                    " E=" + std::to_string(E) + " k=" + std::to_string(k) + (renormalize ? " renormalized" : ""),
                ok);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool ok = true;
  ok = run_softmax(DType::bf16, 8, 2, true) && ok;
  ok = run_softmax(DType::f16, 128, 8, true) && ok;
  ok = run_softmax(DType::f32, 300, 6, false) && ok;
  ok = run_softmax(DType::bf16, 1024, 64, true) && ok;  // the largest E and top_k
  ok = run_sigmoid_grouped(DType::bf16, 256, 8, 8, 4, true, true, true, 2.5f) && ok;  // DeepSeek-V3's shape
  ok = run_sigmoid_grouped(DType::f32, 64, 6, 1, 1, false, false, false, 1.0f) && ok;
  ok = run_sigmoid_grouped(DType::f16, 96, 3, 32, 3, true, true, true, 1.0f) && ok;  // 3 experts a group
  ok = run_selected<std::int32_t>(DType::bf16, DType::i32, DType::f32, 128, 8, MoeScoring::softmax, true, 1.0f) && ok;
  ok = run_selected<std::int64_t>(DType::f32, DType::i64, DType::f32, 40, 4, MoeScoring::sigmoid, true, 2.5f) && ok;
  ok = run_selected<std::uint32_t>(DType::f16, DType::u32, DType::f16, 300, 6, MoeScoring::softmax, false, 1.0f) && ok;
  // k = 1, renormalized: every dlogit exactly 0
  ok = run_selected<std::int32_t>(DType::f32, DType::i32, DType::f32, 64, 1, MoeScoring::softmax, true, 3.0f) && ok;
  return ok ? 0 : 1;
}
