// CPU reference backend of the gated delta rule, float32 state and float32 arithmetic:
// gated_delta_rule runs the plain token-by-token recurrence, chunk_gated_delta_rule the
// chunked (WY / UT) form with chunk_size tokens per chunk, the algorithm of the CUDA chunked
// kernel. The backward (both entry points) runs the recurrence in reverse time, recomputing
// the forward states chunk by chunk from checkpoints.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "gated_delta/problem.hpp"

namespace rudnn::gated_delta {

namespace {

using host::from_float;
using host::to_float;

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

// Token range and batch row of sequence n.
struct Sequence {
  std::int64_t b, bos, eos;
};

Sequence sequence(const Problem& p, const Tensor* cu_seqlens, std::int64_t n) {
  if (!p.varlen) return {n, 0, p.T};
  auto at = [&](std::int64_t i) -> std::int64_t {
    const std::int64_t s = cu_seqlens->strides[0];
    return p.cu_dtype == DType::i32 ? std::int64_t(cu_seqlens->ptr<std::int32_t>()[i * s])
                                    : cu_seqlens->ptr<std::int64_t>()[i * s];
  };
  return {0, at(n), at(n + 1)};
}

// Reads of one token's row of a [B, H, T, X] tensor (or element of a [B, H, T] one) as float.
template <class T>
struct SeqView {
  const T* data;
  SeqStrides s;
  const T* row(std::int64_t b, std::int64_t h, std::int64_t t) const { return data + b * s.b + h * s.h + t * s.t; }
  float at(std::int64_t b, std::int64_t h, std::int64_t t) const { return to_float(*row(b, h, t)); }
  void load(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t n, float* out, float mul = 1.0f) const {
    const T* r = row(b, h, t);
    for (std::int64_t i = 0; i < n; ++i) out[i] = to_float(r[i]) * mul;
  }
};

template <class T>
SeqView<T> view(const Tensor& t, const SeqStrides& s) { return {t.ptr<T>(), s}; }

void load_state(const Tensor* t, const StateStrides& s, std::int64_t n, std::int64_t h, std::int64_t K,
                std::int64_t V, float* S) {
  if (!t) {
    std::fill(S, S + K * V, 0.0f);
    return;
  }
  for (std::int64_t i = 0; i < K; ++i) {
    const float* row = t->ptr<float>() + n * s.n + h * s.h + i * s.k;
    std::copy(row, row + V, S + i * V);
  }
}

void store_state(const Tensor& t, const StateStrides& s, std::int64_t n, std::int64_t h, std::int64_t K,
                 std::int64_t V, const float* S) {
  for (std::int64_t i = 0; i < K; ++i)
    std::copy(S + i * V, S + (i + 1) * V, t.ptr<float>() + n * s.n + h * s.h + i * s.k);
}

// One forward step on the state S [K, V]: decay, delta-rule update. Returns nothing; `u`
// receives beta * (v - (a S)^T k), the value written into the state.
void step(float* S, std::int64_t K, std::int64_t V, float decay, float beta, const float* k, const float* v,
          float* u) {
  for (std::int64_t i = 0; i < K * V; ++i) S[i] *= decay;
  for (std::int64_t j = 0; j < V; ++j) u[j] = 0.0f;
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < V; ++j) u[j] += S[i * V + j] * k[i];
  for (std::int64_t j = 0; j < V; ++j) u[j] = beta * (v[j] - u[j]);
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < V; ++j) S[i * V + j] += k[i] * u[j];
}

template <class T>
void forward_impl(const GatedDeltaForwardArgs& a, const Problem& p) {
  const std::int64_t K = p.K, V = p.V;
  const auto q = view<T>(a.q, p.q), k = view<T>(a.k, p.k), v = view<T>(a.v, p.v), beta = view<T>(a.beta, p.beta);
  const auto g = view<float>(a.log_decay, p.g);
  std::vector<float> S(K * V), qt(K), kt(K), vt(V), u(V);
  for (std::int64_t n = 0; n < p.N; ++n) {
    const Sequence sq = sequence(p, a.cu_seqlens, n);
    for (std::int64_t h = 0; h < p.Hv; ++h) {
      const std::int64_t hk = h / p.group;
      load_state(a.initial_state, p.initial, n, h, K, V, S.data());
      for (std::int64_t t = sq.bos; t < sq.eos; ++t) {
        k.load(sq.b, hk, t, K, kt.data());
        v.load(sq.b, h, t, V, vt.data());
        step(S.data(), K, V, std::exp(g.at(sq.b, h, t)), beta.at(sq.b, h, t), kt.data(), vt.data(), u.data());
        q.load(sq.b, hk, t, K, qt.data(), p.scale);
        T* o = a.out.ptr<T>() + sq.b * p.out.b + h * p.out.h + t * p.out.t;
        for (std::int64_t j = 0; j < V; ++j) {
          float acc = 0.0f;
          for (std::int64_t i = 0; i < K; ++i) acc += S[i * V + j] * qt[i];
          o[j] = from_float<T>(acc);
        }
      }
      store_state(a.final_state, p.final_state, n, h, K, V, S.data());
    }
  }
}

// T = (I + L)^-1 for a strictly lower triangular L [C, C]. With C a multiple of 16 it runs the
// blocked scheme of the CUDA chunked kernel: 16 x 16 diagonal blocks by forward substitution,
// then the blocks at distance d below the diagonal, T_ab = -T_aa sum_{b <= m < a} L_am T_mb.
// Otherwise plain forward substitution, row by row: T_i = e_i - sum_{m < i} L_im T_m.
void invert_unit_lower(const float* L, float* T, std::int64_t C) {
  constexpr std::int64_t B = 16;
  std::fill(T, T + C * C, 0.0f);
  if (C % B != 0) {
    for (std::int64_t i = 0; i < C; ++i) {
      T[i * C + i] = 1.0f;
      for (std::int64_t m = 0; m < i; ++m)
        for (std::int64_t j = 0; j <= m; ++j) T[i * C + j] -= L[i * C + m] * T[m * C + j];
    }
    return;
  }
  for (std::int64_t base = 0; base < C; base += B)
    for (std::int64_t jj = 0; jj < B; ++jj)
      for (std::int64_t i = jj; i < B; ++i) {
        float acc = i == jj ? 1.0f : 0.0f;
        for (std::int64_t m = jj; m < i; ++m) acc -= L[(base + i) * C + base + m] * T[(base + m) * C + base + jj];
        T[(base + i) * C + base + jj] = acc;
      }
  std::vector<float> y(B * B);
  for (std::int64_t d = 1; d < C / B; ++d)
    for (std::int64_t b = 0; b + d < C / B; ++b) {
      const std::int64_t a = b + d;
      for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t c = 0; c < B; ++c) {
          float acc = 0.0f;
          for (std::int64_t m = b * B; m < a * B; ++m) acc += L[(a * B + r) * C + m] * T[m * C + b * B + c];
          y[r * B + c] = acc;
        }
      for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t c = 0; c < B; ++c) {
          float acc = 0.0f;
          for (std::int64_t m = 0; m < B; ++m) acc -= T[(a * B + r) * C + a * B + m] * y[m * B + c];
          T[(a * B + r) * C + b * B + c] = acc;
        }
    }
}

// The chunked form (chunk_gated_delta_rule), the algorithm of the CUDA chunked kernel. Within a
// chunk of C tokens with cumulative log decays G_i = g_1 + ... + g_i and start state S0:
//   L_ij = beta_i e^(G_i - G_j) k_i.k_j (j < i),  T = (I + L)^-1 (unit lower triangular),
//   W = T diag(beta e^G) K,  U = T diag(beta) V - W S0   (U row i: the value written at token i),
//   O = scale (diag(e^G) Q S0 + (e^(G_i - G_j) [j <= i] * Q K^T) U),
//   S = e^(G_last) S0 + K^T diag(e^(G_last - G)) U.
// Every decay factor is one exp of a difference of cumulative sums (<= 0: nothing overflows).
// The last chunk is padded with k = q = v = beta = g = 0 tokens, which add nothing to U, O or S.
template <class T>
void chunked_forward_impl(const GatedDeltaForwardArgs& a, const Problem& p) {
  const std::int64_t K = p.K, V = p.V, C = p.chunk_size;
  const auto q = view<T>(a.q, p.q), k = view<T>(a.k, p.k), v = view<T>(a.v, p.v), beta = view<T>(a.beta, p.beta);
  const auto g = view<float>(a.log_decay, p.g);
  std::vector<float> S(K * V), Kc(C * K), Qc(C * K), Vc(C * V), b(C), G(C), Lm(C * C), Tm(C * C), W(C * K), U(C * V),
      o(V);
  for (std::int64_t n = 0; n < p.N; ++n) {
    const Sequence sq = sequence(p, a.cu_seqlens, n);
    for (std::int64_t h = 0; h < p.Hv; ++h) {
      const std::int64_t hk = h / p.group;
      load_state(a.initial_state, p.initial, n, h, K, V, S.data());
      for (std::int64_t c0 = sq.bos; c0 < sq.eos; c0 += C) {
        const std::int64_t c = std::min(C, sq.eos - c0);  // valid tokens; the rest is padding
        std::fill(Kc.begin(), Kc.end(), 0.0f);
        std::fill(Qc.begin(), Qc.end(), 0.0f);
        std::fill(Vc.begin(), Vc.end(), 0.0f);
        float cum = 0.0f;
        for (std::int64_t i = 0; i < C; ++i) {
          b[i] = 0.0f;
          if (i < c) {
            k.load(sq.b, hk, c0 + i, K, &Kc[i * K]);
            q.load(sq.b, hk, c0 + i, K, &Qc[i * K]);
            v.load(sq.b, h, c0 + i, V, &Vc[i * V]);
            b[i] = beta.at(sq.b, h, c0 + i);
            cum += chunked_log_decay(g.at(sq.b, h, c0 + i));
          }
          G[i] = cum;
        }
        auto dot = [&](const float* x, const float* y) {
          float acc = 0.0f;
          for (std::int64_t e = 0; e < K; ++e) acc += x[e] * y[e];
          return acc;
        };
        for (std::int64_t i = 0; i < C; ++i)
          for (std::int64_t m = 0; m < C; ++m)
            Lm[i * C + m] = m < i ? b[i] * std::exp(G[i] - G[m]) * dot(&Kc[i * K], &Kc[m * K]) : 0.0f;
        invert_unit_lower(Lm.data(), Tm.data(), C);
        // W = T diag(beta e^G) K;  U = T diag(beta) V - W S0.
        for (std::int64_t i = 0; i < C; ++i) {
          for (std::int64_t e = 0; e < K; ++e) W[i * K + e] = 0.0f;
          for (std::int64_t e = 0; e < V; ++e) U[i * V + e] = 0.0f;
          for (std::int64_t j = 0; j <= i; ++j) {
            const float wk = Tm[i * C + j] * b[j] * std::exp(G[j]), wv = Tm[i * C + j] * b[j];
            for (std::int64_t e = 0; e < K; ++e) W[i * K + e] += wk * Kc[j * K + e];
            for (std::int64_t e = 0; e < V; ++e) U[i * V + e] += wv * Vc[j * V + e];
          }
          for (std::int64_t e = 0; e < K; ++e)
            for (std::int64_t f = 0; f < V; ++f) U[i * V + f] -= W[i * K + e] * S[e * V + f];
        }
        // O = scale (diag(e^G) Q S0 + (decay * Q K^T) U), for the valid rows.
        for (std::int64_t i = 0; i < c; ++i) {
          const float eg = std::exp(G[i]);
          for (std::int64_t f = 0; f < V; ++f) o[f] = 0.0f;
          for (std::int64_t e = 0; e < K; ++e)
            for (std::int64_t f = 0; f < V; ++f) o[f] += eg * Qc[i * K + e] * S[e * V + f];
          for (std::int64_t j = 0; j <= i; ++j) {
            const float qk = std::exp(G[i] - G[j]) * dot(&Qc[i * K], &Kc[j * K]);
            for (std::int64_t f = 0; f < V; ++f) o[f] += qk * U[j * V + f];
          }
          T* out = a.out.ptr<T>() + sq.b * p.out.b + h * p.out.h + (c0 + i) * p.out.t;
          for (std::int64_t f = 0; f < V; ++f) out[f] = from_float<T>(p.scale * o[f]);
        }
        // S = e^(G_last) S0 + K^T diag(e^(G_last - G)) U.
        const float last = G[C - 1];
        for (std::int64_t e = 0; e < K * V; ++e) S[e] *= std::exp(last);
        for (std::int64_t j = 0; j < C; ++j) {
          const float d = std::exp(last - G[j]);
          for (std::int64_t e = 0; e < K; ++e) {
            const float kd = Kc[j * K + e] * d;
            for (std::int64_t f = 0; f < V; ++f) S[e * V + f] += kd * U[j * V + f];
          }
        }
      }
      store_state(a.final_state, p.final_state, n, h, K, V, S.data());
    }
  }
}

// Reverse-time gradient of the recurrence. With S' = a S_{t-1} (a = exp(g_t)), p = S'^T k,
// u = beta (v - p), S_t = S' + k u^T, o = S_t^T (scale q), walking t backwards with dS = dL/dS_t:
//   dq = scale S_t do;  dS += scale q do^T;  dk = dS u + S' dp;  du = dS^T k;  dbeta = du.(v - p);
//   dv = beta du;  dp = -beta du;  dS' = dS + k dp^T;  dg = sum(dS' * S');  dS_{t-1} = a dS'.
template <class T>
void backward_impl(const GatedDeltaBackwardArgs& a, const Problem& p) {
  constexpr std::int64_t kCheckpointEvery = 64;
  const std::int64_t K = p.K, V = p.V;
  const auto q = view<T>(a.q, p.q), k = view<T>(a.k, p.k), v = view<T>(a.v, p.v), beta = view<T>(a.beta, p.beta);
  const auto g = view<float>(a.log_decay, p.g);
  const auto dout = view<T>(a.dout, p.dout);
  std::vector<float> dS(K * V), checkpoints, states((kCheckpointEvery + 1) * K * V);
  std::vector<float> dq_acc, dk_acc, qt(K), kt(K), vt(V), u(V), pv(V), du(V), dot(V);
  for (std::int64_t n = 0; n < p.N; ++n) {
    const Sequence sq = sequence(p, a.cu_seqlens, n);
    const std::int64_t len = sq.eos - sq.bos;
    const std::int64_t chunks = (len + kCheckpointEvery - 1) / kCheckpointEvery;
    checkpoints.resize(std::max<std::int64_t>(chunks, 1) * K * V);
    for (std::int64_t hk = 0; hk < p.Hk; ++hk) {
      // dq/dk of a q/k head sum over the value heads of its group.
      dq_acc.assign(len * K, 0.0f);
      dk_acc.assign(len * K, 0.0f);
      for (std::int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        // Forward pass keeping the state before every chunk.
        load_state(a.initial_state, p.initial, n, h, K, V, states.data());
        for (std::int64_t c = 0; c < chunks; ++c) {
          std::copy(states.begin(), states.begin() + K * V, checkpoints.begin() + c * K * V);
          const std::int64_t t0 = sq.bos + c * kCheckpointEvery, t1 = std::min(sq.eos, t0 + kCheckpointEvery);
          for (std::int64_t t = t0; t < t1; ++t) {
            k.load(sq.b, hk, t, K, kt.data());
            v.load(sq.b, h, t, V, vt.data());
            step(states.data(), K, V, std::exp(g.at(sq.b, h, t)), beta.at(sq.b, h, t), kt.data(), vt.data(), u.data());
          }
        }
        load_state(a.dfinal_state, p.dfinal, n, h, K, V, dS.data());
        for (std::int64_t c = chunks - 1; c >= 0; --c) {
          const std::int64_t t0 = sq.bos + c * kCheckpointEvery, t1 = std::min(sq.eos, t0 + kCheckpointEvery);
          // states[i] = S before token t0 + i.
          std::copy(checkpoints.begin() + c * K * V, checkpoints.begin() + (c + 1) * K * V, states.begin());
          for (std::int64_t t = t0; t < t1; ++t) {
            float* next = states.data() + (t - t0 + 1) * K * V;
            std::copy(next - K * V, next, next);
            k.load(sq.b, hk, t, K, kt.data());
            v.load(sq.b, h, t, V, vt.data());
            step(next, K, V, std::exp(g.at(sq.b, h, t)), beta.at(sq.b, h, t), kt.data(), vt.data(), u.data());
          }
          for (std::int64_t t = t1 - 1; t >= t0; --t) {
            const float* S_prev = states.data() + (t - t0) * K * V;
            const float* S_t = S_prev + K * V;
            const float decay = std::exp(g.at(sq.b, h, t)), b_t = beta.at(sq.b, h, t);
            q.load(sq.b, hk, t, K, qt.data(), p.scale);
            k.load(sq.b, hk, t, K, kt.data());
            v.load(sq.b, h, t, V, vt.data());
            dout.load(sq.b, h, t, V, dot.data());
            float* dq_t = dq_acc.data() + (t - sq.bos) * K;
            float* dk_t = dk_acc.data() + (t - sq.bos) * K;
            // Output: o = S_t^T (scale q).
            for (std::int64_t i = 0; i < K; ++i) {
              float acc = 0.0f;
              for (std::int64_t j = 0; j < V; ++j) acc += S_t[i * V + j] * dot[j];
              dq_t[i] += p.scale * acc;
              for (std::int64_t j = 0; j < V; ++j) dS[i * V + j] += qt[i] * dot[j];
            }
            // Recompute p = S'^T k and u = beta (v - p).
            for (std::int64_t j = 0; j < V; ++j) pv[j] = 0.0f;
            for (std::int64_t i = 0; i < K; ++i)
              for (std::int64_t j = 0; j < V; ++j) pv[j] += decay * S_prev[i * V + j] * kt[i];
            for (std::int64_t j = 0; j < V; ++j) u[j] = b_t * (vt[j] - pv[j]);
            // Update S_t = S' + k u^T.
            for (std::int64_t j = 0; j < V; ++j) du[j] = 0.0f;
            for (std::int64_t i = 0; i < K; ++i) {
              float acc = 0.0f;
              for (std::int64_t j = 0; j < V; ++j) {
                acc += dS[i * V + j] * u[j];
                du[j] += dS[i * V + j] * kt[i];
              }
              dk_t[i] += acc;
            }
            float dbeta = 0.0f;
            for (std::int64_t j = 0; j < V; ++j) dbeta += du[j] * (vt[j] - pv[j]);
            T* dv = a.dv.ptr<T>() + sq.b * p.dv.b + h * p.dv.h + t * p.dv.t;
            for (std::int64_t j = 0; j < V; ++j) dv[j] = from_float<T>(b_t * du[j]);
            a.dbeta.ptr<T>()[sq.b * p.dbeta.b + h * p.dbeta.h + t * p.dbeta.t] = from_float<T>(dbeta);
            // p = S'^T k with dp = -beta du; then the decay S' = a S_{t-1}.
            float dg = 0.0f;
            for (std::int64_t i = 0; i < K; ++i) {
              float acc = 0.0f;
              for (std::int64_t j = 0; j < V; ++j) {
                const float dp = -b_t * du[j];
                const float s_decayed = decay * S_prev[i * V + j];
                acc += s_decayed * dp;
                float& d = dS[i * V + j];
                d += kt[i] * dp;
                dg += d * s_decayed;
                d *= decay;
              }
              dk_t[i] += acc;
            }
            a.dlog_decay.ptr<float>()[sq.b * p.dg.b + h * p.dg.h + t * p.dg.t] = dg;
          }
        }
        if (a.dinitial_state) store_state(*a.dinitial_state, p.dinitial, n, h, K, V, dS.data());
      }
      for (std::int64_t t = sq.bos; t < sq.eos; ++t) {
        T* dq = a.dq.ptr<T>() + sq.b * p.dq.b + hk * p.dq.h + t * p.dq.t;
        T* dk = a.dk.ptr<T>() + sq.b * p.dk.b + hk * p.dk.h + t * p.dk.t;
        for (std::int64_t i = 0; i < K; ++i) {
          dq[i] = from_float<T>(dq_acc[(t - sq.bos) * K + i]);
          dk[i] = from_float<T>(dk_acc[(t - sq.bos) * K + i]);
        }
      }
    }
  }
}

}  // namespace

void forward_cpu(const GatedDeltaForwardArgs& a, const Problem& p) {
  dispatch(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.algo == GatedDeltaAlgo::chunked && p.kernel != GatedDeltaKernel::recurrent)
      chunked_forward_impl<T>(a, p);
    else
      forward_impl<T>(a, p);
  });
}

void backward_cpu(const GatedDeltaBackwardArgs& a, const Problem& p) {
  dispatch(p.dtype, [&](auto tag) { backward_impl<typename decltype(tag)::type>(a, p); });
}

}  // namespace rudnn::gated_delta
