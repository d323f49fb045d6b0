// CUDA backend of the CTC family: one block per sequence, the recursions of cpu.cpp with the
// states of a time step spread over the block's threads (one __syncthreads per step).
//
//   ctc_alpha_kernel   alpha over time; stores the sequence's negative log-likelihood (and, for
//                      the backward, every alpha row)
//   ctc_reduce_kernel  sum / mean of the losses in sequence order (one thread: deterministic,
//                      and the CPU backend's order)
//   ctc_grad_kernel    beta backwards over time and, at each step, the gradient row
//
// The per-sequence labels (and the backward's label chains and rolling rows) live in shared
// memory when they fit; longer targets use the same arrays in the global workspace, so there
// is no label limit. The sequence table and labels are copied from the host into the workspace
// (cudaMemcpyAsync from pageable memory: the copy is staged before the call returns).
// Instantiations: the log_probs dtype only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/convert.cuh"
#include "core/cuda_check.hpp"
#include "core/dispatch.hpp"
#include "ctc/problem.hpp"

namespace rudnn::ctc {

namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxStagedBytes = 48 * 1024;  // the default dynamic shared memory limit

// log(exp(a) + exp(b)), exact for -inf operands (where a - b would be NaN).
__device__ __forceinline__ float log_add(float a, float b) {
  const float hi = fmaxf(a, b), lo = fminf(a, b);
  if (hi == -INFINITY) return -INFINITY;
  return hi + log1pf(expf(lo - hi));
}

// log(exp(a) + exp(b) + exp(c)) with one logarithm (cpu.cpp's log_add3: the same operations).
__device__ __forceinline__ float log_add3(float a, float b, float c) {
  const float m = fmaxf(a, fmaxf(b, c));
  if (m == -INFINITY) return -INFINITY;
  return m + logf(expf(a - m) + expf(b - m) + expf(c - m));
}

__device__ __forceinline__ bool is_inf(float v) { return fabsf(v) == INFINITY; }

// The arrays of one call in the workspace, and the call's scalars.
struct Params {
  i64 T, C, blank, max_states, lp_t, lp_n, loss_n, grad_t, grad_n, N;
  int reduction;  // CtcReduction
  bool zero_infinity;
  bool staged;    // labels (and rows) in shared memory
  const Sequence* sequences;
  const std::int32_t* labels;
  std::int32_t* links;
  float* losses;
  float* alpha;
  float* beta;
};

template <class T>
struct LogProbs {
  const T* base;
  i64 stride_t;
  __device__ float operator()(i64 t, i64 c) const { return core::to_float(base[t * stride_t + c]); }
};

// Copies n ints to shared memory when staged, else returns the global array.
__device__ const std::int32_t* stage(const std::int32_t* global, std::int32_t* shared, i64 n, bool staged) {
  if (!staged) return global;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) shared[i] = global[i];
  return shared;
}

// Alpha rows of one sequence: rows == 2 rolls them (the forward, in shared memory when staged),
// rows == T keeps every row in the workspace (the backward's gradient reads them).
template <class T>
__global__ void __launch_bounds__(kThreads) ctc_alpha_kernel(Params p, const T* log_probs, T* loss, i64 rows) {
  extern __shared__ float smem[];
  const i64 n = blockIdx.x;
  const Sequence seq = p.sequences[n];
  const i64 states = 2 * seq.target_length + 1;
  const bool rows_in_smem = p.staged && rows == 2;
  float* alpha = rows_in_smem ? smem : p.alpha + n * rows * p.max_states;
  const std::int32_t* labels =
      stage(p.labels + seq.label_offset, reinterpret_cast<std::int32_t*>(smem + (rows_in_smem ? 2 * p.max_states : 0)),
            seq.target_length, p.staged);
  const LogProbs<T> lp{log_probs + n * p.lp_n, p.lp_t};
  __syncthreads();
  if (seq.input_length > 0) {
    for (i64 s = threadIdx.x; s < states; s += blockDim.x)
      alpha[s] = s < 2 ? lp(0, state_label(labels, p.blank, s)) : -INFINITY;
    __syncthreads();
    for (i64 t = 1; t < seq.input_length; ++t) {
      const float* prev = alpha + ((t - 1) % rows) * p.max_states;
      float* row = alpha + (t % rows) * p.max_states;
      for (i64 s = threadIdx.x; s < states; s += blockDim.x) {
        const float sum = log_add3(prev[s], s >= 1 ? prev[s - 1] : -INFINITY,
                                   can_skip(labels, s) ? prev[s - 2] : -INFINITY);
        row[s] = sum == -INFINITY ? -INFINITY : sum + lp(t, state_label(labels, p.blank, s));
      }
      __syncthreads();
    }
  }
  if (threadIdx.x != 0) return;
  float nll;
  if (seq.input_length == 0) {
    nll = seq.target_length == 0 ? 0.0f : INFINITY;
  } else {
    const float* last = alpha + ((seq.input_length - 1) % rows) * p.max_states;
    nll = -(states > 1 ? log_add(last[states - 1], last[states - 2]) : last[0]);
  }
  p.losses[n] = nll;
  if (loss && p.reduction == int(CtcReduction::none))
    loss[n * p.loss_n] = core::from_float<T>(p.zero_infinity && is_inf(nll) ? 0.0f : nll);
}

// The reduced loss, summed in sequence order as the CPU backend does.
template <class T>
__global__ void ctc_reduce_kernel(Params p, T* loss) {
  float reduced = 0.0f;
  for (i64 n = 0; n < p.N; ++n) {
    float nll = p.losses[n];
    if (p.zero_infinity && is_inf(nll)) nll = 0.0f;
    const i64 len = p.sequences[n].target_length;
    reduced += p.reduction == int(CtcReduction::mean) ? nll / float(len > 1 ? len : 1) : nll;
  }
  if (p.reduction == int(CtcReduction::mean)) reduced /= float(p.N);
  loss[0] = core::from_float<T>(reduced);
}

// Beta backwards over time and the gradient of each time step. The lse of alpha + beta per class
// walks, for each label's first position in the target, the chain of its later positions
// (links), and for the blank every even state: one thread per class, in the CPU's order.
template <class T>
__global__ void __launch_bounds__(kThreads) ctc_grad_kernel(Params p, const T* log_probs, const void* dloss,
                                                            DType dloss_dtype, T* grad) {
  extern __shared__ float smem[];
  const i64 n = blockIdx.x;
  const Sequence seq = p.sequences[n];
  const i64 S = seq.target_length, states = 2 * S + 1;
  const LogProbs<T> lp{log_probs + n * p.lp_n, p.lp_t};
  T* g = grad + n * p.grad_n;
  const float nll = p.losses[n];
  const bool zeroed = p.zero_infinity && is_inf(nll);
  const i64 live = zeroed ? 0 : seq.input_length;  // rows past it are zero

  for (i64 i = live * p.C + threadIdx.x; i < p.T * p.C; i += blockDim.x) g[(i / p.C) * p.grad_t + i % p.C] =
      core::from_float<T>(0.0f);
  if (live == 0) return;

  float* beta = p.staged ? smem : p.beta + n * 2 * p.max_states;
  std::int32_t* shared_ints = reinterpret_cast<std::int32_t*>(smem + 2 * p.max_states);
  const std::int32_t* labels = stage(p.labels + seq.label_offset, shared_ints, S, p.staged);
  std::int32_t* links = p.staged ? shared_ints + S : p.links + seq.label_offset;
  __syncthreads();
  // links[k]: the next position after k with the same label (-1 at the last) for a label's
  // first position; -(next + 3) for a later one (its chain is walked from the first).
  for (i64 k = threadIdx.x; k < S; k += blockDim.x) {
    std::int32_t next = -1;
    for (i64 j = k + 1; j < S && next < 0; ++j)
      if (labels[j] == labels[k]) next = std::int32_t(j);
    bool first = true;
    for (i64 j = 0; j < k && first; ++j) first = labels[j] != labels[k];
    links[k] = first ? next : -(next + 3);
  }
  const double mean_scale = p.reduction == int(CtcReduction::mean) ? 1.0 / double(S > 1 ? S : 1) / double(p.N) : 1.0;
  const float scale =
      float(double(core::load_as_float(dloss, dloss_dtype, p.reduction == int(CtcReduction::none) ? n * p.loss_n : 0)) *
            mean_scale);
  const float* alpha_all = p.alpha + n * p.T * p.max_states;
  __syncthreads();

  for (i64 t = live - 1; t >= 0; --t) {
    float* row = beta + (t % 2) * p.max_states;
    const float* next = beta + ((t + 1) % 2) * p.max_states;
    for (i64 s = threadIdx.x; s < states; s += blockDim.x) {
      float sum;
      if (t == live - 1) {
        sum = s >= states - 2 ? 0.0f : -INFINITY;
      } else {
        sum = log_add3(next[s], s + 1 < states ? next[s + 1] : -INFINITY,
                       s + 2 < states && can_skip(labels, s + 2) ? next[s + 2] : -INFINITY);
      }
      row[s] = sum == -INFINITY ? -INFINITY : sum + lp(t, state_label(labels, p.blank, s));
    }
    // Every class first as if it had no state (the lse is -inf), then the classes that do.
    for (i64 c = threadIdx.x; c < p.C; c += blockDim.x) {
      const float v = lp(t, c);
      g[t * p.grad_t + c] = core::from_float<T>((expf(v) - expf(-INFINITY + nll - v)) * scale);
    }
    __syncthreads();
    const float* alpha = alpha_all + t * p.max_states;
    for (i64 k = threadIdx.x; k <= S; k += blockDim.x) {
      float acc = -INFINITY;
      i64 c;
      if (k == S) {  // the blank: every even state
        c = p.blank;
        for (i64 s = 0; s < states; s += 2) acc = log_add(acc, alpha[s] + row[s]);
      } else {
        if (links[k] < -1) continue;
        c = labels[k];
        for (i64 j = k; j >= 0; j = links[j] >= -1 ? links[j] : -links[j] - 3)
          acc = log_add(acc, alpha[2 * j + 1] + row[2 * j + 1]);
      }
      const float v = lp(t, c);
      g[t * p.grad_t + c] = core::from_float<T>((expf(v) - expf(acc + nll - v)) * scale);
    }
    __syncthreads();
  }
}

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<__half, __nv_bfloat16>(dtype, std::forward<F>(f));
}

Params make_params(const Problem& p, const Tensor& workspace, std::size_t staged_bytes) {
  auto* base = static_cast<std::uint8_t*>(workspace.data);
  Params q{};
  q.T = p.T; q.C = p.C; q.blank = p.blank; q.max_states = p.max_states; q.N = p.N;
  q.lp_t = p.lp_t; q.lp_n = p.lp_n; q.loss_n = p.loss_n; q.grad_t = p.grad_t; q.grad_n = p.grad_n;
  q.reduction = int(p.reduction);
  q.zero_infinity = p.zero_infinity;
  q.staged = staged_bytes <= kMaxStagedBytes;
  q.sequences = reinterpret_cast<const Sequence*>(base + p.ws.sequences);
  q.labels = reinterpret_cast<const std::int32_t*>(base + p.ws.labels);
  q.links = reinterpret_cast<std::int32_t*>(base + p.ws.links);
  q.losses = reinterpret_cast<float*>(base + p.ws.losses);
  q.alpha = reinterpret_cast<float*>(base + p.ws.alpha);
  q.beta = reinterpret_cast<float*>(base + p.ws.beta);
  return q;
}

// (tests/emulation/ctc_emu.cpp runs everything above this line on the CPU.)
// The sequence table and the labels into the workspace.
void upload(const Problem& p, const Tensor& workspace, cudaStream_t stream) {
  auto* base = static_cast<std::uint8_t*>(workspace.data);
  RUDNN_CUDA_CHECK(cudaMemcpyAsync(base + p.ws.sequences, p.sequences.data(), p.sequences.size() * sizeof(Sequence),
                                   cudaMemcpyHostToDevice, stream));
  if (!p.labels.empty())
    RUDNN_CUDA_CHECK(cudaMemcpyAsync(base + p.ws.labels, p.labels.data(), p.labels.size() * sizeof(std::int32_t),
                                     cudaMemcpyHostToDevice, stream));
}

i64 max_target(const Problem& p) { return (p.max_states - 1) / 2; }

template <class T>
void launch_alpha(const Problem& p, const Params& q, const T* log_probs, T* loss, i64 rows, cudaStream_t stream) {
  const std::size_t smem = q.staged ? std::size_t(rows == 2 ? 2 * p.max_states : 0) * sizeof(float) +
                                          std::size_t(max_target(p)) * sizeof(std::int32_t)
                                    : 0;
  ctc_alpha_kernel<T><<<unsigned(p.N), kThreads, smem, stream>>>(q, log_probs, loss, rows);
  RUDNN_CUDA_CHECK_LAUNCH("ctc_alpha_kernel");
}

}  // namespace

void forward_cuda(const Problem& p, const CtcLossArgs& args, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t staged = std::size_t(2 * p.max_states) * sizeof(float) + std::size_t(max_target(p)) * 4;
  const Params q = make_params(p, *args.workspace, staged);
  upload(p, *args.workspace, s);
  dispatch(args.log_probs.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* loss = args.loss.ptr<T>();
    launch_alpha<T>(p, q, args.log_probs.ptr<const T>(), loss, 2, s);
    if (p.reduction != CtcReduction::none) {
      ctc_reduce_kernel<T><<<1, 1, 0, s>>>(q, loss);
      RUDNN_CUDA_CHECK_LAUNCH("ctc_reduce_kernel");
    }
  });
}

void backward_cuda(const Problem& p, const CtcLossBackwardArgs& args, Stream stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  // The gradient kernel stages two beta rows, the labels and their links.
  const std::size_t staged = std::size_t(2 * p.max_states) * sizeof(float) + std::size_t(max_target(p)) * 8;
  const Params q = make_params(p, *args.workspace, staged);
  upload(p, *args.workspace, s);
  dispatch(args.log_probs.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* log_probs = args.log_probs.ptr<const T>();
    launch_alpha<T>(p, q, log_probs, nullptr, p.T, s);
    ctc_grad_kernel<T><<<unsigned(p.N), kThreads, q.staged ? staged : 0, s>>>(q, log_probs, args.dloss.data,
                                                                             args.dloss.dtype, args.dlog_probs.ptr<T>());
    RUDNN_CUDA_CHECK_LAUNCH("ctc_grad_kernel");
  });
}

}  // namespace rudnn::ctc
