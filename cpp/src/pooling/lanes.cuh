// The channel packs of the spatial families' CUDA kernels (pooling, interpolate, grid_sample): on
// channels-last data, L adjacent channels of T read or written as one 16-byte access and
// converted to float lanes (Lanes, pooling/problem.hpp). Their host emulators include it too.
#pragma once

#include "core/convert.cuh"
#include "pooling/problem.hpp"

namespace rudnn::pooling {

// L elements of T read or written as one access (16 bytes at most per instruction).
template <class T, int L>
struct alignas(sizeof(T) * L < 16 ? sizeof(T) * L : 16) Pack {
  T v[L];
};

// The lanes of a 16-byte pack of T.
template <class T>
inline constexpr int kVecLanes = 16 / int(sizeof(T));

template <class T, int L>
__device__ __forceinline__ Lanes<L> load_lanes(const T* data, i64 offset) {
  const Pack<T, L> pack = *reinterpret_cast<const Pack<T, L>*>(data + offset);
  Lanes<L> out;
#pragma unroll
  for (int l = 0; l < L; ++l) out.v[l] = core::to_float(pack.v[l]);
  return out;
}

template <class T, int L>
__device__ __forceinline__ void store_lanes(T* data, i64 offset, const Lanes<L>& values) {
  Pack<T, L> pack;
#pragma unroll
  for (int l = 0; l < L; ++l) pack.v[l] = core::from_float<T>(values.v[l]);
  *reinterpret_cast<Pack<T, L>*>(data + offset) = pack;
}

}  // namespace rudnn::pooling
