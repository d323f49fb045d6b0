// CPU reference backend of the paged family: plain loops over (query row, head), each key
// read from its physical page through the table, the row arithmetic (dots in double, the
// softmax-weighted sum, out 0 / lse -inf for a row without keys) shared with the dense
// attention reference (attention/cpu_rows.hpp). Split-KV runs the same chunks a CUDA split
// would and merges their float32 partial results by log-sum-exp, so that path is tested here too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention/cpu_rows.hpp"
#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "paged/problem.hpp"

namespace rudnn::paged {

namespace {

using attention::cpu::dot;
using attention::cpu::kNegInf;
using attention::cpu::load_row;
using attention::cpu::softmax_weighted_sum;

template <class T>
void forward(const Problem& p, float* ws) {
  const T* Q = static_cast<const T*>(p.q);
  const T* K = static_cast<const T*>(p.k);
  const T* V = static_cast<const T*>(p.v);
  const T* Q2 = static_cast<const T*>(p.q2);
  const T* K2 = static_cast<const T*>(p.k2);
  T* O = static_cast<T*>(p.out);
  const Schedule& sc = p.sched;
  const std::int64_t ps = sc.page_size;
  // Split partials: out [splits, queries, heads, dv], then lse [splits, queries, heads].
  float* part_out = ws;
  float* part_lse = ws ? ws + std::int64_t(p.splits) * sc.queries * p.hq * p.dv : nullptr;
  std::vector<float> q, q2, scores, sub;
  std::vector<double> acc;
  for (std::int64_t r = 0; r < sc.queries; ++r) {
    std::int64_t seq = 0;
    const std::int64_t n = p.visible(r, seq);
    // Where KV position t lives, as an offset into a cache of strides `at`.
    auto slot = [&](const CacheStrides& at, std::int64_t t, std::int64_t h) {
      return at.at(sc.page(seq, t / ps), t % ps, h);
    };
    for (std::int64_t h = 0; h < p.hq; ++h) {
      const std::int64_t hk = h / p.group;
      load_row(Q + p.q_at.at(r, h), p.d, q);
      if (p.mla) load_row(Q2 + p.q2_at.at(r, h), p.d2, q2);
      scores.assign(n, kNegInf);
      for (std::int64_t t = 0; t < n; ++t) {
        double s = dot(q, K + slot(p.k_at, t, hk), p.d);
        if (p.mla) s += dot(q2, K2 + slot(p.k2_at, t, 0), p.d2);
        scores[t] = float(double(p.scale) * s);
      }
      auto value = [&](std::int64_t t) { return V + slot(p.v_at, t, hk); };
      T* o = O + p.out_at.at(r, h);
      float lse;
      if (p.splits == 1) {
        lse = softmax_weighted_sum(scores, value, p.dv, o, acc);
      } else {
        const std::int64_t chunk = (n + p.splits - 1) / p.splits;
        float m = kNegInf;
        for (int s = 0; s < p.splits; ++s) {
          const std::int64_t t0 = std::min(n, s * chunk), t1 = std::min(n, (s + 1) * chunk);
          sub.assign(scores.begin() + t0, scores.begin() + t1);
          const std::int64_t at = (std::int64_t(s) * sc.queries + r) * p.hq + h;
          part_lse[at] = softmax_weighted_sum(
              sub, [&](std::int64_t j) { return value(t0 + j); }, p.dv, part_out + at * p.dv, acc);
          m = std::fmax(m, part_lse[at]);
        }
        // Merge: out = sum_s w_s out_s / sum_s w_s with w_s = exp(lse_s - max lse).
        acc.assign(p.dv, 0.0);
        double sum = 0.0;
        for (int s = 0; s < p.splits && m != kNegInf; ++s) {
          const std::int64_t at = (std::int64_t(s) * sc.queries + r) * p.hq + h;
          if (part_lse[at] == kNegInf) continue;
          const double w = std::exp(double(part_lse[at]) - double(m));
          sum += w;
          for (std::int64_t d = 0; d < p.dv; ++d) acc[d] += w * double(part_out[at * p.dv + d]);
        }
        for (std::int64_t d = 0; d < p.dv; ++d) o[d] = host::from_float<T>(sum > 0 ? float(acc[d] / sum) : 0.0f);
        lse = m == kNegInf ? kNegInf : float(double(m) + std::log(sum));
      }
      if (p.lse) p.lse[p.lse_at.at(r, h)] = lse;
    }
  }
}

}  // namespace

void forward_cpu(const Problem& p, const Tensor* workspace) {
  float* ws = p.splits > 1 ? workspace->ptr<float>() : nullptr;
  core::dispatch_float<host::f16, host::bf16>(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward<T>(p, ws);
  });
}

void append_cpu(const PagedAppendArgs& a, const AppendProblem& p) {
  const std::size_t elem = dtype_size(p.dtype);
  const auto* K = static_cast<const unsigned char*>(a.k.data);
  const auto* V = static_cast<const unsigned char*>(a.v.data);
  auto* KC = static_cast<unsigned char*>(a.k_cache.data);
  auto* VC = static_cast<unsigned char*>(a.v_cache.data);
  const Schedule& sc = p.sched;
  for (std::int64_t r = 0; r < sc.queries; ++r) {
    const std::int64_t seq = sc.sequence(r), t = sc.position(r);
    const std::int64_t page = sc.page(seq, t / sc.page_size), slot = t % sc.page_size;
    for (std::int64_t h = 0; h < p.hkv; ++h) {
      std::memcpy(KC + p.kc_at.at(page, slot, h) * elem, K + p.k_at.at(r, h) * elem, std::size_t(p.d) * elem);
      std::memcpy(VC + p.vc_at.at(page, slot, h) * elem, V + p.v_at.at(r, h) * elem, std::size_t(p.dv) * elem);
    }
  }
}

}  // namespace rudnn::paged
