// What the host emulators of CUDA kernels share (tests/emulation/*_emu.cpp): every CUDA thread
// of a block is a std::thread, __syncthreads is a block-wide std::barrier, __shfl_xor_sync a
// warp-wide exchange (emu_warp_exchange: also what the warp-collective tensor-core and ldmatrix
// stand-ins of emu_sm80_atoms.hpp use), dynamic shared memory one poisoned buffer per block (blocks run one after
// another), and the raw-array files the pytest side writes and reads.
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
inline std::barrier<>* emu_block_barrier = nullptr;
inline unsigned long emu_block_serial = 0;  // which block is running (blocks run one after another)

struct EmuWarp {
  std::unique_ptr<std::barrier<>> barrier;
  alignas(16) unsigned char slot[32][64];  // one per lane: what it publishes to the others
};
inline std::vector<EmuWarp>* emu_warps = nullptr;

// Block-wide barriers this thread has passed in the running block: the "epoch" of its accesses.
// Two threads' accesses in the same epoch are unordered; a barrier between them orders them.
inline thread_local long emu_epoch = 0;

inline void __syncthreads() {
  emu_block_barrier->arrive_and_wait();
  ++emu_epoch;
}

// Ordering check of the asynchronous copies into shared memory (cp.async; emu_sm80_atoms.hpp)
// against the reads of the tiles they overwrite (ldmatrix, wgmma): per 16-byte chunk of the
// running block's shared memory, the epoch and thread of the latest copy issued into it and of
// the latest read of it. The hardware may land a copy at any moment between its issue and the
// wait for its group, and a wgmma may read at any moment between its issue and its wait, so a
// copy and a read of the same chunk by different threads in overlapping epochs are unordered:
// the read may see either tile. The emulator lands copies as late as it may (at the wait), which
// finds reads that come too early; this check finds copies issued too early (before every
// thread is done reading what they overwrite), which late landing cannot see.
struct EmuChunkAccess {
  std::atomic<std::uint64_t> read{0}, write{0};  // 0: none; else epoch + 1 (40 bits) | thread << 40
};
inline std::unique_ptr<EmuChunkAccess[]> emu_chunk_access;
inline std::size_t emu_chunks = 0;
inline std::atomic<long> emu_hazards{0};
constexpr std::uint64_t kEmuManyReaders = 0xffff;

inline unsigned emu_thread_id() { return threadIdx.x + threadIdx.y * blockDim.x; }
inline std::uint64_t emu_access(long epoch, std::uint64_t thread) { return std::uint64_t(epoch + 1) | thread << 40; }
inline long emu_access_epoch(std::uint64_t a) { return long(a & ((std::uint64_t(1) << 40) - 1)) - 1; }
inline std::uint64_t emu_access_thread(std::uint64_t a) { return a >> 40; }

inline void emu_report_hazard(const char* what, std::size_t chunk, std::uint64_t other) {
  if (emu_hazards++ < 8)
    std::fprintf(stderr,
                 "shared-memory ordering hazard: %s, bytes %zu..%zu, block %lu, thread %u epoch %ld against thread "
                 "%llu epoch %ld\n",
                 what, chunk * 16, chunk * 16 + 15, emu_block_serial, emu_thread_id(), emu_epoch,
                 static_cast<unsigned long long>(emu_access_thread(other)), emu_access_epoch(other));
}

// An asynchronous copy into the 16 bytes at `smem_offset`, issued now by this thread.
inline void emu_note_async_write(std::size_t smem_offset) {
  const std::size_t c = smem_offset / 16;
  if (c >= emu_chunks) return;
  const std::uint64_t read = emu_chunk_access[c].read.load();
  if (read != 0 && emu_access_epoch(read) == emu_epoch && emu_access_thread(read) != emu_thread_id())
    emu_report_hazard("cp.async issued over a tile another thread reads in the same barrier interval", c, read);
  emu_chunk_access[c].write.store(emu_access(emu_epoch, emu_thread_id()));
}

// A read of the chunk holding `smem_offset` by this thread, somewhere between epochs `first` and
// now (ldmatrix: first = now; wgmma: first = its issue).
inline void emu_note_read(std::size_t smem_offset, long first) {
  const std::size_t c = smem_offset / 16;
  if (c >= emu_chunks) return;
  const std::uint64_t write = emu_chunk_access[c].write.load();
  const long w = emu_access_epoch(write);
  if (write != 0 && w >= first && w <= emu_epoch && emu_access_thread(write) != emu_thread_id())
    emu_report_hazard("a tile read while another thread's cp.async into it may land", c, write);
  std::uint64_t old = emu_chunk_access[c].read.load(), mine;
  do {
    const bool shared = old != 0 && emu_access_epoch(old) == emu_epoch && emu_access_thread(old) != emu_thread_id();
    mine = emu_access(emu_epoch, shared ? kEmuManyReaders : emu_thread_id());
  } while (!emu_chunk_access[c].read.compare_exchange_weak(old, mine));
}

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

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  float r = 0.0f;
  emu_warp_exchange(v, [&](auto lane_value) { r = lane_value(emu_lane ^ lane_mask); });
  return r;
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
        emu_chunk_access.reset(new EmuChunkAccess[emu_chunks]);
        ++emu_block_serial;
        std::barrier<> block_barrier(threads);
        emu_block_barrier = &block_barrier;
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
            emu_epoch = 0;
            kernel();
          });
        for (auto& th : pool) th.join();
      }
}
