// Host stand-ins for the sm90a (Hopper) atoms of the flash forward kernel, written from the PTX
// ISA (as emu_sm80_atoms.hpp, which this includes):
//   EmuGmmaSS<Real, In>  wgmma.mma_async.sync.aligned.m64n64k16.f32.{f16,bf16} with both operands
//                        K-major in shared memory, described by matrix descriptors with the
//                        128-byte swizzle. Every thread of the warpgroup computes its own 32
//                        accumulators from shared memory at issue (the emulator's async group
//                        completes at once; the kernel's fences and waits become no-ops).
// Shared-memory addresses reach the descriptors through cute::cast_smem_ptr_to_uint, which here
// (through the NVVM hook CuTe already has) gives the offset from the running block's shared
// memory, so the descriptors hold the offsets the kernel would see on the GPU with its
// 1024-byte aligned dynamic shared memory.
#pragma once

#include "emu_runtime.hpp"

// Must precede CuTe's headers.
#define CUTE_NVVM_GET_SMEM_POINTER_ACTIVATED 1
inline std::uint32_t __nvvm_get_smem_pointer(const void* p) {
  return std::uint32_t(static_cast<const unsigned char*>(p) - emu_smem);
}

#include "emu_sm80_atoms.hpp"

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

// Byte offset of element (row, k) of a K-major 16-bit operand from its wgmma matrix descriptor
// (PTX ISA, "Matrix Descriptor Format": start address bits 0-13, stride byte offset bits 32-45,
// both in 16-byte units; base offset bits 49-51; layout type bits 62-63, 1 = 128-byte swizzle).
// With the 128-byte swizzle, row r of each 8-row core group sits 128 bytes after row r - 1, the
// groups are `stride byte offset` apart, and the 16-byte chunk index of an address (bits 4-6) is
// XORed with its bits 7-9.
inline std::uint32_t emu_gmma_k_major_offset(std::uint64_t desc, int row, int k) {
  const std::uint32_t start = std::uint32_t(desc & 0x3fff) << 4;
  const std::uint32_t group_stride = std::uint32_t((desc >> 32) & 0x3fff) << 4;
  const unsigned base_offset = unsigned(desc >> 49) & 7u, layout = unsigned(desc >> 62);
  if (layout != 1 || base_offset != 0) {
    std::fprintf(stderr, "wgmma stand-in: only the 128-byte swizzle with base offset 0 is emulated\n");
    std::abort();
  }
  const std::uint32_t addr = start + std::uint32_t(row / 8) * group_stride + std::uint32_t(row % 8) * 128 + 2 * k;
  return addr ^ (((addr >> 7) & 7u) << 4);
}

template <class Real, class In>
struct EmuGmmaSS : Real {
  static constexpr int kN = 64;
  static float element(std::uint64_t desc, int row, int k) {
    std::uint16_t bits;
    std::memcpy(&bits, emu_smem + emu_gmma_k_major_offset(desc, row, k), 2);
    return float(In::bitcast(bits));
  }
  // Accumulator i of a thread (PTX ISA, wgmma D fragment for m64nNk16): warp w of the warpgroup
  // owns rows 16w .. 16w + 15; i = v0 + 2 v1 + 4 j is row 16w + lane/4 + 8 v1, column
  // 8 j + 2 (lane % 4) + v0.
  static void compute(std::uint64_t desc_a, std::uint64_t desc_b, float* const (&d)[kN / 2],
                      cute::SM90::GMMA::ScaleOut scale_d) {
    const int w = emu_warp % 4, lane = emu_lane;
    for (int i = 0; i < kN / 2; ++i) {
      const int row = 16 * w + lane / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
      float acc = scale_d == cute::SM90::GMMA::ScaleOut::Zero ? 0.0f : *d[i];
      for (int k = 0; k < 16; ++k) acc += element(desc_a, row, k) * element(desc_b, col, k);
      *d[i] = acc;
    }
  }
  static void fma(std::uint64_t const& desc_a, std::uint64_t const& desc_b, float& d00, float& d01, float& d02,
                  float& d03, float& d04, float& d05, float& d06, float& d07, float& d08, float& d09, float& d10,
                  float& d11, float& d12, float& d13, float& d14, float& d15, float& d16, float& d17, float& d18,
                  float& d19, float& d20, float& d21, float& d22, float& d23, float& d24, float& d25, float& d26,
                  float& d27, float& d28, float& d29, float& d30, float& d31,
                  cute::SM90::GMMA::ScaleOut const scale_d = cute::SM90::GMMA::ScaleOut::One) {
    float* const d[kN / 2] = {&d00, &d01, &d02, &d03, &d04, &d05, &d06, &d07, &d08, &d09, &d10,
                              &d11, &d12, &d13, &d14, &d15, &d16, &d17, &d18, &d19, &d20, &d21,
                              &d22, &d23, &d24, &d25, &d26, &d27, &d28, &d29, &d30, &d31};
    compute(desc_a, desc_b, d, scale_d);
  }
};

namespace cute {
template <class Real, class In>
struct MMA_Traits<EmuGmmaSS<Real, In>> : MMA_Traits<Real> {};
}  // namespace cute

template <cute::SM90::GMMA::Major A, cute::SM90::GMMA::Major B>
using EmuGmma64x64F16 = EmuGmmaSS<cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<A, B>, cute::half_t>;
template <cute::SM90::GMMA::Major A, cute::SM90::GMMA::Major B>
using EmuGmma64x64BF16 = EmuGmmaSS<cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<A, B>, cute::bfloat16_t>;

// wgmma.fence / commit_group / wait_group and fence.proxy.async: nothing is in flight here.
inline void emu_warpgroup_arrive() {}
inline void emu_warpgroup_commit_batch() {}
template <int N>
void emu_warpgroup_wait() {}
inline void emu_fence_view_async_shared() {}
