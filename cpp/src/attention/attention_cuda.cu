// CUDA side of attention: picks the kernels for a strategy and launches them.
//   "flash"     forward, f16/bf16, head dims (D, Dv) in {(64, 64), (96, 96), (128, 128), (192, 128),
//               (256, 256)}, 16-byte aligned rows: the CuTe sm80 kernel (flash_sm80.cuh) on every
//               device >= 8.0, except on Hopper (compute capability 9.x) for every pair but
//               (96, 96), where the sm90a kernel (flash_sm90.cuh: wgmma for both GEMMs) runs. The
//               environment variable RUDNN_ATTENTION_FLASH=sm80|sm90|sm90ws forces one
//               generation where it has a kernel for the head dims (sm90ws: the warp-specialized
//               sm90a kernel with TMA loads, flash_sm90_ws.cuh, not the default until measured;
//               packed varlen batches and zero-stride operands run sm90 instead).
//               backward, f16/bf16, the same head-dim pairs: the CuTe sm80 kernels
//               (flash_bwd_sm80.cuh) where the device's shared memory per block holds their
//               tiles (D = 256 takes 144 KiB: A100 and Hopper, not Ada or consumer Ampere); on
//               Hopper for D = Dv in {64, 128} the sm90a kernels (flash_bwd_sm90.cuh: wgmma),
//               unless RUDNN_ATTENTION_FLASH=sm80. Deterministic (no atomics).
//   "fallback"  fallback_cuda.cu: any dtype, head dim and option; deterministic backward.
//   "auto"      flash where it supports the case, the fallback otherwise.
//   "autotune"  times the supported candidates once per (shape class, dtype, device) on the
//               caller's stream (synchronizing it once per new key) and caches the winner.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "attention/kernels.hpp"
#include "attention/tma.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"

namespace rudnn::attention {

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }
bool rows_aligned(const Strides& s) { return s.b % 8 == 0 && s.h % 8 == 0 && s.s % 8 == 0; }

// The flash kernels of this build per head-dim pair: the forward and backward of each generation
// (null where that generation has no kernel for the pair).
struct FlashKernels {
  std::int64_t d, dv;
  FlashForward forward_sm80, forward_sm90, forward_sm90ws;
  FlashBackward backward_sm80, backward_sm90;
};
constexpr FlashKernels kFlashBuilt[] = {
    {64, 64, flash_forward_sm80_d64, flash_forward_sm90_d64, flash_forward_sm90ws_d64, flash_backward_sm80_d64,
     flash_backward_sm90_d64},
    {96, 96, flash_forward_sm80_d96, nullptr, nullptr, flash_backward_sm80_d96, nullptr},
    {128, 128, flash_forward_sm80_d128, flash_forward_sm90_d128, flash_forward_sm90ws_d128, flash_backward_sm80_d128,
     flash_backward_sm90_d128},
    {192, 128, flash_forward_sm80_d192_dv128, flash_forward_sm90_d192_dv128, flash_forward_sm90ws_d192_dv128,
     flash_backward_sm80_d192_dv128, nullptr},
    {256, 256, flash_forward_sm80_d256, flash_forward_sm90_d256, flash_forward_sm90ws_d256, flash_backward_sm80_d256,
     nullptr},
};

const FlashKernels* flash_kernels_for(const Problem& p) {
  for (const FlashKernels& k : kFlashBuilt)
    if (k.d == p.d && k.dv == p.dv) return &k;
  return nullptr;
}

// "supports head dims ..., got ..." from the table: the forward's pairs, or the backward's.
std::string flash_head_dims_error(const Problem& p, bool backward) {
  std::string pairs;
  for (const FlashKernels& k : kFlashBuilt)
    if (!backward || k.backward_sm80 != nullptr)
      pairs += (pairs.empty() ? "(" : ", (") + std::to_string(k.d) + ", " + std::to_string(k.dv) + ")";
  return "supports head dims (D, Dv) in {" + pairs + "}, got D = " + std::to_string(p.d) + ", Dv = " +
         std::to_string(p.dv);
}

// Why the flash forward cannot serve this call (empty: it can).
std::string flash_forward_unsupported(const AttentionForwardArgs& a, const Problem& p) {
  const core::DeviceProps& props = core::device_props(core::current_device());
  if (props.cc_major < 8)
    return "needs compute capability >= 8.0, this device has " + std::to_string(props.cc_major) + "." +
           std::to_string(props.cc_minor);
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return std::string("supports float16 and bfloat16, got ") + dtype_name(p.dtype);
  if (flash_kernels_for(p) == nullptr) return flash_head_dims_error(p, false);
  if (!aligned16(a.q.data) || !aligned16(a.k.data) || !aligned16(a.v.data) || !aligned16(a.out.data) ||
      !rows_aligned(p.q) || !rows_aligned(p.k) || !rows_aligned(p.v) || !rows_aligned(p.out))
    return "needs 16-byte aligned rows (data pointers aligned to 16 bytes, strides multiples of 8 elements)";
  if ((p.sq + 63) / 64 > 0x7fffffffLL || p.hq > 65535 || p.batch > 65535)
    return "supports at most 65535 heads and 65535 sequences per call";
  return {};
}

// The flash kernel generation for the current device: sm90a on Hopper, sm80 elsewhere,
// unless RUDNN_ATTENTION_FLASH says otherwise (sm90ws, the warp-specialized sm90a kernel, only
// that way until it is measured).
enum class Generation { sm80, sm90, sm90ws };
Generation flash_generation() {
  const core::DeviceProps& props = core::device_props(core::current_device());
  const char* env = std::getenv("RUDNN_ATTENTION_FLASH");
  const std::string choice = env ? env : "";
  if (choice.empty()) return props.cc_major == 9 ? Generation::sm90 : Generation::sm80;
  if (choice == "sm80") return Generation::sm80;
  if (choice == "sm90" || choice == "sm90ws") {
    if (props.cc_major != 9)
      core::fail(ErrorKind::unsupported, "attention: RUDNN_ATTENTION_FLASH=" + choice +
                                             " needs a Hopper GPU (compute capability 9.x), this device has " +
                                             std::to_string(props.cc_major) + "." + std::to_string(props.cc_minor));
    return choice == "sm90" ? Generation::sm90 : Generation::sm90ws;
  }
  core::fail(ErrorKind::value, "attention: RUDNN_ATTENTION_FLASH: expected 'sm80', 'sm90', 'sm90ws' or unset, got '" +
                                   choice + "'");
}

// Runs the chosen generation's kernel where this head-dim pair has one, the sm80 kernel otherwise;
// returns the name of the kernel that ran.
const char* run_flash_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  float* lse = a.lse ? a.lse->ptr<float>() : nullptr;
  const FlashKernels& kernels = *flash_kernels_for(p);
  const Generation generation = flash_generation();
  if (generation == Generation::sm90ws && kernels.forward_sm90ws != nullptr &&
      tma_forward_supports(p, a.q.data, a.k.data, a.v.data)) {
    kernels.forward_sm90ws(p, a.q.data, a.k.data, a.v.data, a.out.data, lse, stream);
    return "flash_sm90ws";
  }
  if (generation != Generation::sm80 && kernels.forward_sm90 != nullptr) {
    kernels.forward_sm90(p, a.q.data, a.k.data, a.v.data, a.out.data, lse, stream);
    return "flash_sm90";
  }
  kernels.forward_sm80(p, a.q.data, a.k.data, a.v.data, a.out.data, lse, stream);
  return "flash_sm80";
}

void run_fallback_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  fallback_forward(p, a.q.data, a.k.data, a.v.data, a.out.data, a.lse ? a.lse->ptr<float>() : nullptr, stream);
}

// ---- autotune: the winner per (device, dtype, shape class, options) ----

enum class Choice { flash, fallback };

std::int64_t log2_bucket(std::int64_t n) {
  std::int64_t b = 0;
  while ((std::int64_t(1) << b) < n) ++b;
  return b;
}

using TuneKey = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int>;

TuneKey tune_key(const Problem& p, int device) {
  const int options = int(p.causal) | int(p.window_left >= 0 || p.window_right >= 0) << 1 |
                      int(p.softcap > 0) << 2 | int(p.has_mask()) << 3 | int(p.has_bias()) << 4 | int(p.varlen) << 5;
  return TuneKey{device,           int(p.dtype),  p.d, p.dv, log2_bucket(p.sq), log2_bucket(p.sk),
                 log2_bucket(p.batch * p.hq), options};
}

std::mutex tune_mutex;
std::map<TuneKey, Choice> tune_cache;

// Milliseconds of `reps` runs of `run` on `stream` (synchronizes the stream once).
template <class Run>
float time_on_stream(Run&& run, Stream stream, int reps) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaEvent_t start, stop;
  RUDNN_CUDA_CHECK(cudaEventCreate(&start));
  RUDNN_CUDA_CHECK(cudaEventCreate(&stop));
  float ms = 0.0f;
  try {
    run();  // warm-up (module load, first-launch attributes)
    RUDNN_CUDA_CHECK(cudaEventRecord(start, s));
    for (int i = 0; i < reps; ++i) run();
    RUDNN_CUDA_CHECK(cudaEventRecord(stop, s));
    RUDNN_CUDA_CHECK(cudaEventSynchronize(stop));
    RUDNN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  RUDNN_CUDA_CHECK(cudaEventDestroy(start));
  RUDNN_CUDA_CHECK(cudaEventDestroy(stop));
  return ms;
}

Choice autotune_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  if (!flash_forward_unsupported(a, p).empty()) return Choice::fallback;  // the only candidate
  const TuneKey key = tune_key(p, core::current_device());
  {
    std::lock_guard<std::mutex> lock(tune_mutex);
    auto it = tune_cache.find(key);
    if (it != tune_cache.end()) return it->second;
  }
  // The candidates write out/lse, which the chosen kernel then overwrites.
  const float flash_ms = time_on_stream([&] { run_flash_forward(a, p, stream); }, stream, 3);
  const float fallback_ms = time_on_stream([&] { run_fallback_forward(a, p, stream); }, stream, 1);
  const Choice best = flash_ms <= fallback_ms ? Choice::flash : Choice::fallback;
  std::lock_guard<std::mutex> lock(tune_mutex);
  tune_cache.emplace(key, best);
  return best;
}

Choice choose_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  switch (a.options.strategy) {
    case AttentionStrategy::flash: {
      const std::string why = flash_forward_unsupported(a, p);
      if (!why.empty()) core::fail(ErrorKind::unsupported, "attention: strategy 'flash': " + why);
      return Choice::flash;
    }
    case AttentionStrategy::fallback: return Choice::fallback;
    case AttentionStrategy::autotune: return autotune_forward(a, p, stream);
    case AttentionStrategy::automatic:
    default: return flash_forward_unsupported(a, p).empty() ? Choice::flash : Choice::fallback;
  }
}

// Why the flash backward cannot serve this call (empty: it can).
std::string flash_backward_unsupported(const AttentionBackwardArgs& a, const BackwardProblem& bp) {
  const Problem& p = bp.fwd;
  const core::DeviceProps& props = core::device_props(core::current_device());
  if (props.cc_major < 8)
    return "needs compute capability >= 8.0, this device has " + std::to_string(props.cc_major) + "." +
           std::to_string(props.cc_minor);
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return std::string("supports float16 and bfloat16, got ") + dtype_name(p.dtype);
  const FlashKernels* kernels = flash_kernels_for(p);
  if (kernels == nullptr || kernels->backward_sm80 == nullptr) return flash_head_dims_error(p, true);
  const std::size_t smem = flash_backward_smem_bytes(p.d, p.dv);
  if (smem > std::size_t(props.max_smem_per_block_optin))
    return "needs " + std::to_string(smem / 1024) + " KiB of shared memory per block for head dims (" +
           std::to_string(p.d) + ", " + std::to_string(p.dv) + "), this device has " +
           std::to_string(props.max_smem_per_block_optin / 1024) + " KiB";
  for (const void* ptr : {a.q.data, a.k.data, a.v.data, a.dout.data, a.dq.data, a.dk.data, a.dv.data})
    if (!aligned16(ptr)) return "needs data pointers aligned to 16 bytes";
  for (const Strides* s : {&p.q, &p.k, &p.v, &bp.dout, &bp.dq, &bp.dk, &bp.dv})
    if (!rows_aligned(*s)) return "needs row strides that are multiples of 8 elements";
  if ((p.sq + 3) / 4 > 0x7fffffffLL || (p.sk + 63) / 64 > 0x7fffffffLL || p.hq > 65535 || p.batch > 65535)
    return "supports at most 65535 heads and 65535 sequences per call";
  return {};
}

void run_fallback_backward(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                           Stream stream) {
  fallback_backward(bp, a.dout.data, a.q.data, a.k.data, a.v.data, a.out.data, a.lse.ptr<float>(), a.dq.data,
                    a.dk.data, a.dv.data, workspace ? workspace->data : nullptr, stream);
}

// The sm90a backward on Hopper where the pair has one (unless RUDNN_ATTENTION_FLASH=sm80; sm90ws
// has no backward of its own and takes sm90's), the sm80 one otherwise; returns the name of the
// kernels that ran.
const char* run_flash_backward(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                               Stream stream) {
  const FlashKernels& kernels = *flash_kernels_for(bp.fwd);
  const bool sm90 = flash_generation() != Generation::sm80 && kernels.backward_sm90 != nullptr;
  (sm90 ? kernels.backward_sm90 : kernels.backward_sm80)(bp, a.dout.data, a.q.data, a.k.data, a.v.data, a.out.data,
                                                         a.lse.ptr<float>(), a.dq.data, a.dk.data, a.dv.data,
                                                         workspace ? workspace->data : nullptr, stream);
  return sm90 ? "flash_sm90" : "flash_sm80";
}

std::map<TuneKey, Choice> tune_cache_backward;

Choice choose_backward(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                       Stream stream) {
  const std::string why = flash_backward_unsupported(a, bp);
  switch (a.options.strategy) {
    case AttentionStrategy::flash:
      if (!why.empty()) core::fail(ErrorKind::unsupported, "attention_backward: strategy 'flash': " + why);
      return Choice::flash;
    case AttentionStrategy::fallback: return Choice::fallback;
    case AttentionStrategy::autotune: {
      if (!why.empty()) return Choice::fallback;
      const TuneKey key = tune_key(bp.fwd, core::current_device());
      {
        std::lock_guard<std::mutex> lock(tune_mutex);
        auto it = tune_cache_backward.find(key);
        if (it != tune_cache_backward.end()) return it->second;
      }
      const float flash_ms = time_on_stream([&] { run_flash_backward(a, bp, workspace, stream); }, stream, 3);
      const float fallback_ms = time_on_stream([&] { run_fallback_backward(a, bp, workspace, stream); }, stream, 1);
      const Choice best = flash_ms <= fallback_ms ? Choice::flash : Choice::fallback;
      std::lock_guard<std::mutex> lock(tune_mutex);
      tune_cache_backward.emplace(key, best);
      return best;
    }
    case AttentionStrategy::automatic:
    default: return why.empty() ? Choice::flash : Choice::fallback;
  }
}

}  // namespace

std::size_t forward_workspace_bytes_cuda(const Problem& p, AttentionStrategy strategy) {
  (void)p, (void)strategy;
  return 0;
}

std::size_t backward_workspace_bytes_cuda(const BackwardProblem& bp, AttentionStrategy strategy) {
  (void)strategy;
  return fallback_backward_workspace_bytes(bp.fwd);  // delta_i per query row, for both strategies
}

const char* forward_cuda(const AttentionForwardArgs& a, const Problem& p, const Tensor* workspace, Stream stream) {
  (void)workspace;
  if (choose_forward(a, p, stream) == Choice::flash) return run_flash_forward(a, p, stream);
  run_fallback_forward(a, p, stream);
  return "fallback";
}

const char* backward_cuda(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                          Stream stream) {
  if (choose_backward(a, bp, workspace, stream) == Choice::flash) return run_flash_backward(a, bp, workspace, stream);
  run_fallback_backward(a, bp, workspace, stream);
  return "fallback";
}

}  // namespace rudnn::attention
