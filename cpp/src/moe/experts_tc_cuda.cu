// The "tensor_core" strategy of SwiGluExperts on sm_90 (Hopper), on CUTLASS ptr-array grouped
// GEMMs whose problem sizes and pointers are built on the device from the offsets (no host
// synchronization). Forward:
//   1. one grouped GEMM with 2E groups: a = x · gate_e^T and b = x · up_e^T (rounded to T),
//   2. h = silu(a) * b (elementwise, rows up to offsets[E]),
//   3. one grouped GEMM with E groups: y = h · down_e^T.
// On sm_80-class GPUs the forward's two GEMMs run a CUTLASS 2.x mma.sync grouped kernel instead
// (grouped_gemm_sm80.hpp); RUDNN_MOE_SM80_ON_SM90=1 selects it on Hopper too (to test it there).
// Backward (sm_90 only; float32 GEMM outputs, rounded once):
//   1. dh = dy · down_e (E groups), 2. h, da, db from dh, a, b (elementwise),
//   3. dx = da · gate_e + db · up_e: p = da · gate_e into a float32 partial (E groups), then
//      dx = db · up_e + p (E groups, the partial as the GEMM's source C, beta = 1), rounded once,
//   4. dgate = da^T x, dup = db^T x, ddown = dy^T h (3E groups, K = the expert's rows; the
//      experts without rows, which get no tiles, keep the zeros written first, only for them).
// Forward GEMM tiles on sm_90 (fused or not): 64-row ping-pong tiles when experts hold <= 64 rows
// on average, 128x128 cooperative ones otherwise (forward_schedule below).
// Fused forward (sm_90, inference, the experts built with gate_up, moe_interleave_gate_up's
// layout): steps 1 and 2 are one grouped GEMM with E groups over gate_up (N = 2I) whose epilogue
// writes h = silu(a) * b (swiglu_epilogue.hpp): a and b never reach memory.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/device.hpp"
#include "moe/cuda_common.cuh"
#include "moe/grouped_gemm_sm80.hpp"
#include "moe/grouped_gemm_sm90.hpp"
#include "moe/problem.hpp"

namespace rudnn::moe {

using namespace cuda;

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }
bool aligned16(const void* p) { return aligned(p, 16); }

// The workspace holds CUTLASS's TMA descriptors (64-byte aligned, cutlass::MinTensorMapWorkspaceAlignment)
// and the buffers TMA reads; its parts are carved at 256-byte offsets from its base.
bool workspace_aligned(const Tensor* workspace) { return !workspace || aligned(workspace->data, 128); }

// h = silu(a) * b for the rows that belong to an expert (a, b already rounded to T).
template <class T>
__global__ void swiglu_rows_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ h,
                                   const int* __restrict__ offsets, int E, std::int64_t rows, std::int64_t inter) {
  const std::int64_t used = min(max(std::int64_t(offsets[E]), std::int64_t(0)), rows);
  const std::int64_t n = used * inter;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float av = to_float(a[i]), bv = to_float(b[i]);
    h[i] = from_float<T>(av * sigmoid(av) * bv);
  }
}

sm90::SegmentGemm segment_gemm(const ExpertsProblem& p, const int* offsets, int sets) {
  sm90::SegmentGemm g;
  g.experts = p.experts;
  g.sets = sets;
  g.offsets = offsets;
  g.rows = p.rows;
  return g;
}

using sm90::Placement;

// D[rows of e] = A[rows of e] · B_e: A and D move with the expert's rows, B by expert.
sm90::OperandSet rows_set(const void* a, std::int64_t lda, const void* b, std::int64_t b_expert_stride,
                          std::int64_t ldb, void* d, std::int64_t ldd, std::int64_t n, std::int64_t k) {
  sm90::OperandSet s;
  s.a = {a, lda, Placement::segment, 0};
  s.b = {b, ldb, Placement::expert, b_expert_stride};
  s.d = {d, ldd, Placement::segment, 0};
  s.m = -1;
  s.n = int(n);
  s.k = int(k);
  return s;
}

// D_e = A[rows of e]^T · B[rows of e] (K = the expert's rows): a weight gradient of expert e.
sm90::OperandSet weight_grad_set(const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float* d,
                                 std::int64_t m, std::int64_t n) {
  sm90::OperandSet s;
  s.a = {a, lda, Placement::segment, 0};
  s.b = {b, ldb, Placement::segment, 0};
  s.d = {d, n, Placement::expert, m * n};
  s.m = int(m);
  s.n = int(n);
  s.k = -1;
  return s;
}

enum class Arch { sm80, sm90, none };

Arch forward_arch(int device) {
  const core::DeviceProps& props = core::device_props(device);
  if (props.cc_major == 9 && props.cc_minor == 0) {
    const char* force = std::getenv("RUDNN_MOE_SM80_ON_SM90");
    return force && force[0] == '1' ? Arch::sm80 : Arch::sm90;
  }
  return props.cc_major == 8 ? Arch::sm80 : Arch::none;
}

// The schedule of the forward's nt GEMMs on sm90 (issue 25's configuration table). With few rows
// per expert on average (T * k / E <= 64: decode and small batches), 64-row ping-pong tiles: an
// expert of r <= 64 rows is padded to 64 rows of MMA work instead of 128, and one warpgroup's
// epilogue runs under the other's mainloop. Otherwise 128x128 cooperative tiles, which move a third
// fewer operand bytes per FLOP. The fused gate/up GEMM (nt_swiglu) follows the same rule.
// RUDNN_MOE_GEMM_SCHEDULE=cooperative or =pingpong forces one (the tests run both; the bench
// prices the other one on decode rows). Where the variants are built (-DRUDNN_WITH_MOE_GEMM_VARIANTS=ON),
// =multicast takes the cooperative tiles in 1x2 clusters sharing A, and =pingpong_wide 128x128
// ping-pong tiles for the nt GEMMs (the down projection; the fused gate/up GEMM keeps cooperative
// tiles: gemm_schedule); the bench prices both at large batches, and either becomes the rule above
// 64 rows per expert if a GPU run shows it faster. Any other value means this rule.
constexpr std::int64_t kPingpongRowsPerExpert = 64;

sm90::Schedule forward_schedule(const ExpertsProblem& p) {
  const char* force = std::getenv("RUDNN_MOE_GEMM_SCHEDULE");
  const std::string forced = force ? force : "";
  if (forced == "cooperative") return sm90::Schedule::cooperative;
  if (forced == "pingpong") return sm90::Schedule::pingpong;
  if (forced == "multicast") return sm90::Schedule::multicast;
  if (forced == "pingpong_wide") return sm90::Schedule::pingpong_wide;
  return p.rows <= kPingpongRowsPerExpert * p.experts ? sm90::Schedule::pingpong : sm90::Schedule::cooperative;
}

// The schedule one forward GEMM of the layouts takes under the call's: the call's, but the fused
// gate/up GEMM (nt_swiglu) keeps cooperative tiles under pingpong_wide (built for nt only: the down
// projection is the short-K GEMM it is for).
sm90::Schedule gemm_schedule(sm90::Layouts layouts, sm90::Schedule schedule) {
  return schedule == sm90::Schedule::pingpong_wide && layouts != sm90::Layouts::nt ? sm90::Schedule::cooperative
                                                                                   : schedule;
}

// Workspace bytes and launch of one forward segment GEMM on the chosen architecture (sm90: the
// layouts nt, or nt_swiglu for the fused gate/up GEMM, with gemm_schedule of the call's schedule).
std::size_t forward_gemm_bytes(Arch arch, sm90::Layouts layouts, sm90::Schedule schedule, DType dtype, int groups,
                               int device) {
  return arch == Arch::sm80 ? sm80::workspace_bytes(dtype, groups)
                            : sm90::workspace_bytes(layouts, dtype, groups, device, gemm_schedule(layouts, schedule));
}

void run_forward_gemm(Arch arch, sm90::Layouts layouts, sm90::Schedule schedule, DType dtype,
                      const sm90::SegmentGemm& g, void* ws, std::size_t bytes, int device, cudaStream_t stream) {
  if (arch == Arch::sm80)
    sm80::run(dtype, g, ws, bytes, stream);
  else
    sm90::run(layouts, dtype, g, ws, bytes, device, stream, gemm_schedule(layouts, schedule));
}

struct Layout {
  std::size_t gemm1, gemm2, buffer;  // bytes of each part
  int buffers;                       // [N, I] buffers: h, plus a and b when unfused and not training
};

Layout layout_of(const ExpertsProblem& p, DType dtype, bool training, bool fused, int device) {
  Layout l;
  const Arch arch = forward_arch(device);
  const sm90::Schedule schedule = forward_schedule(p);
  l.gemm1 = align_up(
      fused ? forward_gemm_bytes(arch, sm90::Layouts::nt_swiglu, schedule, dtype, p.experts, device)
            : forward_gemm_bytes(arch, sm90::Layouts::nt, schedule, dtype, 2 * p.experts, device));
  l.gemm2 = align_up(forward_gemm_bytes(arch, sm90::Layouts::nt, schedule, dtype, p.experts, device));
  l.buffer = align_up(std::size_t(p.rows) * std::size_t(p.inter) * dtype_size(dtype));
  l.buffers = training || fused ? 1 : 3;
  return l;
}

}  // namespace

const char* tensor_core_forward_unsupported(const MoeExpertsForwardArgs& a, const ExpertsProblem& p) {
  if (forward_arch(a.x.device.index) == Arch::none)
    return "needs an sm_80-class (Ampere, Ada) or sm_90 (Hopper) GPU in this build";
  if (a.x.dtype != DType::f16 && a.x.dtype != DType::bf16) return "needs float16 or bfloat16 (use 'scalar')";
  if (p.hidden % 8 != 0 || p.inter % 8 != 0) return "needs H and I to be multiples of 8 (16-byte rows for TMA)";
  if (p.x_stride % 8 != 0 || p.y_stride % 8 != 0) return "needs row strides of x and y that are multiples of 8";
  const void* ptrs[] = {a.x.data, a.y.data, a.gate.data, a.up.data, a.down.data,
                        a.gate_pre ? a.gate_pre->data : nullptr, a.up_pre ? a.up_pre->data : nullptr};
  for (const void* ptr : ptrs)
    if (!aligned16(ptr)) return "needs 16-byte aligned arrays";
  if (!workspace_aligned(a.workspace)) return "needs a 128-byte aligned workspace";
  return nullptr;
}

// Hopper, inference (training keeps a and b for the backward), gate_up given and 16-byte aligned
// for TMA.
bool tensor_core_forward_fused(const MoeExpertsForwardArgs& a) {
  return a.gate_up != nullptr && a.gate_pre == nullptr && aligned16(a.gate_up->data) &&
         forward_arch(a.x.device.index) == Arch::sm90;
}

std::size_t experts_forward_tensor_core_workspace_bytes(const MoeExpertsForwardArgs& a, const ExpertsProblem& p) {
  const Layout l = layout_of(p, a.x.dtype, a.gate_pre != nullptr, tensor_core_forward_fused(a), a.x.device.index);
  return l.gemm1 + l.gemm2 + l.buffers * l.buffer;
}

void experts_forward_tensor_core_cuda(const MoeExpertsForwardArgs& a, const ExpertsProblem& p, Stream s) {
  const cudaStream_t stream = as_cuda(s);
  const int device = a.x.device.index;
  const bool training = a.gate_pre != nullptr;
  const bool fused = tensor_core_forward_fused(a);
  const Layout l = layout_of(p, a.x.dtype, training, fused, device);
  char* ws = static_cast<char*>(a.workspace->data);
  char* gemm1_ws = ws;
  char* gemm2_ws = ws + l.gemm1;
  char* buffers = gemm2_ws + l.gemm2;
  void* h = buffers;
  void* pre_a = training ? a.gate_pre->data : buffers + l.buffer;
  void* pre_b = training ? a.up_pre->data : buffers + 2 * l.buffer;
  const std::int64_t H = p.hidden, I = p.inter;

  const int* offsets = a.offsets.ptr<int>();
  const Arch arch = forward_arch(device);
  const sm90::Schedule schedule = forward_schedule(p);
  if (fused) {
    // h [rows, I] straight from the epilogue of x · gate_up^T ([rows, 2I], never stored)
    sm90::SegmentGemm up_proj = segment_gemm(p, offsets, 1);
    up_proj.set[0] = rows_set(a.x.data, p.x_stride, a.gate_up->data, 2 * I * H, H, h, I, 2 * I, H);
    run_forward_gemm(arch, sm90::Layouts::nt_swiglu, schedule, a.x.dtype, up_proj, gemm1_ws, l.gemm1, device,
                     stream);
  } else {
    sm90::SegmentGemm up_proj = segment_gemm(p, offsets, 2);
    up_proj.set[0] = rows_set(a.x.data, p.x_stride, a.gate.data, I * H, H, pre_a, I, I, H);
    up_proj.set[1] = rows_set(a.x.data, p.x_stride, a.up.data, I * H, H, pre_b, I, I, H);
    run_forward_gemm(arch, sm90::Layouts::nt, schedule, a.x.dtype, up_proj, gemm1_ws, l.gemm1, device, stream);

    dispatch_float(a.x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      swiglu_rows_kernel<T><<<grid_1d(p.rows * I, 256, 8192), 256, 0, stream>>>(
          static_cast<const T*>(pre_a), static_cast<const T*>(pre_b), static_cast<T*>(h), a.offsets.ptr<int>(),
          p.experts, p.rows, I);
      RUDNN_CUDA_CHECK_LAUNCH(swiglu_rows_kernel);
    });
  }

  sm90::SegmentGemm down_proj = segment_gemm(p, offsets, 1);
  down_proj.set[0] = rows_set(h, I, a.down.data, H * I, I, a.y.data, p.y_stride, H, I);
  run_forward_gemm(arch, sm90::Layouts::nt, schedule, a.x.dtype, down_proj, gemm2_ws, l.gemm2, device, stream);
}

}  // namespace rudnn::moe

// ---- backward ------------------------------------------------------------------------------------

namespace rudnn::moe {

namespace {

// h, da, db from dh (float32) and the pre-activations a, b; rows up to offsets[E].
template <class T>
__global__ void swiglu_backward_rows_kernel(const float* __restrict__ dh, const T* __restrict__ a_pre,
                                            const T* __restrict__ b_pre, T* __restrict__ h, T* __restrict__ da,
                                            T* __restrict__ db, const int* __restrict__ offsets, int E,
                                            std::int64_t rows, std::int64_t inter) {
  const std::int64_t used = min(max(std::int64_t(offsets[E]), std::int64_t(0)), rows);
  const std::int64_t n = used * inter;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float a = to_float(a_pre[i]), b = to_float(b_pre[i]), g = dh[i];
    const float sig = sigmoid(a);
    h[i] = from_float<T>(a * sig * b);
    da[i] = from_float<T>(g * b * sig * (1.0f + a * (1.0f - sig)));
    db[i] = from_float<T>(g * a * sig);
  }
}

// The weight gradients of the experts without rows: zeros. Those experts get no tiles from the
// weight-gradient GEMM; every other expert's [M, N] gradient is written whole by it (beta = 0, no
// source C: written, not accumulated), so nothing else needs clearing. Grid: (slices, E, the
// three gradients); a slab is one expert's gradient (I * H floats, a multiple of 64, 16-byte
// aligned), cleared 16 bytes per store.
constexpr int kZeroThreads = 256;
constexpr int kZeroMaxSlices = 8;

struct IdleExpertGrads {
  float* grad[3];
  std::int64_t slab;  // floats per expert
};

__global__ void __launch_bounds__(kZeroThreads)
    zero_idle_expert_grads_kernel(IdleExpertGrads g, const int* __restrict__ offsets, std::int64_t rows) {
  const int e = blockIdx.y;
  const Segment s = segment_of(offsets, e, rows);
  if (s.end > s.begin) return;
  // selected, not indexed: a parameter array indexed at run time is copied to local memory
  float* grad = blockIdx.z == 0 ? g.grad[0] : blockIdx.z == 1 ? g.grad[1] : g.grad[2];
  float4* slab = reinterpret_cast<float4*>(grad + e * g.slab);
  const std::int64_t n = g.slab / 4;
  for (std::int64_t i = blockIdx.x * std::int64_t(kZeroThreads) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * kZeroThreads)
    slab[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

struct BackwardLayout {
  std::size_t gemm_dh, gemm_p, gemm_dx, gemm_w;  // workspaces of the four grouped GEMMs
  std::size_t f32_inter, f32_hidden;             // dh [N, I]; the dx partial p [N, H]
  std::size_t inter;                             // each of h, da, db [N, I] in the dtype
  std::size_t total() const { return gemm_dh + gemm_p + gemm_dx + gemm_w + f32_inter + f32_hidden + 3 * inter; }
};

BackwardLayout backward_layout(const ExpertsProblem& p, DType dtype, int device) {
  BackwardLayout l;
  l.gemm_dh = align_up(sm90::workspace_bytes(sm90::Layouts::nn, dtype, p.experts, device));
  l.gemm_p = align_up(sm90::workspace_bytes(sm90::Layouts::nn, dtype, p.experts, device));
  l.gemm_dx = align_up(sm90::workspace_bytes(sm90::Layouts::nn_accumulate, dtype, p.experts, device));
  l.gemm_w = align_up(sm90::workspace_bytes(sm90::Layouts::tn, dtype, 3 * p.experts, device));
  const std::size_t n = std::size_t(p.rows);
  l.f32_inter = align_up(n * std::size_t(p.inter) * sizeof(float));
  l.f32_hidden = align_up(n * std::size_t(p.hidden) * sizeof(float));
  l.inter = align_up(n * std::size_t(p.inter) * dtype_size(dtype));
  return l;
}

}  // namespace

const char* tensor_core_backward_unsupported(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p) {
  const core::DeviceProps& props = core::device_props(a.x.device.index);
  if (props.cc_major != 9 || props.cc_minor != 0)
    return "needs an sm_90 (Hopper) GPU for the backward in this build (the sm_80 grouped kernels cover the forward)";
  if (a.x.dtype != DType::f16 && a.x.dtype != DType::bf16) return "needs float16 or bfloat16 (use 'scalar')";
  if (p.hidden % 8 != 0 || p.inter % 8 != 0) return "needs H and I to be multiples of 8 (16-byte rows for TMA)";
  if (p.x_stride % 8 != 0 || p.y_stride % 8 != 0 || p.dy_stride % 8 != 0)
    return "needs row strides of x, dy and dx that are multiples of 8";
  const void* ptrs[] = {a.x.data,        a.dy.data,     a.dx.data,     a.gate.data, a.up.data, a.down.data,
                        a.gate_pre.data, a.up_pre.data, a.dgate.data, a.dup.data,  a.ddown.data};
  for (const void* ptr : ptrs)
    if (!aligned16(ptr)) return "needs 16-byte aligned arrays";
  if (!workspace_aligned(a.workspace)) return "needs a 128-byte aligned workspace";
  return nullptr;
}

std::size_t experts_backward_tensor_core_workspace_bytes(const ExpertsProblem& p, DType dtype, int device) {
  return backward_layout(p, dtype, device).total();
}

void experts_backward_tensor_core_cuda(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p, Stream s) {
  const cudaStream_t stream = as_cuda(s);
  const int device = a.x.device.index;
  const DType dtype = a.x.dtype;
  const BackwardLayout l = backward_layout(p, dtype, device);
  char* ws = static_cast<char*>(a.workspace->data);
  char* gemm_dh_ws = ws;
  char* gemm_p_ws = gemm_dh_ws + l.gemm_dh;
  char* gemm_dx_ws = gemm_p_ws + l.gemm_p;
  char* gemm_w_ws = gemm_dx_ws + l.gemm_dx;
  float* dh = reinterpret_cast<float*>(gemm_w_ws + l.gemm_w);
  float* dx_partial = reinterpret_cast<float*>(reinterpret_cast<char*>(dh) + l.f32_inter);
  char* h = reinterpret_cast<char*>(dx_partial) + l.f32_hidden;
  char* da = h + l.inter;
  char* db = da + l.inter;
  const std::int64_t H = p.hidden, I = p.inter;
  const int* offsets = a.offsets.ptr<int>();

  // Experts without rows get no GEMM tiles: their weight gradients are zeroed here (only theirs).
  if (p.experts > 0 && H * I > 0) {
    const IdleExpertGrads idle{{a.dgate.ptr<float>(), a.dup.ptr<float>(), a.ddown.ptr<float>()}, H * I};
    const std::int64_t per_slice = 8 * kZeroThreads;  // float4 stores per slice at least
    const std::int64_t slices = std::min<std::int64_t>(kZeroMaxSlices, (H * I / 4 + per_slice - 1) / per_slice);
    zero_idle_expert_grads_kernel<<<dim3(unsigned(slices), unsigned(p.experts), 3), kZeroThreads, 0, stream>>>(
        idle, offsets, p.rows);
    RUDNN_CUDA_CHECK_LAUNCH(zero_idle_expert_grads_kernel);
  }
  if (p.rows == 0) return;

  // 1. dh = dy · down_e   (B(k = h, n = i) = down[e][h][i]: N-contiguous with ld I)
  sm90::SegmentGemm g_dh = segment_gemm(p, offsets, 1);
  g_dh.set[0] = rows_set(a.dy.data, p.dy_stride, a.down.data, H * I, I, dh, I, I, H);
  sm90::run(sm90::Layouts::nn, dtype, g_dh, gemm_dh_ws, l.gemm_dh, device, stream);

  // 2. h, da, db
  dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_backward_rows_kernel<T><<<grid_1d(p.rows * I, 256, 8192), 256, 0, stream>>>(
        dh, a.gate_pre.ptr<T>(), a.up_pre.ptr<T>(), reinterpret_cast<T*>(h), reinterpret_cast<T*>(da),
        reinterpret_cast<T*>(db), offsets, p.experts, p.rows, I);
    RUDNN_CUDA_CHECK_LAUNCH(swiglu_backward_rows_kernel);
  });

  // 3. dx = da · gate_e + db · up_e   (B(k = i, n = h) = gate[e][i][h]: N-contiguous with ld H).
  //    The second GEMM adds the first's float32 result through its source C and rounds once: the
  //    same float sum as adding two partials, without writing and reading a second one.
  sm90::SegmentGemm g_p = segment_gemm(p, offsets, 1);
  g_p.set[0] = rows_set(da, I, a.gate.data, I * H, H, dx_partial, H, H, I);
  sm90::run(sm90::Layouts::nn, dtype, g_p, gemm_p_ws, l.gemm_p, device, stream);
  sm90::SegmentGemm g_dx = segment_gemm(p, offsets, 1);
  g_dx.set[0] = rows_set(db, I, a.up.data, I * H, H, a.dx.data, p.y_stride, H, I);
  g_dx.set[0].c = {dx_partial, H, Placement::segment, 0};
  sm90::run(sm90::Layouts::nn_accumulate, dtype, g_dx, gemm_dx_ws, l.gemm_dx, device, stream);

  // 4. dgate_e = da_e^T x_e, dup_e = db_e^T x_e, ddown_e = dy_e^T h_e
  sm90::SegmentGemm g_w = segment_gemm(p, offsets, 3);
  g_w.set[0] = weight_grad_set(da, I, a.x.data, p.x_stride, a.dgate.ptr<float>(), I, H);
  g_w.set[1] = weight_grad_set(db, I, a.x.data, p.x_stride, a.dup.ptr<float>(), I, H);
  g_w.set[2] = weight_grad_set(a.dy.data, p.dy_stride, h, I, a.ddown.ptr<float>(), H, I);
  sm90::run(sm90::Layouts::tn, dtype, g_w, gemm_w_ws, l.gemm_w, device, stream);
}

}  // namespace rudnn::moe
