// Host stand-ins for the sm90a (Hopper) atoms of the flash kernels and of the chunked gated delta
// forward's state kernel, written from the PTX ISA (as emu_sm80_atoms.hpp, which this includes):
//   EmuGmma<Real, In, N, kRegisterA, kMajorB, kMajorA>
//     wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}: A (64 x 16) K-major or MN-major from
//     shared memory through its matrix descriptor (SS) or from the warpgroup's registers (RS, the
//     m16n8k16-style fragment of each warp's 16 rows), B (N x 16) from shared memory, K-major or
//     MN-major, through its descriptor; 128-byte swizzle. Every thread computes its own N / 2
//     accumulators, from shared memory as it is when the kernel waits for the group
//     (emu_warpgroup_wait), the latest moment the hardware may read it;
//   EmuMbarrier  mbarrier init / arrive / expected transaction bytes / phase-parity wait, with
//     the clocks of the ordering check (emu_runtime.hpp, which also has the named barriers);
//     setmaxnreg and the barrier-init fence are no-ops;
//   emu_tma_load_4d, emu_encode_tma  the TMA tile copy (128-byte swizzle, zeros outside the
//     tensor, bytes completed on an mbarrier, its writes stamped by the barrier's copy engine)
//     and its descriptor.
// Shared-memory addresses reach the descriptors through cute::cast_smem_ptr_to_uint, which here
// (through the NVVM hook CuTe already has) gives the offset from the running block's shared
// memory, so the descriptors hold the offsets the kernel would see on the GPU with its
// 1024-byte aligned dynamic shared memory.
#pragma once

#include <chrono>

#include "emu_runtime.hpp"

// Must precede CuTe's headers.
#define CUTE_NVVM_GET_SMEM_POINTER_ACTIVATED 1
inline std::uint32_t __nvvm_get_smem_pointer(const void* p) {
  return std::uint32_t(static_cast<const unsigned char*>(p) - emu_smem);
}

#include "emu_sm80_atoms.hpp"

#include "attention/tma.hpp"

#include <cute/arch/mma_sm90_gmma.hpp>
#include <functional>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

// Byte offset of element (mn, k) of a 16-bit operand from its wgmma matrix descriptor (PTX ISA,
// "Matrix Descriptor Format": start address bits 0-13, leading byte offset bits 16-29, stride byte
// offset bits 32-45, all in 16-byte units; base offset bits 49-51; layout type bits 62-63, 1 =
// 128-byte swizzle, 2 = 64-byte), for the canonical swizzled layouts of row width W (128 or 64
// bytes):
//   K-major   rows (M or N) W bytes apart in groups of 8, the groups `stride` apart; the 16 k of
//             one wgmma are 32 contiguous bytes of a row;
//   MN-major  W / 2 contiguous elements along M or N, the next W / 2 `leading` bytes on; k rows
//             W bytes apart in groups of 8, the groups `stride` apart.
// The swizzle XORs the 16-byte chunk index of an address (bits 4-6, or 4-5 for W = 64) with its
// bits 7-9 (7-8).
inline std::uint32_t emu_gmma_offset(std::uint64_t desc, bool mn_major, int mn, int k) {
  const std::uint32_t start = std::uint32_t(desc & 0x3fff) << 4;
  const std::uint32_t leading = std::uint32_t((desc >> 16) & 0x3fff) << 4;
  const std::uint32_t stride = std::uint32_t((desc >> 32) & 0x3fff) << 4;
  const unsigned base_offset = unsigned(desc >> 49) & 7u, layout = unsigned(desc >> 62);
  if ((layout != 1 && layout != 2) || base_offset != 0) {
    std::fprintf(stderr, "wgmma stand-in: only the 128- and 64-byte swizzles with base offset 0 are emulated\n");
    std::abort();
  }
  const std::uint32_t width = layout == 1 ? 128 : 64, per_row = width / 2;
  const std::uint32_t addr =
      mn_major ? start + std::uint32_t(mn) / per_row * leading + std::uint32_t(k / 8) * stride +
                     std::uint32_t(k % 8) * width + 2 * (std::uint32_t(mn) % per_row)
               : start + std::uint32_t(mn / 8) * stride + std::uint32_t(mn % 8) * width + 2 * std::uint32_t(k);
  const std::uint32_t row_bits = layout == 1 ? 7u : 3u;
  return addr ^ (((addr >> 7) & row_bits) << 4);
}

// The calling thread's wgmma operations: issued since the last commit, then committed groups.
inline thread_local std::vector<std::function<void()>> emu_wgmma_open;
inline thread_local std::vector<std::vector<std::function<void()>>> emu_wgmma_committed;
// This thread's accumulator registers that a wgmma in flight (issued, its group not waited for)
// writes: address -> (how many such wgmma, the bits the register must hold when the next of them
// runs). The hardware may read and write them at any moment until the wait, so the kernel must
// not write them in between (ptxas would serialize the wgmma: C7514); the emulator runs the
// products at the wait, so such a write would otherwise go unseen, folded into the product.
inline thread_local std::map<const float*, std::pair<int, std::uint32_t>> emu_wgmma_in_flight;
inline std::uint32_t emu_float_bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

template <class Real, class In, int N, bool kRegisterA, cute::SM90::GMMA::Major kMajorB,
          cute::SM90::GMMA::Major kMajorA = cute::SM90::GMMA::Major::K>
struct EmuGmma : Real {
  static constexpr bool kMnMajorA = kMajorA == cute::SM90::GMMA::Major::MN;
  static float smem_element(std::uint64_t desc, bool mn_major, int mn, int k) {
    std::uint16_t bits;
    std::memcpy(&bits, emu_smem + emu_gmma_offset(desc, mn_major, mn, k), 2);
    return float(In::bitcast(bits));
  }

  // Accumulator i of a thread (PTX ISA, wgmma D fragment for m64nNk16): warp w of the warpgroup
  // owns rows 16w .. 16w + 15; i = v0 + 2 v1 + 4 j is row 16w + lane/4 + 8 v1, column
  // 8 j + 2 (lane % 4) + v0. A from registers: per warp the m16n8k16 A fragment of its 16 rows
  // (a0..a3 = (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..), lower column first).
  // The registers are read at issue (a warp exchange: the thread's two rows of A); shared memory
  // and the accumulators only when the group is waited for (emu_warpgroup_wait), as late as the
  // hardware may, so reading an accumulator early or overwriting an operand's shared memory
  // before the wait shows up as wrong results; writing an accumulator before the wait is
  // reported (emu_wgmma_in_flight).
  static void issue(const std::uint32_t (&a)[4], std::uint64_t desc_a, std::uint64_t desc_b, float* const* d,
                    cute::SM90::GMMA::ScaleOut scale_d) {
    const int w = emu_warp % 4, lane = emu_lane;
    std::array<float, 2 * 16> a_rows{};  // RS: A(lane/4 (+8), k) of this warp's rows
    if constexpr (kRegisterA) {
      struct Fragment {
        std::uint32_t a[4];
      };
      emu_warp_exchange(Fragment{{a[0], a[1], a[2], a[3]}}, [&](auto lane_value) {
        for (int half = 0; half < 2; ++half)
          for (int k = 0; k < 16; ++k) {
            const int r = lane / 4 + 8 * half;
            const std::uint32_t reg = lane_value((r % 8) * 4 + (k % 8) / 2).a[r / 8 + 2 * (k / 8)];
            a_rows[half * 16 + k] = float(In::bitcast(std::uint16_t(k % 2 ? reg >> 16 : reg & 0xffffu)));
          }
      });
    }
    std::array<float*, N / 2> acc;
    for (int i = 0; i < N / 2; ++i) {
      acc[i] = d[i];
      auto [entry, fresh] = emu_wgmma_in_flight.try_emplace(acc[i], 0, emu_float_bits(*acc[i]));
      ++entry->second.first;
    }
    // The warpgroup's reads of its shared-memory operands, noted once (by its first thread: every
    // thread of a warpgroup that hands the operands on waits for the group first).
    EmuClock issued;
    if (emu_thread_id() % 128 == 0) issued = emu_clock;
    emu_wgmma_open.push_back([=] {
      if (emu_thread_id() % 128 == 0)
        for (int k = 0; k < 16; ++k) {
          for (int mn = 0; mn < N; ++mn)
            emu_note_read(emu_gmma_offset(desc_b, kMajorB == cute::SM90::GMMA::Major::MN, mn, k), issued);
          if (!kRegisterA)
            for (int m = 0; m < 64; ++m) emu_note_read(emu_gmma_offset(desc_a, kMnMajorA, m, k), issued);
        }
      for (int i = 0; i < N / 2; ++i) {
        auto entry = emu_wgmma_in_flight.find(acc[i]);
        if (emu_float_bits(*acc[i]) != entry->second.second) {
          std::fprintf(stderr, "wgmma accumulator written while its wgmma was in flight: thread %u, register %d\n",
                       emu_thread_id(), i);
          std::abort();
        }
        const int half = (i / 2) % 2, row = 16 * w + lane / 4 + 8 * half;
        const int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        float sum = scale_d == cute::SM90::GMMA::ScaleOut::Zero ? 0.0f : *acc[i];
        for (int k = 0; k < 16; ++k) {
          const float a_value = kRegisterA ? a_rows[half * 16 + k] : smem_element(desc_a, kMnMajorA, row, k);
          sum += a_value * smem_element(desc_b, kMajorB == cute::SM90::GMMA::Major::MN, col, k);
        }
        *acc[i] = sum;
        entry->second.second = emu_float_bits(sum);
        if (--entry->second.first == 0) emu_wgmma_in_flight.erase(entry);
      }
    });
  }

  // The real atoms' fma takes (desc_a | a0..a3, desc_b, d00..d(N/2-1), scale_d); CuTe calls it
  // through detail::explode, so one generic callable serves every N.
  struct Fma {
    template <class... Args>
    void operator()(Args&&... args) const {
      static_assert(sizeof...(Args) == (kRegisterA ? 4 : 1) + 1 + N / 2 + 1, "unexpected wgmma operands");
      std::uint32_t a[4] = {};
      std::uint64_t desc[2] = {};
      float* d[N / 2];
      cute::SM90::GMMA::ScaleOut scale_d = cute::SM90::GMMA::ScaleOut::One;
      int n_a = 0, n_desc = 0, n_d = 0;
      auto take = [&](auto&& arg) {
        using T = std::decay_t<decltype(arg)>;
        if constexpr (std::is_same_v<T, float>)
          d[n_d++] = &arg;
        else if constexpr (std::is_same_v<T, cute::SM90::GMMA::ScaleOut>)
          scale_d = arg;
        else if constexpr (std::is_same_v<T, std::uint32_t>)
          a[n_a++] = arg;
        else
          desc[n_desc++] = static_cast<std::uint64_t>(arg);
      };
      (take(std::forward<Args>(args)), ...);
      issue(a, kRegisterA ? 0 : desc[0], kRegisterA ? desc[0] : desc[1], d, scale_d);
    }
  };
  static constexpr Fma fma{};
};

namespace cute {
template <class Real, class In, int N, bool kRegisterA, SM90::GMMA::Major kMajorB, SM90::GMMA::Major kMajorA>
struct MMA_Traits<EmuGmma<Real, In, N, kRegisterA, kMajorB, kMajorA>> : MMA_Traits<Real> {};
}  // namespace cute

// The names the kernel's atoms are replaced by.
namespace emu_gmma {
using Major = cute::SM90::GMMA::Major;
namespace G = cute::SM90::GMMA;
}  // namespace emu_gmma
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaSS32F16 = EmuGmma<emu_gmma::G::MMA_64x32x16_F32F16F16_SS<A, B>, cute::half_t, 32, false, B, A>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaSS32BF16 = EmuGmma<emu_gmma::G::MMA_64x32x16_F32BF16BF16_SS<A, B>, cute::bfloat16_t, 32, false, B, A>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaSS64F16 = EmuGmma<emu_gmma::G::MMA_64x64x16_F32F16F16_SS<A, B>, cute::half_t, 64, false, B, A>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaSS64BF16 = EmuGmma<emu_gmma::G::MMA_64x64x16_F32BF16BF16_SS<A, B>, cute::bfloat16_t, 64, false, B, A>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaSS128F16 = EmuGmma<emu_gmma::G::MMA_64x128x16_F32F16F16_SS<A, B>, cute::half_t, 128, false, B, A>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaSS128BF16 = EmuGmma<emu_gmma::G::MMA_64x128x16_F32BF16BF16_SS<A, B>, cute::bfloat16_t, 128, false, B, A>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS64F16 = EmuGmma<emu_gmma::G::MMA_64x64x16_F32F16F16_RS<A, B>, cute::half_t, 64, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS64BF16 = EmuGmma<emu_gmma::G::MMA_64x64x16_F32BF16BF16_RS<A, B>, cute::bfloat16_t, 64, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS96F16 = EmuGmma<emu_gmma::G::MMA_64x96x16_F32F16F16_RS<A, B>, cute::half_t, 96, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS96BF16 = EmuGmma<emu_gmma::G::MMA_64x96x16_F32BF16BF16_RS<A, B>, cute::bfloat16_t, 96, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS128F16 = EmuGmma<emu_gmma::G::MMA_64x128x16_F32F16F16_RS<A, B>, cute::half_t, 128, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS128BF16 = EmuGmma<emu_gmma::G::MMA_64x128x16_F32BF16BF16_RS<A, B>, cute::bfloat16_t, 128, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS192F16 = EmuGmma<emu_gmma::G::MMA_64x192x16_F32F16F16_RS<A, B>, cute::half_t, 192, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS192BF16 = EmuGmma<emu_gmma::G::MMA_64x192x16_F32BF16BF16_RS<A, B>, cute::bfloat16_t, 192, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS256F16 = EmuGmma<emu_gmma::G::MMA_64x256x16_F32F16F16_RS<A, B>, cute::half_t, 256, true, B>;
template <emu_gmma::Major A, emu_gmma::Major B>
using EmuGmmaRS256BF16 = EmuGmma<emu_gmma::G::MMA_64x256x16_F32BF16BF16_RS<A, B>, cute::bfloat16_t, 256, true, B>;

// mbarrier (the ClusterBarrier / ClusterTransactionBarrier static interface the kernels use: init,
// arrive, arrive with an expected transaction count, wait on a phase parity), kept beside shared
// memory by address. A phase completes when `count` arrivals have happened and the transaction
// bytes expected in it have all completed (TMA copies complete theirs with complete_tx);
// wait(parity) returns once the phase with that parity has completed, i.e. while the current
// phase's parity differs (so a wait for parity 1 on a fresh barrier passes at once).
// Ordering (emu_runtime.hpp): arrivals release the thread's clock into the barrier, a completed
// copy its copy engine's; a wait acquires what the barrier held when its last phase completed.
// Each barrier has its own copy engine (clock slot emu_block_threads + its number in the block):
// the copies completing on it are ordered for whoever waits for it, and for no one else.
struct EmuMbarrier {
  struct State {
    unsigned count = 0, pending = 0, completed = 0;
    long long tx = 0;  // expected bytes not yet completed
    std::uint32_t engine = 0;
    EmuClock joined, at_completion, engine_clock;
  };
  static inline std::mutex mutex;
  static inline std::condition_variable changed;
  static inline std::map<const void*, State> states;
  static inline unsigned long block = 0;
  static inline std::uint32_t engines = 0;  // of the running block
  static inline unsigned long completions = 0;  // phases completed by any mbarrier: the run's progress
  // A wait during which no mbarrier completes a phase for this long is taken for a deadlock (the
  // run stops, naming it, instead of running into the test's time limit). EMU_STALL_SECONDS
  // overrides the 120 s; an emulated CTA completes phases every few milliseconds.
  static int stall_seconds() {
    static const int seconds = [] {
      const char* s = std::getenv("EMU_STALL_SECONDS");
      return s != nullptr && std::atoi(s) > 0 ? std::atoi(s) : 120;
    }();
    return seconds;
  }

  static void init(const std::uint64_t* bar, std::uint32_t count) {
    std::lock_guard<std::mutex> lock(mutex);
    if (emu_cluster != nullptr) {
      std::fprintf(stderr, "mbarrier stand-in: not emulated under a cluster launch (its registry is per running block)\n");
      std::abort();
    }
    if (block != emu_block_serial) block = emu_block_serial, engines = 0;
    if (engines == kEmuCopyEngines) {
      std::fprintf(stderr, "mbarrier stand-in: more than %u barriers in a block\n", kEmuCopyEngines);
      std::abort();
    }
    states[bar] = State{count, count, 0, 0, emu_block_threads + engines++};
  }
  static void complete_phase_if_done(State& s) {  // the caller holds the lock
    if (s.pending == 0 && s.tx == 0) {
      s.pending = s.count;
      ++s.completed;
      ++completions;
      s.at_completion = s.joined;
      changed.notify_all();
    }
  }
  static void arrive(const std::uint64_t* bar) {
    std::lock_guard<std::mutex> lock(mutex);
    State& s = states.at(bar);
    if (s.pending == 0) {
      std::fprintf(stderr, "mbarrier stand-in: more arrivals than its count in one phase\n");
      std::abort();
    }
    --s.pending;
    emu_release(s.joined);
    complete_phase_if_done(s);
  }
  static void arrive_and_expect_tx(const std::uint64_t* bar, std::uint32_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      states.at(bar).tx += bytes;
    }
    arrive(bar);
  }
  // A copy issued by this thread that completes on `bar`: its copy engine's slot and the stamp of
  // its writes.
  static std::pair<std::uint32_t, std::uint32_t> issue_copy(const std::uint64_t* bar) {
    std::lock_guard<std::mutex> lock(mutex);
    State& s = states.at(bar);
    emu_join(s.engine_clock, emu_clock);  // the copy starts after what its issuer knows
    return {s.engine, ++s.engine_clock[s.engine]};
  }
  static void complete_tx(const std::uint64_t* bar, std::uint32_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    State& s = states.at(bar);
    emu_join(s.joined, s.engine_clock);
    s.tx -= bytes;
    complete_phase_if_done(s);
  }
  // A wait that finds its phase pending needs the next completion. Should the barrier complete
  // twice before the waiter looks again, the hardware's waiter sees its parity pending once more
  // and waits for good (a thread left two phases behind, as a producer lane that no __syncwarp
  // holds back): the stand-in stops the run there, naming it, instead of hanging.
  static void wait(const std::uint64_t* bar, std::uint32_t parity) {
    std::unique_lock<std::mutex> lock(mutex);
    const unsigned at_start = states.at(bar).completed;
    auto done = [&] {
      const unsigned completed = states.at(bar).completed;
      if ((at_start & 1u) == (parity & 1u) && completed - at_start >= 2) {
        std::fprintf(stderr, "mbarrier stand-in: a wait for parity %u missed its phase (the barrier completed "
                             "%u times while the thread waited)\n", parity & 1u, completed - at_start);
        std::abort();
      }
      return (completed & 1u) != (parity & 1u);
    };
    unsigned long seen = completions;
    int idle = 0;
    while (!changed.wait_for(lock, std::chrono::seconds(1), done)) {
      idle = completions == seen ? idle + 1 : 0;
      seen = completions;
      if (idle >= stall_seconds()) {
        std::fprintf(stderr, "mbarrier stand-in: a wait for parity %u saw no mbarrier complete a phase for %d s "
                             "(a deadlock)\n", parity & 1u, idle);
        std::abort();
      }
    }
    emu_acquire(states.at(bar).at_completion);
  }
};

// cp.async.bulk.tensor.4d (TMA) into shared memory with the 128-byte swizzle, completing its
// bytes on an mbarrier. The descriptor holds what the host gave the encoder
// (rudnn::attention::TmaTensor4d, stored by emu_encode_tma in place of the driver's opaque
// format). Box element (i, j) (i along dims[0]) goes to byte j * box[0] * 2 + i * 2 of the box,
// whose 16-byte chunk index (bits 4-6) is XORed with bits 7-9 (the box starts 1024-aligned);
// elements outside the tensor are zeros; the full box's bytes complete on the barrier.
inline CUtensorMap emu_encode_tma(const rudnn::attention::TmaTensor4d& t) {
  static_assert(sizeof(rudnn::attention::TmaTensor4d) <= sizeof(CUtensorMap), "descriptor stand-in too big");
  CUtensorMap map{};
  std::memcpy(&map, &t, sizeof t);
  return map;
}
inline void emu_tma_load_4d(const void* desc, std::uint64_t* mbar, std::uint64_t, void* smem, std::int32_t c0,
                            std::int32_t c1, std::int32_t c2, std::int32_t c3) {
  rudnn::attention::TmaTensor4d t;
  std::memcpy(&t, desc, sizeof t);
  if (reinterpret_cast<std::uintptr_t>(smem) % 1024 != 0 || t.box[2] != 1 || t.box[3] != 1 || t.box[0] * 2 != 128) {
    std::fprintf(stderr, "TMA stand-in: only 1024-aligned 2-D boxes of 128-byte rows are emulated\n");
    std::abort();
  }
  const auto [engine, stamp] = EmuMbarrier::issue_copy(mbar);
  const std::size_t box_offset = std::size_t(static_cast<unsigned char*>(smem) - emu_smem);
  for (std::uint32_t chunk = 0; chunk < t.box[0] * t.box[1] * 2 / 16; ++chunk)
    emu_note_engine_write(box_offset + 16 * chunk, engine, stamp);
  const std::int64_t crd[4] = {c0, c1, c2, c3};
  const auto* base = static_cast<const unsigned char*>(t.base);
  auto* dst = static_cast<unsigned char*>(smem);
  for (std::uint32_t j = 0; j < t.box[1]; ++j) {
    for (std::uint32_t i = 0; i < t.box[0]; ++i) {
      const std::int64_t x = crd[0] + i, y = crd[1] + j;
      std::uint16_t value = 0;
      if (x >= 0 && y >= 0 && crd[2] >= 0 && crd[3] >= 0 && std::uint64_t(x) < t.dims[0] &&
          std::uint64_t(y) < t.dims[1] && std::uint64_t(crd[2]) < t.dims[2] && std::uint64_t(crd[3]) < t.dims[3])
        std::memcpy(&value, base + x * 2 + y * t.strides_bytes[0] + crd[2] * t.strides_bytes[1] +
                                crd[3] * t.strides_bytes[2], 2);
      const std::uint32_t offset = j * t.box[0] * 2 + i * 2;
      std::memcpy(dst + (offset ^ (((offset >> 7) & 7u) << 4)), &value, 2);
    }
  }
  EmuMbarrier::complete_tx(mbar, t.box[0] * t.box[1] * 2);
}

// setmaxnreg and fence.mbarrier_init: nothing to do on the host.
template <std::uint32_t kRegisters>
void emu_setmaxnreg() {}
inline void emu_fence_barrier_init() {}

// wgmma.commit_group closes the open group; wgmma.wait_group N completes all but the N most
// recent committed groups, oldest first. wgmma.fence and fence.proxy.async: nothing to do.
inline void emu_warpgroup_arrive() {}
inline void emu_warpgroup_commit_batch() {
  emu_wgmma_committed.push_back(std::move(emu_wgmma_open));
  emu_wgmma_open.clear();
}
template <int N>
void emu_warpgroup_wait() {
  while (emu_wgmma_committed.size() > std::size_t(N)) {
    for (auto& op : emu_wgmma_committed.front()) op();
    emu_wgmma_committed.erase(emu_wgmma_committed.begin());
  }
}
inline void emu_fence_view_async_shared() {}
