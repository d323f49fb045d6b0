// What the host emulators of CUDA kernels share (tests/emulation/*_emu.cpp): every CUDA thread
// of a block is a std::thread, __syncthreads is named barrier 0 of every thread (EmuNamedBarrier),
// __shfl_xor_sync, __shfl_up_sync and __match_any_sync warp-wide exchanges (emu_warp_exchange:
// also what the warp-collective tensor-core and ldmatrix stand-ins of emu_sm80_atoms.hpp use),
// dynamic shared memory one poisoned buffer per block with the ordering check of its asynchronous
// copies and tensor-core reads, thread block clusters (emu_launch_cluster: a cluster's blocks run
// at once, with the cluster barrier and peers' shared memory checked for ordering), and the
// raw-array files the pytest side writes and reads.
//
// A block's state (its shared memory, warps, barrier keys) is reached through thread_local
// pointers that each of its threads sets when it starts, so blocks of one cluster can run at the
// same time; emu_launch runs a grid's blocks one after another. `__shared__` variables are
// statics (emu_keywords.hpp), shared by every block: kernels launched as clusters keep their
// shared memory in the dynamic buffer (their tests check the source for `__shared__` statics).
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
// The calling thread's block (set by each emulated thread when it starts):
inline thread_local unsigned char* emu_smem = nullptr;   // its dynamic shared memory
inline thread_local unsigned long emu_block_serial = 0;  // which block (unique over the run)
inline thread_local unsigned emu_block_threads = 0;      // its thread count

struct EmuWarp {
  std::unique_ptr<std::barrier<>> barrier;
  alignas(16) unsigned char slot[32][64];  // one per lane: what it publishes to the others
};
inline thread_local std::vector<EmuWarp>* emu_warps = nullptr;

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
inline thread_local EmuChunk* emu_chunk_state = nullptr;  // the calling thread's block's
inline thread_local std::size_t emu_chunks = 0;
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
    unsigned arrived = 0, completed = 0;
    EmuClock joined;                  // the open phase's arrivals
    std::map<unsigned, Phase> done;   // completed phases not yet acquired by all
  };
  using Key = std::pair<unsigned long, std::uint32_t>;  // (block serial, barrier id)
  static inline std::mutex mutex;
  static inline std::condition_variable changed;
  static inline std::map<Key, State> states;

  static void forget_block(unsigned long block) {  // after its threads have ended
    std::lock_guard<std::mutex> lock(mutex);
    states.erase(states.lower_bound(Key{block, 0}), states.upper_bound(Key{block, ~0u}));
  }

  static unsigned arrive_in(std::uint32_t count, std::uint32_t id) {  // the caller holds the lock
    if (id == 0 && count != emu_block_threads) {
      std::fprintf(stderr, "named barrier 0 is __syncthreads' (every thread of the block), used here with %u\n",
                   count);
      std::abort();
    }
    State& s = states[Key{emu_block_serial, id}];
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
    State& s = states[Key{emu_block_serial, id}];  // std::map: stays valid while others insert
    changed.wait(lock, [&] { return s.completed != phase; });
    auto& done = s.done;
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

// One block's state, owned by the launch that runs it.
struct EmuBlock {
  std::vector<unsigned char> storage;
  unsigned char* smem;
  std::size_t chunks;
  std::unique_ptr<EmuChunk[]> chunk_state;
  unsigned long serial;
  unsigned threads;
  std::vector<EmuWarp> warps;

  static inline std::atomic<unsigned long> serials{0};

  // `dyn_smem` bytes of dynamic shared memory, 1024-byte aligned as the kernels declare it (CuTe's
  // swizzled smem pointers XOR address bits), poisoned with NaN bit patterns.
  EmuBlock(std::size_t dyn_smem, unsigned threads_)
      : storage(dyn_smem + 128 + 1024, 0xff), chunks((dyn_smem + 15) / 16), chunk_state(new EmuChunk[chunks]),
        serial(++serials), threads(threads_), warps((threads_ + 31) / 32) {
    smem = storage.data() + (1024 - reinterpret_cast<std::uintptr_t>(storage.data()) % 1024) % 1024;
    for (auto& w : warps) w.barrier = std::make_unique<std::barrier<>>(32);
  }
  ~EmuBlock() { EmuNamedBarrier::forget_block(serial); }

  // Makes the calling std::thread thread t of this block (a block of bx x by threads at `index`).
  void enter(unsigned t, unsigned bx, unsigned by, EmuDim3 index, EmuDim3 grid) {
    emu_smem = smem;
    emu_chunk_state = chunk_state.get();
    emu_chunks = chunks;
    emu_block_serial = serial;
    emu_block_threads = threads;
    emu_warps = &warps;
    threadIdx = {t % bx, t / bx, 0};
    blockIdx = index;
    blockDim = {bx, by, 1};
    gridDim = grid;
    emu_lane = int(t % 32);
    emu_warp = int(t / 32);
    emu_clock.assign(threads + kEmuCopyEngines, 0);
    emu_clock[t] = 1;  // what it does before its first release: unknown to every other thread
  }
};

// Runs kernel() for every block of `grid` with blockDim (bx, by) threads and `dyn_smem` bytes of
// dynamic shared memory, one block after another.
template <class Kernel>
void emu_launch(EmuDim3 grid, unsigned bx, unsigned by, std::size_t dyn_smem, Kernel kernel) {
  const unsigned threads = bx * by;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        EmuBlock block(dyn_smem, threads);
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            block.enter(t, bx, by, EmuDim3{x, y, z}, grid);
            kernel();
          });
        for (auto& th : pool) th.join();
      }
}

// ---- Thread block clusters (sm_90) ----
// A cluster's blocks run at the same time (clusters one after another). The stand-ins of the
// kernels' cluster pieces (norm/kernels.cuh: cluster_rank, cluster_size, cluster_barrier,
// publish_to_cluster, read_from_cluster) are checked for ordering by cluster-barrier epochs (how
// many cluster barriers a thread has passed; every thread of a cluster is in the same epoch
// between two barriers): a slot published for the peers (a plain shared store in the kernel) must
// be published in an earlier epoch than any read of it, must not be rewritten in an epoch in which
// it is read, and a block must pass a cluster barrier after the last read of its memory by a peer
// before it exits (its shared memory goes away with it). Only the clusters' x dimension is
// emulated (the kernels' clusters are (C, 1, 1)).
struct EmuCluster {
  struct Slot {
    bool published = false, read = false;
    unsigned published_in = 0, last_read_in = 0;
  };
  unsigned size;
  std::barrier<> barrier;
  std::vector<EmuBlock*> blocks;
  std::mutex lock;
  std::vector<std::map<std::size_t, Slot>> slots;  // per rank, by byte offset in its shared memory
  std::vector<unsigned> ended_in;                  // per rank: the epoch its threads ended in

  EmuCluster(unsigned size_, unsigned threads)
      : size(size_), barrier(std::ptrdiff_t(size_) * threads), slots(size_), ended_in(size_, 0) {}
};
inline thread_local EmuCluster* emu_cluster = nullptr;
inline thread_local unsigned emu_cluster_rank = 0, emu_cluster_epoch = 0;

inline void emu_cluster_hazard(const char* what, unsigned rank, std::size_t offset) {
  if (emu_hazards++ < 8)
    std::fprintf(stderr, "cluster ordering hazard: %s, rank %u byte %zu, read or written by rank %u thread %u\n", what,
                 rank, offset, emu_cluster_rank, emu_thread_id());
}

inline unsigned emu_cluster_ctarank() { return emu_cluster_rank; }
inline unsigned emu_cluster_nctarank() { return emu_cluster->size; }
// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: every thread of the cluster.
inline void emu_cluster_sync() {
  emu_cluster->barrier.arrive_and_wait();
  ++emu_cluster_epoch;
}

inline std::size_t emu_cluster_offset(const void* local) {
  const std::size_t offset = std::size_t(static_cast<const unsigned char*>(local) - emu_smem);
  if (offset + 4 > emu_chunks * 16) {
    std::fprintf(stderr, "cluster shared-memory access out of bounds: byte %zu of a block's %zu\n", offset,
                 emu_chunks * 16);
    std::abort();
  }
  return offset;
}

// A store into this block's shared memory for the peers to read after a cluster barrier.
template <class T>
void emu_cluster_publish(T* local, T value) {
  const std::size_t offset = emu_cluster_offset(local);
  {
    std::lock_guard<std::mutex> guard(emu_cluster->lock);
    EmuCluster::Slot& s = emu_cluster->slots[emu_cluster_rank][offset];
    if (s.read && s.last_read_in == emu_cluster_epoch)
      emu_cluster_hazard("a slot rewritten in an epoch in which a peer reads it", emu_cluster_rank, offset);
    s.published = true;
    s.published_in = emu_cluster_epoch;
  }
  *local = value;
}

// The value at `local`'s offset in the shared memory of the cluster's block `rank`.
template <class T>
T emu_cluster_read(const T* local, unsigned rank) {
  const std::size_t offset = emu_cluster_offset(local);
  if (rank >= emu_cluster->size) {
    std::fprintf(stderr, "cluster shared-memory read of rank %u in a cluster of %u\n", rank, emu_cluster->size);
    std::abort();
  }
  std::lock_guard<std::mutex> guard(emu_cluster->lock);
  EmuCluster::Slot& s = emu_cluster->slots[rank][offset];
  if (!s.published || s.published_in >= emu_cluster_epoch)
    emu_cluster_hazard("a slot read that no cluster barrier orders after its publication", rank, offset);
  s.read = true;
  s.last_read_in = std::max(s.last_read_in, emu_cluster_epoch);
  T value;
  std::memcpy(&value, emu_cluster->blocks[rank]->smem + offset, sizeof(T));
  return value;
}

// Runs kernel() for every block of `grid` in clusters of (cluster_x, 1, 1) blocks (grid.x a
// multiple of cluster_x), the blocks of a cluster at the same time, each with blockDim (bx, by)
// threads and `dyn_smem` bytes of dynamic shared memory. Kernels launched so must not use
// mbarriers (EmuMbarrier's registry is per running block) or `__shared__` statics.
template <class Kernel>
void emu_launch_cluster(EmuDim3 grid, unsigned cluster_x, unsigned bx, unsigned by, std::size_t dyn_smem,
                        Kernel kernel) {
  if (cluster_x == 0 || grid.x % cluster_x != 0) {
    std::fprintf(stderr, "cluster launch: grid.x %u is not a multiple of the cluster's %u blocks\n", grid.x, cluster_x);
    std::abort();
  }
  const unsigned threads = bx * by;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x0 = 0; x0 < grid.x; x0 += cluster_x) {
        EmuCluster cluster(cluster_x, threads);
        std::vector<std::unique_ptr<EmuBlock>> blocks;
        for (unsigned r = 0; r < cluster_x; ++r) {
          blocks.push_back(std::make_unique<EmuBlock>(dyn_smem, threads));
          cluster.blocks.push_back(blocks.back().get());
        }
        std::vector<std::thread> pool;
        for (unsigned r = 0; r < cluster_x; ++r)
          for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([&, r, t] {
              blocks[r]->enter(t, bx, by, EmuDim3{x0 + r, y, z}, grid);
              emu_cluster = &cluster;
              emu_cluster_rank = r;
              emu_cluster_epoch = 0;
              kernel();
              std::lock_guard<std::mutex> guard(cluster.lock);
              cluster.ended_in[r] = std::max(cluster.ended_in[r], emu_cluster_epoch);
              emu_cluster = nullptr;
            });
        for (auto& th : pool) th.join();
        for (unsigned r = 0; r < cluster_x; ++r)
          for (const auto& [offset, slot] : cluster.slots[r])
            if (slot.read && slot.last_read_in >= cluster.ended_in[r]) {
              emu_cluster_rank = r;
              emu_cluster_hazard("a block exited with no cluster barrier after a peer's read of its memory", r, offset);
              break;
            }
      }
}
