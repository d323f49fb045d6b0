// The "tensor_core" strategy of SwiGluExperts.forward_dispatched on sm_90 (Hopper):
//   1. one ptr-array grouped GEMM with 2E groups: a = x · gate_e^T and b = x · up_e^T,
//   2. h = silu(a) * b (elementwise, rows up to offsets[E]),
//   3. one grouped GEMM with E groups: y = h · down_e^T.
// Problem sizes and pointers are built on the device from the offsets; no host sync.
// (Fusing 1 and 2 into one GEMM with the SwiGLU in its epilogue is the next step.)
#include <string>

#include "core/device.hpp"
#include "moe/cuda_common.cuh"
#include "moe/grouped_gemm_sm90.hpp"
#include "moe/problem.hpp"

namespace rudnn::moe {

using namespace cuda;

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// h = silu(a) * b for the rows that belong to an expert (a, b already rounded to T).
template <class T>
__global__ void swiglu_rows_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ h,
                                   const int* __restrict__ offsets, int E, std::int64_t rows, std::int64_t inter) {
  const std::int64_t used = min(max(std::int64_t(offsets[E]), std::int64_t(0)), rows);
  const std::int64_t n = used * inter;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float av = to_f(a[i]), bv = to_f(b[i]);
    h[i] = from_f<T>(av * sigmoid(av) * bv);
  }
}

struct Layout {
  std::size_t gemm1, gemm2, buffer;  // bytes of each part
  int buffers;                       // [N, I] buffers: h, plus a and b when not training
};

Layout layout_of(const ExpertsProblem& p, DType dtype, bool training, int device) {
  Layout l;
  l.gemm1 = align_up(sm90::workspace_bytes(dtype, 2 * p.experts, device));
  l.gemm2 = align_up(sm90::workspace_bytes(dtype, p.experts, device));
  l.buffer = align_up(std::size_t(p.rows) * std::size_t(p.inter) * dtype_size(dtype));
  l.buffers = training ? 1 : 3;
  return l;
}

}  // namespace

const char* tensor_core_forward_unsupported(const MoeExpertsForwardArgs& a, const ExpertsProblem& p) {
  const core::DeviceProps& props = core::device_props(a.x.device.index);
  if (props.cc_major != 9 || props.cc_minor != 0)
    return "needs an sm_90 (Hopper) GPU in this build (the sm_80 grouped kernel is not implemented yet)";
  if (a.x.dtype != DType::f16 && a.x.dtype != DType::bf16) return "needs float16 or bfloat16 (use 'scalar')";
  if (p.hidden % 8 != 0 || p.inter % 8 != 0) return "needs H and I to be multiples of 8 (16-byte rows for TMA)";
  if (p.x_stride % 8 != 0 || p.y_stride % 8 != 0) return "needs row strides of x and y that are multiples of 8";
  const void* ptrs[] = {a.x.data, a.y.data, a.gate.data, a.up.data, a.down.data,
                        a.gate_pre ? a.gate_pre->data : nullptr, a.up_pre ? a.up_pre->data : nullptr};
  for (const void* ptr : ptrs)
    if (!aligned16(ptr)) return "needs 16-byte aligned arrays";
  return nullptr;
}

std::size_t experts_forward_tensor_core_workspace_bytes(const ExpertsProblem& p, DType dtype, bool training,
                                                        int device) {
  const Layout l = layout_of(p, dtype, training, device);
  return l.gemm1 + l.gemm2 + l.buffers * l.buffer;
}

void experts_forward_tensor_core_cuda(const MoeExpertsForwardArgs& a, const ExpertsProblem& p, Stream s) {
  const cudaStream_t stream = as_cuda(s);
  const int device = a.x.device.index;
  const bool training = a.gate_pre != nullptr;
  const Layout l = layout_of(p, a.x.dtype, training, device);
  char* ws = static_cast<char*>(a.workspace->data);
  char* gemm1_ws = ws;
  char* gemm2_ws = ws + l.gemm1;
  char* buffers = gemm2_ws + l.gemm2;
  void* h = buffers;
  void* pre_a = training ? a.gate_pre->data : buffers + l.buffer;
  void* pre_b = training ? a.up_pre->data : buffers + 2 * l.buffer;
  const std::int64_t H = p.hidden, I = p.inter;

  sm90::SegmentGemm up_proj;
  up_proj.experts = p.experts;
  up_proj.sets = 2;
  up_proj.set[0] = {a.x.data, p.x_stride, a.gate.data, I * H, H, pre_a, I};
  up_proj.set[1] = {a.x.data, p.x_stride, a.up.data, I * H, H, pre_b, I};
  up_proj.n = int(I);
  up_proj.k = int(H);
  up_proj.offsets = a.offsets.ptr<int>();
  up_proj.rows = p.rows;
  sm90::run(a.x.dtype, up_proj, gemm1_ws, l.gemm1, device, stream);

  dispatch_float(a.x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_rows_kernel<T><<<grid_1d(p.rows * I, 256, 8192), 256, 0, stream>>>(
        static_cast<const T*>(pre_a), static_cast<const T*>(pre_b), static_cast<T*>(h), a.offsets.ptr<int>(),
        p.experts, p.rows, I);
    RUDNN_CUDA_CHECK_LAUNCH(swiglu_rows_kernel);
  });

  sm90::SegmentGemm down_proj;
  down_proj.experts = p.experts;
  down_proj.sets = 1;
  down_proj.set[0] = {h, I, a.down.data, H * I, I, a.y.data, p.y_stride};
  down_proj.n = int(H);
  down_proj.k = int(I);
  down_proj.offsets = a.offsets.ptr<int>();
  down_proj.rows = p.rows;
  sm90::run(a.x.dtype, down_proj, gemm2_ws, l.gemm2, device, stream);
}

}  // namespace rudnn::moe
