// CPU reference backend of attention: plain loops over (batch, head, query row), scores
// kept in float32, dot products and softmax sums in double, each result rounded once.
// It defines the semantics the CUDA kernels must reproduce and serves NumPy users.
#include <cmath>
#include <limits>
#include <vector>

#include "attention/cpu_rows.hpp"
#include "attention/problem.hpp"
#include "core/dispatch.hpp"
#include "core/half.hpp"

namespace rudnn::attention {

namespace {

using host::from_float;
using host::to_float;

using cpu::dot;
using cpu::kNegInf;
using cpu::load_row;

float load_float(const void* data, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[offset];
    case DType::f16: return to_float(static_cast<const host::f16*>(data)[offset]);
    case DType::bf16: return to_float(static_cast<const host::bf16*>(data)[offset]);
    case DType::boolean: return static_cast<const std::uint8_t*>(data)[offset] ? 1.0f : 0.0f;
    default: return 0.0f;
  }
}

// The logits of one query row: scores[j] (-inf where hidden) and, with softcap,
// tanh_s[j] = tanh(raw / softcap) for the backward's chain rule.
template <class T>
void row_scores(const Problem& p, const T* k_base, std::int64_t b, std::int64_t h, std::int64_t i,
                std::int64_t k0, std::int64_t len_q, std::int64_t len_k, const std::vector<float>& q,
                std::vector<float>& scores, std::vector<float>& tanh_s) {
  scores.assign(len_k, kNegInf);
  tanh_s.assign(len_k, 0.0f);
  const std::int64_t hk = h / p.group;
  for (std::int64_t j = 0; j < len_k; ++j) {
    if (!p.visible(i, j, len_q, len_k)) continue;
    const bool bool_mask = p.has_mask() && p.mask_is_bool;
    if (bool_mask && load_float(p.mask.data, p.mask.dtype, p.mask.at(b, h, i, j)) == 0.0f) continue;
    float s = float(p.scale * dot(q, k_base + p.k.at(b, hk, k0 + j), p.d));
    if (p.softcap > 0) {
      tanh_s[j] = std::tanh(s / p.softcap);
      s = p.softcap * tanh_s[j];
    }
    if (p.has_bias()) s += load_float(p.bias.data, p.bias.dtype, p.bias.at(b, h, i, j));
    if (p.has_mask() && !bool_mask) s += load_float(p.mask.data, p.mask.dtype, p.mask.at(b, h, i, j));
    scores[j] = s;
  }
}

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

}  // namespace

void forward_cpu(const AttentionForwardArgs& a, const Problem& p) {
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* Q = a.q.ptr<T>();
    const T* K = a.k.ptr<T>();
    const T* V = a.v.ptr<T>();
    T* O = a.out.ptr<T>();
    float* L = a.lse ? a.lse->ptr<float>() : nullptr;
    std::vector<float> q, scores, tanh_s;
    std::vector<double> acc;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      std::int64_t q0, len_q, k0, len_k;
      p.sequence(b, q0, len_q, k0, len_k);
      for (std::int64_t h = 0; h < p.hq; ++h) {
        const std::int64_t hk = h / p.group;
        for (std::int64_t i = 0; i < len_q; ++i) {
          load_row(Q + p.q.at(b, h, q0 + i), p.d, q);
          row_scores(p, K, b, h, i, k0, len_q, len_k, q, scores, tanh_s);
          const float lse = cpu::softmax_weighted_sum(
              scores, [&](std::int64_t j) { return V + p.v.at(b, hk, k0 + j); }, p.dv, O + p.out.at(b, h, q0 + i), acc);
          if (L) L[p.lse.at(b, h, q0 + i)] = lse;
        }
      }
    }
  });
}

void backward_cpu(const AttentionBackwardArgs& a, const BackwardProblem& bp) {
  const Problem& p = bp.fwd;
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* Q = a.q.ptr<T>();
    const T* K = a.k.ptr<T>();
    const T* V = a.v.ptr<T>();
    const T* O = a.out.ptr<T>();
    const T* dO = a.dout.ptr<T>();
    const float* L = a.lse.ptr<float>();
    std::vector<float> q, dout, scores, tanh_s;
    std::vector<double> dq(p.d);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      std::int64_t q0, len_q, k0, len_k;
      p.sequence(b, q0, len_q, k0, len_k);
      for (std::int64_t hk = 0; hk < p.hkv; ++hk) {
        // dk/dv of this key/value head sum over the query heads of its group, in a fixed order.
        std::vector<double> dk(len_k * p.d, 0.0), dv(len_k * p.dv, 0.0);
        for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
          for (std::int64_t i = 0; i < len_q; ++i) {
            load_row(Q + p.q.at(b, h, q0 + i), p.d, q);
            load_row(dO + bp.dout.at(b, h, q0 + i), p.dv, dout);
            const float lse = L[p.lse.at(b, h, q0 + i)];
            std::fill(dq.begin(), dq.end(), 0.0);
            if (lse != kNegInf) {  // a row that saw no key has no gradient
              row_scores(p, K, b, h, i, k0, len_q, len_k, q, scores, tanh_s);
              // sum_j P_ij dP_ij, less the gradient through lse
              const float delta = bp.row_delta(float(dot(dout, O + p.out.at(b, h, q0 + i), p.dv)), b, h, q0 + i);
              for (std::int64_t j = 0; j < len_k; ++j) {
                if (scores[j] == kNegInf) continue;
                const float prob = std::exp(scores[j] - lse);
                const T* vj = V + p.v.at(b, hk, k0 + j);
                const T* kj = K + p.k.at(b, hk, k0 + j);
                const float dp = float(dot(dout, vj, p.dv));
                float ds = prob * (dp - delta);
                if (p.softcap > 0) ds *= 1.0f - tanh_s[j] * tanh_s[j];
                ds *= p.scale;
                for (std::int64_t d = 0; d < p.d; ++d) {
                  dq[d] += double(ds) * to_float(kj[d]);
                  dk[j * p.d + d] += double(ds) * q[d];
                }
                for (std::int64_t d = 0; d < p.dv; ++d) dv[j * p.dv + d] += double(prob) * dout[d];
              }
            }
            T* dqi = a.dq.ptr<T>() + bp.dq.at(b, h, q0 + i);
            for (std::int64_t d = 0; d < p.d; ++d) dqi[d] = from_float<T>(float(dq[d]));
          }
        }
        for (std::int64_t j = 0; j < len_k; ++j) {
          T* dkj = a.dk.ptr<T>() + bp.dk.at(b, hk, k0 + j);
          T* dvj = a.dv.ptr<T>() + bp.dv.at(b, hk, k0 + j);
          for (std::int64_t d = 0; d < p.d; ++d) dkj[d] = from_float<T>(float(dk[j * p.d + d]));
          for (std::int64_t d = 0; d < p.dv; ++d) dvj[d] = from_float<T>(float(dv[j * p.dv + d]));
        }
      }
    }
  });
}

}  // namespace rudnn::attention
