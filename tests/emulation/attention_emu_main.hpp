// The driver the attention kernel emulators share (attention_fallback_emu.cpp,
// attention_flash_emu.cpp): reads a case, launches the kernels through a `Kernels` policy,
// writes the results.
//
//   <emulator> <forward|backward> <dir>
// reads <dir>/meta.txt ("B Hq Hkv Sq Sk D Dv bf16 scale softcap causal window_left window_right
// varlen batches mask_kind bias_kind", mask_kind/bias_kind: 0 none, 1 bool [B,Hq,Sq,Sk] mask,
// 2 float [B or 1, Hq, Sq, Sk]) and raw arrays q k v (float32 or bfloat16 bits, dense
// [B, H, S, D], or packed [total, H, D] when varlen with int32 cu_q.bin/cu_k.bin), mask.bin /
// bias.bin (uint8 or float32, dense [B', Hq, Sq, Sk] with B' in the meta line's mask/bias batch);
// writes out.bin (q's format) and lse.bin (float32, [B, Hq, Sq] or [Hq, total]). backward also
// reads dout.bin, out.bin and lse.bin (the forward's results, as given), dlse.bin (float32, like
// lse) if it exists, and writes dq.bin, dk.bin, dv.bin (q's format) and delta.bin (float32).
//
// Kernels provides
//   template <class Bits> static void forward(const Problem&, const Bits* q, k, v, Bits* out, float* lse);
//   template <class Bits> static void backward(const BackwardProblem&, const Bits* dout, q, k, v, out,
//                                              const float* lse, Bits* dq, dk, dv, float* delta);
// with Bits float (float32) or std::uint16_t (bfloat16), and kFloat32: whether float32 is served.
#pragma once

#include "emu_runtime.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "attention/problem.hpp"

namespace emu_attention {

using namespace rudnn;
using namespace rudnn::attention;
using i64 = std::int64_t;

// Every element must be written: NaN bit patterns in both formats.
template <class Bits>
void poison(std::vector<Bits>& v) {
  if constexpr (std::is_same_v<Bits, float>)
    std::fill(v.begin(), v.end(), NAN);
  else
    std::fill(v.begin(), v.end(), Bits(0xffff));
}

template <class Kernels, class Bits>
int run(const std::string& which, const std::string& dir, Problem p, i64 mask_batch, int mask_kind, i64 bias_batch,
        int bias_kind, i64 tq, i64 tk) {
  const bool varlen = p.varlen;
  const i64 rows_q = varlen ? tq : p.batch * p.sq, rows_k = varlen ? tk : p.batch * p.sk;
  auto q = emu_read<Bits>(dir + "/q.bin", rows_q * p.hq * p.d);
  auto k = emu_read<Bits>(dir + "/k.bin", rows_k * p.hkv * p.d);
  auto v = emu_read<Bits>(dir + "/v.bin", rows_k * p.hkv * p.dv);
  std::vector<std::int32_t> cu_q, cu_k;
  if (varlen) {
    cu_q = emu_read<std::int32_t>(dir + "/cu_q.bin", p.batch + 1);
    cu_k = emu_read<std::int32_t>(dir + "/cu_k.bin", p.batch + 1);
    p.cu_q = cu_q.data(), p.cu_k = cu_k.data();
    p.sq = tq, p.sk = tk;
    p.q = {0, p.d, p.hq * p.d}, p.k = {0, p.d, p.hkv * p.d}, p.v = {0, p.dv, p.hkv * p.dv};
    p.out = {0, p.dv, p.hq * p.dv}, p.lse = {0, tq, 1};
  } else {
    p.q = {p.hq * p.sq * p.d, p.sq * p.d, p.d}, p.k = {p.hkv * p.sk * p.d, p.sk * p.d, p.d};
    p.v = {p.hkv * p.sk * p.dv, p.sk * p.dv, p.dv}, p.out = {p.hq * p.sq * p.dv, p.sq * p.dv, p.dv};
    p.lse = {p.hq * p.sq, p.sq, 1};
  }
  const i64 plane = p.hq * p.sq * p.sk;
  std::vector<std::uint8_t> mask_u8;
  std::vector<float> mask_f, bias_f;
  if (mask_kind != 0) {
    p.mask = {nullptr, mask_kind == 1 ? DType::boolean : DType::f32, mask_batch > 1 ? plane : 0, p.sq * p.sk, p.sk, 1};
    p.mask_is_bool = mask_kind == 1;
    if (mask_kind == 1) {
      mask_u8 = emu_read<std::uint8_t>(dir + "/mask.bin", mask_batch * plane);
      p.mask.data = mask_u8.data();
    } else {
      mask_f = emu_read<float>(dir + "/mask.bin", mask_batch * plane);
      p.mask.data = mask_f.data();
    }
  }
  if (bias_kind != 0) {
    bias_f = emu_read<float>(dir + "/bias.bin", bias_batch * plane);
    p.bias = {bias_f.data(), DType::f32, bias_batch > 1 ? plane : 0, p.sq * p.sk, p.sk, 1};
  }
  if (which == "forward") {
    // EMU_OUT_ROW_PAD=n: out's rows n elements longer than Dv (a strided out=; odd n gives an odd row
    // stride, where the epilogue cannot store pairs of elements); the padding must stay poisoned.
    const char* pad_env = std::getenv("EMU_OUT_ROW_PAD");
    const i64 pad = pad_env ? std::atoll(pad_env) : 0, row_len = p.dv + pad;
    if (pad > 0)
      p.out = varlen ? Strides{0, row_len, p.hq * row_len} : Strides{p.hq * p.sq * row_len, p.sq * row_len, row_len};
    std::vector<Bits> out_rows(rows_q * p.hq * row_len);
    poison(out_rows);
    const std::vector<Bits> poisoned = out_rows;
    std::vector<float> lse(rows_q * p.hq, NAN);
    Kernels::forward(p, q.data(), k.data(), v.data(), out_rows.data(), lse.data());
    std::vector<Bits> out(rows_q * p.hq * p.dv);
    for (i64 row = 0; row < rows_q * p.hq; ++row) {
      std::memcpy(&out[row * p.dv], &out_rows[row * row_len], p.dv * sizeof(Bits));
      if (std::memcmp(&out_rows[row * row_len + p.dv], &poisoned[row * row_len + p.dv], pad * sizeof(Bits)) != 0) {
        std::fprintf(stderr, "forward wrote into the padding of out's row %lld\n", (long long)row);
        return 4;
      }
    }
    emu_write(dir + "/out.bin", out);
    emu_write(dir + "/lse.bin", lse);
    return 0;
  }
  BackwardProblem bp;
  bp.fwd = p;
  // EMU_DETERMINISTIC=1: deterministic = true (the library's default is false)
  const char* deterministic = std::getenv("EMU_DETERMINISTIC");
  bp.deterministic = deterministic != nullptr && std::string(deterministic) == "1";
  bp.dout = p.out, bp.dq = p.q, bp.dk = p.k, bp.dv = p.v;  // dout is laid out like out
  auto dout = emu_read<Bits>(dir + "/dout.bin", rows_q * p.hq * p.dv);
  auto out = emu_read<Bits>(dir + "/out.bin", rows_q * p.hq * p.dv);
  auto lse = emu_read<float>(dir + "/lse.bin", rows_q * p.hq);
  std::vector<float> dlse;
  if (std::ifstream(dir + "/dlse.bin").good()) {
    dlse = emu_read<float>(dir + "/dlse.bin", rows_q * p.hq);
    bp.dlse = dlse.data(), bp.dlse_at = p.lse;
  }
  std::vector<Bits> dq(q.size()), dk(k.size()), dv(v.size());
  poison(dq), poison(dk), poison(dv);
  std::vector<float> delta(rows_q * p.hq, NAN);
  Kernels::backward(bp, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), dq.data(), dk.data(),
                    dv.data(), delta.data());
  emu_write(dir + "/dq.bin", dq);
  emu_write(dir + "/dk.bin", dk);
  emu_write(dir + "/dv.bin", dv);
  emu_write(dir + "/delta.bin", delta);
  return 0;
}

template <class Kernels>
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string which = argv[1], dir = argv[2];
  std::ifstream meta(dir + "/meta.txt");
  Problem p;
  int bf16 = 0, causal = 0, varlen = 0, mask_kind = 0, bias_kind = 0;
  i64 mask_batch = 0, bias_batch = 0, tq = 0, tk = 0;
  meta >> p.batch >> p.hq >> p.hkv >> p.sq >> p.sk >> p.d >> p.dv >> bf16 >> p.scale >> p.softcap >> causal >>
      p.window_left >> p.window_right >> varlen >> tq >> tk >> mask_kind >> mask_batch >> bias_kind >> bias_batch;
  if (!meta) return 2;
  p.causal = causal != 0, p.varlen = varlen != 0, p.group = p.hq / p.hkv;
  p.dtype = bf16 ? DType::bf16 : DType::f32;
  if (bf16)
    return run<Kernels, std::uint16_t>(which, dir, p, mask_batch, mask_kind, bias_batch, bias_kind, tq, tk);
  if constexpr (Kernels::kFloat32)
    return run<Kernels, float>(which, dir, p, mask_batch, mask_kind, bias_batch, bias_kind, tq, tk);
  std::fprintf(stderr, "these kernels take bfloat16 only\n");
  return 2;
}

}  // namespace emu_attention
