// Connectionist temporal classification loss and its gradient (SPEC section 7), with
// torch.nn.functional.ctc_loss's semantics.
//
// log_probs is (T, N, C): log-probabilities over C classes (blank included) for T time steps
// of N sequences, f32/f16/bf16 with a contiguous last axis (a batch-less (T, C) input is the
// caller's (T, 1, C) view). Targets are padded (N, S) or concatenated (sum(target_lengths),).
// targets, input_lengths and target_lengths are int32 or int64 arrays in host memory: their
// values decide the problem (and the workspace size), and are all checked before any work.
//
// The loss of sequence n is -log p(target_n | log_probs[:input_length_n, n]) computed with the
// log-space alpha (forward) recursion in float32; it is inf when no alignment exists (a target
// too long for its input). Reductions: none (a loss per sequence, shape (N,)), sum, and mean
// (each loss divided by max(target_length, 1), then averaged over the batch), both rank 0.
// zero_infinity replaces inf losses (and their gradients) with zeros.
//
// The workspace (uint8 on log_probs' device, *_workspace_bytes(args) bytes, allocated by the
// caller) holds the sequence table, the labels, the per-sequence losses and the alpha / beta
// rows. Reductions run in a fixed order: results are bitwise run-to-run deterministic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

enum class CtcReduction { none, mean, sum };

struct CtcOptions {
  std::int64_t blank = 0;  // 0 <= blank < C
  CtcReduction reduction = CtcReduction::mean;
  bool zero_infinity = false;
};

struct CtcLossArgs {
  CtcOptions options;
  Tensor log_probs;       // (T, N, C), f32/f16/bf16
  Tensor targets;         // host int32/int64: (N, S) or (sum(target_lengths),); values in [0, C), != blank
  Tensor input_lengths;   // host int32/int64 (N,), 0 <= value <= T
  Tensor target_lengths;  // host int32/int64 (N,), >= 0 (<= S when padded)
  Tensor loss;            // log_probs' dtype: (N,) for none, else rank 0 (output)
  const Tensor* workspace = nullptr;
};

// dlog_probs = d(loss)/d(log_probs) given dloss (any float dtype: (N,) for none, else rank 0),
// exactly what torch's autograd returns: zero at time steps t >= input_length.
struct CtcLossBackwardArgs {
  CtcOptions options;
  Tensor dloss;
  Tensor log_probs;
  Tensor targets;
  Tensor input_lengths;
  Tensor target_lengths;
  Tensor dlog_probs;  // like log_probs (output)
  const Tensor* workspace = nullptr;
};

// Workspace sizes in bytes; they validate like the calls (the outputs and workspace are not read).
std::size_t ctc_loss_workspace_bytes(const CtcLossArgs& args);
std::size_t ctc_loss_backward_workspace_bytes(const CtcLossBackwardArgs& args);

void ctc_loss_forward(const CtcLossArgs& args, Stream stream = nullptr);
void ctc_loss_backward(const CtcLossBackwardArgs& args, Stream stream = nullptr);

}  // namespace rudnn
