// CPU reference backend of the CTC family: the textbook log-space recursions, one sequence at
// a time, in float32 (Graves et al. 2006, section 4.1; the notation of torch's documentation).
//
// Sequence n has the extended target l' = (blank, l1, blank, l2, ..., lS, blank) of 2S + 1
// states. alpha[t][s] is the log-probability of all prefixes of alignments that emit l'[0..s]
// in steps 0..t and sit in state s at t; beta[t][s] the same for suffixes from state s at t to
// the end (both include the emission at t). The loss is -log(alpha[T-1][2S] + alpha[T-1][2S-1]),
// and the gradient with respect to log_probs[t][c] is
//   exp(log_probs[t][c]) - exp(lse_{s: l'[s] = c}(alpha[t][s] + beta[t][s]) + loss - log_probs[t][c]),
// times the incoming gradient (torch's formula, which yields NaN when the loss is inf).
#include <cmath>
#include <limits>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "ctc/problem.hpp"

namespace rudnn::ctc {

namespace {

using host::from_float;
using host::to_float;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

// log(exp(a) + exp(b)), exact for -inf operands (where a - b would be NaN).
float log_add(float a, float b) {
  const float hi = a > b ? a : b, lo = a > b ? b : a;
  if (hi == kNegInf) return kNegInf;
  return hi + std::log1p(std::exp(lo - hi));
}

// log(exp(a) + exp(b) + exp(c)) with one logarithm: the recursions' three-way step as torch's
// kernels take it (two log_adds round twice: 2.5x torch's gradient error at T = 50). ctc_cuda.cu's
// twin computes the same float operations in the same order (the emulator compares bitwise).
float log_add3(float a, float b, float c) {
  const float m = std::fmax(a, std::fmax(b, c));
  if (m == kNegInf) return kNegInf;
  return m + std::log(std::exp(a - m) + std::exp(b - m) + std::exp(c - m));
}

float* workspace_floats(const Tensor* ws, std::size_t offset) {
  return reinterpret_cast<float*>(static_cast<std::uint8_t*>(ws->data) + offset);
}

// One sequence's log_probs as floats: lp(t, c).
template <class T>
struct LogProbs {
  const T* base;
  i64 stride_t;
  float operator()(i64 t, i64 c) const { return to_float(base[t * stride_t + c]); }
};

// Fills alpha rows (row t at alpha + (t % rows) * states): rows = 2 rolls, rows = T keeps all.
// Returns the sequence's negative log-likelihood.
template <class T>
float alpha_recursion(const Problem& p, const Sequence& seq, const LogProbs<T>& lp, float* alpha, i64 rows) {
  const std::int32_t* labels = p.labels.data() + seq.label_offset;
  const i64 states = 2 * seq.target_length + 1;
  if (seq.input_length == 0) return seq.target_length == 0 ? 0.0f : std::numeric_limits<float>::infinity();
  for (i64 s = 0; s < states; ++s)
    alpha[s] = s < 2 ? lp(0, state_label(labels, p.blank, s)) : kNegInf;
  for (i64 t = 1; t < seq.input_length; ++t) {
    const float* prev = alpha + ((t - 1) % rows) * p.max_states;
    float* row = alpha + (t % rows) * p.max_states;
    for (i64 s = 0; s < states; ++s) {
      const float a = prev[s], b = s >= 1 ? prev[s - 1] : kNegInf, c = can_skip(labels, s) ? prev[s - 2] : kNegInf;
      const float sum = log_add3(a, b, c);
      row[s] = sum == kNegInf ? kNegInf : sum + lp(t, state_label(labels, p.blank, s));
    }
  }
  const float* last = alpha + ((seq.input_length - 1) % rows) * p.max_states;
  const float total = states > 1 ? log_add(last[states - 1], last[states - 2]) : last[0];
  return -total;
}

// The scale of sequence n's loss in the reduced loss (1 for none and sum).
double loss_scale(const Problem& p, i64 n) {
  if (p.reduction != CtcReduction::mean) return 1.0;
  return 1.0 / p.mean_divisor(n) / double(p.N);
}

template <class T>
void forward_typed(const Problem& p, const CtcLossArgs& args) {
  const T* log_probs = args.log_probs.ptr<const T>();
  float* alpha = workspace_floats(args.workspace, p.ws.alpha);
  T* loss = args.loss.ptr<T>();
  // Reduced losses accumulate in a fixed order (sequence 0 first); the mean divides each loss
  // by its clamped target length, sums, then divides by N, as torch does.
  float reduced = 0.0f;
  for (i64 n = 0; n < p.N; ++n) {
    const Sequence& seq = p.sequences[std::size_t(n)];
    float nll = alpha_recursion(p, seq, LogProbs<T>{log_probs + n * p.lp_n, p.lp_t}, alpha + n * 2 * p.max_states, 2);
    if (p.zero_infinity && std::isinf(nll)) nll = 0.0f;
    if (p.reduction == CtcReduction::none) loss[n * p.loss_n] = from_float<T>(nll);
    else reduced += p.reduction == CtcReduction::mean ? nll / float(p.mean_divisor(n)) : nll;
  }
  if (p.reduction == CtcReduction::mean) reduced /= float(p.N);
  if (p.reduction != CtcReduction::none) loss[0] = from_float<T>(reduced);
}

template <class T, class D>
void backward_typed(const Problem& p, const CtcLossBackwardArgs& args) {
  const T* log_probs = args.log_probs.ptr<const T>();
  const D* dloss = args.dloss.ptr<const D>();
  T* grad = args.dlog_probs.ptr<T>();
  float* alpha_all = workspace_floats(args.workspace, p.ws.alpha);
  float* beta_all = workspace_floats(args.workspace, p.ws.beta);
  std::vector<float> class_sum(std::size_t(p.C));  // lse of alpha + beta per class at one t
  for (i64 n = 0; n < p.N; ++n) {
    const Sequence& seq = p.sequences[std::size_t(n)];
    const std::int32_t* labels = p.labels.data() + seq.label_offset;
    const LogProbs<T> lp{log_probs + n * p.lp_n, p.lp_t};
    T* g = grad + n * p.grad_n;
    float* alpha = alpha_all + n * p.T * p.max_states;
    float* beta = beta_all + n * 2 * p.max_states;
    const float nll = alpha_recursion(p, seq, lp, alpha, p.T);
    const float scale = float(to_float(dloss[p.reduction == CtcReduction::none ? n * p.loss_n : 0]) * loss_scale(p, n));
    const bool zeroed = p.zero_infinity && std::isinf(nll);
    for (i64 t = 0; t < p.T; ++t)
      for (i64 c = 0; c < p.C; ++c) g[t * p.grad_t + c] = from_float<T>(0.0f);
    if (zeroed) continue;
    const i64 states = 2 * seq.target_length + 1;
    for (i64 t = seq.input_length - 1; t >= 0; --t) {
      float* row = beta + (t % 2) * p.max_states;
      const float* next = beta + ((t + 1) % 2) * p.max_states;
      for (i64 s = 0; s < states; ++s) {
        float sum;
        if (t == seq.input_length - 1) {
          sum = s >= states - 2 ? 0.0f : kNegInf;
        } else {
          sum = log_add3(next[s], s + 1 < states ? next[s + 1] : kNegInf,
                         s + 2 < states && can_skip(labels, s + 2) ? next[s + 2] : kNegInf);
        }
        row[s] = sum == kNegInf ? kNegInf : sum + lp(t, state_label(labels, p.blank, s));
      }
      const float* alpha_t = alpha + t * p.max_states;
      for (i64 c = 0; c < p.C; ++c) class_sum[std::size_t(c)] = kNegInf;
      for (i64 s = 0; s < states; ++s) {
        float& acc = class_sum[std::size_t(state_label(labels, p.blank, s))];
        acc = log_add(acc, alpha_t[s] + row[s]);
      }
      for (i64 c = 0; c < p.C; ++c) {
        const float v = lp(t, c);
        g[t * p.grad_t + c] = from_float<T>((std::exp(v) - std::exp(class_sum[std::size_t(c)] + nll - v)) * scale);
      }
    }
  }
}

}  // namespace

void forward_cpu(const Problem& p, const CtcLossArgs& args) {
  dispatch(args.log_probs.dtype, [&](auto tag) { forward_typed<typename decltype(tag)::type>(p, args); });
}

void backward_cpu(const Problem& p, const CtcLossBackwardArgs& args) {
  dispatch(args.log_probs.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch(args.dloss.dtype, [&](auto dtag) { backward_typed<T, typename decltype(dtag)::type>(p, args); });
  });
}

}  // namespace rudnn::ctc
