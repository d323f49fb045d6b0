// The validated form of a CTC call, shared by the CPU and CUDA backends: sizes, strides, the
// per-sequence table and the labels read from the host arrays, and the workspace layout.
// validate.cpp builds a problem after every check has passed; backends assume it is valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rudnn/ctc.hpp"

#if !defined(RUDNN_HD)
#if defined(__CUDACC__)
#define RUDNN_HD __host__ __device__ __forceinline__
#else
#define RUDNN_HD inline
#endif
#endif

namespace rudnn::ctc {

using i64 = std::int64_t;

// One sequence: its input length, its target length and where its labels start in the
// packed label array.
struct Sequence {
  i64 input_length = 0;
  i64 target_length = 0;
  i64 label_offset = 0;
};

// Byte offsets of the workspace parts (each 16-byte aligned). losses holds each sequence's
// negative log-likelihood as float32 (before zero_infinity); alpha two rolling rows per sequence
// in the forward and every time step in the backward; beta two rolling rows. links (backward
// only, CUDA) chains each label position to the next position of the same label.
struct WorkspaceLayout {
  std::size_t sequences = 0, labels = 0, links = 0, losses = 0, alpha = 0, beta = 0, total = 0;
};

struct Problem {
  i64 T = 0, N = 0, C = 0;
  i64 blank = 0;
  i64 max_states = 1;  // 2 * max(target_length) + 1: the length of an alpha / beta row
  CtcReduction reduction = CtcReduction::mean;
  bool zero_infinity = false;
  bool backward = false;
  i64 lp_t = 0, lp_n = 0;       // log_probs (and dlog_probs) element strides of time and batch
  i64 grad_t = 0, grad_n = 0;   // dlog_probs strides (backward)
  i64 loss_n = 0;               // loss (none) or dloss (none) stride
  std::vector<Sequence> sequences;
  std::vector<std::int32_t> labels;  // every target's labels, packed
  WorkspaceLayout ws;

  // The divisor of sequence n's loss in the mean reduction (torch clamps it to >= 1).
  double mean_divisor(i64 n) const {
    const i64 len = sequences[std::size_t(n)].target_length;
    return double(len > 1 ? len : 1);
  }
};

// The label of extended state s (blanks between and around the target's labels).
RUDNN_HD i64 state_label(const std::int32_t* labels, i64 blank, i64 s) {
  return (s & 1) ? i64(labels[s >> 1]) : blank;
}

// Whether state s may be entered from s - 2 (skipping a blank): s is a label that differs
// from the previous label.
RUDNN_HD bool can_skip(const std::int32_t* labels, i64 s) {
  return (s & 1) && s >= 3 && labels[s >> 1] != labels[(s >> 1) - 1];
}

// check_outputs: also the loss / dloss / dlog_probs and the workspace (the size queries skip them).
Problem validate_forward(const CtcLossArgs& args, bool check_outputs = true);
Problem validate_backward(const CtcLossBackwardArgs& args, bool check_outputs = true);

void forward_cpu(const Problem& p, const CtcLossArgs& args);
void backward_cpu(const Problem& p, const CtcLossBackwardArgs& args);
#if RUDNN_WITH_CUDA
void forward_cuda(const Problem& p, const CtcLossArgs& args, Stream stream);
void backward_cuda(const Problem& p, const CtcLossBackwardArgs& args, Stream stream);
#endif

}  // namespace rudnn::ctc
