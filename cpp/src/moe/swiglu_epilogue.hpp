// SwiGLU in the epilogue of the sm90a gate/up grouped GEMM (the fused forward of SwiGluExperts'
// tensor_core strategy, used when the experts were built with fused_gate_up).
//
// The GEMM multiplies the dispatched rows by gate_up [E, 2I, H], gate and up interleaved in
// blocks of 64 weight rows (moe_interleave_gate_up: rows [128 j, 128 j + 64) are gate's rows
// [64 j, 64 j + 64), the next 64 up's same rows). A 128-column output tile t therefore holds
// a = x gate^T in its first 64 columns and b = x up^T in its last 64, both for h's columns
// [64 t, 64 t + 64): each thread finds a and b of one h element in its own accumulators, half a
// fragment apart (the m64n128k16 D fragment: element v0 + 2 v1 + 4 j is column 8 j + 2 (l % 4) + v0,
// so column + 64 is element + 32), and stores h = silu(a) * b, never a or b.
//
// a and b are rounded to the element type before the SwiGLU, as the unfused path rounds them when
// it stores them: fused and unfused give the same h for the same accumulators.
//
// Two schedules run it (grouped_gemm_sm90.hpp): cooperative, 128-row tiles shared by two consumer
// warpgroups (256 threads), and ping-pong, 64-row tiles of one warpgroup each (128 threads); the
// pairing is the same in both, as each warpgroup holds m64n128 fragments.
//
// The tile store below is plain CuTe and C++ (host and device): tests/emulation/
// moe_swiglu_epilogue_emu.cpp runs it on the CPU for every thread of both real TiledMmas.
#pragma once

#include <cmath>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_atom.hpp"

namespace rudnn::moe::sm90 {

// ---- tile store (tests/emulation/moe_swiglu_epilogue_emu.cpp extracts this section) ----

// A CTA tile of the fused GEMM: kRows rows (128 cooperative, 64 ping-pong), 128 interleaved
// columns (64 of h), K by 64.
template <int kRows>
using SwigluTile = cute::Shape<cute::Int<kRows>, cute::_128, cute::_64>;
constexpr int kSwigluBlock = 64;  // weight rows per gate or up block of gate_up, h columns per tile

// The tiled MMA the kernel runs on that tile (kRows / 64 consumer warpgroups stacked along M, each
// an m64n128 wgmma): grouped_gemm_sm90.cuh checks that the collective builder chose it.
template <class Element, int kRows>
using SwigluTiledMma = decltype(cute::make_tiled_mma(
    cute::SM90::GMMA::ss_op_selector<Element, Element, float, SwigluTile<kRows>, cute::SM90::GMMA::Major::K,
                                     cute::SM90::GMMA::Major::K>(),
    cute::Layout<cute::Shape<cute::Int<kRows / 64>, cute::_1, cute::_1>>{}));

// h = silu(a) * b from float32 accumulators, a and b rounded to Element first (the unfused path
// stores them rounded), in the unfused kernel's order: (a * sigmoid(a)) * b.
template <class Element>
CUTE_HOST_DEVICE float swiglu_of(float acc_a, float acc_b) {
  const float a = static_cast<float>(Element(acc_a)), b = static_cast<float>(Element(acc_b));
  return a * (1.0f / (1.0f + expf(-a))) * b;
}

// Thread `thread_idx`'s part of one tile: `acc` its accumulators of the 128 x 128 tile,
// `out` h's element (tile row 0, the tile's first h column), `ld` h's row stride; rows at or
// past `rows` and h columns at or past `cols` (both counted from the tile's) are not written.
// Elements i and i + 1 (i even) are adjacent columns, i and i + kHalf the a and b of one h
// column: stored two h values (4 bytes) at a time.
template <class Element, class TiledMma, class Accumulators>
CUTE_HOST_DEVICE void store_swiglu_tile(TiledMma const& tiled_mma, int thread_idx, Accumulators const& acc,
                                        Element* out, std::int64_t ld, int rows, int cols) {
  using namespace cute;
  auto thr = tiled_mma.get_thread_slice(thread_idx);
  auto coords = thr.partition_C(make_identity_tensor(make_shape(tile_size<0>(tiled_mma), _128{})));  // (row, col)
  constexpr int kHalf = decltype(size(acc))::value / 2;
  static_assert(kHalf * 2 == decltype(size(coords))::value, "one coordinate per accumulator");
  CUTE_UNROLL
  for (int i = 0; i < kHalf; i += 2) {
    const int row = get<0>(coords(i)), col = get<1>(coords(i));
    if (row < rows && col < cols) {
      const Element h0(swiglu_of<Element>(acc(i), acc(i + kHalf)));
      const Element h1(swiglu_of<Element>(acc(i + 1), acc(i + 1 + kHalf)));
      const std::uint32_t bits = std::uint32_t(h0.raw()) | std::uint32_t(h1.raw()) << 16;
      auto* word = reinterpret_cast<std::uint32_t*>(out + row * ld + col);
#if defined(__CUDA_ARCH__)
      // st.global: D's pointer comes from a parameter array, and a plain store would be generic.
      // No "memory" clobber: nothing in the kernel reads D, and volatile keeps the order.
      asm volatile("st.global.b32 [%0], %1;" ::"l"(word), "r"(bits));
#else
      *word = bits;
#endif
    }
  }
}

// ---- end of the tile store ----

}  // namespace rudnn::moe::sm90
