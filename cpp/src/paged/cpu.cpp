// CPU reference backend of the paged family: plain loops over (query row, head), each key
// read from its physical page through the table, the row arithmetic (dots in double, the
// softmax-weighted sum, out 0 / lse -inf for a row without keys) shared with the dense
// attention reference (attention/cpu_rows.hpp). Split-KV runs the same chunks a CUDA split
// would and merges their float32 partial results by log-sum-exp, so that path is tested here too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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

// dq and dq2 of (row r, head h) from their float64 sums, in the gradients' dtype (those asked for).
template <class T>
void store_query_grads(const BackwardProblem& b, std::int64_t r, std::int64_t h, const std::vector<double>& dq,
                       const std::vector<double>& dq2) {
  if (b.dq) {
    T* g = static_cast<T*>(b.dq) + b.dq_at.at(r, h);
    for (std::int64_t e = 0; e < b.fwd.d; ++e) g[e] = host::from_float<T>(float(dq[e]));
  }
  if (b.dq2) {
    T* g = static_cast<T*>(b.dq2) + b.dq2_at.at(r, h);
    for (std::int64_t e = 0; e < b.fwd.d2; ++e) g[e] = host::from_float<T>(float(dq2[e]));
  }
}

// Gradients of one problem: for each (row, head) the probabilities are recomputed, then
// dS = P (dP - delta) with delta = dout . out - dlse; every sum in double, in a fixed order (rows,
// heads, positions), cache gradients accumulated per slot and written once.
template <class T>
void backward(const BackwardProblem& b) {
  const Problem& p = b.fwd;
  const T* Q = static_cast<const T*>(p.q);
  const T* K = static_cast<const T*>(p.k);
  const T* V = static_cast<const T*>(p.v);
  const T* Q2 = static_cast<const T*>(p.q2);
  const T* K2 = static_cast<const T*>(p.k2);
  const T* dO = static_cast<const T*>(p.out);
  const Schedule& sc = p.sched;
  const std::int64_t ps = sc.page_size, slots = p.pages * ps;
  // Dense accumulators [pages * page_size, heads, dim] of the cache gradients that were asked for.
  std::vector<double> dk(b.dk ? slots * p.hkv * p.d : 0), dv(b.dv ? slots * p.hkv * p.dv : 0),
      dk2(b.dk2 ? slots * p.d2 : 0);
  std::vector<float> q, q2, dout, scores;
  std::vector<double> prob, out, dq, dq2;
  for (std::int64_t r = 0; r < sc.queries; ++r) {
    std::int64_t seq = 0;
    const std::int64_t n = p.visible(r, seq);
    auto slot_of = [&](std::int64_t t) { return std::int64_t(sc.page(seq, t / ps)) * ps + t % ps; };
    auto at = [&](const CacheStrides& s, std::int64_t t, std::int64_t h) {
      return s.at(sc.page(seq, t / ps), t % ps, h);
    };
    for (std::int64_t h = 0; h < p.hq; ++h) {
      const std::int64_t hk = h / p.group;
      load_row(Q + p.q_at.at(r, h), p.d, q);
      if (p.mla) load_row(Q2 + p.q2_at.at(r, h), p.d2, q2);
      load_row(dO + p.out_at.at(r, h), p.dv, dout);
      scores.assign(n, kNegInf);
      float m = kNegInf;
      for (std::int64_t t = 0; t < n; ++t) {
        double s = dot(q, K + at(p.k_at, t, hk), p.d);
        if (p.mla) s += dot(q2, K2 + at(p.k2_at, t, 0), p.d2);
        scores[t] = float(double(p.scale) * s);
        m = std::fmax(m, scores[t]);
      }
      prob.assign(n, 0.0);
      double sum = 0.0;
      for (std::int64_t t = 0; t < n; ++t) sum += prob[t] = std::exp(double(scores[t]) - double(m));
      out.assign(p.dv, 0.0);
      for (std::int64_t t = 0; t < n; ++t) {
        prob[t] /= sum;
        const T* vt = V + at(p.v_at, t, hk);
        for (std::int64_t e = 0; e < p.dv; ++e) out[e] += prob[t] * double(host::to_float(vt[e]));
      }
      double delta = 0.0;
      for (std::int64_t e = 0; e < p.dv; ++e) delta += double(dout[e]) * out[e];
      if (b.dlse) delta -= double(b.dlse[b.dlse_at.at(r, h)]);
      dq.assign(p.d, 0.0);
      dq2.assign(p.d2, 0.0);
      for (std::int64_t t = 0; t < n; ++t) {
        const T* kt = K + at(p.k_at, t, hk);
        const double ds = prob[t] * (dot(dout, V + at(p.v_at, t, hk), p.dv) - delta) * double(p.scale);
        const std::int64_t slot = slot_of(t);
        for (std::int64_t e = 0; e < p.d; ++e) dq[e] += ds * double(host::to_float(kt[e]));
        if (b.dk)
          for (std::int64_t e = 0; e < p.d; ++e) {
            double g = ds * double(q[e]);
            if (p.mla) g += prob[t] * double(dout[e]);  // the latent is the value too
            dk[(slot * p.hkv + hk) * p.d + e] += g;
          }
        if (b.dv)
          for (std::int64_t e = 0; e < p.dv; ++e) dv[(slot * p.hkv + hk) * p.dv + e] += prob[t] * double(dout[e]);
        if (p.mla) {
          const T* k2t = K2 + at(p.k2_at, t, 0);
          for (std::int64_t e = 0; e < p.d2; ++e) dq2[e] += ds * double(host::to_float(k2t[e]));
          if (b.dk2)
            for (std::int64_t e = 0; e < p.d2; ++e) dk2[slot * p.d2 + e] += ds * double(q2[e]);
        }
      }
      store_query_grads<T>(b, r, h, dq, dq2);
    }
  }
  // Every slot of each cache gradient is written (zeros where no visible key lives).
  auto store = [&](void* base, const CacheStrides& s, const std::vector<double>& acc, std::int64_t heads,
                   std::int64_t dim) {
    if (!base) return;
    for (std::int64_t slot = 0; slot < slots; ++slot)
      for (std::int64_t h = 0; h < heads; ++h) {
        T* g = static_cast<T*>(base) + s.at(slot / ps, slot % ps, h);
        for (std::int64_t e = 0; e < dim; ++e) g[e] = host::from_float<T>(float(acc[(slot * heads + h) * dim + e]));
      }
  };
  store(b.dk, b.dk_at, dk, p.hkv, p.d);
  store(b.dv, b.dv_at, dv, p.hkv, p.dv);
  store(b.dk2, b.dk2_at, dk2, 1, p.d2);
}

// The ordered algorithm (paged.hpp), as the CUDA ordered kernels run it: a row pass writes each
// (row, head)'s lse and delta (and with the row cache P and dS of every visible position) into
// the workspace and dq; a history pass reduces every listed page slot over the page's reader
// entries in index order, one writer per slot; inactive pages get zeros. P and dS of a (row,
// position, head) come from one function (`terms`) in both passes, so the row cache changes
// where they are read from, never their bits.
template <class T>
struct OrderedRun {
  const BackwardProblem& b;
  const Problem& p;
  const Ordered& o;
  const T *Q, *K, *V, *Q2, *K2, *dO;
  std::int64_t ps;

  explicit OrderedRun(const BackwardProblem& bp)
      : b(bp), p(bp.fwd), o(bp.order), Q(static_cast<const T*>(p.q)), K(static_cast<const T*>(p.k)),
        V(static_cast<const T*>(p.v)), Q2(static_cast<const T*>(p.q2)), K2(static_cast<const T*>(p.k2)),
        dO(static_cast<const T*>(p.out)), ps(p.sched.page_size) {}

  float* stats(std::int64_t r, std::int64_t h) const { return o.stats + (r * p.hq + h) * 2; }
  std::int64_t at(const CacheStrides& s, std::int64_t seq, std::int64_t t, std::int64_t h) const {
    return s.at(p.sched.page(seq, t / ps), t % ps, h);
  }
  bool pruned(std::int64_t r, std::int64_t h) const {
    if (!o.pruning) return false;
    if (b.dlse && b.dlse[b.dlse_at.at(r, h)] != 0.0f) return false;
    const T* g = dO + p.out_at.at(r, h);
    for (std::int64_t e = 0; e < p.dv; ++e)
      if (host::to_float(g[e]) != 0.0f) return false;
    return true;
  }
  // The float32 score of (row, head) at KV position t, read from the slot at k / k2 offsets.
  float score(const std::vector<float>& q, const std::vector<float>& q2, std::int64_t k_off, std::int64_t k2_off) const {
    double s = dot(q, K + k_off, p.d);
    if (p.mla) s += dot(q2, K2 + k2_off, p.d2);
    return float(double(p.scale) * s);
  }
  // P and dS (dS = P (dP - delta) scale) of one (row, head, position) from the row's statistics.
  void terms(const std::vector<float>& q, const std::vector<float>& q2, const std::vector<float>& dout,
             const float* st, std::int64_t k_off, std::int64_t k2_off, std::int64_t v_off, float& P, float& dS) const {
    P = float(std::exp(double(score(q, q2, k_off, k2_off)) - double(st[0])));
    dS = float(double(P) * (dot(dout, V + v_off, p.dv) - double(st[1])) * double(p.scale));
  }

  void rows() const {
    std::vector<float> q, q2, dout, scores;
    std::vector<double> out, dq, dq2;
    for (std::int64_t r = 0; r < p.sched.queries; ++r) {
      std::int64_t seq = 0;
      const std::int64_t n = p.visible(r, seq);
      for (std::int64_t h = 0; h < p.hq; ++h) {
        const std::int64_t hk = h / p.group;
        float* st = stats(r, h);
        dq.assign(p.d, 0.0);
        dq2.assign(p.d2, 0.0);
        if (pruned(r, h)) {
          st[0] = std::numeric_limits<float>::infinity();  // the history pass skips the pair
          st[1] = 0.0f;
        } else {
          load_row(Q + p.q_at.at(r, h), p.d, q);
          if (p.mla) load_row(Q2 + p.q2_at.at(r, h), p.d2, q2);
          load_row(dO + p.out_at.at(r, h), p.dv, dout);
          scores.assign(n, kNegInf);
          float m = kNegInf;
          for (std::int64_t t = 0; t < n; ++t) {
            scores[t] = score(q, q2, at(p.k_at, seq, t, hk), p.mla ? at(p.k2_at, seq, t, 0) : 0);
            m = std::fmax(m, scores[t]);
          }
          double sum = 0.0;
          for (std::int64_t t = 0; t < n; ++t) sum += std::exp(double(scores[t]) - double(m));
          out.assign(p.dv, 0.0);
          for (std::int64_t t = 0; t < n; ++t) {
            const double w = std::exp(double(scores[t]) - double(m)) / sum;
            const T* vt = V + at(p.v_at, seq, t, hk);
            for (std::int64_t e = 0; e < p.dv; ++e) out[e] += w * double(host::to_float(vt[e]));
          }
          double delta = 0.0;
          for (std::int64_t e = 0; e < p.dv; ++e) delta += double(dout[e]) * out[e];
          if (b.dlse) delta -= double(b.dlse[b.dlse_at.at(r, h)]);
          st[0] = n ? float(double(m) + std::log(sum)) : kNegInf;
          st[1] = float(delta);
          for (std::int64_t t = 0; t < n; ++t) {
            float P, dS;
            const std::int64_t k_off = at(p.k_at, seq, t, hk), k2_off = p.mla ? at(p.k2_at, seq, t, 0) : 0;
            terms(q, q2, dout, st, k_off, k2_off, at(p.v_at, seq, t, hk), P, dS);
            if (o.row_cache) {
              float* c = o.cache + ((o.row_start[r] + t) * p.hq + h) * 2;
              c[0] = P;
              c[1] = dS;
            }
            for (std::int64_t e = 0; e < p.d; ++e) dq[e] += double(dS) * double(host::to_float(K[k_off + e]));
            for (std::int64_t e = 0; e < p.d2; ++e) dq2[e] += double(dS) * double(host::to_float(K2[k2_off + e]));
          }
        }
        store_query_grads<T>(b, r, h, dq, dq2);
      }
    }
  }

  void history() const {
    std::vector<float> q, q2, dout;
    std::vector<double> dk, dv, dk2;
    auto put = [&](void* base, const CacheStrides& s, std::int64_t pg, std::int64_t slot, std::int64_t h,
                   const std::vector<double>* acc, std::int64_t dim) {
      if (!base) return;
      T* g = static_cast<T*>(base) + s.at(pg, slot, h);
      for (std::int64_t e = 0; e < dim; ++e) g[e] = host::from_float<T>(acc ? float((*acc)[e]) : 0.0f);
    };
    for (std::int64_t i = 0; i < o.listed; ++i) {
      const std::int64_t pg = o.listed_ids[i];
      const std::int64_t end = p.causal && o.pruning ? o.causal_end[i] : o.page_start[i + 1];
      for (std::int64_t slot = 0; slot < ps; ++slot)
        for (std::int64_t hk = 0; hk < p.hkv; ++hk) {
          dk.assign(p.d, 0.0);
          dv.assign(p.dv, 0.0);
          dk2.assign(p.d2, 0.0);
          const std::int64_t k_off = p.k_at.at(pg, slot, hk), v_off = p.v_at.at(pg, slot, hk),
                             k2_off = p.mla ? p.k2_at.at(pg, slot, 0) : 0;
          for (std::int64_t e = o.page_start[i]; e < end; ++e) {
            const std::int64_t r = o.entry_row[e], t = std::int64_t(o.entry_index[e]) * ps + slot;
            std::int64_t seq = 0;
            if (t >= p.visible(r, seq)) continue;  // masked (causal) or past the sequence's length
            for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
              const float* st = stats(r, h);
              if (st[0] == std::numeric_limits<float>::infinity()) continue;  // pruned: no gradient
              load_row(Q + p.q_at.at(r, h), p.d, q);
              if (p.mla) load_row(Q2 + p.q2_at.at(r, h), p.d2, q2);
              load_row(dO + p.out_at.at(r, h), p.dv, dout);
              float P, dS;
              if (o.row_cache) {
                const float* c = o.cache + ((o.row_start[r] + t) * p.hq + h) * 2;
                P = c[0];
                dS = c[1];
              } else {
                terms(q, q2, dout, st, k_off, k2_off, v_off, P, dS);
              }
              for (std::int64_t x = 0; x < p.d; ++x) {
                dk[x] += double(dS) * double(q[x]);
                if (p.mla) dk[x] += double(P) * double(dout[x]);  // the latent is the value too
              }
              for (std::int64_t x = 0; x < p.dv; ++x) dv[x] += double(P) * double(dout[x]);
              for (std::int64_t x = 0; x < p.d2; ++x) dk2[x] += double(dS) * double(q2[x]);
            }
          }
          put(b.dk, b.dk_at, pg, slot, hk, &dk, p.d);
          put(b.dv, b.dv_at, pg, slot, hk, &dv, p.dv);
          if (hk == 0) put(b.dk2, b.dk2_at, pg, slot, 0, &dk2, p.d2);
        }
    }
    for (std::int64_t i = 0; i < o.inactive; ++i)
      for (std::int64_t slot = 0; slot < ps; ++slot)
        for (std::int64_t hk = 0; hk < p.hkv; ++hk) {
          const std::int64_t pg = o.inactive_ids[i];
          put(b.dk, b.dk_at, pg, slot, hk, nullptr, p.d);
          put(b.dv, b.dv_at, pg, slot, hk, nullptr, p.dv);
          if (hk == 0) put(b.dk2, b.dk2_at, pg, slot, 0, nullptr, p.d2);
        }
  }
};

}  // namespace

void backward_ordered_cpu(const BackwardProblem& b) {
  core::dispatch_float<host::f16, host::bf16>(b.fwd.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const OrderedRun<T> run(b);
    run.rows();
    if (b.dk || b.dv || b.dk2) run.history();
  });
}

void backward_cpu(const BackwardProblem& b) {
  core::dispatch_float<host::f16, host::bf16>(b.fwd.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward<T>(b);
  });
}

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
