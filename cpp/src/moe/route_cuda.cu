// CUDA routing kernels: softmax top-k, DeepSeek-V3 grouped sigmoid routing, and the
// differentiable weights of a given selection (forward and backward). One fused kernel per
// call, one thread block per token: the row lives in shared memory (E <= 1024), every top-k
// round is one block-wide argmax with ties to the lower id, exactly as the CPU reference.
#include "moe/cuda_common.cuh"
#include "moe/problem.hpp"

namespace rudnn::moe {

using namespace cuda;

namespace {

constexpr int kThreads = 128;

// Rows that must not produce weights: experts 0..k-1 with NaN weights.
template <class T>
__device__ void write_nan_row(std::uint32_t* idx, T* w, int k) {
  for (int j = threadIdx.x; j < k; j += kThreads) {
    idx[j] = std::uint32_t(j);
    w[j] = from_float<T>(kNaN);
  }
}

// Thread 0 writes the chosen experts and their (renormalized, scaled) weights in slot order.
template <class T>
__device__ void write_selection(const int* chosen, const float* selected, int k, bool renormalize, float scale,
                                std::uint32_t* idx, T* w) {
  if (threadIdx.x != 0) return;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += selected[j];
  for (int j = 0; j < k; ++j) {
    idx[j] = std::uint32_t(chosen[j]);
    w[j] = from_float<T>((renormalize ? selected[j] / sum : selected[j]) * scale);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    route_softmax_kernel(const T* __restrict__ logits, std::int64_t stride, int E, int k, bool renormalize,
                         std::uint32_t* __restrict__ indices, T* __restrict__ weights) {
  __shared__ float keys[kMoeMaxExperts];
  __shared__ unsigned char eligible[kMoeMaxExperts];
  __shared__ float scratch[32];
  __shared__ Candidate candidates[32];
  __shared__ float selected[kMoeMaxTopK];
  __shared__ int chosen[kMoeMaxTopK];
  const std::int64_t t = blockIdx.x;
  const T* row = logits + t * stride;
  std::uint32_t* idx = indices + t * k;
  T* w = weights + t * k;

  float m = -kInf;
  int bad = 0;
  for (int e = threadIdx.x; e < E; e += kThreads) {
    const float v = to_float(row[e]);
    keys[e] = v;
    eligible[e] = 1;
    bad |= isnan(v) || v == kInf;
    m = fmaxf(m, v);
  }
  bad = __syncthreads_or(bad);
  m = block_max<kThreads>(m, scratch);
  if (bad || m == -kInf) {  // block-uniform: the whole block leaves together
    write_nan_row(idx, w, k);
    return;
  }
  float part = 0.0f;
  for (int e = threadIdx.x; e < E; e += kThreads) part += expf(keys[e] - m);
  const float z = block_sum<kThreads>(part, scratch);
  // The softmax is monotone in the logits: the top-k is taken on them exactly.
  for (int j = 0; j < k; ++j) {
    const int best = block_argmax<kThreads>(keys, eligible, E, candidates);
    if (threadIdx.x == 0) {
      eligible[best] = 0;
      chosen[j] = best;
      selected[j] = expf(keys[best] - m) / z;
    }
    __syncthreads();
  }
  write_selection(chosen, selected, k, renormalize, 1.0f, idx, w);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    route_sigmoid_grouped_kernel(const T* __restrict__ logits, std::int64_t stride, const float* __restrict__ bias,
                                 int E, int k, int groups, int selected_groups, bool group_top_two, bool renormalize,
                                 float scale, std::uint32_t* __restrict__ indices, T* __restrict__ weights) {
  __shared__ float scores[kMoeMaxExperts];     // s = sigmoid(logits): the weights
  __shared__ float corrected[kMoeMaxExperts];  // c = s + bias: the selection keys
  __shared__ unsigned char eligible[kMoeMaxExperts];
  __shared__ float group_score[kMoeMaxGroups];
  __shared__ unsigned char group_eligible[kMoeMaxGroups];
  __shared__ Candidate candidates[32];
  __shared__ float selected[kMoeMaxTopK];
  __shared__ int chosen[kMoeMaxTopK];
  const std::int64_t t = blockIdx.x;
  const T* row = logits + t * stride;
  std::uint32_t* idx = indices + t * k;
  T* w = weights + t * k;
  const int per_group = E / groups;

  int bad = 0;
  for (int e = threadIdx.x; e < E; e += kThreads) {
    const float s = sigmoid(to_float(row[e]));
    const float c = s + (bias ? bias[e] : 0.0f);
    scores[e] = s;
    corrected[e] = c;
    eligible[e] = 0;
    bad |= isnan(c);
  }
  if (__syncthreads_or(bad)) {
    write_nan_row(idx, w, k);
    return;
  }
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float first = -kInf, second = -kInf;
    for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
      const float c = corrected[e];
      if (c > first) {
        second = first;
        first = c;
      } else if (c > second) {
        second = c;
      }
    }
    group_score[g] = group_top_two ? first + second : first;
    group_eligible[g] = 1;
  }
  __syncthreads();
  for (int r = 0; r < selected_groups; ++r) {
    const int g = block_argmax<kThreads>(group_score, group_eligible, groups, candidates);
    for (int e = g * per_group + threadIdx.x; e < (g + 1) * per_group; e += kThreads) eligible[e] = 1;
    if (threadIdx.x == 0) group_eligible[g] = 0;
    __syncthreads();
  }
  for (int j = 0; j < k; ++j) {
    const int best = block_argmax<kThreads>(corrected, eligible, E, candidates);
    if (threadIdx.x == 0) {
      eligible[best] = 0;
      chosen[j] = best;
      selected[j] = scores[best];
    }
    __syncthreads();
  }
  write_selection(chosen, selected, k, renormalize, scale, idx, w);
}

// ---- differentiable weights of a given selection ------------------------------------------

struct RouterRow {
  float m = 0.0f, z = 1.0f;  // softmax: max and sum of exp(l - m)
};

// Reads and checks the row's k (<= 64) indices into `sel`; false (block-uniform) when one is
// outside [0, E). Nothing is read at an invalid index.
template <class Idx>
__device__ bool load_selection(const Idx* indices, int k, int E, int* sel) {
  int bad = 0;
  if (threadIdx.x < k) {
    const std::int64_t e = std::int64_t(indices[threadIdx.x]);
    bad = e < 0 || e >= E;
    sel[threadIdx.x] = bad ? 0 : int(e);
  }
  return !__syncthreads_or(bad);
}

template <class T>
__device__ RouterRow softmax_stats(const T* row, int E, MoeScoring scoring, float* scratch) {
  RouterRow r;
  if (scoring != MoeScoring::softmax) return r;
  float m = -kInf;
  for (int e = threadIdx.x; e < E; e += kThreads) m = fmaxf(m, to_float(row[e]));
  r.m = block_max<kThreads>(m, scratch);
  float part = 0.0f;
  for (int e = threadIdx.x; e < E; e += kThreads) part += expf(to_float(row[e]) - r.m);
  r.z = block_sum<kThreads>(part, scratch);
  return r;
}

__device__ __forceinline__ float score(float l, const RouterRow& r, MoeScoring scoring) {
  return scoring == MoeScoring::softmax ? expf(l - r.m) / r.z : sigmoid(l);
}

template <class T, class Idx>
__global__ void __launch_bounds__(kThreads)
    selected_router_kernel(const T* __restrict__ logits, std::int64_t logits_stride, const Idx* __restrict__ indices,
                           std::int64_t index_stride, int E, int k, MoeScoring scoring, bool renormalize, float scale,
                           float* __restrict__ weights) {
  __shared__ int sel[kMoeMaxTopK];
  __shared__ float scratch[32];
  const std::int64_t t = blockIdx.x;
  float* w = weights + t * k;
  if (!load_selection(indices + t * index_stride, k, E, sel)) {
    if (threadIdx.x < k) w[threadIdx.x] = kNaN;
    return;
  }
  const T* row = logits + t * logits_stride;
  const RouterRow r = softmax_stats(row, E, scoring, scratch);
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += score(to_float(row[sel[j]]), r, scoring);
    for (int j = 0; j < k; ++j) {
      const float q = score(to_float(row[sel[j]]), r, scoring);
      w[j] = (renormalize ? q / sum : q) * scale;
    }
  }
}

template <class T, class Idx>
__global__ void __launch_bounds__(kThreads)
    selected_router_backward_kernel(const T* __restrict__ logits, std::int64_t logits_stride,
                                    const Idx* __restrict__ indices, std::int64_t index_stride, const void* grad,
                                    DType grad_dtype, std::int64_t grad_stride, int E, int k, MoeScoring scoring,
                                    bool renormalize, float scale, T* __restrict__ dlogits,
                                    std::int64_t dlogits_stride) {
  __shared__ int sel[kMoeMaxTopK];
  __shared__ float dp[kMoeMaxTopK];  // d loss / d p of each slot
  __shared__ float scratch[32];
  const std::int64_t t = blockIdx.x;
  T* dl = dlogits + t * dlogits_stride;
  if (!load_selection(indices + t * index_stride, k, E, sel)) {
    for (int e = threadIdx.x; e < E; e += kThreads) dl[e] = from_float<T>(kNaN);
    return;
  }
  const T* row = logits + t * logits_stride;
  const RouterRow r = softmax_stats(row, E, scoring, scratch);
  if (threadIdx.x == 0) {
    // weights_j = scale * p_j / S (renormalized): d/dp_m = scale * (delta_jm - q_j) / S.
    float sum = 0.0f, gq = 0.0f;
    for (int j = 0; j < k; ++j) sum += score(to_float(row[sel[j]]), r, scoring);
    // q_j = p_j / S as the forward forms it (k = 1: q = 1 exactly, so g - gq is exactly 0).
    for (int j = 0; j < k; ++j)
      gq += load_as_float(grad, grad_dtype, t * grad_stride + j) * (score(to_float(row[sel[j]]), r, scoring) / sum);
    for (int j = 0; j < k; ++j) {
      const float g = load_as_float(grad, grad_dtype, t * grad_stride + j);
      dp[j] = renormalize ? scale * (g - gq) / sum : scale * g;
    }
  }
  __syncthreads();
  // gp_e: the slots' gradients gathered per expert, in slot order (repeated indices add up).
  auto gp_of = [&](int e) {
    float g = 0.0f;
    for (int j = 0; j < k; ++j)
      if (sel[j] == e) g += dp[j];
    return g;
  };
  if (scoring == MoeScoring::sigmoid) {
    for (int e = threadIdx.x; e < E; e += kThreads) {
      const float p = sigmoid(to_float(row[e]));
      dl[e] = from_float<T>(gp_of(e) * p * (1.0f - p));
    }
    return;
  }
  float part = 0.0f;
  for (int e = threadIdx.x; e < E; e += kThreads) part += gp_of(e) * score(to_float(row[e]), r, scoring);
  const float dot = block_sum<kThreads>(part, scratch);
  for (int e = threadIdx.x; e < E; e += kThreads) {
    const float p = score(to_float(row[e]), r, scoring);
    dl[e] = from_float<T>(p * (gp_of(e) - dot));
  }
}

}  // namespace

void route_cuda(const MoeRouteArgs& a, const RouteProblem& p, Stream s) {
  dispatch_float(a.logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    route_softmax_kernel<T><<<unsigned(p.tokens), kThreads, 0, as_cuda(s)>>>(
        a.logits.ptr<T>(), p.logits_stride, p.experts, p.top_k, p.renormalize, a.expert_indices.ptr<std::uint32_t>(),
        a.weights.ptr<T>());
    RUDNN_CUDA_CHECK_LAUNCH(route_softmax_kernel);
  });
}

void route_sigmoid_grouped_cuda(const MoeRouteSigmoidGroupedArgs& a, const RouteProblem& p, Stream s) {
  dispatch_float(a.logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    route_sigmoid_grouped_kernel<T><<<unsigned(p.tokens), kThreads, 0, as_cuda(s)>>>(
        a.logits.ptr<T>(), p.logits_stride, a.bias ? a.bias->ptr<float>() : nullptr, p.experts, p.top_k, p.groups,
        p.selected_groups, p.group_top_two, p.renormalize, p.scale, a.expert_indices.ptr<std::uint32_t>(),
        a.weights.ptr<T>());
    RUDNN_CUDA_CHECK_LAUNCH(route_sigmoid_grouped_kernel);
  });
}

void selected_router_cuda(const MoeSelectedRouterArgs& a, const SelectedRouterProblem& p, Stream s) {
  dispatch_float(a.logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(a.indices.dtype, [&](auto itag) {
      using Idx = typename decltype(itag)::type;
      selected_router_kernel<T, Idx><<<unsigned(p.tokens), kThreads, 0, as_cuda(s)>>>(
          a.logits.ptr<T>(), p.logits_stride, a.indices.ptr<Idx>(), p.index_stride, p.experts, p.top_k, a.scoring,
          a.renormalize, a.scale, a.weights.ptr<float>());
      RUDNN_CUDA_CHECK_LAUNCH(selected_router_kernel);
    });
  });
}

void selected_router_backward_cuda(const MoeSelectedRouterBackwardArgs& a, const SelectedRouterProblem& p,
                                   Stream s) {
  dispatch_float(a.logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(a.indices.dtype, [&](auto itag) {
      using Idx = typename decltype(itag)::type;
      selected_router_backward_kernel<T, Idx><<<unsigned(p.tokens), kThreads, 0, as_cuda(s)>>>(
          a.logits.ptr<T>(), p.logits_stride, a.indices.ptr<Idx>(), p.index_stride, a.grad_weights.data,
          a.grad_weights.dtype, p.grad_stride, p.experts, p.top_k, a.scoring, a.renormalize, a.scale,
          a.dlogits.ptr<T>(), p.dlogits_stride);
      RUDNN_CUDA_CHECK_LAUNCH(selected_router_backward_kernel);
    });
  });
}

}  // namespace rudnn::moe
