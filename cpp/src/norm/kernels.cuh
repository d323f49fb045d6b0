// Private building blocks of the CUDA LayerNorm / RMSNorm / softmax kernels
// (norm_fwd_cuda.cu, norm_bwd_cuda.cu, softmax_cuda.cu; host helpers in norm_cuda.cu).
//
// Every kernel of this family has the same shape (QuACK-style memory-bound kernels):
//   * A row is cut into chunks of VEC elements; VEC * sizeof(T) = 16 bytes on the vector path
//     (all row starts and strides 16-byte aligned, H % VEC == 0; checked on the host), VEC = 1
//     otherwise, so any H works.
//   * A *team* of `team.size` threads owns one row at a time. Thread `rank` of the team owns the
//     chunks rank, rank + size, rank + 2*size, ... (coalesced: a warp touches consecutive 16-byte
//     pieces). Team sizes are powers of two from 1 to 1024: sub-warp teams for short rows (several
//     rows per warp), multi-warp teams for long rows. A block holds `team.count` teams.
//   * "regs" kernels keep a thread's chunks in registers between the passes over the row (at most
//     kSlots chunks per thread, so a row of up to kSlots * 1024 chunks; kPairSlots for kernels that
//     hold two row tensors); "stream" kernels (longer rows) read the row twice from global memory,
//     the second read mostly from L2.
//   * Statistics are float32; reductions are warp butterflies, then shared memory across warps.
//   * Rows are spread over a persistent grid: block b handles the contiguous rows
//     [b * rows_per_block, (b + 1) * rows_per_block), its teams taking them in turn.
//
// The 16-byte accesses go through CuTe: a row is a cute::Tensor of shape (VEC, chunks), a thread's
// registers are a cute::Tensor of shape (VEC, kSlots), and a chunk (one VEC-element column) is
// recast to 16-byte pieces for single 128-bit loads and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <cute/tensor.hpp>
#include <type_traits>
#include <utility>

#include "core/convert.cuh"
#include "core/rows.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::norm::kern {

using i64 = std::int64_t;

// ---------------------------------------------------------------------------------------------
// Tuning constants shared by the host planner and the kernels.

constexpr int kSlots = 4;              // chunks per thread kept in registers ("regs" kernels, one row tensor)
constexpr int kPairSlots = 2;          // the same for kernels that keep two row tensors (dy and x, dy and y)
constexpr int kMaxTeam = 1024;         // largest team: one whole block
constexpr int kStreamThreads = 512;    // block (= team) size of the "stream" kernels
constexpr int kStreamUnroll = 4;       // chunks in flight per thread per step in "stream" kernels
constexpr int kPairStreamUnroll = 2;   // the same for kernels that read two row tensors
constexpr int kStreamMinBlocks = 2;    // stream kernels: >= 2 blocks per SM (<= 64 registers)
constexpr int kRegsBlockTarget = 256;  // threads per block for short rows (several teams per block)
constexpr int kPipelinedMinBlocks = 2; // pipelined norm kernels (teams of <= 256 threads): >= 2 such blocks per SM
                                       // (<= 128 registers for the weight/bias cache and the next row)
constexpr int kFusedBlockMax = 512;    // fused norm backward: two such blocks per SM at <= 64 registers
                                       // (a team of 1024 threads makes a block of its own)
constexpr int kWgradColumns = 32;      // columns per block of the column-reduction kernel
constexpr int kWgradRowLanes = 8;      // row lanes per block of the column-reduction kernel
constexpr int kReduceThreads = 256;    // threads per block of the split-reduction kernel
constexpr int kClusterThreads = 512;   // cluster kernels: threads per block (kSlots or kPairSlots chunks each)
constexpr int kMaxCluster = 8;         // cluster kernels: blocks per row at most (the portable cluster size)
constexpr int kClusterScratch = 2 * 32;  // cluster kernels: block-reduction scratch (floats; two sums at most)
constexpr std::size_t kClusterSmem = (kClusterScratch + 2 * 2) * sizeof(float);  // + 2 exchange slots of 2 sums
constexpr i64 kMaxGridY = 65535;       // grid.y limit (the cluster kernels' row groups)

// Elements of T in one 16-byte access.
template <class T>
inline constexpr int kVec16 = 16 / int(sizeof(T));

// ---------------------------------------------------------------------------------------------
// Element conversions: all arithmetic is float32, results are rounded once to T.

using core::from_float;
using core::to_float;

// exp for softmax. float32 outputs get the accurate expf; 16-bit outputs are rounded to 8 or 11
// mantissa bits afterwards, so the one-instruction ex2.approx path (about 2 ulp of float32) is
// invisible there and halves the arithmetic per element.
template <class T>
__device__ __forceinline__ float softmax_exp(float v) {
  if constexpr (sizeof(T) == 4) {
    return expf(v);
  } else {
    return exp2f(v * 1.4426950408889634f);
  }
}

// ---------------------------------------------------------------------------------------------
// CuTe views for 16-byte accesses.

// Row (or parameter vector) `row` seen as VEC-element chunks: shape (VEC, chunks), stride (1, VEC).
template <int VEC, class T>
__device__ __forceinline__ auto chunked_row(T* row, i64 chunks) {
  return cute::make_tensor(cute::make_gmem_ptr(row), cute::make_layout(cute::make_shape(cute::Int<VEC>{}, chunks)));
}

// Per-thread register storage for N chunks: shape (VEC, N); column s is chunk slot s.
template <class T, int VEC, int N>
__device__ __forceinline__ auto chunk_registers() {
  return cute::make_tensor<T>(cute::Shape<cute::Int<VEC>, cute::Int<N>>{});
}

// Chunks move in pieces of up to 16 bytes (uint4 for full 16-byte chunks): CuTe recasts of the
// chunk tensors. Loads are plain (weak, coherent: no .nc, so rows that alias between inputs and
// outputs stay correct; __isGlobal lets the compiler emit LDG rather than generic LD). Stores are
// explicit st.global of the whole piece: a plain uint4 store is sometimes split into four 32-bit
// stores after the compiler breaks the struct apart. The "memory" clobber keeps every load of the
// same address (in-place rows) on its side of the store.
template <int Bytes>
struct PieceOf;
template <>
struct PieceOf<16> { using type = uint4; };
template <>
struct PieceOf<8> { using type = uint2; };
template <>
struct PieceOf<4> { using type = unsigned; };
template <>
struct PieceOf<2> { using type = unsigned short; };

template <class Tensor>
using ElementOf = std::remove_cv_t<typename std::decay_t<Tensor>::value_type>;

template <class Tensor>
inline constexpr int kChunkBytes = int(decltype(cute::size(std::declval<std::decay_t<Tensor>>()))::value) *
                                   int(sizeof(ElementOf<Tensor>));

template <class Tensor>
using PieceFor = typename PieceOf<(kChunkBytes<Tensor> < 16 ? kChunkBytes<Tensor> : 16)>::type;

#ifndef RUDNN_HOST_EMULATOR
__device__ __forceinline__ void st_global(uint4* p, const uint4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void st_global(uint2* p, const uint2& v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void st_global(unsigned* p, unsigned v) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_global(unsigned short* p, unsigned short v) {
  asm volatile("st.global.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}
#define RUDNN_NORM_ASSUME_GLOBAL(address) __builtin_assume(__isGlobal(address))
#else  // the host emulator (tests/emulation/norm_emu.cpp): the same pieces as plain stores
template <class Piece>
inline void st_global(Piece* p, const Piece& v) { *p = v; }
#define RUDNN_NORM_ASSUME_GLOBAL(address) (void)(address)
#endif

// Makes the compiler forget what a register tensor holds, at no cost in instructions (an empty asm
// that "rewrites" each 32-bit word). A loop that converts loop-invariant 16-bit values to float32
// would otherwise hoist the conversions and keep the float32 copies live (twice the registers), and
// a row converted once for its sum would be kept as float32 through its reductions.
template <class RTensor>
__device__ __forceinline__ void forget_values(RTensor& registers) {
#ifndef RUDNN_HOST_EMULATOR
  auto words = cute::recast<std::uint32_t>(registers);
#pragma unroll
  for (int i = 0; i < int(cute::size(words)); ++i) asm volatile("" : "+r"(words(i)));
#else
  (void)registers;
#endif
}

// L2 eviction priority of a stream kernel's row accesses (sm_80+: a createpolicy cache policy on
// ld/st.global.L2::cache_hint). The two-read kernels mark what pass 2 reads again evict_last and
// their last reads evict_first, so the rows in flight between the passes stay in L2 while the
// stream of other lines goes first. Hints only: the data and the access order are those of the
// plain accesses (weak, coherent; asm volatile with a memory clobber, so an in-place row's
// loads and stores keep their program order).
enum class L2Hint { none, evict_last, evict_first };

#ifndef RUDNN_HOST_EMULATOR
template <L2Hint kHint>
__device__ __forceinline__ std::uint64_t l2_policy() {
  std::uint64_t policy;
  if constexpr (kHint == L2Hint::evict_last) {
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

__device__ __forceinline__ void ld_global_hint(uint4& v, const uint4* p, std::uint64_t policy) {
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void ld_global_hint(uint2& v, const uint2* p, std::uint64_t policy) {
  asm volatile("ld.global.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(v.x), "=r"(v.y) : "l"(p), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void ld_global_hint(unsigned& v, const unsigned* p, std::uint64_t policy) {
  asm volatile("ld.global.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(policy) : "memory");
}
__device__ __forceinline__ void ld_global_hint(unsigned short& v, const unsigned short* p, std::uint64_t policy) {
  asm volatile("ld.global.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(policy) : "memory");
}
__device__ __forceinline__ void st_global_hint(uint4* p, const uint4& v, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void st_global_hint(uint2* p, const uint2& v, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.u32 [%0], {%1, %2}, %3;" ::"l"(p), "r"(v.x), "r"(v.y), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void st_global_hint(unsigned* p, unsigned v, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" ::"l"(p), "r"(v), "l"(policy) : "memory");
}
__device__ __forceinline__ void st_global_hint(unsigned short* p, unsigned short v, std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.u16 [%0], %1, %2;" ::"l"(p), "h"(v), "l"(policy) : "memory");
}
#else  // the host emulator: plain accesses
template <L2Hint kHint>
inline std::uint64_t l2_policy() { return 0; }
template <class Piece>
inline void ld_global_hint(Piece& v, const Piece* p, std::uint64_t) { v = *p; }
template <class Piece>
inline void st_global_hint(Piece* p, const Piece& v, std::uint64_t) { *p = v; }
#endif

// One chunk, global memory -> registers; kHint != none: with that L2 eviction priority.
template <L2Hint kHint = L2Hint::none, class GTensor, class RTensor>
__device__ __forceinline__ void load_chunk(const GTensor& global_chunk, RTensor&& registers) {
  using Piece = PieceFor<GTensor>;
  const auto src = cute::recast<const Piece>(global_chunk);
  auto dst = cute::recast<Piece>(registers);
  if constexpr (kHint == L2Hint::none) {
#pragma unroll
    for (int i = 0; i < int(cute::size(dst)); ++i) {
      const Piece* address = &src(i);
      RUDNN_NORM_ASSUME_GLOBAL(address);
      dst(i) = *address;
    }
  } else {
    const std::uint64_t policy = l2_policy<kHint>();
#pragma unroll
    for (int i = 0; i < int(cute::size(dst)); ++i) ld_global_hint(dst(i), &src(i), policy);
  }
}

// One chunk, registers -> global memory; kHint != none: with that L2 eviction priority.
template <L2Hint kHint = L2Hint::none, class RTensor, class GTensor>
__device__ __forceinline__ void store_chunk(const RTensor& registers, GTensor&& global_chunk) {
  using Piece = PieceFor<RTensor>;
  const auto src = cute::recast<const Piece>(registers);
  auto dst = cute::recast<Piece>(global_chunk);
  if constexpr (kHint == L2Hint::none) {
#pragma unroll
    for (int i = 0; i < int(cute::size(dst)); ++i) st_global(&dst(i), src(i));
  } else {
    const std::uint64_t policy = l2_policy<kHint>();
#pragma unroll
    for (int i = 0; i < int(cute::size(dst)); ++i) st_global_hint(&dst(i), src(i), policy);
  }
}

// ---------------------------------------------------------------------------------------------
// Teams and reductions.

struct Team {
  int size;   // threads per row: 1, 2, 4, ..., 1024
  int rank;   // this thread's index within its team
  int index;  // this team's index within the block
  int count;  // teams per block
};

__device__ __forceinline__ Team make_team(int size) {
  const int t = int(threadIdx.x);
  return Team{size, t % size, t / size, int(blockDim.x) / size};
}

// The slot-s chunk of a thread: chunks are dealt round-robin over the team.
__device__ __forceinline__ i64 slot_chunk(const Team& team, int s) { return i64(team.rank) + i64(s) * team.size; }

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

constexpr unsigned kFullMask = 0xffffffffu;

// All-reduce of K floats over each team. Every thread of a team ends with the same bits: a xor
// butterfly combines the same two operands in both lanes of a pair (op is commutative), and the
// cross-warp step has every lane read one shared list. Must be reached by every thread of the
// block (teams larger than a warp synchronize the block).
// `scratch` is __shared__ memory of at least K * 32 floats.
template <int K, class Op>
__device__ __forceinline__ void team_allreduce(float (&v)[K], const Team& team, float* scratch, Op op,
                                               float identity) {
  const int width = team.size < 32 ? team.size : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = op(v[k], __shfl_xor_sync(kFullMask, v[k], offset));
  }
  if (team.size <= 32) return;
  const int lane = int(threadIdx.x) % 32;
  const int warp = int(threadIdx.x) / 32;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) scratch[k * 32 + warp] = v[k];
  }
  __syncthreads();
  const int warps = team.size / 32;
  const int first = team.index * warps;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = lane < warps ? scratch[k * 32 + first + lane] : identity;
  for (int offset = 16; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = op(v[k], __shfl_xor_sync(kFullMask, v[k], offset));
  }
  __syncthreads();  // scratch is free again for the next reduction
}

// ---------------------------------------------------------------------------------------------
// Thread block clusters (sm_90; the cluster kernels, plan::cluster_blocks): a row shared by the
// blocks of a cluster, their partial results exchanged through distributed shared memory. Each
// piece is one PTX instruction on sm_90 (and traps elsewhere: plan::launch_row_cluster launches a
// cluster kernel only on Hopper, from sm_90 code); the host emulator (tests/emulation/
// emu_runtime.hpp) provides stand-ins that check the exchange's ordering.

#ifndef RUDNN_HOST_EMULATOR
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RUDNN_NORM_CLUSTERS 1
#endif

// This block's rank in its cluster, and the cluster's block count.
__device__ __forceinline__ unsigned cluster_rank() {
#ifdef RUDNN_NORM_CLUSTERS
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
#else
  __trap();
  return 0;
#endif
}
__device__ __forceinline__ unsigned cluster_size() {
#ifdef RUDNN_NORM_CLUSTERS
  unsigned blocks;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(blocks));
  return blocks;
#else
  __trap();
  return 1;
#endif
}
// Every thread of every block of the cluster meets; shared-memory stores before it (release) are
// visible to the reads of any block's threads after it (acquire).
__device__ __forceinline__ void cluster_barrier() {
#ifdef RUDNN_NORM_CLUSTERS
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}
// A plain store into this block's shared memory, for the peers to read after a cluster barrier.
__device__ __forceinline__ void publish_to_cluster(float* slot, float value) { *slot = value; }
// The float at `slot`'s address in the shared memory of the cluster's block `rank` (mapa gives
// the peer's shared::cluster address).
__device__ __forceinline__ float read_from_cluster(const float* slot, unsigned rank) {
#ifdef RUDNN_NORM_CLUSTERS
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(slot));
  unsigned remote;
  float value;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(remote) : "memory");
  return value;
#else
  (void)slot, (void)rank;
  __trap();
  return 0.f;
#endif
}
#else  // the host emulator's stand-ins
inline unsigned cluster_rank() { return emu_cluster_ctarank(); }
inline unsigned cluster_size() { return emu_cluster_nctarank(); }
inline void cluster_barrier() { emu_cluster_sync(); }
inline void publish_to_cluster(float* slot, float value) { emu_cluster_publish(slot, value); }
inline float read_from_cluster(const float* slot, unsigned rank) { return emu_cluster_read(slot, rank); }
#endif

// The cluster kernels' team: every thread of the cluster, thread g = rank * blockDim.x + t.
__device__ __forceinline__ Team cluster_team() {
  return Team{int(cluster_size() * blockDim.x), int(cluster_rank() * blockDim.x + threadIdx.x), 0, 1};
}

// All-reduce of K floats over every thread of the cluster (sums by default; `op` as
// team_allreduce's), the same bits in all of them: a block all-reduce (team_allreduce over
// `block_team`, the whole block; `scratch` holds K * 32 floats), then every thread combines the
// blocks' results in rank order. `exchange` is 2 * K floats of dynamic shared memory, used by
// alternate reductions (`parity`, flipped here): a block rewrites a slot only after the next
// reduction's barrier, which every reader of the slot's last value has passed, so one cluster
// barrier per reduction suffices. Every thread of the cluster must call it the same number of
// times, and the kernel must pass a cluster barrier after its last call (a block's shared memory
// goes away when it exits).
template <int K, class Op = SumOp>
__device__ __forceinline__ void cluster_allreduce(float (&v)[K], const Team& block_team, float* scratch,
                                                  float* exchange, unsigned& parity, Op op = {}, float identity = 0.f) {
  static_assert(K * 32 <= kClusterScratch && 2 * K * sizeof(float) <= kClusterSmem - kClusterScratch * sizeof(float),
                "kClusterSmem holds the scratch and exchange slots of at most two values");
  team_allreduce(v, block_team, scratch, op, identity);
  float* slot = exchange + parity * K;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) publish_to_cluster(slot + k, v[k]);
  }
  cluster_barrier();
  const unsigned blocks = cluster_size();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = identity;
  for (unsigned r = 0; r < blocks; ++r) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = op(v[k], read_from_cluster(slot + k, r));
  }
  parity ^= 1u;
}

// What a cluster kernel's thread knows of the row its cluster shares (norm_forward_cluster,
// norm_backward_cluster, softmax_forward_cluster, softmax_backward_cluster): its shared memory
// (`smem`: kClusterSmem bytes of dynamic shared memory), its teams, which of its N slots fall
// inside a row (the same in every row) and the exchange parity of cluster_allreduce.
template <int N>
struct ClusterShare {
  float* scratch;   // the block reduction's (kClusterScratch floats)
  float* exchange;  // cluster_allreduce's slots, after it
  Team block_team;  // the block, reducing as one team
  Team team;        // every thread of the cluster (cluster_team)
  bool valid[N];
  unsigned parity = 0;

  __device__ __forceinline__ ClusterShare(float* smem, i64 chunks)
      : scratch(smem), exchange(smem + kClusterScratch), block_team(make_team(int(blockDim.x))), team(cluster_team()) {
#pragma unroll
    for (int s = 0; s < N; ++s) valid[s] = chunk(s) < chunks;
  }
  __device__ __forceinline__ i64 chunk(int s) const { return slot_chunk(team, s); }
  template <int K, class Op = SumOp>
  __device__ __forceinline__ void allreduce(float (&v)[K], Op op = {}, float identity = 0.f) {
    cluster_allreduce(v, block_team, scratch, exchange, parity, op, identity);
  }
};

// Running mean and sum of squared deviations (Chan et al.), for the one-read variance of rows too
// long for registers. Stable: no E[x^2] - E[x]^2 cancellation.
struct MeanM2 {
  float n, mean, m2;
};

__device__ __forceinline__ MeanM2 merge(const MeanM2& a, const MeanM2& b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float delta = b.mean - a.mean;
  const float wb = __fdividef(b.n, n);  // n is a small exact count; no need for IEEE division
  return MeanM2{n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

__device__ __forceinline__ MeanM2 shfl_xor(const MeanM2& s, int offset) {
  return MeanM2{__shfl_xor_sync(kFullMask, s.n, offset), __shfl_xor_sync(kFullMask, s.mean, offset),
                __shfl_xor_sync(kFullMask, s.m2, offset)};
}

// Butterfly step for a non-commutative merge: both lanes of a pair merge (lower, upper), so both
// get the same bits.
__device__ __forceinline__ MeanM2 butterfly_merge(const MeanM2& s, int offset) {
  const MeanM2 other = shfl_xor(s, offset);
  const bool upper = (int(threadIdx.x) & offset) != 0;
  return upper ? merge(other, s) : merge(s, other);
}

// All-reduce of MeanM2 over a team that is the whole block (stream kernels). Same contract as
// team_allreduce; `scratch` holds at least 3 * 32 floats.
__device__ __forceinline__ MeanM2 block_allreduce(MeanM2 s, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) s = butterfly_merge(s, offset);
  const int lane = int(threadIdx.x) % 32;
  const int warp = int(threadIdx.x) / 32;
  if (lane == 0) {
    scratch[warp] = s.n;
    scratch[32 + warp] = s.mean;
    scratch[64 + warp] = s.m2;
  }
  __syncthreads();
  const int warps = int(blockDim.x) / 32;
  s = lane < warps ? MeanM2{scratch[lane], scratch[32 + lane], scratch[64 + lane]} : MeanM2{0.f, 0.f, 0.f};
  for (int offset = 16; offset > 0; offset /= 2) s = butterfly_merge(s, offset);
  __syncthreads();
  return s;
}

// Running (max, sum of exp(x - max)) for the one-read softmax of rows too long for registers.
// A row that is all -inf keeps (-inf, 0) and later yields NaN (0/0 style), like torch.
struct MaxSum {
  float max, sum;
};

template <class T>
__device__ __forceinline__ MaxSum merge_softmax(const MaxSum& a, const MaxSum& b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return MaxSum{m, 0.f};  // exp(-inf - -inf) would be NaN
  return MaxSum{m, a.sum * softmax_exp<T>(a.max - m) + b.sum * softmax_exp<T>(b.max - m)};
}

// ---------------------------------------------------------------------------------------------
// Row offsets: core::RowIndexer (one multiply for collapsed tensors; the general loop indexes the
// kernel-parameter arrays directly, ptxas keeps them in the constant bank).

template <class T>
__device__ __forceinline__ T* row_ptr(T* base, const core::RowIndexer& ix, i64 row) {
  return base + ix.offset(row);
}

// Row `row` of a tensor; kCollapsed: its indexer has at most one leading axis (ndims <= 1, checked
// by the host: indexers_collapsed), so the offset is one multiply (ndims = 0 has stride 0), without
// the general path's 64-bit divisions.
template <bool kCollapsed, class T>
__device__ __forceinline__ T* row_at(T* base, const core::RowIndexer& ix, i64 row) {
  if constexpr (kCollapsed) {
    return base + row * ix.strides[0];
  } else {
    return row_ptr(base, ix, row);
  }
}

// Whether every indexer has at most one leading axis after collapsing (the pipelined kernels'
// precondition).
inline bool indexers_collapsed(std::initializer_list<const core::RowIndexer*> indexers) {
  for (const core::RowIndexer* ix : indexers)
    if (ix->ndims > 1) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Rows of a block: block b owns [b * rows_per_block, min(rows, (b + 1) * rows_per_block)).

struct BlockRows {
  i64 begin, end;
};

__device__ __forceinline__ BlockRows block_rows(i64 rows, i64 rows_per_block) {
  const i64 begin = i64(blockIdx.x) * rows_per_block;
  const i64 end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
  return BlockRows{begin, end};
}

}  // namespace rudnn::norm::kern

// ---------------------------------------------------------------------------------------------
// Host-side planning (norm_cuda.cu).

namespace rudnn::norm::plan {

using i64 = std::int64_t;

// How one row kernel is launched.
struct RowLaunch {
  bool stream = false;     // row too long for registers: the two-read kernel
  int team = 1;            // threads per row
  int block = 1;           // threads per block
  int grid = 0;            // blocks
  i64 rows_per_block = 0;  // contiguous rows per block
  std::size_t smem = 0;    // dynamic shared memory per block
};

// Team shape for a row of `chunks` chunks: each thread gets about `slot_target` chunks (at most
// `max_slots`), teams of at most kMaxTeam threads; longer rows use the stream kernels.
RowLaunch row_shape(i64 chunks, int slot_target, int max_slots);

// Whether a norm forward or backward runs its pipelined register kernel
// (norm_forward_regs_pipelined, norm_backward_regs_pipelined: weight/bias kept in registers, the
// next row's loads in flight) rather than norm_forward_regs / norm_backward_regs: register rows of
// `vec` > 1 element chunks whose teams fit its kRegsBlockTarget-thread blocks, when every row
// tensor's leading axes collapse to one (`collapsed`). RUDNN_NORM_PIPELINED=0 in the environment
// keeps the 1024-thread kernels (read at each call), to compare the two on a GPU.
bool regs_pipelined(const RowLaunch& launch, int vec, bool collapsed);

// Blocks per row of the cluster kernels (norm_forward_cluster with `slots` = kSlots,
// norm_backward_cluster with kPairSlots; sm_90, 16-byte chunks), 0 where they are not taken. They
// are for few long rows, which one block per row leaves most of the chip idle for (and rows too
// long for one block's registers read twice by the stream kernels): rows too long for one
// kClusterThreads block's registers (more than kClusterThreads * slots chunks: shorter rows, decode
// sizes among them, keep the register kernels and their block barriers), when rows <= sm_count / 2
// (two or more blocks per row still fit in one wave) or the row needs a stream kernel and rows <=
// sm_count; a cluster of C blocks
// (2 <= C <= kMaxCluster) holds rows of up to C * kClusterThreads * slots chunks in registers and
// takes C = the blocks that fill one wave (sm_count / rows), at least those the row needs, at most
// one chunk per thread's worth. `capable`: a Hopper GPU (compute capability 9.x; launch_row_cluster
// also checks that the kernel's code is sm_90's). RUDNN_NORM_CLUSTER=0 in the environment turns them off, =1 takes
// them wherever the row fits in a cluster, with at least 2 blocks (read at each call; for
// comparing the kernels on a GPU).
int cluster_blocks(i64 rows, i64 chunks, int sm_count, bool capable, int slots);

// Launches a cluster kernel over `rows` rows of `chunks` chunks (`params`: its one parameter) where
// cluster_blocks takes it on the current device and the device can hold such a cluster
// (cudaOccupancyMaxActiveClusters, asked once per kernel and cluster size); returns whether it ran.
bool launch_row_cluster(const void* kernel, void* params, i64 rows, i64 chunks, int slots, cudaStream_t stream);

// Blocks of `kernel` (with `block` threads, `smem` dynamic bytes) resident per SM; raises the
// kernel's dynamic shared-memory limit first when smem > 48 KB. Cached per device and kernel.
int resident_blocks(const void* kernel, int block, std::size_t smem);

// Fills grid / rows_per_block: the rows spread evenly over at most resident_blocks * SMs blocks,
// each a multiple of `teams` rows.
void spread_rows(RowLaunch& launch, i64 rows, const void* kernel);
// The same over at most `max_blocks` blocks (the device-free part, which the host emulator runs).
void spread_rows_over(RowLaunch& launch, i64 rows, i64 max_blocks);

// True when a tensor's rows can be read with 16-byte accesses of `vec` elements.
bool rows_vectorizable(const void* data, const core::RowIndexer& rows, int vec);
bool aligned16(const void* data);

// Weight-gradient plan of norm backward (shared by backward_cuda and the workspace query, so both
// agree; it depends on rows, H and the device only). `fused`: the dx kernel also accumulates
// dweight/dbias per block (two float32 rows of H per team in shared memory: up to ~28K columns on
// sm90, one or two blocks per SM); otherwise a column kernel re-reads dy and x. `splits` partial
// rows [2][splits][H] are reduced in a fixed order; splits == 1 writes dweight/dbias directly.
struct WgradPlan {
  bool fused = false;
  i64 splits = 1;
  i64 rows_per_split = 0;
  std::size_t fused_smem_budget = 0;  // dynamic shared memory a fused block may use
  std::size_t workspace_bytes = 0;
};
WgradPlan wgrad_plan(i64 rows, i64 hidden, int device);
// The same for a device of `sm_count` SMs and `optin` bytes of opt-in shared memory per block.
WgradPlan wgrad_plan(i64 rows, i64 hidden, int sm_count, std::size_t optin);

// The fused weight-gradient launch of a dx kernel whose blocks take at most `max_block` threads:
// one block per split (the plan the workspace was sized for: one wave of one or two blocks per
// SM), as many teams per block as the plan's shared-memory budget allows, whole warps only, and
// [teams][2][H] floats of dynamic shared memory. Fills block, smem, grid and rows_per_block.
void fused_wgrad_launch(RowLaunch& launch, const WgradPlan& wgrad, i64 hidden, int max_block);

}  // namespace rudnn::norm::plan
