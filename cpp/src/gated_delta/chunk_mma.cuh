// The tensor-core pieces the chunked gated delta kernels share (chunked_forward.cu,
// chunked_backward.cu): the sm80 mma.sync and ldmatrix atoms through CuTe, the swizzled layout of
// 16-bit shared-memory tiles, and acc += A B^T from two such tiles. Kept apart from
// cuda_common.cuh so the recurrent kernels' translation units do not parse CuTe.
// The atoms are named unqualified inside `using namespace cute` so the host emulator
// (tests/emulation/gated_delta_emu.cpp) can put its stand-ins in their place.
#pragma once

#include <cute/arch/copy_sm75.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <cute/tensor.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace rudnn::gated_delta::cuda::chunk_mma {

using namespace cute;

// The ldmatrix atoms: an operand whose contracted index runs along the tile's rows (N), or down
// its columns (T: ldmatrix .trans).
using LdsmN = SM75_U32x4_LDSM_N;
using LdsmT = SM75_U16x8_LDSM_T;

template <class E> struct MmaAtomFor;
template <> struct MmaAtomFor<cute::half_t> { using type = SM80_16x8x16_F32F16F16F32_TN; };
template <> struct MmaAtomFor<cute::bfloat16_t> { using type = SM80_16x8x16_F32BF16BF16F32_TN; };
// The CUDA type of the same bits, for the global loads of cuda_common.cuh.
template <class E>
using StorageOf = std::conditional_t<std::is_same_v<E, cute::half_t>, __half, __nv_bfloat16>;
// The other way: the CuTe element type of a storage type; void for float (no 16-bit operands).
template <class T> struct CuteOf { using type = void; };
template <> struct CuteOf<__half> { using type = cute::half_t; };
template <> struct CuteOf<__nv_bfloat16> { using type = cute::bfloat16_t; };

// Layout of a [Rows][Cols] tile of 16-bit elements in shared memory: row-major, and within each
// row the 16-byte pieces (8 elements: address bits 3-5 of an element offset) XORed with bits of
// the row, r mod 8 for rows of 64 or 128 elements, (r / 2) mod 4 for rows of 32 (two 64-byte
// rows share one 128-byte bank window). The 8 rows of an 8 x 8 ldmatrix matrix, and a cp.async
// piece of each of 8 rows, then fall in 8 different bank groups. A row stays a row (only pieces
// within it move), and the pattern repeats every 8 rows.
template <int Rows, int Cols>
struct SmemTile {
  static constexpr int kRows = Rows, kCols = Cols, kPitch = Cols;  // kPitch: elements from a row to the next
  static_assert(Cols == 32 || Cols == 64 || Cols == 128, "rows of 64, 128 or 256 bytes");
  static constexpr int kShift = Cols == 128 ? 4 : 3;  // from the piece bits to the row bits
  using Swz = Swizzle<Cols == 32 ? 2 : 3, 3, kShift>;
  using Layout = decltype(composition(Swz{}, cute::Layout<Shape<Int<kRows>, Int<kCols>>, Stride<Int<kCols>, _1>>{}));
  // The tile as [Rows][Cols], and its transpose [Cols][Rows] (the same memory).
  template <class E>
  static __device__ __forceinline__ auto view(E* p) {
    return make_tensor(make_smem_ptr(p), Layout{});
  }
  template <class E>
  static __device__ __forceinline__ auto view_t(E* p) {
    return make_tensor(make_smem_ptr(p),
                       composition(Swz{}, cute::Layout<Shape<Int<kCols>, Int<kRows>>, Stride<_1, Int<kCols>>>{}));
  }
  // What stage_tile and the element-wise passes rely on: the swizzle moves whole 16-byte pieces
  // (8 elements from a multiple of 8) within their row, and element (r + 8, c) sits 8 rows after
  // (r, c). Checked over the first 16 rows (the swizzle reads no row bit above the third).
  static constexpr bool pieces_stay_in_rows_every_8() {
    constexpr Layout l{};
    for (int r = 0; r < (Rows < 16 ? Rows : 16); ++r)
      for (int c = 0; c < Cols; ++c) {
        const int at = l(r, c);
        if (at / Cols != r || at != l(r, c / 8 * 8) + c % 8 || l(r, c / 8 * 8) % 8 != 0 ||
            (r >= 8 && at != l(r - 8, c) + 8 * Cols))
          return false;
      }
    return true;
  }
  static_assert(Rows % 8 == 0 && pieces_stay_in_rows_every_8(),
                "the swizzled layout is not the one stage_tile steps through");
};

// acc += A B^T with A (M, Kd) and B (N, Kd) views of swizzled shared tiles, their fragments
// loaded by ldmatrix (AtomA, AtomB: LdsmN or LdsmT) one k step of 16 at a time.
template <class AtomA, class AtomB, class Mma, class TA, class TB, class Acc>
__device__ __forceinline__ void mma_from_smem(const Mma& mma, const TA& sA, const TB& sB, Acc& acc) {
  using E = typename TA::value_type;
  auto thr = mma.get_thread_slice(threadIdx.x);
  auto rA = thr.partition_fragment_A(sA);  // (MMA, MMA_M, MMA_K)
  auto rB = thr.partition_fragment_B(sB);  // (MMA, MMA_N, MMA_K)
  auto copy_a = make_tiled_copy_A(Copy_Atom<AtomA, E>{}, mma);
  auto copy_b = make_tiled_copy_B(Copy_Atom<AtomB, E>{}, mma);
  auto thr_a = copy_a.get_thread_slice(threadIdx.x);
  auto thr_b = copy_b.get_thread_slice(threadIdx.x);
  auto sA_parts = thr_a.partition_S(sA);
  auto rA_parts = thr_a.retile_D(rA);
  auto sB_parts = thr_b.partition_S(sB);
  auto rB_parts = thr_b.retile_D(rB);
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(rA); ++kk) {
    copy(copy_a, sA_parts(_, _, kk), rA_parts(_, _, kk));
    copy(copy_b, sB_parts(_, _, kk), rB_parts(_, _, kk));
    gemm(mma, rA(_, _, kk), rB(_, _, kk), acc);
  }
}


// 4 warps as 2 x 2, a tile of 32 x 32 per k step of 16: each warp takes 16 rows and two 8-column
// atoms, so one ldmatrix.x4 fills its A fragment (16 x 16) and one its B fragment (2 x 8 x 16).
template <class E>
__device__ __forceinline__ auto make_chunk_mma() {
  return make_tiled_mma(typename MmaAtomFor<E>::type{}, Layout<Shape<_2, _2, _1>>{}, Tile<_32, _32, _16>{});
}

// TF32 operands (mma.sync m16n8k8 .tf32, float32 accumulators): a float32 value rounded to TF32's
// 10 mantissa bits, to nearest with ties away from zero as cvt.rna.tf32.f32 does (finite values
// only), kept as the bits of a float32 whose low 13 bits are zero. The same integer code on the
// GPU and in the host emulator.
__host__ __device__ __forceinline__ std::uint32_t tf32_bits(float x) {
  std::uint32_t u;
  memcpy(&u, &x, 4);
  return (u + 0x1000u) & 0xffffe000u;
}
__host__ __device__ __forceinline__ float tf32_value(std::uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
// x as hi + lo, both TF32: hi carries x's top 11 significant bits, lo the next 11, so a product
// by an operand exact in TF32 (a 16-bit float) keeps about float32's 24 (the 3xTF32 idea with the
// exact operand's lo term zero).
__host__ __device__ __forceinline__ void tf32_split(float x, std::uint32_t& hi, std::uint32_t& lo) {
  hi = tf32_bits(x);
  lo = tf32_bits(x - tf32_value(hi));
}

// d += A B for one warp: A [16 x 8] in a[4], B [8 x 8] in b0, b1 (each thread's fragment
// elements, PTX ISA "Matrix Fragments for mma.m16n8k8" with .tf32: group g = lane / 4, t = lane %
// 4; a0..a3 hold A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4); b0, b1 hold B(t, g),
// B(t + 4, g); d0..d3 hold D(g, 2t), D(g, 2t + 1), D(g + 8, 2t), D(g + 8, 2t + 1)).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  SM80_16x8x8_F32TF32TF32F32_TN::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b0, b1, d[0], d[1], d[2], d[3]);
}

}  // namespace rudnn::gated_delta::cuda::chunk_mma
