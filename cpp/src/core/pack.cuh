// L adjacent elements of T read or written as one access (16 bytes at most per instruction):
// the vector loads of every family whose rows or channels are dense (pooling, interpolate,
// grid_sample through pooling/lanes.cuh, the MoE row gather and combine). Host code includes it
// too (to pick a path, and in the emulators).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <vector_types.h>
#endif

#include "core/rows.hpp"  // RUDNN_HD

namespace rudnn::core {

template <class T, int L>
struct alignas(sizeof(T) * L < 16 ? sizeof(T) * L : 16) Pack {
  T v[L];
};

// The lanes of a 16-byte pack of T.
template <class T>
inline constexpr int kVecLanes = 16 / int(sizeof(T));

// Whether `data` is aligned for Pack<T, L> accesses (host code picks a path with it, device code too).
template <class T, int L>
RUDNN_HD bool pack_aligned(const void* data) {
  return reinterpret_cast<std::uintptr_t>(data) % alignof(Pack<T, L>) == 0;
}

// The integer type of a pack's bytes: a pack moves as one integer access, whatever T's copy
// constructor is (a struct of __nv_bfloat16 copied member by member becomes four 4-byte stores).
template <int Bytes> struct PackWord;
template <> struct PackWord<2> { using type = std::uint16_t; };
template <> struct PackWord<4> { using type = std::uint32_t; };
template <> struct PackWord<8> { using type = std::uint64_t; };
#if defined(__CUDACC__)
template <> struct PackWord<16> { using type = uint4; };
#else
struct alignas(16) PackWord16 { std::uint32_t x, y, z, w; };  // host code (the emulators)
template <> struct PackWord<16> { using type = PackWord16; };
#endif

// A pack and its bytes as one integer (the union is how nvcc keeps the access whole; a memcpy
// between the two is split into 4-byte stores).
template <class T, int L>
union PackBits {
  Pack<T, L> pack;
  typename PackWord<int(sizeof(T)) * L>::type word;
  RUDNN_HD PackBits() {}
};

template <class T, int L>
RUDNN_HD Pack<T, L> load_pack(const T* src) {
  PackBits<T, L> b;
  b.word = *reinterpret_cast<const decltype(b.word)*>(src);
  return b.pack;
}

template <class T, int L>
RUDNN_HD void store_pack(T* dst, const Pack<T, L>& p) {
  PackBits<T, L> b;
  b.pack = p;
  *reinterpret_cast<decltype(b.word)*>(dst) = b.word;
}

}  // namespace rudnn::core
