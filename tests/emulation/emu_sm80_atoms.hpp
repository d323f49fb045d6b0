// Host stand-ins for the sm80 hardware atoms of the CuTe flash kernels, written from the PTX ISA's
// description of each instruction (not from CuTe's layouts, so a kernel that relies on a wrong
// fragment layout fails here as it would on the GPU):
//   EmuMma<Real, In>   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: a warp-collective
//                      16x8x16 product, each lane reading the other lanes' fragments;
//   EmuMmaTf32         mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, the same way;
//   EmuLdsmN / EmuLdsmT  ldmatrix.sync.aligned.x4.m8n8.shared.b16 (.trans): each lane names one
//                      8-element row, each lane receives its fragment of the four 8x8 matrices;
//   EmuCpAsync<T>, EmuCpAsyncZfill<T>  cp.async.cg 16 bytes, the second with src-size 16 or 0
//                      (the predicate false: nothing read, 16 zero bytes written): queued per thread and performed only when
//                      emu_cp_async_wait says its group must have landed, so a kernel that reads
//                      shared memory before waiting sees the poison, not the data; issued over a
//                      tile that other threads may still read, it is reported (emu_runtime.hpp:
//                      emu_note_async_write, with the reads of ldmatrix and wgmma).
// The emulators' tests replace the real atoms' names in the kernel text with these. Each stand-in
// derives from the real atom for its register typedefs and hides its copy/fma; its CuTe traits
// are the real atom's.
#pragma once

#include "emu_runtime.hpp"

#include <cute/tensor.hpp>  // first: it orders CuTe's own headers
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm80.hpp>

#include <array>
#include <cstring>

// The warp-collective body of an m16n8kK mma.sync stand-in: the lanes' A (4 registers) and B
// (2 registers) fragments exchanged, then this lane's four outputs (c0, c1: (g, 2t), (g, 2t + 1);
// c2, c3: (g + 8, 2t), (g + 8, 2t + 1), g = lane / 4, t = lane % 4) as c + sum over k of
// a_at(f, row, k) * b_at(f, k, col), f the 32 lanes' fragments.
struct EmuMmaFragments {
  std::uint32_t a[4], b[2];
};
template <int kK, class AAt, class BAt>
void emu_mma_m16n8(float& d0, float& d1, float& d2, float& d3, const EmuMmaFragments& mine, const float (&c)[4],
                   AAt a_at, BAt b_at) {
  float d[4];
  emu_warp_exchange(mine, [&](auto lane_value) {
    std::array<EmuMmaFragments, 32> f;
    for (int l = 0; l < 32; ++l) f[l] = lane_value(l);
    const int g = emu_lane / 4, t = emu_lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      float acc = c[i];
      for (int k = 0; k < kK; ++k) acc += a_at(f, row, k) * b_at(f, k, col);
      d[i] = acc;
    }
  });
  d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
}

template <class Real, class In>
struct EmuMma : Real {
  // Element (row, k) of A [16 x 16] and (k, n) of B [16 x 8] in the lanes' fragments (PTX ISA,
  // "Matrix Fragments for mma.m16n8k16 with floating point type"): groupID = lane / 4, thread
  // in group = lane % 4; a0..a3 hold (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..);
  // b0, b1 hold (2t.., g), (2t + 8.., g); two 16-bit values per register, lower column first.
  static float half_of(std::uint32_t reg, int k) {
    return float(In::bitcast(std::uint16_t(k % 2 ? reg >> 16 : reg & 0xffffu)));
  }
  static void fma(float& d0, float& d1, float& d2, float& d3, std::uint32_t const& a0, std::uint32_t const& a1,
                  std::uint32_t const& a2, std::uint32_t const& a3, std::uint32_t const& b0, std::uint32_t const& b1,
                  float const& c0, float const& c1, float const& c2, float const& c3) {
    emu_mma_m16n8<16>(
        d0, d1, d2, d3, EmuMmaFragments{{a0, a1, a2, a3}, {b0, b1}}, {c0, c1, c2, c3},
        [](const auto& f, int row, int k) { return half_of(f[(row % 8) * 4 + (k % 8) / 2].a[row / 8 + 2 * (k / 8)], k); },
        [](const auto& f, int k, int col) { return half_of(f[col * 4 + (k % 8) / 2].b[k / 8], k); });
  }
};

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k8" with .tf32): group g = lane / 4, t = lane % 4; a0..a3 hold A(g, t), A(g + 8, t),
// A(g, t + 4), A(g + 8, t + 4); b0, b1 hold B(t, g), B(t + 4, g); c0..c3 and d0..d3 (g, 2t),
// (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Operands are float32 bit patterns of which the
// hardware reads the TF32 part: the stand-in drops the low 13 bits, so operands the kernel did not
// round are truncated here.
struct EmuMmaTf32 : cute::SM80_16x8x8_F32TF32TF32F32_TN {
  static float tf32_of(std::uint32_t bits) {
    bits &= 0xffffe000u;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static void fma(float& d0, float& d1, float& d2, float& d3, std::uint32_t const& a0, std::uint32_t const& a1,
                  std::uint32_t const& a2, std::uint32_t const& a3, std::uint32_t const& b0, std::uint32_t const& b1,
                  float const& c0, float const& c1, float const& c2, float const& c3) {
    emu_mma_m16n8<8>(  // A(row, k): lane (row % 8) * 4 + k % 4, register row / 8 + 2 (k / 4); B(k, col): lane col * 4 + k % 4
        d0, d1, d2, d3, EmuMmaFragments{{a0, a1, a2, a3}, {b0, b1}}, {c0, c1, c2, c3},
        [](const auto& f, int row, int k) { return tf32_of(f[(row % 8) * 4 + k % 4].a[row / 8 + 2 * (k / 4)]); },
        [](const auto& f, int k, int col) { return tf32_of(f[col * 4 + k % 4].b[k / 4]); });
  }
};

// Four 8x8 matrices of 16-bit values; lanes 8i..8i+7 give the rows of matrix i (16 bytes each).
// Without .trans lane l receives row l/4, values 2(l%4) and 2(l%4)+1 of each matrix; with .trans
// it receives column l/4, rows 2(l%4) and 2(l%4)+1 (the lower half is the first).
template <class Real, bool kTransposed>
struct EmuLdsm : Real {
  static void copy(cute::uint128_t const& smem_src, std::uint32_t& dst0, std::uint32_t& dst1, std::uint32_t& dst2,
                   std::uint32_t& dst3) {
    std::uint32_t dst[4];
    emu_note_read(std::size_t(reinterpret_cast<const unsigned char*>(&smem_src) - emu_smem), emu_clock);  // my row
    emu_warp_exchange(static_cast<const void*>(&smem_src), [&](auto lane_value) {
      const int l = emu_lane;
      for (int i = 0; i < 4; ++i) {
        if constexpr (kTransposed) {
          const auto* r0 = static_cast<const std::uint16_t*>(lane_value(8 * i + 2 * (l % 4)));
          const auto* r1 = static_cast<const std::uint16_t*>(lane_value(8 * i + 2 * (l % 4) + 1));
          dst[i] = std::uint32_t(r0[l / 4]) | std::uint32_t(r1[l / 4]) << 16;
        } else {
          dst[i] = static_cast<const std::uint32_t*>(lane_value(8 * i + l / 4))[l % 4];
        }
      }
    });
    dst0 = dst[0], dst1 = dst[1], dst2 = dst[2], dst3 = dst[3];
  }
};
using EmuLdsmN = EmuLdsm<cute::SM75_U32x4_LDSM_N, false>;
using EmuLdsmT = EmuLdsm<cute::SM75_U16x8_LDSM_T, true>;

// cp.async groups of the calling thread: copies since the last fence, then committed groups.
struct EmuAsyncCopy {
  const void* src;  // nullptr: src-size 0, the copy writes zeros
  void* dst;
};
inline thread_local std::vector<EmuAsyncCopy> emu_open_group;
inline thread_local std::vector<std::vector<EmuAsyncCopy>> emu_committed_groups;

// cp.async.cg of 16 bytes needs both addresses 16-byte aligned (a misaligned one faults on the GPU):
// the run ends here as it would there.
inline void emu_check_cp_async_alignment(const void* src, const void* dst) {
  if (reinterpret_cast<std::uintptr_t>(src) % 16 != 0 || reinterpret_cast<std::uintptr_t>(dst) % 16 != 0) {
    std::fprintf(stderr, "cp.async with a misaligned address: global %p, shared byte %td, thread %u\n", src,
                 static_cast<const unsigned char*>(dst) - emu_smem, emu_thread_id());
    std::abort();
  }
}

template <class TS, class TD = TS>
struct EmuCpAsync : cute::SM80_CP_ASYNC_CACHEGLOBAL<TS, TD> {
  static void copy(TS const& gmem_src, TD& smem_dst) {
    emu_check_cp_async_alignment(&gmem_src, &smem_dst);
    emu_note_async_write(std::size_t(reinterpret_cast<unsigned char*>(&smem_dst) - emu_smem));
    emu_open_group.push_back({&gmem_src, &smem_dst});
  }
};

template <class TS, class TD = TS>
struct EmuCpAsyncZfill : cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<TS, TD> {
  static void copy(TS const& gmem_src, TD& smem_dst, bool pred) {
    emu_check_cp_async_alignment(&gmem_src, &smem_dst);  // (the source operand is given even when pred is false)
    emu_note_async_write(std::size_t(reinterpret_cast<unsigned char*>(&smem_dst) - emu_smem));
    emu_open_group.push_back({pred ? static_cast<const void*>(&gmem_src) : nullptr, &smem_dst});
  }
};

inline void emu_cp_async_fence() {
  emu_committed_groups.push_back(std::move(emu_open_group));
  emu_open_group.clear();
}

// cp.async.wait_group N: all but the N most recent committed groups have landed.
template <int N>
void emu_cp_async_wait() {
  while (emu_committed_groups.size() > std::size_t(N)) {
    for (const EmuAsyncCopy& c : emu_committed_groups.front()) {
      if (c.src != nullptr)
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
      emu_note_landed(std::size_t(static_cast<unsigned char*>(c.dst) - emu_smem));
    }
    emu_committed_groups.erase(emu_committed_groups.begin());
  }
}

namespace cute {
template <class Real, class In>
struct MMA_Traits<EmuMma<Real, In>> : MMA_Traits<Real> {};
template <class Real, bool kTransposed>
struct Copy_Traits<EmuLdsm<Real, kTransposed>> : Copy_Traits<Real> {};
template <class TS, class TD>
struct Copy_Traits<EmuCpAsync<TS, TD>> : Copy_Traits<SM80_CP_ASYNC_CACHEGLOBAL<TS, TD>> {};
template <class TS, class TD>
struct Copy_Traits<EmuCpAsyncZfill<TS, TD>> : Copy_Traits<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<TS, TD>> {};
}  // namespace cute

using EmuMmaF16 = EmuMma<cute::SM80_16x8x16_F32F16F16F32_TN, cute::half_t>;
using EmuMmaBF16 = EmuMma<cute::SM80_16x8x16_F32BF16BF16F32_TN, cute::bfloat16_t>;
