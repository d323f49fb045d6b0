// Host emulator of the CTC CUDA kernels (tests/test_ctc_emulation.py builds and runs it). The
// kernels' own source (cpp/src/ctc/ctc_cuda.cu up to its launch code, extracted by the test
// into kernels.inc with one edit: the dynamic shared-memory pointer) runs on the CPU through
// emu_runtime.hpp, a std::thread per CUDA thread, with few threads per block so that the loops
// over states, classes and label positions wrap. Each case runs the forward (alpha + reduce) and
// the backward (alpha + beta/gradient) kernels with the labels and rows in shared memory and in
// the workspace, and compares them bitwise with the CPU backend (which tests/test_ctc.py checks
// against torch): both use the same float operations in the same order. Prints one line per
// case and path; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "ctc/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "ctc/cpu.cpp"
#include "ctc/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"

// namespace rudnn::ctc { namespace emu_k { ...the kernels of ctc_cuda.cu... } }
#include "kernels.inc"

namespace {

using namespace rudnn;
using namespace rudnn::ctc;

struct Array {
  Tensor t;
  std::vector<std::uint64_t> storage;  // 8 bytes per element: room for every dtype
};

Array make(DType dtype, const std::vector<i64>& shape) {
  Array a;
  i64 n = 1;
  for (i64 d : shape) n *= d;
  a.storage.assign(std::size_t(n) + 2, 0);
  a.t = Tensor::contiguous(a.storage.data(), dtype, Device{}, shape.data(), int(shape.size()));
  return a;
}

std::uint32_t next_random(std::uint32_t& state) { return state = state * 1664525u + 1013904223u; }

void store(const Tensor& t, i64 i, float v) {
  switch (t.dtype) {
    case DType::f32: t.ptr<float>()[i] = v; break;
    case DType::f16: t.ptr<host::f16>()[i] = host::from_float<host::f16>(v); break;
    case DType::bf16: t.ptr<host::bf16>()[i] = host::from_float<host::bf16>(v); break;
    default: break;
  }
}

// (T, N, C) log-softmax rows of random logits.
Array log_probs(DType dtype, i64 T, i64 N, i64 C, std::uint32_t seed) {
  Array a = make(dtype, {T, N, C});
  std::vector<float> logits(static_cast<std::size_t>(C));
  for (i64 r = 0; r < T * N; ++r) {
    float mx = -INFINITY, sum = 0.0f;
    for (auto& v : logits) mx = std::max(mx, v = float(int(next_random(seed) >> 24) - 128) / 32.0f);
    for (float v : logits) sum += std::exp(v - mx);
    for (i64 c = 0; c < C; ++c) store(a.t, r * C + c, logits[std::size_t(c)] - mx - std::log(sum));
  }
  return a;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const std::size_t bytes = std::size_t(a.numel()) * dtype_size(a.dtype);
  return std::memcmp(a.data, b.data, bytes) == 0;
}

template <class F>
decltype(auto) device_types(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

struct Case {
  const char* name;
  DType dtype;
  i64 T, C, blank;
  std::vector<i64> input_lengths, target_lengths;
  std::vector<std::vector<i64>> targets;  // padded rows
  CtcReduction reduction;
  bool zero_infinity;
  unsigned threads;
};

// The workspace as the CUDA backend fills it before its kernels: the table and the labels.
std::vector<std::uint64_t> workspace_for(const Problem& p) {
  std::vector<std::uint64_t> ws(p.ws.total / 8 + 2, ~std::uint64_t(0));  // poisoned
  auto* base = reinterpret_cast<std::uint8_t*>(ws.data());
  std::memcpy(base + p.ws.sequences, p.sequences.data(), p.sequences.size() * sizeof(Sequence));
  std::memcpy(base + p.ws.labels, p.labels.data(), p.labels.size() * sizeof(std::int32_t));
  return ws;
}

std::size_t staged_bytes(const Problem& p, bool backward, i64 rows) {
  const std::size_t ints = std::size_t((p.max_states - 1) / 2) * (backward ? 2 : 1);
  return std::size_t(rows) * std::size_t(p.max_states) * sizeof(float) + ints * sizeof(std::int32_t);
}

bool run_case(const Case& c, bool staged) {
  const i64 N = i64(c.input_lengths.size()), S = i64(c.targets[0].size());
  Array lp = log_probs(c.dtype, c.T, N, c.C, 7);
  Array targets = make(DType::i64, {N, S}), il = make(DType::i64, {N}), tl = make(DType::i64, {N});
  for (i64 n = 0; n < N; ++n) {
    for (i64 k = 0; k < S; ++k) targets.t.ptr<std::int64_t>()[n * S + k] = c.targets[std::size_t(n)][std::size_t(k)];
    il.t.ptr<std::int64_t>()[n] = c.input_lengths[std::size_t(n)];
    tl.t.ptr<std::int64_t>()[n] = c.target_lengths[std::size_t(n)];
  }
  const bool none = c.reduction == CtcReduction::none;
  const std::vector<i64> loss_shape = none ? std::vector<i64>{N} : std::vector<i64>{};
  Array loss_cpu = make(c.dtype, loss_shape), loss_emu = make(c.dtype, loss_shape);
  Array dloss = make(DType::f32, loss_shape);
  for (i64 n = 0; n < (none ? N : 1); ++n) dloss.t.ptr<float>()[n] = 0.5f + float(n);
  Array grad_cpu = make(c.dtype, {c.T, N, c.C}), grad_emu = make(c.dtype, {c.T, N, c.C});

  const CtcOptions options{c.blank, c.reduction, c.zero_infinity};
  // The CPU backend, with workspaces of its own.
  CtcLossArgs fa{options, lp.t, targets.t, il.t, tl.t, loss_cpu.t, nullptr};
  Problem fp = validate_forward(fa, false);
  std::vector<std::uint64_t> cpu_ws(fp.ws.total / 8 + 2);
  Tensor cpu_ws_t = Tensor::contiguous(cpu_ws.data(), DType::u8, Device{}, std::vector<i64>{i64(fp.ws.total)}.data(), 1);
  fa.workspace = &cpu_ws_t;
  fp = validate_forward(fa);
  forward_cpu(fp, fa);
  CtcLossBackwardArgs ba{options, dloss.t, lp.t, targets.t, il.t, tl.t, grad_cpu.t, nullptr};
  Problem bp = validate_backward(ba, false);
  std::vector<std::uint64_t> cpu_bws(bp.ws.total / 8 + 2);
  Tensor cpu_bws_t =
      Tensor::contiguous(cpu_bws.data(), DType::u8, Device{}, std::vector<i64>{i64(bp.ws.total)}.data(), 1);
  ba.workspace = &cpu_bws_t;
  bp = validate_backward(ba);
  backward_cpu(bp, ba);

  // The kernels, on the problems of the same validation.
  fa.loss = loss_emu.t;
  fp = validate_forward(fa);
  ba.dlog_probs = grad_emu.t;
  bp = validate_backward(ba);
  device_types(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<std::uint64_t> ws = workspace_for(fp);
    Tensor ws_t = Tensor::contiguous(ws.data(), DType::u8, Device{}, std::vector<i64>{i64(fp.ws.total)}.data(), 1);
    emu_k::Params q = emu_k::make_params(fp, ws_t, staged ? 0 : ~std::size_t(0));
    const T* x = lp.t.ptr<const T>();
    T* loss = loss_emu.t.ptr<T>();
    emu_launch(EmuDim3{unsigned(N), 1, 1}, c.threads, 1, staged ? staged_bytes(fp, false, 2) : 0,
               [&] { emu_k::ctc_alpha_kernel<T>(q, x, loss, 2); });
    if (!none) emu_launch(EmuDim3{1, 1, 1}, 1, 1, 0, [&] { emu_k::ctc_reduce_kernel<T>(q, loss); });

    std::vector<std::uint64_t> bws = workspace_for(bp);
    Tensor bws_t = Tensor::contiguous(bws.data(), DType::u8, Device{}, std::vector<i64>{i64(bp.ws.total)}.data(), 1);
    q = emu_k::make_params(bp, bws_t, staged ? 0 : ~std::size_t(0));
    emu_launch(EmuDim3{unsigned(N), 1, 1}, c.threads, 1, staged ? staged_bytes(bp, false, 0) : 0,
               [&] { emu_k::ctc_alpha_kernel<T>(q, x, static_cast<T*>(nullptr), c.T); });
    emu_launch(EmuDim3{unsigned(N), 1, 1}, c.threads, 1, staged ? staged_bytes(bp, true, 2) : 0,
               [&] { emu_k::ctc_grad_kernel<T>(q, x, dloss.t.data, DType::f32, grad_emu.t.ptr<T>()); });
  });
  const bool ok = same_bytes(loss_cpu.t, loss_emu.t) && same_bytes(grad_cpu.t, grad_emu.t);
  std::printf("%s %s %s\n", c.name, staged ? "staged=shared" : "staged=global", ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  const std::vector<Case> cases = {
      {"f32_none_blank0", DType::f32, 12, 6, 0, {12, 9, 4, 0}, {4, 3, 2, 0},
       {{1, 2, 2, 5}, {3, 3, 3, 1}, {4, 4, 1, 1}, {1, 1, 1, 1}}, CtcReduction::none, false, 8},
      {"f32_mean_blank_mid_zero_inf", DType::f32, 10, 7, 3, {10, 3, 10}, {5, 3, 0},
       {{1, 1, 2, 1, 1}, {2, 2, 2, 1, 1}, {1, 1, 1, 1, 1}}, CtcReduction::mean, true, 8},
      {"f32_sum_impossible", DType::f32, 6, 5, 4, {6, 3}, {3, 3}, {{1, 1, 1}, {1, 1, 1}}, CtcReduction::sum, false, 4},
      {"f16_sum_many_classes", DType::f16, 9, 300, 299, {9, 8}, {4, 3},
       {{256, 257, 256, 3}, {298, 0, 280, 1}}, CtcReduction::sum, false, 32},
      {"bf16_none_long_target", DType::bf16, 40, 5, 0, {40, 33}, {18, 16},
       {{1, 2, 3, 4, 1, 1, 2, 3, 4, 4, 1, 2, 3, 3, 4, 1, 2, 2}, {4, 3, 2, 1, 1, 2, 3, 4, 4, 3, 2, 1, 1, 2, 3, 4, 0, 0}},
       CtcReduction::none, false, 16},
  };
  bool all = true;
  for (const Case& c : cases)
    for (bool staged : {true, false}) all = run_case(c, staged) && all;
  return all ? 0 : 1;
}
