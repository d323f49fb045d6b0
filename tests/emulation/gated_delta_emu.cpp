// Host emulator of the gated delta CUDA kernels (tests/test_gated_delta_emulation.py builds it).
//
// The kernels' own source text (the anonymous namespaces of cpp/src/gated_delta/*.cu, extracted
// by the test into kernels.inc) runs on the CPU: every CUDA thread of a block is a std::thread,
// __syncthreads is a block-wide std::barrier, __shfl_xor_sync a warp-wide exchange, __shared__
// variables are shared by the block's threads (blocks run one after another). The chunked
// forward's hardware atoms are the stand-ins of emu_sm80_atoms.hpp: mma.sync and ldmatrix
// (.trans) as warp-collective exchanges with the PTX ISA's fragment layouts (and, for
// chunked_forward_wgmma, the state kernel's wgmma of emu_sm90_atoms.hpp, which reads its
// operands through the matrix descriptors as the PTX ISA defines them), cp.async copies
// that land only when their group is waited for (zero-filled pieces included); the ordering
// check of emu_runtime.hpp sees the copies and every lane's ldmatrix row read (chunk_mma.cuh takes
// the stand-ins through the macros below; the chunked backward's K K^T too). So its
// partitioning, swizzled staging, fragment loads, barriers, triangular solve and epilogues are
// the real code; a run that meets a shared-memory ordering hazard exits with 3 (the hazards are
// on stderr). The chunked backward's state passes stage through the same cp.async stand-in, and
// the test wraps their reads of the staged tiles (bwd_staged) so that the check sees them too.
// The chunked forward writes <dir>/staging.txt: which of its tiles took 16-byte cp.async
// ("qk v ws", 1 or 0 each, staging_for); the chunked backward its state passes' plan
// ("forward_stages reverse_stages k q dout g w u p", bwd_launch_plan for the device that
// EMU_MAX_SMEM, EMU_SMEM_PER_SM and EMU_SM_COUNT describe, by default an H100/H200).
//
//   gated_delta_emu <recurrent_forward|chunked_forward|chunked_forward_wgmma|recurrent_backward|chunked_backward> <dir>
// reads <dir>/meta.txt ("B T Hk Hv K V N has_initial has_cu has_dfinal bf16 scale [bthk [chunk_size]]") and
// raw little-endian arrays (q k v beta: float32 or bfloat16 bits; g, initial, dfinal: float32;
// cu: int32), all dense [B, H, T, X] / [N, Hv, K, V], or with bthk = 1 the forward's q k v beta g
// and out as dense [B, T, H, X] (the chunked backward: q k v beta g dout; its gradients stay
// dense [B, H, T, X]); writes out/final (forward) or dq dk dv dbeta dg dinit (backward) in the
// same formats. The chunked backward's workspace starts as NaN. Built with
// EMU_NO_CHUNKED_BACKWARD (and a kernel text without the chunked backward) it compiles in about
// half the time and refuses chunked_backward (exit 2): the forwards' planted-bug builds.
#include "emu_sm90_atoms.hpp"  // with emu_sm80_atoms.hpp

#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "core/dispatch.hpp"
#include "gated_delta/problem.hpp"

#include "emu_keywords.hpp"

namespace rudnn::gated_delta::cuda {
using i64 = std::int64_t;
inline i64 min(i64 a, i64 b) { return a < b ? a : b; }
inline i64 max(i64 a, i64 b) { return a > b ? a : b; }
}  // namespace rudnn::gated_delta::cuda

// cuda_common.cuh without its CUDA headers (already included above, before the macros).
#include "gated_delta/cuda_common.cuh"

// The chunked kernels' shared tensor-core pieces with the stand-ins in place of the hardware atoms
// (chunk_mma.cuh names them unqualified, so these macros swap them for its text only).
#define SM75_U32x4_LDSM_N EmuLdsmN
#define SM75_U16x8_LDSM_T EmuLdsmT
#define SM80_16x8x16_F32F16F16F32_TN EmuMmaF16
#define SM80_16x8x16_F32BF16BF16F32_TN EmuMmaBF16
#define SM80_16x8x8_F32TF32TF32F32_TN EmuMmaTf32
#include "chunk_mma.inc"  // gated_delta/chunk_mma.cuh as the test extracted it (planted bugs included)
#undef SM75_U32x4_LDSM_N
#undef SM75_U16x8_LDSM_T
#undef SM80_16x8x16_F32F16F16F32_TN
#undef SM80_16x8x16_F32BF16BF16F32_TN
#undef SM80_16x8x8_F32TF32TF32F32_TN

// namespace rudnn::gated_delta::cuda { namespace emu_rf {...} namespace emu_rb {...} namespace emu_ch {...} }
#include "kernels.inc"

using namespace rudnn;
using namespace rudnn::gated_delta;
using namespace rudnn::gated_delta::cuda;

namespace {

template <class T>
std::vector<T> read(const std::string& path, std::size_t n) {
  return emu_read<T>(path, n);
}
template <class T>
void write(const std::string& path, const std::vector<T>& v) {
  emu_write(path, v);
}
// Runs kernel() for `blocks` blocks along x with blockDim (bx, by).
template <class Kernel>
void launch(i64 blocks, unsigned bx, unsigned by, std::size_t dyn_smem, Kernel kernel) {
  emu_launch(EmuDim3{unsigned(blocks), 1, 1}, bx, by, dyn_smem, kernel);
}

SeqStrides dense(i64 H, i64 T, i64 X) { return {H * T * X, T * X, X}; }
SeqStrides dense_bthk(i64 H, i64 T, i64 X) { return {T * H * X, X, H * X}; }
StateStrides dense_state(i64 H, i64 K, i64 V) { return {H * K * V, K * V, V}; }

template <class T, class Bits>
int run(const std::string& which, const std::string& dir, Problem pr, bool has_init, bool has_cu, bool has_dfinal,
        bool bthk) {
  const i64 B = pr.B, T_ = pr.T, Hk = pr.Hk, Hv = pr.Hv, K = pr.K, V = pr.V, N = pr.N;
  auto q = read<Bits>(dir + "/q.bin", B * Hk * T_ * K), k = read<Bits>(dir + "/k.bin", B * Hk * T_ * K);
  auto v = read<Bits>(dir + "/v.bin", B * Hv * T_ * V), beta = read<Bits>(dir + "/beta.bin", B * Hv * T_);
  auto g = read<float>(dir + "/g.bin", B * Hv * T_);
  auto init = has_init ? read<float>(dir + "/init.bin", N * Hv * K * V) : std::vector<float>();
  auto cu = has_cu ? read<std::int32_t>(dir + "/cu.bin", N + 1) : std::vector<std::int32_t>();
  Params p;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.beta = beta.data(), p.g = g.data();
  p.initial = has_init ? init.data() : nullptr;
  p.cu_seqlens = has_cu ? cu.data() : nullptr;
  p.B = B, p.T = T_, p.Hk = Hk, p.Hv = Hv, p.K = K, p.V = V, p.N = N, p.group = Hv / Hk, p.scale = pr.scale;
  const auto seq = bthk ? dense_bthk : dense;
  p.sq = p.sk = seq(Hk, T_, K), p.sv = p.sout = p.sdout = seq(Hv, T_, V), p.sbeta = p.sg = seq(Hv, T_, 1);
  p.sinit = p.sfinal = p.sdfinal = dense_state(Hv, K, V);
  pr.varlen = has_cu;

  if (which == "recurrent_forward" || which == "chunked_forward" || which == "chunked_forward_wgmma") {
    std::vector<Bits> out(B * Hv * T_ * V);
    std::vector<float> fin(N * Hv * K * V, NAN);
    p.out = out.data(), p.final_state = fin.data();
    if (which == "recurrent_forward") {
      const i64 vtiles = value_tiles(V);
      launch(N * Hv * vtiles, kColsPerBlock, unsigned(row_groups(K)), 0,
             [&] { emu_rf::recurrent_forward_kernel<T>(p, vtiles); });
    } else {
      if constexpr (!std::is_same_v<T, float>) {
        using E = std::conditional_t<std::is_same_v<T, __half>, cute::half_t, cute::bfloat16_t>;
        const ChunkLayout l = emu_ch::chunked_forward_layout(pr);
        std::vector<unsigned char> buffer(std::size_t(l.g_bytes + l.p_bytes + l.w_bytes + l.u_bytes), 0xff);
        ChunkWorkspace ws;
        unsigned char* at = buffer.data();
        ws.g = reinterpret_cast<float*>(at);
        ws.p = at += l.g_bytes;
        ws.w = at += l.p_bytes;
        ws.u = at + l.w_bytes;
        ws.vp = l.vp;
        ws.chunks_per_batch = l.chunks_per_batch;
        const emu_ch::Staging st = emu_ch::staging_for(p, buffer.data());
        std::ofstream(dir + "/staging.txt") << st.qk << " " << st.v << " " << st.ws << "\n";
        launch(l.slots * Hv, emu_ch::kThreads, 1, sizeof(emu_ch::PrepSmem<E>),
               [&] { emu_ch::chunk_prep_kernel<E>(p, ws, l.vtiles, st); });
        if (which == "chunked_forward_wgmma")
          launch(N * Hv * l.vtiles, emu_ch::kThreads, 1, sizeof(emu_ch::StateSmem<E, emu_ch::state_stages<true>>),
                 [&] { emu_ch::chunk_state_kernel<E, true>(p, ws, l.vtiles, st); });
        else
          launch(N * Hv * l.vtiles, emu_ch::kThreads, 1, sizeof(emu_ch::StateSmem<E>),
                 [&] { emu_ch::chunk_state_kernel<E, false>(p, ws, l.vtiles, st); });
      }
    }
    write(dir + "/out.bin", out);
    write(dir + "/final.bin", fin);
    return emu_hazards > 0 ? 3 : 0;
  }
  auto dout = read<Bits>(dir + "/dout.bin", B * Hv * T_ * V);
#ifdef EMU_NO_CHUNKED_BACKWARD  // built without the chunked backward's kernels (the forwards' planted bugs)
  if (which == "chunked_backward") return 2;
#else
  if (which == "chunked_backward") {
    // Inputs through their (possibly [B, T, H, X]) strides, gradients dense [B, H, T, X].
    auto dfinal = has_dfinal ? read<float>(dir + "/dfinal.bin", N * Hv * K * V) : std::vector<float>();
    std::vector<Bits> dq(B * Hk * T_ * K), dk(B * Hk * T_ * K), dv(B * Hv * T_ * V), dbeta(B * Hv * T_);
    std::vector<float> dg(B * Hv * T_, NAN), dinit(N * Hv * K * V, NAN);
    p.dout = dout.data(), p.dfinal = has_dfinal ? dfinal.data() : nullptr;
    p.out = dv.data(), p.sout = dense(Hv, T_, V), p.final_state = dinit.data();
    const ChunkedBackwardLayout l = emu_cb::chunked_backward_layout(pr);
    // Every region poisoned with NaN: a read of anything the kernels did not write shows.
    auto region = [](i64 n) { return std::vector<float>(std::size_t(n), NAN); };
    auto wg = region(l.g), wt = region(l.t), wp = region(l.p), ww = region(l.w), wu = region(l.u), wdu = region(l.du),
         ws0 = region(l.s0), wdsc = region(l.dsc), wdq = region(l.dq_acc), wdk = region(l.dk_acc);
    ChunkedBackwardWorkspace ws;
    ws.g = reinterpret_cast<double*>(wg.data()), ws.t = wt.data(), ws.p = wp.data(), ws.w = ww.data(), ws.u = wu.data(), ws.du = wdu.data();
    ws.s0 = ws0.data(), ws.dsc = wdsc.data(), ws.dq_acc = wdq.data(), ws.dk_acc = wdk.data();
    ws.C = pr.chunk_size;
    ws.chunks_per_batch = l.chunks_per_batch;
    // The launcher's plan (bwd_launch_plan) for a device whose blocks may opt in to EMU_MAX_SMEM
    // bytes (default: H100/H200's 232448; A100's is 166912), with EMU_SMEM_PER_SM bytes per SM
    // (default: that + 1024, as on both) and EMU_SM_COUNT SMs (default 132).
    const auto env_or = [](const char* name, i64 fallback) {
      const char* v = std::getenv(name);
      return v ? i64(std::atoll(v)) : fallback;
    };
    emu_cb::BwdDevice dev;
    dev.max_smem_block = env_or("EMU_MAX_SMEM", 232448);
    dev.smem_per_sm = env_or("EMU_SMEM_PER_SM", dev.max_smem_block + 1024);
    dev.sm_count = env_or("EMU_SM_COUNT", 132);
    const i64 vtiles = (V + 31) / 32;
    const emu_cb::BwdLaunchPlan plan = emu_cb::bwd_launch_plan(p, ws, int(sizeof(T)), emu_cb::kBwdTensorCores<T>, dev,
                                                               N * Hv * vtiles, false);
    const emu_cb::BwdPlan& smem = plan.smem;
    const emu_cb::BwdStaging &forward = plan.forward, &reverse = plan.reverse;
    std::ofstream(dir + "/staging.txt") << forward.stages << " " << reverse.stages << " " << forward.k << " "
                                        << forward.q << " " << forward.dout << " " << forward.g << " " << forward.w
                                        << " " << forward.u << " " << forward.p << "\n";
    launch(l.slots * Hv, emu_cb::kBwdThreads, 1, smem.prep, [&] { emu_cb::bwd_prep_kernel<T>(p, ws); });
    launch(N * Hv * vtiles, emu_cb::kBwdThreads, 1, smem.forward,
           [&] { emu_cb::bwd_forward_kernel<T>(p, ws, forward); });
    launch(N * Hv * vtiles, emu_cb::kBwdThreads, 1, smem.reverse,
           [&] { emu_cb::bwd_reverse_kernel<T>(p, ws, reverse); });
    launch(l.slots * Hk, emu_cb::kBwdThreads, 1, smem.local, [&] {
      emu_cb::bwd_local_kernel<T>(p, ws, reinterpret_cast<T*>(dq.data()), dense(Hk, T_, K),
                                  reinterpret_cast<T*>(dk.data()), dense(Hk, T_, K),
                                  reinterpret_cast<T*>(dbeta.data()), dense(Hv, T_, 1), dg.data(), dense(Hv, T_, 1));
    });
    write(dir + "/dq.bin", dq);
    write(dir + "/dk.bin", dk);
    write(dir + "/dv.bin", dv);
    write(dir + "/dbeta.bin", dbeta);
    write(dir + "/dg.bin", dg);
    write(dir + "/dinit.bin", dinit);
    return emu_hazards > 0 ? 3 : 0;
  }
#endif
  // recurrent_backward
  auto dfinal = has_dfinal ? read<float>(dir + "/dfinal.bin", N * Hv * K * V) : std::vector<float>();
  std::vector<Bits> dq(B * Hk * T_ * K), dk(B * Hk * T_ * K), dv(B * Hv * T_ * V), dbeta(B * Hv * T_);
  std::vector<float> dg(B * Hv * T_), dinit(N * Hv * K * V, NAN);
  p.dout = dout.data(), p.dfinal = has_dfinal ? dfinal.data() : nullptr;
  p.out = dv.data(), p.final_state = dinit.data();
  const BackwardLayout l = emu_rb::backward_layout(pr);
  std::vector<float> ck(l.checkpoints), st(l.chunk_states), dqp(l.dq_part), dkp(l.dk_part), dbp(l.dbeta_part),
      dgp(l.dg_part);
  BackwardWorkspace ws{ck.data(), st.data(), dqp.data(), dkp.data(), dbp.data(), dgp.data(), l.slots,
                       l.chunks_per_batch};
  const i64 vtiles = value_tiles(V);
  launch(N * Hv * vtiles, kColsPerBlock, unsigned(row_groups(K)), 0,
         [&] { emu_rb::recurrent_backward_kernel<T>(p, ws, vtiles); });
  launch(4, 256, 1, 0, [&] {
    emu_rb::reduce_partials_kernel<T>(p, ws, vtiles, reinterpret_cast<T*>(dq.data()), dense(Hk, T_, K),
                              reinterpret_cast<T*>(dk.data()), dense(Hk, T_, K), reinterpret_cast<T*>(dbeta.data()),
                              dense(Hv, T_, 1), dg.data(), dense(Hv, T_, 1));
  });
  write(dir + "/dq.bin", dq);
  write(dir + "/dk.bin", dk);
  write(dir + "/dv.bin", dv);
  write(dir + "/dbeta.bin", dbeta);
  write(dir + "/dg.bin", dg);
  write(dir + "/dinit.bin", dinit);
  return 0;
}

}  // namespace

// backward_layout is host code of recurrent_backward.cu, extracted with the kernels.
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::ifstream meta(std::string(argv[2]) + "/meta.txt");
  Problem pr;
  int has_init = 0, has_cu = 0, has_dfinal = 0, bf16 = 0, bthk = 0;
  meta >> pr.B >> pr.T >> pr.Hk >> pr.Hv >> pr.K >> pr.V >> pr.N >> has_init >> has_cu >> has_dfinal >> bf16 >>
      pr.scale;
  if (!meta) return 2;
  if (!(meta >> bthk)) bthk = 0;
  if (!(meta >> pr.chunk_size)) pr.chunk_size = 64;
  if (bf16) return run<__nv_bfloat16, std::uint16_t>(argv[1], argv[2], pr, has_init, has_cu, has_dfinal, bthk);
  return run<float, float>(argv[1], argv[2], pr, has_init, has_cu, has_dfinal, bthk);
}
