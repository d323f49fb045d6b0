// CUDA side of attention: picks the kernels for a strategy and launches them.
//   "flash"     forward, f16/bf16, head dims (D, Dv) in {(64, 64), (96, 96), (128, 128), (192, 128),
//               (256, 256)}, 16-byte aligned rows: the CuTe sm80 kernel (flash_sm80.cuh) on every
//               device >= 8.0, except on Hopper (compute capability 9.x), where the sm90a
//               kernel (flash_sm90.cuh: wgmma for both GEMMs) runs for every pair. The
//               environment variable RUDNN_ATTENTION_FLASH=sm80|sm90|sm90ws forces one
//               generation where it has a kernel for the head dims (sm90ws: the warp-specialized
//               sm90a kernel with TMA loads, flash_sm90_ws.cuh, persistent: one CTA per SM walking
//               the query blocks; not the default until measured; zero-stride operands and D = 96
//               run sm90 instead).
//               backward, f16/bf16, the same head-dim pairs: the CuTe sm80 kernels
//               (flash_bwd_sm80.cuh) where the device's shared memory per block holds their
//               tiles (D = 256 takes 144 KiB: A100 and Hopper, not Ada or consumer Ampere); on
//               Hopper the sm90a kernels (flash_bwd_sm90.cuh: wgmma) for every pair, unless
//               RUDNN_ATTENTION_FLASH=sm80; with RUDNN_ATTENTION_FLASH=sm90ws, a warp-specialized
//               dk/dv kernel (flash_bwd_sm90_ws.cuh: TMA producer, two wgmma consumers) where the
//               forward's sm90ws would run. Deterministic (no atomics), except sm90ws with
//               deterministic = false: its dk/dv kernel also forms dQ, added across key blocks
//               into a float32 accumulator of the workspace by atomics (5 products, not 7).
//   "fallback"  fallback_cuda.cu: any dtype, head dim and option; deterministic backward.
//   "auto"      flash where it supports the case, the fallback otherwise.
//   "autotune"  times the candidates once per (shape class, dtype, device) on the caller's
//               stream (synchronizing it once per new key) and caches the winner: the fallback
//               and each flash generation the device runs (sm80, sm90, sm90ws on Hopper; the one
//               RUDNN_ATTENTION_FLASH names if set), forward and backward separately; with
//               RUDNN_AUTOTUNE_CACHE=<file>, also on disk for later processes (core/tune_cache.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "attention/kernels.hpp"
#include "attention/tma.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "core/tune_cache.hpp"

namespace rudnn::attention {

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }
bool rows_aligned(const Strides& s) { return s.b % 8 == 0 && s.h % 8 == 0 && s.s % 8 == 0; }

// The flash kernels of this build per head-dim pair: the forward and backward of each generation
// (null where that generation has no kernel for the pair).
struct FlashKernels {
  std::int64_t d, dv;
  FlashForward forward_sm80, forward_sm90, forward_sm90ws;
  FlashBackward backward_sm80, backward_sm90, backward_sm90ws;
};
// sm90ws is compiled on request only (CMake RUDNN_WITH_SM90WS, which defines this for this file).
#if RUDNN_WITH_SM90WS
constexpr bool kSm90wsBuilt = true;
#define RUDNN_IF_SM90WS(kernel) kernel
#else
constexpr bool kSm90wsBuilt = false;
#define RUDNN_IF_SM90WS(kernel) nullptr
#endif
constexpr FlashKernels kFlashBuilt[] = {
    {64, 64, flash_forward_sm80_d64, flash_forward_sm90_d64, RUDNN_IF_SM90WS(flash_forward_sm90ws_d64),
     flash_backward_sm80_d64, flash_backward_sm90_d64, RUDNN_IF_SM90WS(flash_backward_sm90ws_d64)},
    {96, 96, flash_forward_sm80_d96, flash_forward_sm90_d96, nullptr, flash_backward_sm80_d96,
     flash_backward_sm90_d96, nullptr},
    {128, 128, flash_forward_sm80_d128, flash_forward_sm90_d128, RUDNN_IF_SM90WS(flash_forward_sm90ws_d128),
     flash_backward_sm80_d128, flash_backward_sm90_d128, RUDNN_IF_SM90WS(flash_backward_sm90ws_d128)},
    {192, 128, flash_forward_sm80_d192_dv128, flash_forward_sm90_d192_dv128,
     RUDNN_IF_SM90WS(flash_forward_sm90ws_d192_dv128), flash_backward_sm80_d192_dv128,
     flash_backward_sm90_d192_dv128, RUDNN_IF_SM90WS(flash_backward_sm90ws_d192_dv128)},
    {256, 256, flash_forward_sm80_d256, flash_forward_sm90_d256, RUDNN_IF_SM90WS(flash_forward_sm90ws_d256),
     flash_backward_sm80_d256, flash_backward_sm90_d256, RUDNN_IF_SM90WS(flash_backward_sm90ws_d256)},
};
#undef RUDNN_IF_SM90WS

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
// that way until it is measured). `forced` tells whether the variable chose it.
enum class Generation { sm80, sm90, sm90ws };
Generation flash_generation(bool* forced = nullptr) {
  const core::DeviceProps& props = core::device_props(core::current_device());
  const char* env = std::getenv("RUDNN_ATTENTION_FLASH");
  const std::string choice = env ? env : "";
  if (forced != nullptr) *forced = !choice.empty();
  if (choice.empty()) return props.cc_major == 9 ? Generation::sm90 : Generation::sm80;
  if (choice == "sm80") return Generation::sm80;
  if (choice == "sm90" || choice == "sm90ws") {
    if (props.cc_major != 9)
      core::fail(ErrorKind::unsupported, "attention: RUDNN_ATTENTION_FLASH=" + choice +
                                             " needs a Hopper GPU (compute capability 9.x), this device has " +
                                             std::to_string(props.cc_major) + "." + std::to_string(props.cc_minor));
    if (choice == "sm90ws" && !kSm90wsBuilt)
      core::fail(ErrorKind::unsupported, "attention: RUDNN_ATTENTION_FLASH=sm90ws: this libruDNN was built without "
                                         "the sm90ws kernels (configure with -DRUDNN_WITH_SM90WS=ON)");
    return choice == "sm90" ? Generation::sm90 : Generation::sm90ws;
  }
  core::fail(ErrorKind::value, "attention: RUDNN_ATTENTION_FLASH: expected 'sm80', 'sm90', 'sm90ws' or unset, got '" +
                                   choice + "'");
}

// The generations "autotune" times: the one RUDNN_ATTENTION_FLASH names, else every one the
// device runs (sm80 and sm90 on Hopper, and sm90ws where this build has it).
std::vector<Generation> tunable_generations() {
  bool forced = false;
  const Generation g = flash_generation(&forced);
  if (forced || g == Generation::sm80) return {g};
  if (!kSm90wsBuilt) return {Generation::sm80, Generation::sm90};
  return {Generation::sm80, Generation::sm90, Generation::sm90ws};
}

const char* generation_name(Generation g) {
  return g == Generation::sm90ws ? "flash_sm90ws" : g == Generation::sm90 ? "flash_sm90" : "flash_sm80";
}

// The generation whose forward kernel serves this call when `wanted` is asked for: itself where
// it has a kernel for the head dims (and, sm90ws, TMA can load the operands), else sm90, else sm80.
Generation forward_generation(const AttentionForwardArgs& a, const Problem& p, Generation wanted) {
  const FlashKernels& kernels = *flash_kernels_for(p);
  if (wanted == Generation::sm90ws && kernels.forward_sm90ws != nullptr &&
      tma_forward_supports(p, a.q.data, a.k.data, a.v.data))
    return Generation::sm90ws;
  if (wanted != Generation::sm80 && kernels.forward_sm90 != nullptr) return Generation::sm90;
  return Generation::sm80;
}

// Runs the forward of `forward_generation(a, p, wanted)`; returns the name of the kernel that ran.
const char* run_flash_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream, Generation wanted) {
  float* lse = a.lse ? a.lse->ptr<float>() : nullptr;
  const FlashKernels& kernels = *flash_kernels_for(p);
  const Generation g = forward_generation(a, p, wanted);
  const FlashForward run = g == Generation::sm90ws ? kernels.forward_sm90ws
                           : g == Generation::sm90  ? kernels.forward_sm90
                                                    : kernels.forward_sm80;
  run(p, a.q.data, a.k.data, a.v.data, a.out.data, lse, stream);
  return generation_name(g);
}

void run_fallback_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  fallback_forward(p, a.q.data, a.k.data, a.v.data, a.out.data, a.lse ? a.lse->ptr<float>() : nullptr, stream);
}

// ---- autotune: the winner per (device, dtype, shape class, options) ----

// What runs: the fallback, or the flash kernels of a generation.
struct Choice {
  bool flash;
  Generation generation;
};

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

const char* choice_name(const Choice& c) { return c.flash ? generation_name(c.generation) : "fallback"; }

// The key of `key` in the on-disk cache (core/tune_cache.hpp): this build, the device by name,
// compute capability and SM count (ordinals differ between machines), the candidates, the shape
// class and options.
std::string disk_key(const char* op, const TuneKey& key) {
  const auto& [device, dtype, d, dv, sq, sk, rows, options] = key;
  std::string candidates;
  for (Generation g : tunable_generations())
    candidates += (candidates.empty() ? "" : ",") + std::string(generation_name(g));
  return std::string(core::build_id()) + " | attention " + op + " | " + core::device_tune_key(device) + " | " +
         candidates + " | dtype " + std::to_string(dtype) + " d " +
         std::to_string(d) + " dv " + std::to_string(dv) + " log2 sq " + std::to_string(sq) + " sk " +
         std::to_string(sk) + " b*hq " + std::to_string(rows) + " options " + std::to_string(options);
}

// The choice a cache line names, if it is one this build can run: the fallback, or a
// generation that was a candidate (and so runs on this device).
bool parse_choice(const std::string& name, Choice& c) {
  if (name == "fallback") {
    c = Choice{false, Generation::sm80};
    return true;
  }
  for (Generation g : tunable_generations()) {
    if (name == generation_name(g)) {
      c = Choice{true, g};
      return true;
    }
  }
  return false;
}

// The cached choice for `key` (this process's, else the on-disk cache's), or the fastest of the
// flash generations (each timed once, the same kernel not twice) and the fallback, timed now by
// run_flash(generation) and run_fallback(), then recorded in both caches. The candidates write
// the outputs, which the chosen kernels then overwrite.
template <class Distinct, class RunFlash, class RunFallback>
Choice tuned(const char* op, std::map<TuneKey, Choice>& cache, const TuneKey& key, Distinct&& distinct,
             RunFlash&& run_flash, RunFallback&& run_fallback, Stream stream) {
  {
    std::lock_guard<std::mutex> lock(tune_mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  const std::string on_disk = disk_key(op, key);
  Choice recorded{};
  if (parse_choice(core::tune_cache_lookup(on_disk), recorded)) {
    std::lock_guard<std::mutex> lock(tune_mutex);
    cache.emplace(key, recorded);
    return recorded;
  }
  Choice best{false, Generation::sm80};
  float best_ms = core::time_on_stream(run_fallback, stream, 1);
  std::vector<Generation> timed;
  for (Generation wanted : tunable_generations()) {
    const Generation g = distinct(wanted);
    if (std::find(timed.begin(), timed.end(), g) != timed.end()) continue;
    timed.push_back(g);
    const float ms = core::time_on_stream([&] { run_flash(g); }, stream, 3);
    if (ms <= best_ms) best = Choice{true, g}, best_ms = ms;
  }
  core::tune_cache_store(on_disk, choice_name(best));
  std::lock_guard<std::mutex> lock(tune_mutex);
  cache.emplace(key, best);
  return best;
}

std::map<TuneKey, Choice> tune_cache_forward;

Choice autotune_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  if (!flash_forward_unsupported(a, p).empty()) return Choice{false, Generation::sm80};  // the only candidate
  return tuned(
      "forward", tune_cache_forward, tune_key(p, core::current_device()),
      [&](Generation g) { return forward_generation(a, p, g); },
      [&](Generation g) { run_flash_forward(a, p, stream, g); }, [&] { run_fallback_forward(a, p, stream); }, stream);
}

Choice choose_forward(const AttentionForwardArgs& a, const Problem& p, Stream stream) {
  switch (a.options.strategy) {
    case AttentionStrategy::flash: {
      const std::string why = flash_forward_unsupported(a, p);
      if (!why.empty()) core::fail(ErrorKind::unsupported, "attention: strategy 'flash': " + why);
      return Choice{true, flash_generation()};
    }
    case AttentionStrategy::fallback: return Choice{false, Generation::sm80};
    case AttentionStrategy::autotune: return autotune_forward(a, p, stream);
    case AttentionStrategy::automatic:
    default:
      if (!flash_forward_unsupported(a, p).empty()) return Choice{false, Generation::sm80};
      return Choice{true, flash_generation()};
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

// The generation whose backward serves this call when `wanted` is asked for: that one where it
// has a kernel for the head dims (and, sm90ws, TMA can load the operands), else sm90, else sm80.
Generation backward_generation(const AttentionBackwardArgs& a, const BackwardProblem& bp, Generation wanted) {
  const FlashKernels& kernels = *flash_kernels_for(bp.fwd);
  if (wanted == Generation::sm90ws && kernels.backward_sm90ws != nullptr &&
      tma_backward_supports(bp, a.q.data, a.k.data, a.v.data, a.dout.data))
    return Generation::sm90ws;
  return wanted != Generation::sm80 && kernels.backward_sm90 != nullptr ? Generation::sm90 : Generation::sm80;
}

// Runs the backward of `backward_generation(bp, wanted)`; returns the name of the kernels that ran.
const char* run_flash_backward(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                               Stream stream, Generation wanted) {
  const FlashKernels& kernels = *flash_kernels_for(bp.fwd);
  const Generation g = backward_generation(a, bp, wanted);
  const FlashBackward run = g == Generation::sm90ws ? kernels.backward_sm90ws
                            : g == Generation::sm90  ? kernels.backward_sm90
                                                     : kernels.backward_sm80;
  run(
      bp, a.dout.data, a.q.data, a.k.data, a.v.data, a.out.data, a.lse.ptr<float>(), a.dq.data, a.dk.data, a.dv.data,
      workspace ? workspace->data : nullptr, stream);
  return generation_name(g);
}

std::map<TuneKey, Choice> tune_cache_backward;

Choice choose_backward(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                       Stream stream) {
  const std::string why = flash_backward_unsupported(a, bp);
  switch (a.options.strategy) {
    case AttentionStrategy::flash:
      if (!why.empty()) core::fail(ErrorKind::unsupported, "attention_backward: strategy 'flash': " + why);
      return Choice{true, flash_generation()};
    case AttentionStrategy::fallback: return Choice{false, Generation::sm80};
    case AttentionStrategy::autotune:
      if (!why.empty()) return Choice{false, Generation::sm80};
      return tuned(
          "backward", tune_cache_backward, tune_key(bp.fwd, core::current_device()),
          [&](Generation g) { return backward_generation(a, bp, g); },
          [&](Generation g) { run_flash_backward(a, bp, workspace, stream, g); },
          [&] { run_fallback_backward(a, bp, workspace, stream); }, stream);
    case AttentionStrategy::automatic:
    default:
      if (!why.empty()) return Choice{false, Generation::sm80};
      return Choice{true, flash_generation()};
  }
}

}  // namespace

std::size_t forward_workspace_bytes_cuda(const Problem& p, AttentionStrategy strategy) {
  (void)p, (void)strategy;
  return 0;
}

std::size_t backward_workspace_bytes_cuda(const BackwardProblem& bp, AttentionStrategy strategy) {
  // delta_i per query row, for every strategy; and the sm90ws backward's float32 dQ accumulator
  // where that backward may run with deterministic = false (sized whether or not TMA can then
  // load the operands: those checks need the pointers, and a larger workspace does no harm)
  const Problem& p = bp.fwd;
  const FlashKernels* kernels = flash_kernels_for(p);
  bool accumulates = !bp.deterministic && kSm90wsBuilt && strategy != AttentionStrategy::fallback &&
                     (p.dtype == DType::f16 || p.dtype == DType::bf16) && kernels != nullptr &&
                     kernels->backward_sm90ws != nullptr;
  if (accumulates) {
    const std::vector<Generation> candidates =
        strategy == AttentionStrategy::autotune ? tunable_generations() : std::vector<Generation>{flash_generation()};
    accumulates = std::find(candidates.begin(), candidates.end(), Generation::sm90ws) != candidates.end();
  }
  if (!accumulates) return fallback_backward_workspace_bytes(p);
  return dq_accumulator_offset(p) + dq_accumulator_bytes(p);
}

const char* forward_cuda(const AttentionForwardArgs& a, const Problem& p, const Tensor* workspace, Stream stream) {
  (void)workspace;
  const Choice choice = choose_forward(a, p, stream);
  if (choice.flash) return run_flash_forward(a, p, stream, choice.generation);
  run_fallback_forward(a, p, stream);
  return "fallback";
}

const char* backward_cuda(const AttentionBackwardArgs& a, const BackwardProblem& bp, const Tensor* workspace,
                          Stream stream) {
  const Choice choice = choose_backward(a, bp, workspace, stream);
  if (choice.flash) return run_flash_backward(a, bp, workspace, stream, choice.generation);
  run_fallback_backward(a, bp, workspace, stream);
  return "fallback";
}

}  // namespace rudnn::attention
