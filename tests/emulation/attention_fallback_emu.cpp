// Host emulator of the attention "fallback" kernels, forward and backward
// (tests/test_attention_emulation.py builds it). The kernel's own source text
// (cpp/src/attention/fallback_cuda.cu, extracted by the test into kernels.inc with one edit: the
// dynamic shared-memory pointer) runs on the CPU through emu_runtime.hpp, so its tiling, staging,
// barriers, team shuffles and masking are the real code. Command line and files:
// attention_emu_main.hpp.
#include "attention_emu_main.hpp"

#include "core/dispatch.hpp"

#include "emu_keywords.hpp"

#include "attention/cuda_common.cuh"

// namespace rudnn::attention::cuda { namespace emu_fb { ...the kernels of fallback_cuda.cu... } }
#include "kernels.inc"

namespace {

using namespace rudnn::attention::cuda::emu_fb;
using emu_attention::i64;

i64 blocks_of(i64 rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

template <class Bits>
using Element = std::conditional_t<std::is_same_v<Bits, float>, float, __nv_bfloat16>;

template <class Bits>
const Element<Bits>* as_element(const Bits* p) {
  return reinterpret_cast<const Element<Bits>*>(p);
}
template <class Bits>
Element<Bits>* as_element(Bits* p) {
  return reinterpret_cast<Element<Bits>*>(p);
}

struct FallbackKernels {
  static constexpr bool kFloat32 = true;

  template <class Bits>
  static void forward(const rudnn::attention::Problem& p, const Bits* q, const Bits* k, const Bits* v, Bits* out,
                      float* lse) {
    const ColumnSplit split = split_columns(p.dv);
    const std::size_t smem = std::size_t(kAcc + kRowsPerBlock * split.cols) * sizeof(float);
    emu_launch(EmuDim3{unsigned(blocks_of(p.sq) * split.blocks), unsigned(p.hq), unsigned(p.batch)}, kThreads, 1,
               smem, [&] { forward_kernel(p, as_element(q), as_element(k), as_element(v), as_element(out), lse); });
  }

  template <class Bits>
  static void backward(const rudnn::attention::BackwardProblem& bp, const Bits* dout, const Bits* q, const Bits* k,
                       const Bits* v, const Bits* out, const float* lse, Bits* dq, Bits* dk, Bits* dv, float* delta) {
    const rudnn::attention::Problem& p = bp.fwd;
    const ColumnSplit dq_split = split_columns(p.d);
    emu_launch(EmuDim3{unsigned(blocks_of(p.sq) * dq_split.blocks), unsigned(p.hq), unsigned(p.batch)}, kThreads, 1,
               std::size_t(kAcc + kRowsPerBlock * dq_split.cols) * sizeof(float), [&] {
                 backward_dq_kernel(bp, as_element(dout), as_element(q), as_element(k), as_element(v),
                                    as_element(out), lse, as_element(dq), delta);
               });
    const ColumnSplit dk_split = split_columns(p.d), dv_split = split_columns(p.dv);
    emu_launch(EmuDim3{unsigned(blocks_of(p.sk) * std::max(dk_split.blocks, dv_split.blocks)), unsigned(p.hkv),
                       unsigned(p.batch)},
               kThreads, 1, std::size_t(kAcc + kRowsPerBlock * (dk_split.cols + dv_split.cols)) * sizeof(float), [&] {
                 backward_dkdv_kernel(bp, as_element(dout), as_element(q), as_element(k), as_element(v), lse, delta,
                                      as_element(dk), as_element(dv));
               });
  }
};

}  // namespace

int main(int argc, char** argv) { return emu_attention::main<FallbackKernels>(argc, argv); }
