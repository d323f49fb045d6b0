// Host emulator of the attention "flash" sm80 kernels (CuTe, mma.sync), forward and backward
// (tests/test_attention_emulation.py builds it). The kernels' own source text
// (cpp/src/attention/flash_sm80.cuh, flash_bwd_sm80.cuh and the sm90a ones, extracted by the test into
// kernels.inc) runs on the CPU through emu_runtime.hpp with its hardware atoms renamed to the
// stand-ins of emu_sm80_atoms.hpp (tensor-core MMA, ldmatrix, cp.async) and the dynamic
// shared-memory pointer edited; the CuTe layouts, swizzles, partitions, the cp.async schedule,
// barriers, online softmax and masking are the real code. bfloat16 only (the kernels' float16
// instantiation differs in the MMA atom's input type alone). Command line and files:
// attention_emu_main.hpp.
#include "emu_sm90_atoms.hpp"

#include "attention_emu_main.hpp"
#include "core/dispatch.hpp"

#include "emu_keywords.hpp"

#include "attention/cuda_common.cuh"
#include "attention/kernels.hpp"

// namespace rudnn::attention::flash { ...flash_sm80.cuh, flash_bwd_sm80.cuh, flash_sm90.cuh, flash_sm90_ws.cuh,
// flash_bwd_sm90.cuh, flash_bwd_sm90_ws.cuh
// without their launchers... }
#include "kernels.inc"

namespace {

using namespace rudnn::attention::flash;
using Element = cute::bfloat16_t;
using emu_attention::i64;

const Element* as_element(const std::uint16_t* p) { return reinterpret_cast<const Element*>(p); }
Element* as_element(std::uint16_t* p) { return reinterpret_cast<Element*>(p); }

// The head dims the library instantiates (cpp/src/attention/flash_*_d*.cu), forward and backward;
// with EMU_HEAD_DIM defined (the planted-bug tests, which run one case) only that one, which
// compiles in a fraction of the time.
constexpr bool emu_builds([[maybe_unused]] int d) {
#ifdef EMU_HEAD_DIM
  return d == EMU_HEAD_DIM;
#else
  return true;
#endif
}
template <class Body>
void head_dims(i64 d, i64 dv, Body&& body) {
  if constexpr (emu_builds(64))
    if (d == 64 && dv == 64) return body(cute::Int<64>{}, cute::Int<64>{});
  if constexpr (emu_builds(96))
    if (d == 96 && dv == 96) return body(cute::Int<96>{}, cute::Int<96>{});
  if constexpr (emu_builds(128))
    if (d == 128 && dv == 128) return body(cute::Int<128>{}, cute::Int<128>{});
  if constexpr (emu_builds(192))
    if (d == 192 && dv == 128) return body(cute::Int<192>{}, cute::Int<128>{});
  if constexpr (emu_builds(256))
    if (d == 256 && dv == 256) return body(cute::Int<256>{}, cute::Int<256>{});
  std::fprintf(stderr, "no flash kernels for head dims %lld, %lld in this build\n", static_cast<long long>(d),
               static_cast<long long>(dv));
  std::exit(2);
}
// EMU_FLASH_GENERATION=sm90 or sm90ws: the forward and the backward run that sm90a generation's
// kernels where they exist (sm90's where sm90ws has none).
std::string generation() {
  const char* g = std::getenv("EMU_FLASH_GENERATION");
  return g != nullptr ? g : "sm80";
}

i64 blocks(i64 n, i64 tile) { return (n + tile - 1) / tile; }

struct FlashKernels {
  static constexpr bool kFloat32 = false;

  template <class Bits>
  static void forward(const rudnn::attention::Problem& p, const Bits* q, const Bits* k, const Bits* v, Bits* out,
                      float* lse) {
    if constexpr (std::is_same_v<Bits, std::uint16_t>) {
      head_dims(p.d, p.dv, [&](auto head_dim, auto head_dim_v) {
        constexpr int D = decltype(head_dim)::value, Dv = decltype(head_dim_v)::value;
        using Cfg = Sm80Config<Element, D, Dv>;
        auto kernel = p.plain_scores() ? forward_sm80_kernel<Element, D, Dv, true>
                                       : forward_sm80_kernel<Element, D, Dv, false>;
        unsigned rows_per_cta = Cfg::kBlockM, threads = Cfg::kThreads;
        std::size_t smem = Cfg::kSmemBytes;
        // sm90ws (TMA boxes of 64 columns: not D = 96) where TMA can load the operands, as the
        // library decides; sm90 otherwise (every head-dim pair).
        if constexpr (D % 64 == 0 && Dv % 64 == 0) {
          if (generation() == "sm90ws" && rudnn::attention::tma_forward_supports(p, q, k, v)) {
            using Ws = Sm90WsConfig<Element, D, Dv>;
            const auto tma = rudnn::attention::tma_forward_loads(p, q, k, v, emu_encode_tma);
            auto ws = p.plain_scores() ? forward_sm90ws_kernel<Element, D, Dv, true>
                                       : forward_sm90ws_kernel<Element, D, Dv, false>;
            emu_launch(EmuDim3{unsigned(blocks(p.sq, Ws::kRowsPerCta)), unsigned(p.hq), unsigned(p.batch)},
                       Ws::kThreads, 1, Ws::kSmemBytes,
                       [&] { ws(p, as_element(q), as_element(k), as_element(v), as_element(out), lse, tma); });
            return;
          }
        }
        if (generation() != "sm80") {  // the sm80 kernel's launch shape, its own shared memory
          kernel = p.plain_scores() ? forward_sm90_kernel<Element, D, Dv, true>
                                    : forward_sm90_kernel<Element, D, Dv, false>;
          smem = Sm90ForwardConfig<Element, D, Dv>::kSmemBytes;
        }
        emu_launch(EmuDim3{unsigned(blocks(p.sq, rows_per_cta)), unsigned(p.hq), unsigned(p.batch)}, threads, 1, smem,
                   [&] { kernel(p, as_element(q), as_element(k), as_element(v), as_element(out), lse); });
      });
    }
  }

  template <class Bits>
  static void backward(const rudnn::attention::BackwardProblem& bp, const Bits* dout, const Bits* q, const Bits* k,
                       const Bits* v, const Bits* out, const float* lse, Bits* dq, Bits* dk, Bits* dv, float* delta) {
    if constexpr (std::is_same_v<Bits, std::uint16_t>) {
      const rudnn::attention::Problem& p = bp.fwd;
      head_dims(p.d, p.dv, [&](auto head_dim, auto head_dim_v) {
        constexpr int D = decltype(head_dim)::value, Dv = decltype(head_dim_v)::value;
        using Cfg = Sm80BwdConfig<Element, D, Dv>;
        emu_launch(EmuDim3{unsigned(blocks(p.sq, 4)), unsigned(p.hq), unsigned(p.batch)}, 128, 1, 0,
                   [&] { delta_kernel<Element>(bp, as_element(dout), as_element(out), delta); });
        auto dq_kernel_here = p.plain_scores() ? dq_kernel<Element, D, Dv, true> : dq_kernel<Element, D, Dv, false>;
        auto dkdv_kernel_here =
            p.plain_scores() ? dkdv_kernel<Element, D, Dv, true> : dkdv_kernel<Element, D, Dv, false>;
        unsigned dq_threads = Cfg::kThreads, dkdv_threads = Cfg::kThreads;
        std::size_t dq_smem = Cfg::kDqSmemBytes, dkdv_smem = Cfg::kDkdvSmemBytes;
        if (generation() != "sm80") {  // the sm90a backward (every head-dim pair)
          using Cfg90 = Sm90BwdConfig<Element, D, Dv>;
          dq_kernel_here =
              p.plain_scores() ? dq_sm90_kernel<Element, D, Dv, true> : dq_sm90_kernel<Element, D, Dv, false>;
          dkdv_kernel_here = p.plain_scores() ? dkdv_sm90<Element, D, Dv, true>() : dkdv_sm90<Element, D, Dv, false>();
          dq_threads = 128, dkdv_threads = Cfg90::kDkdvThreads;
          dq_smem = Cfg90::kDqSmemBytes, dkdv_smem = Cfg90::kDkdvSmemBytes;
        }
        emu_launch(EmuDim3{unsigned(blocks(p.sq, 64)), unsigned(p.hq), unsigned(p.batch)}, dq_threads, 1, dq_smem, [&] {
          dq_kernel_here(bp, as_element(dout), as_element(q), as_element(k), as_element(v), lse, delta, as_element(dq));
        });
        // sm90ws: the warp-specialized dk/dv kernel where the library would run it (TMA boxes of
        // 64 columns; operands TMA can load); sm90's otherwise.
        if constexpr (D % 64 == 0 && Dv % 64 == 0) {
          if (generation() == "sm90ws" && rudnn::attention::tma_backward_supports(bp, q, k, v, dout)) {
            using Ws = Sm90WsBwdConfig<Element, D, Dv>;
            const auto tma = rudnn::attention::tma_backward_loads(bp, q, k, v, dout, emu_encode_tma);
            auto ws = p.plain_scores() ? dkdv_sm90ws_kernel<Element, D, Dv, true>
                                       : dkdv_sm90ws_kernel<Element, D, Dv, false>;
            emu_launch(EmuDim3{unsigned(blocks(p.sk, 64)), unsigned(p.hkv), unsigned(p.batch)}, Ws::kThreads, 1,
                       Ws::kSmemBytes, [&] { ws(bp, lse, delta, as_element(dk), as_element(dv), tma); });
            return;
          }
        }
        emu_launch(EmuDim3{unsigned(blocks(p.sk, 64)), unsigned(p.hkv), unsigned(p.batch)}, dkdv_threads, 1,
                   dkdv_smem, [&] {
                     dkdv_kernel_here(bp, as_element(dout), as_element(q), as_element(k), as_element(v), lse, delta,
                                      as_element(dk), as_element(dv));
                   });
      });
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int rc = emu_attention::main<FlashKernels>(argc, argv);
  return emu_hazards > 0 ? 3 : rc;  // the hazards are on stderr (emu_report_hazard)
}
