// The channel packs of the spatial families' CUDA kernels (pooling, interpolate, grid_sample): on
// channels-last data, L adjacent channels of T read or written as one 16-byte access (core::Pack)
// and converted to float lanes (Lanes, pooling/problem.hpp). Their host emulators include it too.
#pragma once

#include "core/convert.cuh"
#include "core/pack.cuh"
#include "pooling/problem.hpp"

namespace rudnn::pooling {

using core::kVecLanes;
using core::Pack;

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
