// The validated form of each MoE call, shared by the CPU and CUDA backends.
// validate.cpp builds these after every check has passed; backends assume them valid.
// Matrices are rank 2 with a dense last axis; `*_stride` is the row stride in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/rows.hpp"  // RUDNN_HD
#include "rudnn/moe.hpp"

namespace rudnn::moe {

// Rows [begin, end) of expert e: offsets clamped into [0, rows] and made non-decreasing, so any
// offsets array is safe to use (device ones are never read on the host). The one definition of
// an expert's rows for every backend and grouped GEMM: an expert with begin == end gets no GEMM
// tiles, and the tensor_core backward zeroes exactly those experts' weight gradients.
struct Segment {
  std::int64_t begin, end;
};
RUDNN_HD Segment segment_of(const std::int32_t* offsets, int e, std::int64_t rows) {
  const std::int64_t first = offsets[e], last = offsets[e + 1];
  const std::int64_t lo = first < 0 ? 0 : first > rows ? rows : first;
  const std::int64_t hi = last < lo ? lo : last > rows ? rows : last;
  return {lo, hi};
}

// moe_layer_forward: x [T, H] and logits [T, E] on one device, naming the same tokens.
struct LayerProblem {
  std::int64_t tokens = 0, hidden = 0;  // T, H
  int experts = 0, top_k = 0;           // E, k
};

struct RouteProblem {
  std::int64_t tokens = 0;   // T
  int experts = 0;           // E
  int top_k = 0;
  std::int64_t logits_stride = 0;
  // Grouped sigmoid routing only:
  int groups = 1, selected_groups = 1;
  bool group_top_two = false;
  bool renormalize = true;
  float scale = 1.0f;
};

struct DispatchPlanProblem {
  std::int64_t tokens = 0;
  int top_k = 0;
  int experts = 0;
  std::int64_t index_stride = 0;
};

struct GatherProblem {
  std::int64_t tokens = 0, rows = 0, hidden = 0;
  std::int64_t x_stride = 0, out_stride = 0;
};

struct CombineProblem {
  std::int64_t tokens = 0, rows = 0, hidden = 0;  // rows: N of y
  int top_k = 0;
  std::int64_t y_stride = 0, out_stride = 0, dout_stride = 0, dy_stride = 0;
  std::int64_t weight_stride = 0;  // row stride of weights [T, k]
  bool has_weights = false;
};

struct ExpertsProblem {
  std::int64_t rows = 0;  // N
  int experts = 0;        // E
  std::int64_t hidden = 0, inter = 0;  // H, I
  std::int64_t x_stride = 0, y_stride = 0;  // forward: x, y; backward: x, dx
  std::int64_t dy_stride = 0;                // backward only
  MoeExpertsStrategy strategy = MoeExpertsStrategy::scalar;  // resolved (never automatic)
};

// moe_interleave_gate_up: gate, up [E, I, H] and gate_up [E, 2I, H], all dense; I a multiple of
// kMoeGateUpBlock.
struct InterleaveProblem {
  std::int64_t experts = 0, inter = 0, hidden = 0;  // E, I, H
};

struct SelectedRouterProblem {
  std::int64_t tokens = 0;
  int experts = 0, top_k = 0;
  std::int64_t logits_stride = 0, index_stride = 0, grad_stride = 0, dlogits_stride = 0;
};

RouteProblem validate_route(const MoeRouteArgs& a);
RouteProblem validate_route_sigmoid_grouped(const MoeRouteSigmoidGroupedArgs& a);
DispatchPlanProblem validate_dispatch_plan(const MoeDispatchPlanArgs& a);
GatherProblem validate_gather_rows(const Tensor& x, const Tensor& token_of_row, const Tensor& out);
CombineProblem validate_combine(const MoeCombineArgs& a);
CombineProblem validate_combine_backward(const MoeCombineBackwardArgs& a);
// read_offsets: check host offsets' values (off for the JAX trace-time check, which has no data).
ExpertsProblem validate_experts_forward(const MoeExpertsForwardArgs& a, bool read_offsets = true);
ExpertsProblem validate_experts_backward(const MoeExpertsBackwardArgs& a, bool read_offsets = true);
// The layer's own checks (x, logits, T); the steps' validators check the rest on its views.
LayerProblem validate_layer(const MoeLayerArgs& a);
InterleaveProblem validate_interleave_gate_up(const Tensor& gate, const Tensor& up, const Tensor& gate_up);
SelectedRouterProblem validate_selected_router(const MoeSelectedRouterArgs& a);
SelectedRouterProblem validate_selected_router_backward(const MoeSelectedRouterBackwardArgs& a);

// Reads element i of an index tensor of any index dtype as int64 (host side).
std::int64_t read_index(const Tensor& t, std::int64_t offset);

// CPU reference backend (cpu.cpp).
void route_cpu(const MoeRouteArgs& a, const RouteProblem& p);
void route_sigmoid_grouped_cpu(const MoeRouteSigmoidGroupedArgs& a, const RouteProblem& p);
void dispatch_plan_cpu(const MoeDispatchPlanArgs& a, const DispatchPlanProblem& p);
void gather_rows_cpu(const Tensor& x, const Tensor& token_of_row, const Tensor& out, const GatherProblem& p);
void combine_cpu(const MoeCombineArgs& a, const CombineProblem& p);
void combine_backward_cpu(const MoeCombineBackwardArgs& a, const CombineProblem& p);
void experts_forward_cpu(const MoeExpertsForwardArgs& a, const ExpertsProblem& p);
void experts_backward_cpu(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p);
void interleave_gate_up_cpu(const Tensor& gate, const Tensor& up, const Tensor& gate_up, const InterleaveProblem& p);
void selected_router_cpu(const MoeSelectedRouterArgs& a, const SelectedRouterProblem& p);
void selected_router_backward_cpu(const MoeSelectedRouterBackwardArgs& a, const SelectedRouterProblem& p);

// CUDA backend (*_cuda.cu). The caller has made the tensors' device current.
void route_cuda(const MoeRouteArgs& a, const RouteProblem& p, Stream s);
void route_sigmoid_grouped_cuda(const MoeRouteSigmoidGroupedArgs& a, const RouteProblem& p, Stream s);
std::size_t dispatch_plan_workspace_bytes_cuda(const DispatchPlanProblem& p);
void dispatch_plan_cuda(const MoeDispatchPlanArgs& a, const DispatchPlanProblem& p, Stream s);
void gather_rows_cuda(const Tensor& x, const Tensor& token_of_row, const Tensor& out, const GatherProblem& p,
                      Stream s);
void combine_cuda(const MoeCombineArgs& a, const CombineProblem& p, Stream s);
void combine_backward_cuda(const MoeCombineBackwardArgs& a, const CombineProblem& p, Stream s);
// Writes zero into the rows of each output [N, *] that no expert's segment covers (none when the
// offsets tile the rows: then it reads the offsets and returns). Null outputs are skipped; at most 3.
void zero_uncovered_rows_cuda(const Tensor& offsets, int experts, std::int64_t rows,
                              std::initializer_list<const Tensor*> outputs, Stream s);
std::size_t experts_forward_workspace_bytes_cuda(const ExpertsProblem& p, DType dtype);
void experts_forward_cuda(const MoeExpertsForwardArgs& a, const ExpertsProblem& p, Stream s);
// The "tensor_core" forward (experts_tc_cuda.cu): nullptr when this device and these arrays
// are supported, otherwise the reason.
const char* tensor_core_forward_unsupported(const MoeExpertsForwardArgs& a, const ExpertsProblem& p);
std::size_t experts_forward_tensor_core_workspace_bytes(const MoeExpertsForwardArgs& a, const ExpertsProblem& p);
// Whether that forward runs gate/up as one GEMM with SwiGLU in its epilogue (a.gate_up, sm_90,
// inference).
bool tensor_core_forward_fused(const MoeExpertsForwardArgs& a);
void experts_forward_tensor_core_cuda(const MoeExpertsForwardArgs& a, const ExpertsProblem& p, Stream s);
const char* tensor_core_backward_unsupported(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p);
std::size_t experts_backward_tensor_core_workspace_bytes(const ExpertsProblem& p, DType dtype, int device);
void experts_backward_tensor_core_cuda(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p, Stream s);
std::size_t experts_backward_workspace_bytes_cuda(const ExpertsProblem& p, DType dtype);
void experts_backward_cuda(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p, Stream s);
void interleave_gate_up_cuda(const Tensor& gate, const Tensor& up, const Tensor& gate_up, const InterleaveProblem& p,
                             Stream s);
void selected_router_cuda(const MoeSelectedRouterArgs& a, const SelectedRouterProblem& p, Stream s);
void selected_router_backward_cuda(const MoeSelectedRouterBackwardArgs& a, const SelectedRouterProblem& p,
                                   Stream s);

}  // namespace rudnn::moe
