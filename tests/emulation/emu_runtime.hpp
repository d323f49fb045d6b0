// What the host emulators of CUDA kernels share (tests/emulation/*_emu.cpp): every CUDA thread
// of a block is a std::thread, __syncthreads is named barrier 0 of every thread (EmuNamedBarrier),
// __shfl_xor_sync, __shfl_up_sync and __match_any_sync warp-wide exchanges (emu_warp_exchange:
// also what the warp-collective tensor-core and ldmatrix stand-ins of emu_sm80_atoms.hpp use),
// dynamic shared memory one poisoned buffer per block (blocks run one after another) with the
// ordering check of its asynchronous copies and tensor-core reads, and the raw-array files the
// pytest side writes and reads.
//
// Include it first (it pulls in the CUDA headers), then the kernels' own headers, then define
// the CUDA keywords away as each emulator does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <map>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;
inline thread_local int emu_lane = 0, emu_warp = 0;
inline unsigned char* emu_smem = nullptr;  // dynamic shared memory of the running block
inline unsigned long emu_block_serial = 0;  // which block is running (blocks run one after another)
inline unsigned emu_block_threads = 0;      // its thread count

struct EmuWarp {
  std::unique_ptr<std::barrier<>> barrier;
  alignas(16) unsigned char slot[32][64];  // one per lane: what it publishes to the others
};
inline std::vector<EmuWarp>* emu_warps = nullptr;

inline unsigned emu_thread_id() { return threadIdx.x + threadIdx.y * blockDim.x; }

// ---- Ordering check of shared memory: happens-before through vector clocks ----
// Every thread of the running block keeps a vector clock: how far it knows every thread, and
// every copy engine, to have got. A barrier passes clocks from the threads that arrive to the
// threads that wait (__syncthreads and named barriers: one phase's arrivals to its syncs;
// mbarriers: every arrival and completed copy before a phase completes to the waits that see that
// phase), which is what orders accesses of different threads in the memory model. Recorded per
// 16-byte chunk of the running block's shared memory: the last asynchronous write (cp.async,
// TMA) and the tensor-core reads since (ldmatrix, wgmma). Checked:
//  * a read must be ordered after the chunk's last write, and no cp.async into it may be in
//    flight (issued, its group not waited for yet);
//  * a copy must be ordered after that write and after every read since.
// A cp.async's write is stamped by its issuing thread when its group is waited for (the latest
// moment it may land); a TMA copy's by the copy engine of the mbarrier it completes on (one clock
// slot per mbarrier, emu_sm90_atoms.hpp), whose stamp the threads learn by waiting for that
// barrier. A wgmma read must be ordered after the write already at its issue and counts as a
// read until its wait (the hardware reads anywhere between). The emulators land copies and run
// wgmma as late as they may, which finds reads that come too early as wrong numbers; this check
// finds what late landing cannot see (a copy issued over a tile still being read) and orderings
// that hold only by the emulator's timing. Plain loads and stores are not seen.
constexpr unsigned kEmuCopyEngines = 16;  // clock slots after the threads' own
using EmuClock = std::vector<std::uint32_t>;
inline thread_local EmuClock emu_clock;

inline void emu_join(EmuClock& into, const EmuClock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (std::size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}
// Hands this thread's clock to a barrier (joined into `into`), then moves on: what it does next is
// not ordered before whoever acquires `into`.
inline void emu_release(EmuClock& into) {
  emu_join(into, emu_clock);
  ++emu_clock[emu_thread_id()];
}
inline void emu_acquire(const EmuClock& from) { emu_join(emu_clock, from); }

constexpr std::uint32_t kEmuNobody = ~0u;
struct EmuChunk {
  std::mutex lock;
  std::uint32_t writer = kEmuNobody, written = 0;  // the last write: thread or copy engine, and its clock
  bool landing = false;                            // a cp.async into it is in flight
  std::vector<std::pair<std::uint32_t, std::uint32_t>> reads;  // since the last write: (thread, clock)
};
inline std::unique_ptr<EmuChunk[]> emu_chunk_state;
inline std::size_t emu_chunks = 0;
inline std::atomic<long> emu_hazards{0};

inline void emu_report_hazard(const char* what, std::size_t offset, std::uint32_t other) {
  if (emu_hazards++ < 8)
    std::fprintf(stderr, "shared-memory ordering hazard: %s, bytes %zu..%zu, block %lu, thread %u against %s %u\n",
                 what, offset / 16 * 16, offset / 16 * 16 + 15, emu_block_serial, emu_thread_id(),
                 other < emu_block_threads ? "thread" : "the copy engine of mbarrier", other < emu_block_threads ? other : other - emu_block_threads);
}

// The chunk of `offset` (bytes from the block's dynamic shared memory) for `use`; an offset past
// that memory ends the run: on the GPU it would fault or hit another tile.
template <class Use>
void emu_with_chunk(std::size_t offset, Use&& use) {
  if (offset / 16 >= emu_chunks) {
    std::fprintf(stderr, "shared-memory access out of bounds: byte %zu of a block's %zu, block %lu, thread %u\n",
                 offset, emu_chunks * 16, emu_block_serial, emu_thread_id());
    std::abort();
  }
  EmuChunk& c = emu_chunk_state[offset / 16];
  std::lock_guard<std::mutex> guard(c.lock);
  use(c);
}

// Before a copy issued by this thread writes the chunk: ordered after the last write (`clock` is
// the issuer's) and after every read since.
inline void emu_check_overwrite(const EmuChunk& c, std::size_t offset) {
  const std::uint32_t me = emu_thread_id();
  if (c.landing && c.writer != me)
    emu_report_hazard("a copy issued into bytes another thread's cp.async may still land in", offset, c.writer);
  else if (c.writer != kEmuNobody && c.writer != me && emu_clock[c.writer] < c.written)
    emu_report_hazard("a copy issued over bytes whose last copy is not ordered before it", offset, c.writer);
  for (const auto& [who, when] : c.reads)
    if (who != me && emu_clock[who] < when) {
      emu_report_hazard("a copy issued over a tile another thread may still be reading", offset, who);
      break;
    }
}

// cp.async of 16 bytes to `offset`, issued now by this thread; emu_note_landed when it lands.
inline void emu_note_async_write(std::size_t offset) {
  emu_with_chunk(offset, [&](EmuChunk& c) {
    emu_check_overwrite(c, offset);
    c.writer = emu_thread_id();
    c.landing = true;
    c.reads.clear();
  });
}
inline void emu_note_landed(std::size_t offset) {
  emu_with_chunk(offset, [&](EmuChunk& c) {
    c.landing = false;
    c.written = emu_clock[c.writer = emu_thread_id()];
  });
}

// A copy engine's write (TMA), issued now by this thread, stamped `stamp` in slot `engine`.
inline void emu_note_engine_write(std::size_t offset, std::uint32_t engine, std::uint32_t stamp) {
  emu_with_chunk(offset, [&](EmuChunk& c) {
    emu_check_overwrite(c, offset);
    c.writer = engine;
    c.written = stamp;
    c.landing = false;
    c.reads.clear();
  });
}

// A read of the chunk holding `offset` by this thread that began when its clock was `at_start`
// and ends now.
inline void emu_note_read(std::size_t offset, const EmuClock& at_start) {
  emu_with_chunk(offset, [&](EmuChunk& c) {
    const std::uint32_t me = emu_thread_id();
    if (c.landing)
      emu_report_hazard("a tile read while a cp.async into it may still land", offset, c.writer);
    else if (c.writer != kEmuNobody && c.writer != me && at_start[c.writer] < c.written)
      emu_report_hazard("a tile read that is not ordered after the copy into it", offset, c.writer);
    for (auto& [who, when] : c.reads)
      if (who == me) {
        when = emu_clock[me];
        return;
      }
    c.reads.emplace_back(me, emu_clock[me]);
  });
}

// Named barriers (bar.sync / bar.arrive with a thread count; also the NamedBarrier static
// interface of the sm90a kernels) and __syncthreads, which is barrier 0 with every thread: a phase
// completes when `count` threads have arrived; bar.sync waits for the phase it arrived in and
// acquires the clocks of its arrivals. State is per running block.
struct EmuNamedBarrier {
  struct Phase {
    EmuClock clock;
    unsigned acquired = 0;
  };
  struct State {
    unsigned long block = 0;
    unsigned arrived = 0, completed = 0;
    EmuClock joined;                  // the open phase's arrivals
    std::map<unsigned, Phase> done;   // completed phases not yet acquired by all
  };
  static inline std::mutex mutex;
  static inline std::condition_variable changed;
  static inline std::map<std::uint32_t, State> states;

  static unsigned arrive_in(std::uint32_t count, std::uint32_t id) {  // the caller holds the lock
    if (id == 0 && count != emu_block_threads) {
      std::fprintf(stderr, "named barrier 0 is __syncthreads' (every thread of the block), used here with %u\n",
                   count);
      std::abort();
    }
    State& s = states[id];
    if (s.block != emu_block_serial) s = State{emu_block_serial};
    const unsigned phase = s.completed;
    emu_release(s.joined);
    if (++s.arrived == count) {
      s.arrived = 0;
      s.done[phase].clock = std::move(s.joined);
      s.joined.clear();
      ++s.completed;
      changed.notify_all();
    }
    return phase;
  }
  static void arrive(std::uint32_t count, std::uint32_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    arrive_in(count, id);
  }
  static void sync(std::uint32_t count, std::uint32_t id) {
    std::unique_lock<std::mutex> lock(mutex);
    const unsigned phase = arrive_in(count, id);
    changed.wait(lock, [&] { return states[id].completed != phase; });
    auto& done = states[id].done;
    Phase& ph = done.at(phase);
    emu_acquire(ph.clock);
    if (++ph.acquired == count) done.erase(phase);
  }
};

inline void __syncthreads() { EmuNamedBarrier::sync(emu_block_threads, 0); }

// A warp-collective step: every lane publishes `mine`, then `use(lane_value)` runs in every lane
// with lane_value(l) giving what lane l published; no lane leaves before all have used them.
template <class T, class Use>
void emu_warp_exchange(const T& mine, Use&& use) {
  static_assert(sizeof(T) <= sizeof(EmuWarp::slot[0]) && std::is_trivially_copyable_v<T>);
  EmuWarp& w = (*emu_warps)[emu_warp];
  std::memcpy(w.slot[emu_lane], &mine, sizeof(T));
  w.barrier->arrive_and_wait();
  use([&w](int lane) {
    T value;
    std::memcpy(&value, w.slot[lane], sizeof(T));
    return value;
  });
  w.barrier->arrive_and_wait();
}

// __syncwarp (the kernels pass the full mask): every lane of the warp meets. Plain stores, which
// it orders, are not seen by the ordering check, so no clocks pass.
inline void __syncwarp(unsigned = 0xffffffffu) { (*emu_warps)[emu_warp].barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  float r = 0.0f;
  emu_warp_exchange(v, [&](auto lane_value) { r = lane_value(emu_lane ^ lane_mask); });
  return r;
}

template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
  T r = v;
  emu_warp_exchange(v, [&](auto lane_value) {
    if (emu_lane >= int(delta)) r = lane_value(emu_lane - int(delta));
  });
  return r;
}

// The lanes of the warp whose v equals this lane's (every lane takes part: the kernels pass the full mask).
inline unsigned __match_any_sync(unsigned, int v) {
  unsigned same = 0;
  emu_warp_exchange(v, [&](auto lane_value) {
    for (int l = 0; l < 32; ++l)
      if (lane_value(l) == v) same |= 1u << l;
  });
  return same;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }

// CUDA's float atomicAdd for the emulated threads.
inline float atomicAdd(float* address, float value) { return std::atomic_ref<float>(*address).fetch_add(value); }
// red.global.add.v2.f32 (the test puts it in place of the kernels' inline PTX): each of the two
// elements is added atomically (the PTX ISA makes a vector reduction atomic per element only).
inline void emu_red_add_f32x2(float* address, float a, float b) {
  if (reinterpret_cast<std::uintptr_t>(address) % 8 != 0) {
    std::fprintf(stderr, "red.global.add.v2.f32 stand-in: address not 8-byte aligned\n");
    std::abort();
  }
  std::atomic_ref<float>(address[0]).fetch_add(a);
  std::atomic_ref<float>(address[1]).fetch_add(b);
}

template <class T>
std::vector<T> emu_read(const std::string& path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream f(path, std::ios::binary);
  if (n && !f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(T)))) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return v;
}

template <class T>
void emu_write(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}

// Runs kernel() for every block of `grid` with blockDim (bx, by) threads and `dyn_smem` bytes of
// dynamic shared memory, poisoned with NaN bit patterns before each block.
template <class Kernel>
void emu_launch(EmuDim3 grid, unsigned bx, unsigned by, std::size_t dyn_smem, Kernel kernel) {
  const unsigned threads = bx * by;
  // 1024-byte aligned, as the kernels declare it (CuTe's swizzled smem pointers XOR address bits).
  std::vector<unsigned char> smem(dyn_smem + 128 + 1024);
  unsigned char* aligned = smem.data() + (1024 - reinterpret_cast<std::uintptr_t>(smem.data()) % 1024) % 1024;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::fill(smem.begin(), smem.end(), 0xff);
        emu_smem = aligned;
        emu_chunks = (dyn_smem + 15) / 16;
        emu_chunk_state.reset(new EmuChunk[emu_chunks]);
        ++emu_block_serial;
        emu_block_threads = threads;
        std::vector<EmuWarp> warps((threads + 31) / 32);
        for (auto& w : warps) w.barrier = std::make_unique<std::barrier<>>(32);
        emu_warps = &warps;
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            threadIdx = {t % bx, t / bx, 0};
            blockIdx = {x, y, z};
            blockDim = {bx, by, 1};
            gridDim = grid;
            emu_lane = int(t % 32);
            emu_warp = int(t / 32);
            emu_clock.assign(threads + kEmuCopyEngines, 0);
            emu_clock[t] = 1;  // what it does before its first release: unknown to every other thread
            kernel();
          });
        for (auto& th : pool) th.join();
      }
}
