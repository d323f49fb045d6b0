// The gather of KV tiles from physical pages into the sm80 flash kernels' swizzled shared-memory
// tiles, shared by the paged family's tensor-core kernels (prefill_cuda.cu: K and V of attention;
// mla_decode_cuda.cu: the latent and rotary-key rows of MLA, and its query tile): one thread per
// slot of a tile looks up the slot's page once (the bounded reads of cuda_common.cuh: a table entry
// outside [0, pages) is no row, staged as zeros, its scores masked by the kernel) and stores the
// element offsets of its rows; then every thread issues its 16-byte cp.async chunks (flash
// TileLoader's thread-to-chunk map) from those offsets, with zero-fill where a row is absent.
//
// The host emulator (tests/test_paged_emulation.py) runs this file's text from the marker line on.
#pragma once

#include "attention/flash_sm80.cuh"
#include "paged/cuda_common.cuh"

namespace rudnn::paged::cuda {
// ---- emulated from here (tests/test_paged_emulation.py) ----

namespace flash = attention::flash;

// Where the rows of one tile come from: per slot, element offsets of its two rows (attention: K
// and V; MLA: latent and rotary key) in their caches (-1: no row, a zero row is staged) and
// whether its scores take part.
struct TileSlots {
  i64* a_off;
  i64* b_off;
  unsigned char* present;
};

// Slot t0 + tid of sequence seq (threads tid below the tile's slot count, one slot each: one
// table read per slot, the 32-bit division of a slot by the page size; t0 + tid < 2^32 and the
// page size below 2^31, which the kernels' host checks ensure), its rows at a(page, slot, head_a)
// and b(page, slot, head_b); slots at or past `end` and those whose table entry is not a page of
// the caches have none.
__device__ __forceinline__ void locate_slot(const Schedule& s, i64 pages, const CacheStrides& a, i64 head_a,
                                            const CacheStrides& b, i64 head_b, i64 seq, int t0, int end,
                                            const TileSlots& out, int tid) {
  const unsigned t = unsigned(t0 + tid), page_size = unsigned(s.page_size), j = t / page_size;
  i64 page = -1;
  if (t0 + tid < end) {
    page = s.page(seq, j);
    page = page < pages ? page : -1;  // negative ids stay negative
  }
  const unsigned slot = t - j * page_size;
  out.a_off[tid] = page >= 0 ? a.at(page, slot, head_a) : -1;
  out.b_off[tid] = page >= 0 ? b.at(page, slot, head_b) : -1;
  out.present[tid] = page >= 0;
}

// The flash TileLoader's thread-to-chunk map and shared-memory steps, reading each tile row from
// the row offset its slot was given (locate_slot) instead of one strided run of rows.
template <class Element, class SmemLayout, int kThreads, int kThreadsPerRow>
struct PageGather : flash::TileLoader<Element, SmemLayout, kThreads, kThreadsPerRow> {
  using Base = flash::TileLoader<Element, SmemLayout, kThreads, kThreadsPerRow>;
  __device__ explicit PageGather(int tid) : Base(tid) {}

  // The tile's rows into `tile`: row i from base + offset[i], a zero row where the offset is -1
  // (src-size 0: nothing read).
  __device__ __forceinline__ void gather(const Element* base, const i64* offset, Element* tile) const {
    gather_two<Base::kCols>(base, offset, base, offset, tile);
  }

  // Rows of two parts: columns [0, kSplit) of row i from a + a_off[i], the columns from kSplit on
  // from b + b_off[i] (MLA: the latent, then the rotary key); a zero row where a_off[i] is -1.
  // kSplit is a multiple of the loader's column step, so each chunk's source is known at compile time.
  template <int kSplit>
  __device__ __forceinline__ void gather_two(const Element* a, const i64* a_off, const Element* b, const i64* b_off,
                                             Element* tile) const {
    static_assert(kSplit % Base::kColStep == 0, "a 16-byte chunk never straddles the two parts");
    Element* to = &cute::make_tensor(cute::make_smem_ptr(tile), SmemLayout{})(this->row, this->col);
    CUTE_UNROLL
    for (int i = 0; i < Base::kRowSteps; ++i) {
      const i64 ao = a_off[this->row + i * Base::kRowStep];
      const bool present = ao >= 0;
      const Element* from_a = a + (present ? ao : 0) + this->col;
      const Element* from_b = b + (present ? b_off[this->row + i * Base::kRowStep] : 0) + this->col;
      CUTE_UNROLL
      for (int j = 0; j < Base::kColSteps; ++j) {
        const int c = j * Base::kColStep;  // a constant: the chunk's part and its column in that part
        const Element* from = c < kSplit ? from_a + c : from_b + (c - kSplit);
        cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(
            *reinterpret_cast<const cute::uint128_t*>(from),
            *reinterpret_cast<cute::uint128_t*>(to + i * Base::kSmemRowStep + j * Base::kSmemColStep), present);
      }
    }
  }
};

}  // namespace rudnn::paged::cuda
