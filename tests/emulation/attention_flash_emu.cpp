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
#include "core/pack.cuh"  // flash_sm80.cuh's output stores

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

// The head dims the library instantiates (cpp/src/attention/flash_*_d*.cu), forward and backward,
// every generation, plain and general scores. A planted-bug test runs one case through one
// generation and one pass, and builds only those kernels (a fraction of the compile time):
// EMU_HEAD_DIM (64 ... 256), EMU_GENERATION (0 sm80, 1 sm90, 2 sm90ws), EMU_BACKWARD (0 or 1),
// EMU_PLAIN (0 general scores, 1 plain). A run that needs a kernel left out exits with code 2.
enum Generation { kSm80, kSm90, kSm90ws };

constexpr bool emu_builds([[maybe_unused]] int d) {
#ifdef EMU_HEAD_DIM
  return d == EMU_HEAD_DIM;
#else
  return true;
#endif
}
// Whether this build has generation `g`'s kernels of the pass `backward` with plain scores or not.
constexpr bool emu_builds([[maybe_unused]] Generation g, [[maybe_unused]] bool backward,
                          [[maybe_unused]] bool plain) {
  bool built = true;
#ifdef EMU_GENERATION
  built = built && g == EMU_GENERATION;
#endif
#ifdef EMU_BACKWARD
  built = built && backward == bool(EMU_BACKWARD);
#endif
#ifdef EMU_PLAIN
  built = built && plain == bool(EMU_PLAIN);
#endif
  return built;
}
[[noreturn]] void not_built(const char* what) {
  std::fprintf(stderr, "%s is not in this emulator build (EMU_GENERATION, EMU_BACKWARD, EMU_PLAIN)\n", what);
  std::exit(2);
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
// Calls body(std::bool_constant<plain>) for the problem's scores (the kernels' kPlain).
template <class Body>
void scores(bool plain, Body&& body) {
  if (plain) return body(std::true_type{});
  body(std::false_type{});
}
// EMU_FLASH_GENERATION=sm90 or sm90ws: the forward and the backward run that sm90a generation's
// kernels where they exist (sm90's where sm90ws has none).
Generation generation() {
  const char* g = std::getenv("EMU_FLASH_GENERATION");
  const std::string name = g != nullptr ? g : "sm80";
  if (name == "sm80") return kSm80;
  if (name == "sm90") return kSm90;
  if (name == "sm90ws") return kSm90ws;
  std::fprintf(stderr, "EMU_FLASH_GENERATION must be sm80, sm90 or sm90ws, not %s\n", name.c_str());
  std::exit(2);
}

i64 blocks(i64 n, i64 tile) { return (n + tile - 1) / tile; }
// The sm90ws dk/dv kernel's grid (launch_backward_sm90ws): kKeysPerCta keys per CTA.
template <class Ws>
EmuDim3 ws_dkdv_grid(const rudnn::attention::Problem& p) {
  return EmuDim3{unsigned(blocks(p.sk, Ws::kKeysPerCta)), unsigned(p.hkv), unsigned(p.batch)};
}

// The sm90ws dk/dv kernel as launch_backward_sm90ws launches it: its grid, and the softcap
// instantiation where the library takes it (Problem::softcap_scores).
template <int D, int Dv, bool kPlain, class Tma>
void launch_ws_dkdv(const rudnn::attention::BackwardProblem& bp, const float* lse, const float* delta, Element* dk,
                    Element* dv, float* dq_accum, const Tma& tma) {
  using Ws = Sm90WsBwdConfig<Element, D, Dv>;
  const bool softcap = !kPlain && bp.fwd.softcap_scores();
  emu_launch(ws_dkdv_grid<Ws>(bp.fwd), Ws::kThreads, 1, Ws::kSmemBytes, [&] {
    if constexpr (!kPlain) {
      if (softcap) return dkdv_sm90ws_kernel<Element, D, Dv, false, true>(bp, lse, delta, dk, dv, dq_accum, tma);
    }
    dkdv_sm90ws_kernel<Element, D, Dv, kPlain>(bp, lse, delta, dk, dv, dq_accum, tma);
  });
}

// EMU_SMS: the SM count the persistent sm90ws forward is launched for (the library's is the
// device's). Default 3, so that every run has CTAs that walk several work items (the emulator
// runs the CTAs one after another: fewer CTAs cost no time).
int emulated_sms() {
  const char* sms = std::getenv("EMU_SMS");
  const int n = sms != nullptr ? std::atoi(sms) : 3;
  if (n < 1) {
    std::fprintf(stderr, "EMU_SMS must be a positive SM count\n");
    std::exit(2);
  }
  return n;
}

struct FlashKernels {
  static constexpr bool kFloat32 = false;

  template <class Bits>
  static void forward(const rudnn::attention::Problem& p, const Bits* q, const Bits* k, const Bits* v, Bits* out,
                      float* lse) {
    if constexpr (std::is_same_v<Bits, std::uint16_t>) {
      head_dims(p.d, p.dv, [&](auto head_dim, auto head_dim_v) {
        scores(p.plain_scores(), [&](auto plain) {
          constexpr int D = decltype(head_dim)::value, Dv = decltype(head_dim_v)::value;
          constexpr bool kPlain = decltype(plain)::value;
          const Generation g = generation();
          // sm90ws (TMA boxes of 64 columns: not D = 96) where TMA can load the operands, as the
          // library decides; sm90 otherwise (every head-dim pair).
          if constexpr (D % 64 == 0 && Dv % 64 == 0 && emu_builds(kSm90ws, false, kPlain)) {
            if (g == kSm90ws && rudnn::attention::tma_forward_supports(p, q, k, v)) {
              using Ws = Sm90WsConfig<Element, D, Dv>;
              const auto tma = rudnn::attention::tma_forward_loads(p, q, k, v, emu_encode_tma);
              // the softcap instantiation where the library takes it (launch_forward_sm90ws)
              const bool softcap = !kPlain && p.softcap_scores();
              // persistent: the library's grid for an emulated SM count (launch_forward_sm90ws)
              const Sm90WsWork work(p, Ws::kRowsPerCta);
              const i64 ctas = work.ctas(emulated_sms());
              if (ctas == 0) return;
              emu_launch(EmuDim3{unsigned(ctas), 1, 1}, Ws::kThreads, 1, Ws::kSmemBytes, [&] {
                if constexpr (!kPlain) {
                  if (softcap) {
                    forward_sm90ws_kernel<Element, D, Dv, false, true>(p, as_element(q), as_element(k), as_element(v),
                                                                       as_element(out), lse, tma, work);
                    return;
                  }
                }
                forward_sm90ws_kernel<Element, D, Dv, kPlain>(p, as_element(q), as_element(k), as_element(v),
                                                              as_element(out), lse, tma, work);
              });
              return;
            }
          }
          // sm90 runs at the sm80 kernel's launch shape, with its own shared memory (in a build
          // for sm90ws alone, a fallback to it exits as not built).
          using Cfg = Sm80Config<Element, D, Dv>;
          const EmuDim3 grid{unsigned(blocks(p.sq, Cfg::kBlockM)), unsigned(p.hq), unsigned(p.batch)};
          if constexpr (emu_builds(kSm90, false, kPlain)) {
            if (g != kSm80) {
              emu_launch(grid, Cfg::kThreads, 1, Sm90ForwardConfig<Element, D, Dv>::kSmemBytes, [&] {
                forward_sm90_kernel<Element, D, Dv, kPlain>(p, as_element(q), as_element(k), as_element(v),
                                                            as_element(out), lse);
              });
              return;
            }
          }
          if constexpr (emu_builds(kSm80, false, kPlain)) {
            if (g == kSm80) {
              emu_launch(grid, Cfg::kThreads, 1, Cfg::kSmemBytes, [&] {
                forward_sm80_kernel<Element, D, Dv, kPlain>(p, as_element(q), as_element(k), as_element(v),
                                                            as_element(out), lse);
              });
              return;
            }
          }
          not_built("this forward kernel");
        });
      });
    }
  }

  template <class Bits>
  static void backward(const rudnn::attention::BackwardProblem& bp, const Bits* dout, const Bits* q, const Bits* k,
                       const Bits* v, const Bits* out, const float* lse, Bits* dq, Bits* dk, Bits* dv, float* delta) {
    if constexpr (std::is_same_v<Bits, std::uint16_t>) {
      const rudnn::attention::Problem& p = bp.fwd;
      head_dims(p.d, p.dv, [&](auto head_dim, auto head_dim_v) {
        scores(p.plain_scores(), [&](auto plain) {
          constexpr int D = decltype(head_dim)::value, Dv = decltype(head_dim_v)::value;
          constexpr bool kPlain = decltype(plain)::value;
          const Generation g = generation();
          const EmuDim3 dq_grid{unsigned(blocks(p.sq, 64)), unsigned(p.hq), unsigned(p.batch)};
          const EmuDim3 dkdv_grid{unsigned(blocks(p.sk, 64)), unsigned(p.hkv), unsigned(p.batch)};
          // sm90ws with deterministic = false (launch_backward_sm90ws): no dq kernel; the dk/dv
          // kernel adds dQ into a float32 accumulator (NaN until zero_dq_accumulator_kernel
          // clears it), converted to dq after it.
          if constexpr (D % 64 == 0 && Dv % 64 == 0 && emu_builds(kSm90ws, true, kPlain)) {
            if (g == kSm90ws && !bp.deterministic && rudnn::attention::tma_backward_supports(bp, q, k, v, dout)) {
              // delta's rows (fallback_backward_workspace_bytes) x D floats, as dq_accumulator_bytes
              std::vector<float> accumulator(std::size_t((p.varlen ? 1 : p.batch) * p.hq * p.sq * D), NAN);
              float* dq_accum = accumulator.data();
              emu_launch(dq_grid, 128, 1, 0, [&] { zero_dq_accumulator_kernel<D>(bp, dq_accum); });
              emu_launch(EmuDim3{unsigned(blocks(p.sq, 4)), unsigned(p.hq), unsigned(p.batch)}, 128, 1, 0,
                         [&] { delta_kernel<Element>(bp, as_element(dout), as_element(out), delta); });
              const auto tma = rudnn::attention::tma_backward_loads(bp, q, k, v, dout, emu_encode_tma);
              if (p.sk > 0) launch_ws_dkdv<D, Dv, kPlain>(bp, lse, delta, as_element(dk), as_element(dv), dq_accum, tma);
              emu_launch(dq_grid, 128, 1, 0,
                         [&] { convert_dq_accumulator_kernel<Element, D>(bp, dq_accum, as_element(dq)); });
              return;
            }
          }
          emu_launch(EmuDim3{unsigned(blocks(p.sq, 4)), unsigned(p.hq), unsigned(p.batch)}, 128, 1, 0,
                     [&] { delta_kernel<Element>(bp, as_element(dout), as_element(out), delta); });
          // dq: sm80's, or for both sm90a generations sm90's (sm90ws has no dq kernel of its own)
          if constexpr (emu_builds(kSm80, true, kPlain)) {
            if (g == kSm80) {
              emu_launch(dq_grid, Sm80BwdConfig<Element, D, Dv>::kThreads, 1,
                         Sm80BwdConfig<Element, D, Dv>::kDqSmemBytes, [&] {
                           dq_kernel<Element, D, Dv, kPlain>(bp, as_element(dout), as_element(q), as_element(k),
                                                             as_element(v), lse, delta, as_element(dq));
                         });
            }
          }
          if constexpr (emu_builds(kSm90, true, kPlain) || emu_builds(kSm90ws, true, kPlain)) {
            if (g != kSm80) {
              emu_launch(dq_grid, 128, 1, Sm90BwdConfig<Element, D, Dv>::kDqSmemBytes, [&] {
                dq_sm90_kernel<Element, D, Dv, kPlain>(bp, as_element(dout), as_element(q), as_element(k),
                                                       as_element(v), lse, delta, as_element(dq));
              });
            }
          }
          // dk/dv: sm90ws's where the library would run it (TMA boxes of 64 columns; operands
          // TMA can load), else sm90's for both sm90a generations, or sm80's.
          if constexpr (D % 64 == 0 && Dv % 64 == 0 && emu_builds(kSm90ws, true, kPlain)) {
            if (g == kSm90ws && rudnn::attention::tma_backward_supports(bp, q, k, v, dout)) {
              const auto tma = rudnn::attention::tma_backward_loads(bp, q, k, v, dout, emu_encode_tma);
              launch_ws_dkdv<D, Dv, kPlain>(bp, lse, delta, as_element(dk), as_element(dv), nullptr, tma);
              return;
            }
          }
          if constexpr (emu_builds(kSm90, true, kPlain)) {
            if (g != kSm80) {
              using Cfg90 = Sm90BwdConfig<Element, D, Dv>;
              emu_launch(dkdv_grid, Cfg90::kDkdvThreads, 1, Cfg90::kDkdvSmemBytes, [&] {
                dkdv_sm90<Element, D, Dv, kPlain>()(bp, as_element(dout), as_element(q), as_element(k),
                                                    as_element(v), lse, delta, as_element(dk), as_element(dv));
              });
              return;
            }
          }
          if constexpr (emu_builds(kSm80, true, kPlain)) {
            if (g == kSm80) {
              emu_launch(dkdv_grid, Sm80BwdConfig<Element, D, Dv>::kThreads, 1,
                         Sm80BwdConfig<Element, D, Dv>::kDkdvSmemBytes, [&] {
                           dkdv_kernel<Element, D, Dv, kPlain>(bp, as_element(dout), as_element(q), as_element(k),
                                                               as_element(v), lse, delta, as_element(dk),
                                                               as_element(dv));
                         });
              return;
            }
          }
          not_built("this dk/dv kernel");
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
