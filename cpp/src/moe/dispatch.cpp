// Public entry points of the MoE family: validate once, then run the backend of the
// tensors' device (and, for the experts, the resolved strategy).
#include <cstdint>
#include <string>

#include "core/backend.hpp"
#include "moe/problem.hpp"

namespace rudnn {

namespace {

// The forward's strategy: "auto" takes the tensor-core grouped GEMM where this device, dtype
// and layout support it and "scalar" otherwise; an explicit "tensor_core" that cannot run
// says why. On the CPU every strategy but "tensor_core" runs the reference loops.
thread_local const char* last_algorithm = "none";

// Records what an experts call runs (moe_last_algorithm).
void note_strategy(const Device& device, MoeExpertsStrategy s) {
  last_algorithm = !device.is_cuda() ? "cpu" : s == MoeExpertsStrategy::tensor_core ? "tensor_core" : "scalar";
}

MoeExpertsStrategy resolve_forward(const MoeExpertsForwardArgs& a, const moe::ExpertsProblem& p, const std::string& op) {
  const bool explicit_tc = a.strategy == MoeExpertsStrategy::tensor_core;
  if (!a.x.device.is_cuda()) {
    if (explicit_tc)
      core::fail(ErrorKind::unsupported, op + ": strategy 'tensor_core' needs a CUDA device, got " + a.x.device.str());
    return MoeExpertsStrategy::scalar;
  }
#if RUDNN_WITH_CUDA
  if (a.strategy == MoeExpertsStrategy::scalar) return MoeExpertsStrategy::scalar;
  const char* why = moe::tensor_core_forward_unsupported(a, p);
  if (explicit_tc && why) core::fail(ErrorKind::unsupported, op + ": strategy 'tensor_core' " + why);
  return why ? MoeExpertsStrategy::scalar : MoeExpertsStrategy::tensor_core;
#else
  (void)p;
  return MoeExpertsStrategy::scalar;
#endif
}

// The backward's strategy, chosen like the forward's.
MoeExpertsStrategy resolve_backward(const MoeExpertsBackwardArgs& a, const moe::ExpertsProblem& p,
                                    const std::string& op) {
  const bool explicit_tc = a.strategy == MoeExpertsStrategy::tensor_core;
  if (!a.x.device.is_cuda()) {
    if (explicit_tc)
      core::fail(ErrorKind::unsupported, op + ": strategy 'tensor_core' needs a CUDA device, got " + a.x.device.str());
    return MoeExpertsStrategy::scalar;
  }
#if RUDNN_WITH_CUDA
  if (a.strategy == MoeExpertsStrategy::scalar) return MoeExpertsStrategy::scalar;
  const char* why = moe::tensor_core_backward_unsupported(a, p);
  if (explicit_tc && why) core::fail(ErrorKind::unsupported, op + ": strategy 'tensor_core' " + why);
  return why ? MoeExpertsStrategy::scalar : MoeExpertsStrategy::tensor_core;
#else
  (void)p;
  return MoeExpertsStrategy::scalar;
#endif
}

#if RUDNN_WITH_CUDA
std::size_t forward_workspace_cuda(const MoeExpertsForwardArgs& a, const moe::ExpertsProblem& p) {
  if (p.strategy == MoeExpertsStrategy::tensor_core)
    return moe::experts_forward_tensor_core_workspace_bytes(a, p);
  return moe::experts_forward_workspace_bytes_cuda(p, a.x.dtype);
}
#else
std::size_t forward_workspace_cuda(const MoeExpertsForwardArgs&, const moe::ExpertsProblem&) { return 0; }
#endif

#if RUDNN_WITH_CUDA
std::size_t backward_workspace_cuda(const MoeExpertsBackwardArgs& a, const moe::ExpertsProblem& p) {
  if (p.strategy == MoeExpertsStrategy::tensor_core)
    return moe::experts_backward_tensor_core_workspace_bytes(p, a.x.dtype, a.x.device.index);
  return moe::experts_backward_workspace_bytes_cuda(p, a.x.dtype);
}
#else
std::size_t backward_workspace_cuda(const MoeExpertsBackwardArgs&, const moe::ExpertsProblem&) { return 0; }
#endif

}  // namespace

void moe_route(const MoeRouteArgs& args, Stream stream) {
  const moe::RouteProblem p = moe::validate_route(args);
  if (p.tokens == 0) return;
  core::on_device(args.logits.device, "moe.route", [&] { moe::route_cpu(args, p); },
            [&] { moe::route_cuda(args, p, stream); });
}

void moe_route_sigmoid_grouped(const MoeRouteSigmoidGroupedArgs& args, Stream stream) {
  const moe::RouteProblem p = moe::validate_route_sigmoid_grouped(args);
  if (p.tokens == 0) return;
  core::on_device(args.logits.device, "moe.route_sigmoid_grouped", [&] { moe::route_sigmoid_grouped_cpu(args, p); },
            [&] { moe::route_sigmoid_grouped_cuda(args, p, stream); });
}

std::size_t moe_dispatch_plan_workspace_bytes(const MoeDispatchPlanArgs& args) {
  const moe::DispatchPlanProblem p = moe::validate_dispatch_plan(args);
  std::size_t bytes = 0;
  core::on_device(args.expert_indices.device, "moe.dispatch", [] {},
            [&] { bytes = moe::dispatch_plan_workspace_bytes_cuda(p); });
  return bytes;
}

void moe_dispatch_plan(const MoeDispatchPlanArgs& args, Stream stream) {
  const moe::DispatchPlanProblem p = moe::validate_dispatch_plan(args);
  core::on_device(args.expert_indices.device, "moe.dispatch", [&] { moe::dispatch_plan_cpu(args, p); },
            [&] {
              core::expect_workspace(args.workspace, args.expert_indices, "expert_indices", moe::dispatch_plan_workspace_bytes_cuda(p),
                                     "moe.dispatch");
              moe::dispatch_plan_cuda(args, p, stream);
            });
}

void moe_gather_rows(const Tensor& x, const Tensor& token_of_row, const Tensor& x_dispatched, Stream stream) {
  const moe::GatherProblem p = moe::validate_gather_rows(x, token_of_row, x_dispatched);
  if (p.rows == 0 || p.hidden == 0) return;
  core::on_device(x.device, "moe.dispatch", [&] { moe::gather_rows_cpu(x, token_of_row, x_dispatched, p); },
            [&] { moe::gather_rows_cuda(x, token_of_row, x_dispatched, p, stream); });
}

void moe_combine(const MoeCombineArgs& args, Stream stream) {
  const moe::CombineProblem p = moe::validate_combine(args);
  if (p.tokens == 0 || p.hidden == 0) return;
  core::on_device(args.y.device, "moe.combine", [&] { moe::combine_cpu(args, p); },
            [&] { moe::combine_cuda(args, p, stream); });
}

void moe_combine_backward(const MoeCombineBackwardArgs& args, Stream stream) {
  const moe::CombineProblem p = moe::validate_combine_backward(args);
  if (p.rows == 0 && p.tokens == 0) return;
  core::on_device(args.y.device, "moe.combine_backward", [&] { moe::combine_backward_cpu(args, p); },
            [&] { moe::combine_backward_cuda(args, p, stream); });
}

std::size_t moe_experts_forward_workspace_bytes(const MoeExpertsForwardArgs& args) {
  const std::string op =
      args.gate_pre ? "SwiGluExperts.forward_dispatched_training" : "SwiGluExperts.forward_dispatched";
  moe::ExpertsProblem p = moe::validate_experts_forward(args);
  p.strategy = resolve_forward(args, p, op);
  std::size_t bytes = 0;
  core::on_device(args.x.device, op.c_str(), [] {}, [&] { bytes = forward_workspace_cuda(args, p); });
  return bytes;
}

void moe_experts_forward(const MoeExpertsForwardArgs& args, Stream stream) {
  const std::string op =
      args.gate_pre ? "SwiGluExperts.forward_dispatched_training" : "SwiGluExperts.forward_dispatched";
  moe::ExpertsProblem p = moe::validate_experts_forward(args);
  p.strategy = resolve_forward(args, p, op);
  note_strategy(args.x.device, p.strategy);
#if RUDNN_WITH_CUDA
  if (p.strategy == MoeExpertsStrategy::tensor_core && moe::tensor_core_forward_fused(args))
    last_algorithm = "tensor_core_fused";
#endif
  if (p.rows == 0) return;
  core::on_device(args.x.device, op.c_str(), [&] { moe::experts_forward_cpu(args, p); },
            [&] {
              core::expect_workspace(args.workspace, args.x, "x", forward_workspace_cuda(args, p), op);
              moe::zero_uncovered_rows_cuda(args.offsets, p.experts, p.rows, {&args.y, args.gate_pre, args.up_pre},
                                            stream);
              if (p.strategy == MoeExpertsStrategy::tensor_core)
                moe::experts_forward_tensor_core_cuda(args, p, stream);
              else
                moe::experts_forward_cuda(args, p, stream);
            });
}

std::size_t moe_experts_backward_workspace_bytes(const MoeExpertsBackwardArgs& args) {
  const std::string op = "MoeTrainingCache.backward";
  moe::ExpertsProblem p = moe::validate_experts_backward(args);
  p.strategy = resolve_backward(args, p, op);
  std::size_t bytes = 0;
  core::on_device(args.x.device, op.c_str(), [] {}, [&] { bytes = backward_workspace_cuda(args, p); });
  return bytes;
}

void moe_experts_backward(const MoeExpertsBackwardArgs& args, Stream stream) {
  const std::string op = "MoeTrainingCache.backward";
  moe::ExpertsProblem p = moe::validate_experts_backward(args);
  p.strategy = resolve_backward(args, p, op);
  note_strategy(args.x.device, p.strategy);
  // Weight gradients are written even without rows (zeros), so there is no early return.
  core::on_device(args.x.device, op.c_str(), [&] { moe::experts_backward_cpu(args, p); },
            [&] {
              core::expect_workspace(args.workspace, args.x, "x", backward_workspace_cuda(args, p), op);
              moe::zero_uncovered_rows_cuda(args.offsets, p.experts, p.rows, {&args.dx}, stream);
              if (p.strategy == MoeExpertsStrategy::tensor_core)
                moe::experts_backward_tensor_core_cuda(args, p, stream);
              else
                moe::experts_backward_cuda(args, p, stream);
            });
}

const char* moe_last_algorithm() { return last_algorithm; }

void moe_interleave_gate_up(const Tensor& gate, const Tensor& up, const Tensor& gate_up, Stream stream) {
  const moe::InterleaveProblem p = moe::validate_interleave_gate_up(gate, up, gate_up);
  if (p.experts == 0 || p.inter == 0 || p.hidden == 0) return;
  core::on_device(gate.device, "moe.interleave_gate_up", [&] { moe::interleave_gate_up_cpu(gate, up, gate_up, p); },
            [&] { moe::interleave_gate_up_cuda(gate, up, gate_up, p, stream); });
}

void moe_selected_router_weights(const MoeSelectedRouterArgs& args, Stream stream) {
  const moe::SelectedRouterProblem p = moe::validate_selected_router(args);
  if (p.tokens == 0) return;
  core::on_device(args.logits.device, "moe.selected_router_weights", [&] { moe::selected_router_cpu(args, p); },
            [&] { moe::selected_router_cuda(args, p, stream); });
}

void moe_selected_router_backward(const MoeSelectedRouterBackwardArgs& args, Stream stream) {
  const moe::SelectedRouterProblem p = moe::validate_selected_router_backward(args);
  if (p.tokens == 0) return;
  core::on_device(args.logits.device, "moe.selected_router_backward", [&] { moe::selected_router_backward_cpu(args, p); },
            [&] { moe::selected_router_backward_cuda(args, p, stream); });
}

// ---- the whole layer: five calls over views into one workspace -------------------------------

namespace {

std::size_t layer_align(std::size_t v) {
  return (v + kMoeLayerWorkspaceAlign - 1) / kMoeLayerWorkspaceAlign * kMoeLayerWorkspaceAlign;
}

// The steps of moe_layer_forward: their arguments over views into the workspace, each view
// 256-byte aligned from `base`. A null base gives the sizes: the views then start at address
// kMoeLayerWorkspaceAlign, so the experts' alignment rules see the offsets the run will give them,
// and nothing is read through them. Holds pointers to its own members: filled in place.
struct LayerSteps {
  Tensor indices, weights, offsets, token_of_row, row_of_slot, x_dispatched, y, plan_workspace, experts_workspace;
  MoeRouteArgs route;
  MoeRouteSigmoidGroupedArgs grouped;
  MoeDispatchPlanArgs plan;
  MoeExpertsForwardArgs experts;
  MoeCombineArgs combine;
  std::size_t bytes = 0;
};

// Fills `s` and checks the route and experts steps on it (their own validators, before any
// work; the plan, gather and combine steps take only views made here, plus `out`, which
// validate_layer checked). The values of the views are never read (device ids and offsets come
// from the steps before), so this runs before any of them.
void layer_steps(const MoeLayerArgs& a, const moe::LayerProblem& p, char* base, LayerSteps& s) {
  const std::int64_t T = p.tokens, k = p.top_k, N = T * k, H = p.hidden;
  char* const start = base ? base : reinterpret_cast<char*>(std::uintptr_t(kMoeLayerWorkspaceAlign));
  std::size_t at = 0;
  const auto carve = [&](DType dtype, std::int64_t rows, std::int64_t cols, int rank) {
    const std::int64_t dims[2] = {rows, cols};
    Tensor t = Tensor::contiguous(start + at, dtype, a.x.device, dims, rank);
    at = layer_align(at + std::size_t(rows * (rank == 2 ? cols : 1)) * dtype_size(dtype));
    return t;
  };
  s.indices = carve(DType::u32, T, k, 2);
  s.weights = carve(a.logits.dtype, T, k, 2);
  s.offsets = carve(DType::i32, p.experts + 1, 0, 1);
  s.token_of_row = carve(DType::i32, N, 0, 1);
  s.row_of_slot = carve(DType::i32, T, k, 2);
  s.x_dispatched = carve(a.x.dtype, N, H, 2);
  s.y = carve(a.x.dtype, N, H, 2);

  if (a.sigmoid_grouped) {
    s.grouped = MoeRouteSigmoidGroupedArgs{a.logits,        a.bias,          a.top_k, a.groups,  a.selected_groups,
                                           a.group_top_two, a.renormalize,   a.scale, s.indices, s.weights};
    moe::validate_route_sigmoid_grouped(s.grouped);
  } else {
    s.route = MoeRouteArgs{a.logits, a.top_k, a.renormalize, s.indices, s.weights};
    moe::validate_route(s.route);
  }
  s.plan = MoeDispatchPlanArgs{s.indices, p.experts, s.offsets, s.token_of_row, s.row_of_slot, nullptr};
  const std::size_t plan_bytes = a.x.device.is_cuda() ? moe_dispatch_plan_workspace_bytes(s.plan) : 0;
  s.plan_workspace = carve(DType::u8, std::int64_t(plan_bytes), 0, 1);
  s.plan.workspace = plan_bytes ? &s.plan_workspace : nullptr;

  s.experts = MoeExpertsForwardArgs{};
  s.experts.x = s.x_dispatched;
  s.experts.offsets = s.offsets;
  s.experts.gate = a.gate;
  s.experts.up = a.up;
  s.experts.down = a.down;
  s.experts.y = s.y;
  s.experts.gate_up = a.gate_up;
  s.experts.strategy = a.strategy;
  // The CPU backend reads host offsets when it validates; the size query on the CPU must not.
  moe::validate_experts_forward(s.experts, /*read_offsets=*/false);
  const std::size_t experts_bytes = a.x.device.is_cuda() ? moe_experts_forward_workspace_bytes(s.experts) : 0;
  s.experts_workspace = carve(DType::u8, std::int64_t(experts_bytes), 0, 1);
  s.experts.workspace = experts_bytes ? &s.experts_workspace : nullptr;

  s.combine = MoeCombineArgs{s.y, s.row_of_slot, &s.weights, a.out};
  s.bytes = at;
}

// The workspace's alignment: the views' offsets are multiples of 256, which the CUDA steps need
// from its base too (TMA descriptors, 16-byte rows); the CPU steps only need their elements'.
std::size_t layer_alignment(const MoeLayerArgs& a) { return a.x.device.is_cuda() ? kMoeLayerWorkspaceAlign : 8; }

}  // namespace

std::size_t moe_layer_forward_workspace_bytes(const MoeLayerArgs& args) {
  const moe::LayerProblem p = moe::validate_layer(args);
  LayerSteps s;
  layer_steps(args, p, nullptr, s);
  return s.bytes;
}

void moe_layer_forward(const MoeLayerArgs& args, Stream stream) {
  const moe::LayerProblem p = moe::validate_layer(args);
  // One layout pass, over the caller's workspace: the sizes do not depend on its address once
  // the check below has found it aligned (and big enough) before any view is used.
  LayerSteps s;
  layer_steps(args, p, args.workspace ? static_cast<char*>(args.workspace->data) : nullptr, s);
  core::expect_workspace(args.workspace, args.x, "x", s.bytes, "SwiGluExperts", layer_alignment(args),
                         "the layer's expert ids, offsets and rows");
  if (args.sigmoid_grouped)
    moe_route_sigmoid_grouped(s.grouped, stream);
  else
    moe_route(s.route, stream);
  moe_dispatch_plan(s.plan, stream);
  moe_gather_rows(args.x, s.token_of_row, s.x_dispatched, stream);
  moe_experts_forward(s.experts, stream);
  moe_combine(s.combine, stream);
}

}  // namespace rudnn
