// Host emulator of the MoE dispatch-plan CUDA kernels (tests/test_moe_emulation.py builds and
// runs it). The kernels' own source (the "dispatch plan" section of cpp/src/moe/dispatch_cuda.cu,
// extracted by the test into kernels.inc) runs on the CPU through emu_runtime.hpp, a std::thread
// per CUDA thread, in the launches dispatch_plan_cuda makes, on its grids (moe_plan_launches.hpp:
// one for slots that fit a chunk, else count walk, scan of each expert's counts over the chunks,
// scan of the experts' totals, place walk). Each case
// compares offsets, token_of_row and row_of_slot bitwise with the CPU backend's counting sort
// (tests/test_moe.py checks that one against the naive reference), starting from outputs and a
// workspace filled with garbage, so a row or offset the kernels leave unwritten fails too.
// Covers the three index dtypes, index rows wider than k, invalid expert ids (their slots get no
// row; the rows past offsets[E] belong to no token), idle experts, E not a power of two, E = 1024
// (scan_totals_kernel's whole block, and the single-chunk kernel's), two chunks of a few tokens,
// no tokens, and T = 100003 at k = 6: chunks longer than
// kMinChunk (320 slots) and 1876 of them (scan_chunks_kernel's widest block, its last warp
// partly past the row). Prints one line per case; exits 1 on a mismatch. (One emulated thread per
// CUDA thread: the large case is most of the run, about a minute on a loaded machine.)
#include "emu_runtime.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.hpp"
#include "moe/problem.hpp"

// The C++ core's CPU backend (the reference here) and read_index (validate.cpp), compiled into the emulator.
#include "moe/cpu.cpp"
#include "moe/validate.cpp"

#include "emu_keywords.hpp"

namespace rudnn::moe::emu_k {
constexpr unsigned kFullMask = 0xffffffffu;
}  // namespace rudnn::moe::emu_k

// namespace rudnn::moe { namespace emu_k { ...the dispatch plan section of dispatch_cuda.cu... } }
#include "kernels.inc"
#include "moe_plan_launches.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::moe;
using i64 = std::int64_t;

constexpr std::int32_t kGarbage = 0x5a5a5a5a;

struct Case {
  const char* name;
  DType index_dtype;
  i64 tokens;
  int k, experts;
  i64 index_stride;   // >= k
  int invalid_every;  // every n-th slot gets an id outside [0, E) (0: none)
  int used_experts;   // ids drawn from [0, used_experts) (the rest stay idle)
};

template <class Idx>
void fill_indices(std::vector<Idx>& ids, const Case& c) {
  std::uint32_t state = std::uint32_t(c.tokens * 7919 + c.experts);
  for (i64 t = 0; t < c.tokens; ++t)
    for (int j = 0; j < c.k; ++j) {
      state = state * 1664525u + 1013904223u;
      const i64 slot = t * c.k + j;
      i64 e = i64((state >> 8) % std::uint32_t(c.used_experts));
      if (c.invalid_every && slot % c.invalid_every == c.invalid_every - 1)
        e = (slot / c.invalid_every) % 2 && std::is_signed_v<Idx> ? -1 : c.experts + i64(slot % 5);
      ids[t * c.index_stride + j] = Idx(e);
    }
}

template <class Idx>
bool run_typed(const Case& c) {
  const i64 T = c.tokens, N = T * c.k, E = c.experts;
  std::vector<Idx> ids(std::size_t(std::max<i64>(T * c.index_stride, 1)), Idx(0));
  fill_indices(ids, c);
  DispatchPlanProblem p;
  p.tokens = T;
  p.top_k = c.k;
  p.experts = c.experts;
  p.index_stride = c.index_stride;

  const i64 idx_shape[2] = {T, c.index_stride}, off_shape[1] = {E + 1}, rows_shape[1] = {N}, slots_shape[2] = {T, c.k};
  std::vector<std::int32_t> off_cpu(E + 1, kGarbage), tor_cpu(N, kGarbage), ros_cpu(N, kGarbage);
  MoeDispatchPlanArgs a;
  a.expert_indices = Tensor::contiguous(ids.data(), c.index_dtype, Device{}, idx_shape, 2);
  a.expert_indices.shape[1] = c.k;
  a.num_experts = c.experts;
  a.offsets = Tensor::contiguous(off_cpu.data(), DType::i32, Device{}, off_shape, 1);
  a.token_of_row = Tensor::contiguous(tor_cpu.data(), DType::i32, Device{}, rows_shape, 1);
  a.row_of_slot = Tensor::contiguous(ros_cpu.data(), DType::i32, Device{}, slots_shape, 2);
  dispatch_plan_cpu(a, p);

  const emu_k::Chunks chunks = emu_k::chunks_of(p);
  std::vector<std::int32_t> workspace(std::size_t(std::max<i64>(emu_k::workspace_ints(p), 1)), kGarbage);
  std::vector<std::int32_t> off(E + 1, kGarbage), tor(N, kGarbage), ros(N, kGarbage);
  dispatch_plan_emulated<Idx>(ids.data(), p, workspace.data(), off.data(), tor.data(), ros.data());

  const bool ok = off == off_cpu && tor == tor_cpu && ros == ros_cpu;
  std::printf("%s T=%lld k=%d E=%d chunks=%lld chunk=%lld used=%d %s\n", c.name, (long long)T, c.k, c.experts,
              (long long)chunks.count, (long long)chunks.size, E ? off_cpu[E] : 0, ok ? "ok" : "MISMATCH");
  return ok;
}

bool run_case(const Case& c) {
  switch (c.index_dtype) {
    case DType::u32: return run_typed<std::uint32_t>(c);
    case DType::i32: return run_typed<std::int32_t>(c);
    default: return run_typed<std::int64_t>(c);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";  // the small cases only (E <= 300)
  const std::vector<Case> cases = {
      {"i32_small_invalid", DType::i32, 5, 2, 3, 2, 3, 3},
      {"u32_wide_rows_idle_experts", DType::u32, 37, 4, 300, 6, 0, 200},
      {"i64_e1024_invalid", DType::i64, 300, 3, 1024, 3, 17, 1024},
      {"i64_e1024_single_chunk_invalid", DType::i64, 60, 4, 1024, 5, 7, 1024},
      {"i32_two_chunks_invalid", DType::i32, 70, 4, 5, 4, 9, 5},
      {"i32_no_tokens", DType::i32, 0, 4, 6, 4, 0, 6},
      {"u32_t100003_k6_e97_long_chunks_invalid", DType::u32, 100003, 6, 97, 6, 1001, 97},
  };
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bool ok = true;
  for (const Case& c : cases)
    if (!quick || (c.tokens * c.k < 300 && c.experts <= 300)) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
