// Device helpers shared by the attention CUDA kernels: element conversion and the score
// transform (scale, softcap, bias, masks, causal/window visibility) exactly as the CPU
// reference defines it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/problem.hpp"
#include "core/convert.cuh"

namespace rudnn::attention::cuda {

using core::from_float;
using core::load_as_float;
using core::to_float;

// True where key j takes no part in query i's softmax before any arithmetic (causal,
// window, boolean mask). Additive -inf masks are handled by the arithmetic itself.
__device__ __forceinline__ bool hidden(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                                       std::int64_t j, std::int64_t len_q, std::int64_t len_k) {
  if (!p.visible(i, j, len_q, len_k)) return true;
  return p.mask.data != nullptr && p.mask_is_bool && load_as_float(p.mask.data, p.mask.dtype, p.mask.at(b, h, i, j)) == 0.0f;
}

// The logit from the raw dot product q_i . k_j; *tanh_out receives tanh(scale*dot/softcap)
// (0 without softcap) for the backward's chain rule.
__device__ __forceinline__ float logit(const Problem& p, float dot, std::int64_t b, std::int64_t h, std::int64_t i,
                                       std::int64_t j, float* tanh_out) {
  float s = dot * p.scale;
  float t = 0.0f;
  if (p.softcap > 0.0f) {
    t = tanhf(s / p.softcap);
    s = p.softcap * t;
  }
  if (p.bias.data != nullptr) s += load_as_float(p.bias.data, p.bias.dtype, p.bias.at(b, h, i, j));
  if (p.mask.data != nullptr && !p.mask_is_bool) s += load_as_float(p.mask.data, p.mask.dtype, p.mask.at(b, h, i, j));
  *tanh_out = t;
  return s;
}

// The query block of this CTA of a forward or dq kernel (grid x: the query blocks): the last
// first. Under causal masking a query block's work grows with its index, and the hardware starts
// CTAs in blockIdx order, so the heaviest start in the first wave and the lightest fill the last
// one instead of one long block ending the launch alone (FlashAttention-2's order). The dk/dv
// kernels need no change: there key block 0 is the heaviest.
__device__ __forceinline__ int query_block_heaviest_first() { return int(gridDim.x - 1 - blockIdx.x); }

// [first, last) key blocks that hold a key visible to some row in [m0, m0 + rows).
__host__ __device__ __forceinline__ void key_block_range(const Problem& p, std::int64_t m0, std::int64_t rows,
                                                std::int64_t len_q, std::int64_t len_k, int block_n,
                                                std::int64_t& first, std::int64_t& last) {
  const std::int64_t shift = len_k - len_q;
  std::int64_t lo = 0, hi = len_k;  // keys [lo, hi)
  if (p.causal || p.window_right >= 0) {
    // Causal caps the right side at 0 (the query's own position); any window_right >= 0 is wider.
    const std::int64_t right = p.causal ? 0 : p.window_right;
    const std::int64_t bound = m0 + rows - 1 + shift + right + 1;
    hi = bound < hi ? bound : hi;
  }
  if (p.window_left >= 0) {
    const std::int64_t bound = m0 + shift - p.window_left;
    lo = bound > lo ? bound : lo;
  }
  if (hi <= lo) {
    first = last = 0;
    return;
  }
  first = lo / block_n;
  last = (hi + block_n - 1) / block_n;
}

// Index of query row `row` of (b, h) in the float32 delta = dout . out workspace of the backward.
__host__ __device__ __forceinline__ std::int64_t delta_index(const Problem& p, std::int64_t b, std::int64_t h,
                                                             std::int64_t row) {
  return ((p.varlen ? 0 : b) * p.hq + h) * p.sq + row;
}

// [first, last) query blocks holding a query that sees some key of [n0, n0 + cols).
__host__ __device__ __forceinline__ void query_block_range(const Problem& p, std::int64_t n0, std::int64_t cols,
                                                           std::int64_t len_q, std::int64_t len_k, int block_m,
                                                           std::int64_t& first, std::int64_t& last) {
  const std::int64_t shift = len_k - len_q;  // query i sits at key position i + shift
  std::int64_t lo = 0, hi = len_q;          // queries [lo, hi)
  if (p.causal || p.window_right >= 0) {    // key j needs j <= i + shift + right
    const std::int64_t right = p.causal ? 0 : p.window_right;
    const std::int64_t bound = n0 - shift - right;
    lo = bound > lo ? bound : lo;
  }
  if (p.window_left >= 0) {  // key j needs j >= i + shift - left
    const std::int64_t bound = n0 + cols - 1 - shift + p.window_left + 1;
    hi = bound < hi ? bound : hi;
  }
  if (hi <= lo) {
    first = last = 0;
    return;
  }
  first = lo / block_m;
  last = (hi + block_m - 1) / block_m;
}

// The whole score transform of key j for query i: -inf where hidden, else logit(). Out of line
// on purpose: the flash kernels unroll it over every score of a tile, and inlined (bias and mask
// dtype switches, softcap's tanh, the division's slow path) it made the sm90a forward's main
// loop 8.7k instructions, ~140 KB, several times the SM's instruction cache. Kernels for problems
// without a mask, bias or softcap (Problem::plain_scores) keep the raw dots and test causal and
// window visibility by position with a TileBand instead. `*tanh_out` as for logit().
inline __device__ __noinline__ float general_logit(const Problem& p, float dot, std::int64_t b, std::int64_t h,
                                            std::int64_t i, std::int64_t j, std::int64_t len_q, std::int64_t len_k,
                                            float* tanh_out) {
  if (hidden(p, b, h, i, j, len_q, len_k)) {
    *tanh_out = 0.0f;
    return -INFINITY;
  }
  return logit(p, dot, b, h, i, j, tanh_out);
}

// Which scores of one tile (queries [m0, ...), keys [n0, ...)) are visible by position alone:
// inside both sequences, and for causal and the sliding window inside a band of diagonals, all
// in 32-bit tile coordinates (a query row r and key column c of the tile; the 64-bit compares
// of the general test grew the masking code through predicate spills). Limits are clamped to
// +-2^30, far beyond any tile, so that nothing the tile holds changes side.
struct TileBand {
  int rows_in = 0, cols_in = 0;  // rows below rows_in and columns below cols_in are in the sequences
  int lo = 0, hi = 0;            // column c is visible to row r when lo <= c - r <= hi

  __device__ __forceinline__ bool visible(int r, int c) const {
    return r < rows_in && c < cols_in && c - r >= lo && c - r <= hi;
  }
  // Every score of a rows x cols tile is visible (most tiles of a long sequence): nothing to mask.
  __device__ __forceinline__ bool covers(int rows, int cols) const {
    return rows_in >= rows && cols_in >= cols && hi >= cols - 1 && lo <= -(rows - 1);
  }
};

__device__ __forceinline__ TileBand tile_band(const Problem& p, std::int64_t m0, std::int64_t n0, std::int64_t len_q,
                                              std::int64_t len_k) {
  constexpr std::int64_t kFar = std::int64_t(1) << 30;
  auto narrow = [](std::int64_t v) { return int(v < -kFar ? -kFar : v > kFar ? kFar : v); };
  // Problem::visible in tile coordinates: query m0 + r sits at key position m0 + r + len_k - len_q,
  // so key n0 + c is on its diagonal where c - r = diag.
  const std::int64_t diag = m0 - n0 + len_k - len_q;
  TileBand band;
  band.rows_in = narrow(len_q - m0);
  band.cols_in = narrow(len_k - n0);
  band.hi = p.causal ? narrow(diag) : p.window_right >= 0 ? narrow(diag + p.window_right) : int(kFar);
  band.lo = p.window_left >= 0 ? narrow(diag - p.window_left) : int(-kFar);
  return band;
}

// The flash kernels' scores enter the softmax (forward) and the probabilities (backward) in
// units that one multiply by this factor turns into base-2 exponents, so that each probability
// is one FFMA and one ex2 (FlashAttention's exp2 trick): the raw q . k dots in the plain kernels
// (the scale is folded in here and never applied on its own), the transformed logits (natural
// units) otherwise.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
template <bool kPlain>
__device__ __forceinline__ float log2_factor(const Problem& p) {
  return kPlain ? p.scale * kLog2e : kLog2e;
}

// 2^x on the SFU, subnormal results flushed to zero (probabilities below 2^-126 of the row's
// largest do not matter at any precision the output has).
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// 1/x on the SFU (rcp.approx.ftz: within 1 ulp; 1/inf = 0).
__device__ __forceinline__ float rcp_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return 1.0f / x;
#endif
}

// The softcap logit cap tanh(scale dot / cap) inline, for the flash kernels' softcap
// instantiation (no call, no tanhf slow path): tanh(x) = 1 - 2 / (1 + e^(2x)), so
// cap tanh(x) = cap - 2 cap / (1 + 2^(dot k)) with k = 2 log2(e) scale / cap: FMUL, ex2, FADD,
// rcp, FFMA. Absolute error a few 1e-7 cap (ex2.approx and rcp.approx are within 2 ulp; the
// final cap - ... cancels where |logit| << cap, so the error is relative to cap, not to the
// logit): within a 16-bit output's tolerance for cap <= Problem::kInlineSoftcapMax, which
// softcap_scores() enforces (a huge cap would give 0 for every logit). Saturates to +-cap
// (2^(dot k) = inf gives rcp = 0; 0 gives -cap); NaN stays NaN.
struct SoftcapTransform {
  float k = 0.0f, cap = 0.0f, minus_two_cap = 0.0f;
  __device__ __forceinline__ explicit SoftcapTransform(const Problem& p)
      : k(2.0f * kLog2e * p.scale / p.softcap), cap(p.softcap), minus_two_cap(-2.0f * p.softcap) {}
  __device__ __forceinline__ float operator()(float dot) const {
    return fmaf(minus_two_cap, rcp_approx(1.0f + exp2_ftz(dot * k)), cap);
  }
};

// The backward's probability and score-gradient weight of one (query, key) pair from its score s
// (-inf where hidden) in log2_factor's units `to_log2`, tanh_s from the transform and the row's
// lse: P = exp(logit - lse) and w = P * d(softcap)/d(score) * scale, so that the gradient of
// q . k is dS = w (dP - delta) with dP = dout . v and delta = dout . out. Both 0 where s or lse
// is -inf. (The sm90a dk/dv kernel of wide heads computes P and w in one warpgroup and dS in
// another.)
__device__ __forceinline__ void probability_and_weight(const Problem& p, float s, float to_log2, float tanh_s,
                                                       float lse, float& prob, float& weight) {
  prob = weight = 0.0f;
  if (s == -INFINITY || lse == -INFINITY) return;
  prob = exp2_ftz(fmaf(s, to_log2, -lse * kLog2e));
  weight = prob * p.scale;
  if (p.softcap > 0.0f) weight *= 1.0f - tanh_s * tanh_s;
}

// dS from the weight: 0 where the weight is (the pair is hidden, or P underflowed).
__device__ __forceinline__ float dscore(float weight, float dp, float delta) {
  return weight == 0.0f ? 0.0f : weight * (dp - delta);
}

// Both at once, for the kernels that hold dP where they compute P: P and dS = P (dP - delta)
// d(softcap)/d(score) scale (the same value; this order keeps the sm90a dk/dv kernel of D = 128
// within its registers). Shared by the flash and fallback kernels (whose scores are logits:
// to_log2 = kLog2e).
__device__ __forceinline__ void probability_and_dscore(const Problem& p, float s, float to_log2, float tanh_s,
                                                       float lse, float dp, float delta, float& prob, float& ds) {
  prob = ds = 0.0f;
  if (s == -INFINITY || lse == -INFINITY) return;
  prob = exp2_ftz(fmaf(s, to_log2, -lse * kLog2e));
  if (prob == 0.0f) return;
  ds = prob * (dp - delta);
  if (p.softcap > 0.0f) ds *= 1.0f - tanh_s * tanh_s;
  ds *= p.scale;
}

}  // namespace rudnn::attention::cuda
