// Tensor-memory-accelerator (TMA) loads of the flash kernels' [rows, D] operand tiles: what the
// host tells the hardware about a 16-bit [B, H, S, D] operand (any strides, D dense), and the
// descriptors a kernel receives.
//
// A TMA descriptor (CUtensorMap, 128 bytes, built by the driver's cuTensorMapEncodeTiled) names
// the tensor's base, its dims and byte strides, the box one copy moves and the shared-memory
// swizzle. Here: dims (D, S, H, B), boxes of 64 x 64 elements (D split into 128-byte slabs, the
// widest box the 128-byte swizzle takes), landing in the GMMA 128-byte-swizzled layout that
// wgmma reads; rows past S are zero-filled by the hardware.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/problem.hpp"

namespace rudnn::attention {

// What cuTensorMapEncodeTiled is given for one operand (dims[0] is D, contiguous).
struct TmaTensor4d {
  const void* base = nullptr;
  std::uint64_t dims[4] = {0, 0, 0, 0};           // D, S, H, B
  std::uint64_t strides_bytes[3] = {0, 0, 0};     // of S, H, B
  std::uint32_t box[4] = {64, 64, 1, 1};          // elements: 64 of D (128 bytes) x 64 rows
};

// The TMA tensor of an operand with `seq` rows per head; the kernels' box is 64 x 64.
inline TmaTensor4d tma_tensor_of(const void* base, const Strides& s, std::int64_t d, std::int64_t seq,
                                 std::int64_t heads, std::int64_t batch) {
  TmaTensor4d t;
  t.base = base;
  t.dims[0] = std::uint64_t(d), t.dims[1] = std::uint64_t(seq), t.dims[2] = std::uint64_t(heads),
  t.dims[3] = std::uint64_t(batch);
  t.strides_bytes[0] = std::uint64_t(s.s) * 2, t.strides_bytes[1] = std::uint64_t(s.h) * 2,
  t.strides_bytes[2] = std::uint64_t(s.b) * 2;
  return t;
}

// Whether TMA can load this operand: a base and byte strides that are non-zero multiples of 16
// (zero strides, as broadcast views have, are left to cp.async), dims within 2^32, some rows.
inline bool tma_loadable(const TmaTensor4d& t) {
  if (t.base == nullptr || reinterpret_cast<std::uintptr_t>(t.base) % 16 != 0) return false;
  for (std::uint64_t s : t.strides_bytes)
    if (s == 0 || s % 16 != 0 || s >= (std::uint64_t(1) << 40)) return false;
  for (std::uint64_t d : t.dims)
    if (d == 0 || d > (std::uint64_t(1) << 32)) return false;
  return true;
}

// The TMA tensor of one operand of `p` with `rows` rows per (head, batch): (D, S, H, B) for dense
// operands; a packed variable-length batch is one batch of all its rows, (D, total, H, 1), and the
// kernels add the sequence's first row (Problem::sequence) and pass batch 0 (tma_batch). Its tail
// tiles then hold the next sequence's rows where a dense tensor's would be zero-filled: the
// kernels clear those that a product would read (clear_tile_rows, flash_sm90.cuh).
inline TmaTensor4d tma_operand(const Problem& p, const void* base, const Strides& s, std::int64_t d,
                               std::int64_t rows, std::int64_t heads) {
  TmaTensor4d t = tma_tensor_of(base, s, d, rows, heads, p.varlen ? 1 : p.batch);
  if (p.varlen) t.strides_bytes[2] = t.strides_bytes[0] * t.dims[1];  // never stepped; the rows' extent
  return t;
}

// The batch coordinate of sequence b in its operands' TMA tensors (tma_operand).
RUDNN_HD int tma_batch(const Problem& p, std::int64_t b) { return p.varlen ? 0 : int(b); }

// Whether a flash forward can load this problem's Q, K and V by TMA (no zero strides; K and V
// need none without keys).
inline bool tma_forward_supports(const Problem& p, const void* q, const void* k, const void* v) {
  if (!tma_loadable(tma_operand(p, q, p.q, p.d, p.sq, p.hq))) return false;
  return p.sk == 0 || (tma_loadable(tma_operand(p, k, p.k, p.d, p.sk, p.hkv)) &&
                       tma_loadable(tma_operand(p, v, p.v, p.dv, p.sk, p.hkv)));
}

// The descriptors of a flash forward's Q, K and V (a kernel parameter: __grid_constant__).
struct TmaLoads {
  CUtensorMap q, k, v;
};

// ... built by `encode` (TmaTensor4d -> CUtensorMap: the driver's encoder, or a stand-in); K and V
// stay unencoded when there are no keys (no copy is issued).
template <class Encode>
TmaLoads tma_forward_loads(const Problem& p, const void* q, const void* k, const void* v, Encode&& encode) {
  TmaLoads tma{};
  tma.q = encode(tma_operand(p, q, p.q, p.d, p.sq, p.hq));
  if (p.sk > 0) {
    tma.k = encode(tma_operand(p, k, p.k, p.d, p.sk, p.hkv));
    tma.v = encode(tma_operand(p, v, p.v, p.dv, p.sk, p.hkv));
  }
  return tma;
}

// Whether the warp-specialized flash backward can load Q, K, V and dO by TMA: as the forward,
// and dO as well.
inline bool tma_backward_supports(const BackwardProblem& bp, const void* q, const void* k, const void* v,
                                  const void* dout) {
  const Problem& p = bp.fwd;
  return tma_forward_supports(p, q, k, v) &&
         (p.sq == 0 || tma_loadable(tma_operand(p, dout, bp.dout, p.dv, p.sq, p.hq)));
}

// ... and its descriptors (Q and dO unencoded when there are no queries).
struct TmaBackwardLoads {
  CUtensorMap q, k, v, dout;
};
template <class Encode>
TmaBackwardLoads tma_backward_loads(const BackwardProblem& bp, const void* q, const void* k, const void* v,
                                    const void* dout, Encode&& encode) {
  const Problem& p = bp.fwd;
  TmaBackwardLoads tma{};
  tma.k = encode(tma_operand(p, k, p.k, p.d, p.sk, p.hkv));
  tma.v = encode(tma_operand(p, v, p.v, p.dv, p.sk, p.hkv));
  if (p.sq > 0) {
    tma.q = encode(tma_operand(p, q, p.q, p.d, p.sq, p.hq));
    tma.dout = encode(tma_operand(p, dout, bp.dout, p.dv, p.sq, p.hq));
  }
  return tma;
}

// cuTensorMapEncodeTiled for a 16-bit tensor (f16 or bf16) with the 128-byte swizzle, through
// the runtime's driver entry point (the library does not link the driver). tma.cu.
CUtensorMap encode_tma(const TmaTensor4d& t, DType dtype);

}  // namespace rudnn::attention
