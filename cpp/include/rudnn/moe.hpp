// Mixture of experts, local compute (SPEC section 4):
//   logits -> routing -> compact dispatch -> SwiGLU experts -> weighted combine,
// plus the first-order training chain.
//
// The C++ functions are stateless: the plan objects of the Python API (RoutingPlan,
// DispatchedTokens, the training cache) own framework arrays and pass them here as
// tensors. Every function validates all of its arguments before any work and then runs
// the CPU reference backend or the CUDA backend by the tensors' device. Outputs and
// workspaces are allocated by the caller.
//
// Index conventions (all int32 unless said otherwise):
//   expert_indices [T, k]  the chosen expert of each (token, slot); uint32 from routing,
//                          uint32/int32/int64 accepted where the SPEC says so.
//   offsets [E+1]          dispatched rows of expert e are offsets[e] .. offsets[e+1]-1.
//   token_of_row [T*k]     the source token of each dispatched row (-1: unused row).
//   row_of_slot [T, k]     the dispatched row of each (token, slot) (-1: invalid expert index).
// Rows of one expert keep token order (then slot order): the layout is deterministic.
// Device arrays are never trusted: an out-of-range index or offset yields NaN (or an empty
// segment) and is never used to read or write out of bounds.
#pragma once

#include <cstddef>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

// ---- routing -----------------------------------------------------------------------------

// Softmax over all E experts in float32, top-k (ties to the lower expert id), optional
// renormalization of the selected weights, weights cast to the logits dtype. A row with a
// NaN or +inf logit, or only -inf logits, gets NaN weights (and experts 0..k-1).
struct MoeRouteArgs {
  Tensor logits;          // [T, E] f32/f16/bf16, last axis contiguous
  int top_k = 1;          // 1 <= top_k <= E; E <= 1024 and top_k <= 64 (UnsupportedError beyond)
  bool renormalize = true;
  Tensor expert_indices;  // uint32 [T, top_k] (output)
  Tensor weights;         // logits dtype [T, top_k] (output)
};
void moe_route(const MoeRouteArgs& args, Stream stream = nullptr);

// DeepSeek-V3 style: s = sigmoid(logits); c = s + bias selects (bias optional); groups of
// E/groups experts scored by the sum of their two largest c (group_top_two) or their max;
// the best selected_groups groups are kept; top-k on c among their experts (ties to the
// lower id). Weights use s: optional renormalization, then * scale, cast to the logits
// dtype. A row whose c has a NaN gets NaN weights (and experts 0..k-1).
struct MoeRouteSigmoidGroupedArgs {
  Tensor logits;                 // [T, E] f32/f16/bf16, E in 1..1024
  const Tensor* bias = nullptr;  // float32 [E]; optional
  int top_k = 1;                 // 1..64, <= selected_groups * E / groups
  int groups = 1;                // 1..128, divides E
  int selected_groups = 1;       // 1..groups
  bool group_top_two = true;     // needs >= 2 experts per group
  bool renormalize = true;
  float scale = 1.0f;            // finite, > 0
  Tensor expert_indices;         // uint32 [T, top_k] (output)
  Tensor weights;                // logits dtype [T, top_k] (output)
};
void moe_route_sigmoid_grouped(const MoeRouteSigmoidGroupedArgs& args, Stream stream = nullptr);

constexpr int kMoeMaxExperts = 1024;
constexpr int kMoeMaxTopK = 64;
constexpr int kMoeMaxGroups = 128;

// ---- dispatch and combine ------------------------------------------------------------------

// Groups the T*k (token, slot) pairs by expert in stable token order.
struct MoeDispatchPlanArgs {
  Tensor expert_indices;               // [T, k] uint32/int32/int64
  int num_experts = 1;                 // E in 1..1024
  Tensor offsets;                      // int32 [E+1] (output)
  Tensor token_of_row;                 // int32 [T*k] (output)
  Tensor row_of_slot;                  // int32 [T, k] (output)
  const Tensor* workspace = nullptr;   // uint8, >= moe_dispatch_plan_workspace_bytes(args)
};
std::size_t moe_dispatch_plan_workspace_bytes(const MoeDispatchPlanArgs& args);
void moe_dispatch_plan(const MoeDispatchPlanArgs& args, Stream stream = nullptr);

// x_dispatched[r] = x[token_of_row[r]]; rows with an out-of-range token are zero.
void moe_gather_rows(const Tensor& x, const Tensor& token_of_row, const Tensor& x_dispatched,
                     Stream stream = nullptr);

// out[t] = sum_j weights[t, j] * y[row_of_slot[t, j]], float32 accumulation in slot order,
// cast to out's dtype. Without weights every weight is 1: the backward of the dispatch.
struct MoeCombineArgs {
  Tensor y;                        // [N, H] f32/f16/bf16 (dispatched rows)
  Tensor row_of_slot;              // int32 [T, k]
  const Tensor* weights = nullptr; // [T, k] any float dtype; optional
  Tensor out;                      // [T, H], y's dtype (output)
};
void moe_combine(const MoeCombineArgs& args, Stream stream = nullptr);

// Backward of moe_combine: dy[row_of_slot[t, j]] = weights[t, j] * dout[t] (y's dtype) and
// dweights[t, j] = <dout[t], y[row_of_slot[t, j]]> (float32). Both strategies are
// deterministic; "serial" reduces each dot product in one thread, "plane" spreads the
// hidden axis over a thread block (fixed-order tree). dy rows no slot points at are zero.
enum class MoeCombineBackwardStrategy { serial, plane };
struct MoeCombineBackwardArgs {
  Tensor y;            // [N, H]
  Tensor dout;         // [T, H], y's dtype
  Tensor row_of_slot;  // int32 [T, k]
  Tensor weights;      // [T, k] any float dtype
  Tensor dy;           // [N, H], y's dtype (output)
  Tensor dweights;     // float32 [T, k] (output)
  MoeCombineBackwardStrategy strategy = MoeCombineBackwardStrategy::plane;
};
void moe_combine_backward(const MoeCombineBackwardArgs& args, Stream stream = nullptr);

// ---- SwiGLU experts --------------------------------------------------------------------------

// For every expert e and its rows n: a = x[n]·gate[e]^T, b = x[n]·up[e]^T (float32
// accumulation, rounded to the dtype), h = silu(a) * b (rounded), y[n] = h·down[e]^T.
// Host offsets must tile the N rows (offsets[0] = 0, non-decreasing, offsets[E] = N). Device
// offsets are not read on the host: expert e then owns rows [clamp(offsets[e]), max(that,
// clamp(offsets[e + 1]))), clamped into [0, N], and the rows no expert owns are written zero (y,
// and gate_pre and up_pre when given; dx of the backward likewise).
// gate_up (optional) holds gate and up once more, interleaved by moe_interleave_gate_up: the sm90
// tensor-core forward without gate_pre then computes a and b in one grouped GEMM and h in its
// epilogue (a and b rounded to the dtype first, so h is the same as unfused); every other path
// reads gate and up and ignores it. The caller keeps it equal to the interleaving of gate and up.
enum class MoeExpertsStrategy { automatic, tensor_core, scalar };
struct MoeExpertsForwardArgs {
  Tensor x;                          // [N, H] f32/f16/bf16, dispatched rows
  Tensor offsets;                    // int32 [E+1]
  Tensor gate, up;                   // [E, I, H], x's dtype, dense
  Tensor down;                       // [E, H, I], x's dtype, dense
  Tensor y;                          // [N, H], x's dtype (output)
  const Tensor* gate_pre = nullptr;  // [N, I] x's dtype: a (output, for training); optional
  const Tensor* up_pre = nullptr;    // [N, I] x's dtype: b (output); given together with gate_pre
  const Tensor* gate_up = nullptr;   // [E, 2I, H] x's dtype, dense: moe_interleave_gate_up(gate, up); optional
  MoeExpertsStrategy strategy = MoeExpertsStrategy::automatic;
  const Tensor* workspace = nullptr; // uint8, >= moe_experts_forward_workspace_bytes(args)
};
std::size_t moe_experts_forward_workspace_bytes(const MoeExpertsForwardArgs& args);
void moe_experts_forward(const MoeExpertsForwardArgs& args, Stream stream = nullptr);

// Rows of gate, then of up, per block of gate_up (moe_interleave_gate_up).
constexpr int kMoeGateUpBlock = 64;

// gate_up[e] = gate[e] and up[e] interleaved in blocks of kMoeGateUpBlock = 64 rows: for every
// j in [0, I / 64), rows [128 j, 128 j + 64) of gate_up[e] are gate[e]'s rows [64 j, 64 j + 64)
// and rows [128 j + 64, 128 j + 128) are up[e]'s same rows. gate, up [E, I, H] f32/f16/bf16 with
// I a multiple of 64 (UnsupportedError otherwise), one dtype and device, dense; gate_up
// [E, 2I, H] of their dtype and device, dense, apart from both (output). A plain copy: the
// weights of MoeExpertsForwardArgs::gate_up, made once per set of weights.
void moe_interleave_gate_up(const Tensor& gate, const Tensor& up, const Tensor& gate_up, Stream stream = nullptr);

// Gradients of the forward above given a and b (gate_pre, up_pre). dx in x's dtype,
// weight gradients float32, reduced over each expert's rows in row order (deterministic);
// experts without rows get zero gradients.
struct MoeExpertsBackwardArgs {
  Tensor dy;                          // [N, H], x's dtype
  Tensor x;                           // [N, H]
  Tensor offsets;                     // int32 [E+1]
  Tensor gate, up, down;              // as in the forward
  Tensor gate_pre, up_pre;            // [N, I], x's dtype
  Tensor dx;                          // [N, H], x's dtype (output)
  Tensor dgate, dup;                  // float32 [E, I, H] (output)
  Tensor ddown;                       // float32 [E, H, I] (output)
  MoeExpertsStrategy strategy = MoeExpertsStrategy::automatic;
  const Tensor* workspace = nullptr;  // uint8, >= moe_experts_backward_workspace_bytes(args)
};
std::size_t moe_experts_backward_workspace_bytes(const MoeExpertsBackwardArgs& args);
void moe_experts_backward(const MoeExpertsBackwardArgs& args, Stream stream = nullptr);

// What the last experts forward or backward on this thread ran: "cpu", "scalar",
// "tensor_core" or "tensor_core_fused" (the sm90 forward with SwiGLU in the gate/up GEMM's
// epilogue, over gate_up) ("none" before any).
const char* moe_last_algorithm();

// ---- the whole layer ---------------------------------------------------------------------------

// out = the MoE layer of SwiGluExperts(x, logits, top_k=...): moe_route (softmax top-k; with
// sigmoid_grouped, moe_route_sigmoid_grouped with the options below), then
// moe_dispatch_plan, moe_gather_rows, moe_experts_forward (inference: gate_up used as there) and
// moe_combine with the routing weights, in one call whose intermediates (expert ids, weights,
// offsets, token_of_row, row_of_slot, the dispatched rows, the expert outputs) and sub-workspaces
// live in the workspace. The result is the five calls' bitwise; every argument is checked before
// any work, with the messages of those calls (plus x and logits naming the same T tokens).
struct MoeLayerArgs {
  Tensor x;                          // [T, H] f32/f16/bf16
  Tensor logits;                     // [T, E] f32/f16/bf16 (the routing weights take its dtype)
  int top_k = 1;
  bool renormalize = true;
  bool sigmoid_grouped = false;      // DeepSeek-V3 routing (MoeRouteSigmoidGroupedArgs) with:
  const Tensor* bias = nullptr;      //   float32 [E]; optional
  int groups = 1, selected_groups = 1;
  bool group_top_two = true;
  float scale = 1.0f;
  Tensor gate, up;                   // [E, I, H], x's dtype, dense
  Tensor down;                       // [E, H, I], x's dtype, dense
  const Tensor* gate_up = nullptr;   // as in MoeExpertsForwardArgs; optional
  MoeExpertsStrategy strategy = MoeExpertsStrategy::automatic;
  Tensor out;                        // [T, H], x's dtype (output)
  const Tensor* workspace = nullptr; // uint8, 256-byte aligned, >= moe_layer_forward_workspace_bytes(args)
};
constexpr std::size_t kMoeLayerWorkspaceAlign = 256;
std::size_t moe_layer_forward_workspace_bytes(const MoeLayerArgs& args);
void moe_layer_forward(const MoeLayerArgs& args, Stream stream = nullptr);

// ---- differentiable router weights ----------------------------------------------------------

// weights[t, j] = scale * q[t, j], q = p[t, indices[t, j]] (divided by sum_j of them with
// renormalize); p = softmax(logits[t]) over all E (softmax scoring) or sigmoid(logits)
// (sigmoid scoring), all in float32. Repeated indices gather the same p; a row holding an
// index outside [0, E) is NaN (nothing is read at that index).
enum class MoeScoring { softmax, sigmoid };
struct MoeSelectedRouterArgs {
  Tensor logits;        // [T, E] f32/f16/bf16
  Tensor indices;       // [T, k] uint32/int32/int64
  MoeScoring scoring = MoeScoring::softmax;
  bool renormalize = true;
  float scale = 1.0f;   // finite, > 0
  Tensor weights;       // float32 [T, k] (output)
};
void moe_selected_router_weights(const MoeSelectedRouterArgs& args, Stream stream = nullptr);

// dlogits [T, E] in the logits dtype from grad_weights [T, k] (any float dtype).
struct MoeSelectedRouterBackwardArgs {
  Tensor logits;
  Tensor indices;
  Tensor grad_weights;
  MoeScoring scoring = MoeScoring::softmax;
  bool renormalize = true;
  float scale = 1.0f;
  Tensor dlogits;       // [T, E], logits dtype (output)
};
void moe_selected_router_backward(const MoeSelectedRouterBackwardArgs& args, Stream stream = nullptr);

}  // namespace rudnn
