// Host emulator of the attention "fallback" forward kernel (tests/test_attention_emulation.py
// builds it). The kernel's own source text (cpp/src/attention/fallback_cuda.cu, extracted by the
// test into kernels.inc with one edit: the dynamic shared-memory pointer) runs on the CPU through
// emu_runtime.hpp, so its tiling, staging, barriers, team shuffles and masking are the real code.
//
//   attention_fallback_emu <dir>
// reads <dir>/meta.txt ("B Hq Hkv Sq Sk D Dv bf16 scale softcap causal window_left window_right
// varlen batches mask_kind bias_kind", mask_kind/bias_kind: 0 none, 1 bool [B,Hq,Sq,Sk] mask,
// 2 float [B or 1, Hq, Sq, Sk]) and raw arrays q k v (float32 or bfloat16 bits, dense
// [B, H, S, D], or packed [total, H, D] when varlen with int32 cu_q.bin/cu_k.bin), mask.bin /
// bias.bin (uint8 or float32, dense [B', Hq, Sq, Sk] with B' in the meta line's mask/bias batch);
// writes out.bin (q's format) and lse.bin (float32, [B, Hq, Sq] or [Hq, total]).
#include "emu_runtime.hpp"

#include "attention/problem.hpp"
#include "core/dispatch.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(n)

#include "attention/cuda_common.cuh"

// namespace rudnn::attention::cuda { namespace emu_fb { ...the kernels of fallback_cuda.cu... } }
#include "kernels.inc"

using namespace rudnn;
using namespace rudnn::attention;
using i64 = std::int64_t;

namespace {

template <class T, class Bits>
int run(const std::string& dir, Problem p, i64 mask_batch, int mask_kind, i64 bias_batch, int bias_kind, i64 tq,
        i64 tk) {
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
  std::vector<Bits> out(rows_q * p.hq * p.dv);
  if constexpr (std::is_same_v<Bits, float>)  // poison: every element must be written
    std::fill(out.begin(), out.end(), NAN);
  else
    std::fill(out.begin(), out.end(), Bits(0xffff));  // a bfloat16 NaN
  std::vector<float> lse(rows_q * p.hq, NAN);

  using namespace rudnn::attention::cuda::emu_fb;
  const i64 col_blocks = (p.dv + kMaxOutCols - 1) / kMaxOutCols;
  const int out_cols = int((p.dv + col_blocks - 1) / col_blocks);
  const i64 m_blocks = (p.sq + kRowsPerBlock - 1) / kRowsPerBlock;
  const std::size_t smem = std::size_t(kAcc + kRowsPerBlock * out_cols) * sizeof(float);
  emu_launch(EmuDim3{unsigned(m_blocks * col_blocks), unsigned(p.hq), unsigned(p.batch)}, kThreads, 1, smem, [&] {
    forward_kernel<T>(p, out_cols, reinterpret_cast<const T*>(q.data()), reinterpret_cast<const T*>(k.data()),
                      reinterpret_cast<const T*>(v.data()), reinterpret_cast<T*>(out.data()), lse.data());
  });
  emu_write(dir + "/out.bin", out);
  emu_write(dir + "/lse.bin", lse);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::ifstream meta(std::string(argv[1]) + "/meta.txt");
  Problem p;
  int bf16 = 0, causal = 0, varlen = 0, mask_kind = 0, bias_kind = 0;
  i64 mask_batch = 0, bias_batch = 0, tq = 0, tk = 0;
  meta >> p.batch >> p.hq >> p.hkv >> p.sq >> p.sk >> p.d >> p.dv >> bf16 >> p.scale >> p.softcap >> causal >>
      p.window_left >> p.window_right >> varlen >> tq >> tk >> mask_kind >> mask_batch >> bias_kind >> bias_batch;
  if (!meta) return 2;
  p.causal = causal != 0, p.varlen = varlen != 0, p.group = p.hq / p.hkv;
  p.dtype = bf16 ? DType::bf16 : DType::f32;
  if (bf16) return run<__nv_bfloat16, std::uint16_t>(argv[1], p, mask_batch, mask_kind, bias_batch, bias_kind, tq, tk);
  return run<float, float>(argv[1], p, mask_batch, mask_kind, bias_batch, bias_kind, tq, tk);
}
