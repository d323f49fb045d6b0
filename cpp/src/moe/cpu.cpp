// CPU reference backend of the MoE family: plain loops in float32 (the arithmetic the
// SPEC prescribes), values rounded to the tensor dtype exactly where the CUDA kernels
// round them. It defines the semantics the CUDA kernels reproduce and serves NumPy users.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "moe/problem.hpp"

namespace rudnn::moe {

namespace {

using host::from_float;
using host::to_float;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return core::dispatch_float<host::f16, host::bf16>(dtype, std::forward<F>(f));
}

// Row `row` of a float matrix as float32.
void load_row(const Tensor& t, std::int64_t row_stride, std::int64_t row, std::int64_t n, float* out) {
  dispatch(t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = t.ptr<T>() + row * row_stride;
    for (std::int64_t j = 0; j < n; ++j) out[j] = to_float(p[j]);
  });
}

void store_row(const Tensor& t, std::int64_t row_stride, std::int64_t row, std::int64_t n, const float* in) {
  dispatch(t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.ptr<T>() + row * row_stride;
    for (std::int64_t j = 0; j < n; ++j) p[j] = from_float<T>(in[j]);
  });
}

// Rounds v to the dtype and back (the value a kernel stores and reloads).
float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::f16: return to_float(from_float<host::f16>(v));
    case DType::bf16: return to_float(from_float<host::bf16>(v));
    default: return v;
  }
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// k rounds of "largest key not yet taken, ties to the lower index" over keys[lo..hi).
// `allowed` (optional) restricts the candidates.
void top_k_indices(const float* keys, int n, int k, const std::vector<char>* allowed, std::uint32_t* out) {
  std::vector<char> taken(n, 0);
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (taken[e] || (allowed && !(*allowed)[e])) continue;
      if (best < 0 || keys[e] > keys[best]) best = e;  // strict: the lower id wins ties
    }
    taken[best] = 1;
    out[j] = std::uint32_t(best);
  }
}

void write_bad_row(std::uint32_t* idx, float* w, int k) {
  for (int j = 0; j < k; ++j) {
    idx[j] = std::uint32_t(j);
    w[j] = kNaN;
  }
}

}  // namespace

void route_cpu(const MoeRouteArgs& a, const RouteProblem& p) {
  const int E = p.experts, k = p.top_k;
  std::vector<float> l(E), w(k);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    load_row(a.logits, p.logits_stride, t, E, l.data());
    std::uint32_t* idx = a.expert_indices.ptr<std::uint32_t>() + t * k;
    float m = kNegInf;
    bool bad = false;
    for (int e = 0; e < E; ++e) {
      bad |= std::isnan(l[e]) || l[e] == -kNegInf;
      m = std::max(m, l[e]);
    }
    if (bad || m == kNegInf) {
      write_bad_row(idx, w.data(), k);
    } else {
      // The softmax is monotone in the logits, so the top-k is taken on them exactly.
      top_k_indices(l.data(), E, k, nullptr, idx);
      float z = 0.0f;
      for (int e = 0; e < E; ++e) z += std::exp(l[e] - m);
      float selected = 0.0f;
      for (int j = 0; j < k; ++j) {
        w[j] = std::exp(l[idx[j]] - m) / z;
        selected += w[j];
      }
      if (p.renormalize)
        for (int j = 0; j < k; ++j) w[j] /= selected;
    }
    store_row(a.weights, k, t, k, w.data());
  }
}

void route_sigmoid_grouped_cpu(const MoeRouteSigmoidGroupedArgs& a, const RouteProblem& p) {
  const int E = p.experts, k = p.top_k, G = p.groups, per_group = E / G;
  std::vector<float> l(E), s(E), c(E), group_score(G), w(k);
  std::vector<std::uint32_t> kept_groups(p.selected_groups);
  std::vector<char> allowed(E);
  const float* bias = a.bias ? a.bias->ptr<float>() : nullptr;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    load_row(a.logits, p.logits_stride, t, E, l.data());
    std::uint32_t* idx = a.expert_indices.ptr<std::uint32_t>() + t * k;
    bool bad = false;
    for (int e = 0; e < E; ++e) {
      s[e] = sigmoid(l[e]);
      c[e] = s[e] + (bias ? bias[e * a.bias->strides[0]] : 0.0f);
      bad |= std::isnan(c[e]);
    }
    if (bad) {
      write_bad_row(idx, w.data(), k);
      store_row(a.weights, k, t, k, w.data());
      continue;
    }
    for (int g = 0; g < G; ++g) {
      float first = kNegInf, second = kNegInf;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (c[e] > first) {
          second = first;
          first = c[e];
        } else if (c[e] > second) {
          second = c[e];
        }
      }
      group_score[g] = p.group_top_two ? first + second : first;
    }
    top_k_indices(group_score.data(), G, p.selected_groups, nullptr, kept_groups.data());
    std::fill(allowed.begin(), allowed.end(), 0);
    for (std::uint32_t g : kept_groups)
      for (int e = int(g) * per_group; e < int(g + 1) * per_group; ++e) allowed[e] = 1;
    top_k_indices(c.data(), E, k, &allowed, idx);
    float selected = 0.0f;
    for (int j = 0; j < k; ++j) {
      w[j] = s[idx[j]];
      selected += w[j];
    }
    for (int j = 0; j < k; ++j) w[j] = (p.renormalize ? w[j] / selected : w[j]) * p.scale;
    store_row(a.weights, k, t, k, w.data());
  }
}

void dispatch_plan_cpu(const MoeDispatchPlanArgs& a, const DispatchPlanProblem& p) {
  const int E = p.experts, k = p.top_k;
  std::vector<std::int32_t> cursor(E + 1, 0);
  auto expert_of = [&](std::int64_t t, int j) -> std::int64_t {
    const std::int64_t e = read_index(a.expert_indices, t * p.index_stride + j);
    return (e >= 0 && e < E) ? e : -1;
  };
  for (std::int64_t t = 0; t < p.tokens; ++t)
    for (int j = 0; j < k; ++j)
      if (const std::int64_t e = expert_of(t, j); e >= 0) ++cursor[e + 1];
  std::int32_t* offsets = a.offsets.ptr<std::int32_t>();
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + cursor[e + 1];
  for (int e = 0; e < E; ++e) cursor[e] = offsets[e];
  std::int32_t* token_of_row = a.token_of_row.ptr<std::int32_t>();
  std::int32_t* row_of_slot = a.row_of_slot.ptr<std::int32_t>();
  for (std::int64_t r = offsets[E]; r < p.tokens * k; ++r) token_of_row[r] = -1;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      const std::int64_t e = expert_of(t, j);
      if (e < 0) {
        row_of_slot[t * k + j] = -1;
        continue;
      }
      const std::int32_t r = cursor[e]++;
      token_of_row[r] = std::int32_t(t);
      row_of_slot[t * k + j] = r;
    }
  }
}

void gather_rows_cpu(const Tensor& x, const Tensor& token_of_row, const Tensor& out, const GatherProblem& p) {
  const std::int32_t* tokens = token_of_row.ptr<std::int32_t>();
  std::vector<float> row(p.hidden);
  for (std::int64_t r = 0; r < p.rows; ++r) {
    const std::int64_t t = tokens[r];
    if (t >= 0 && t < p.tokens)
      load_row(x, p.x_stride, t, p.hidden, row.data());
    else
      std::fill(row.begin(), row.end(), 0.0f);
    store_row(out, p.out_stride, r, p.hidden, row.data());
  }
}

void combine_cpu(const MoeCombineArgs& a, const CombineProblem& p) {
  const std::int64_t H = p.hidden;
  const int k = p.top_k;
  std::vector<float> acc(H), yrow(H), w(k, 1.0f);
  const std::int32_t* rows = a.row_of_slot.ptr<std::int32_t>();
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    if (a.weights) load_row(*a.weights, p.weight_stride, t, k, w.data());
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int j = 0; j < k; ++j) {
      const std::int64_t r = rows[t * k + j];
      if (r < 0 || r >= p.rows) {
        std::fill(acc.begin(), acc.end(), kNaN);
        break;
      }
      load_row(a.y, p.y_stride, r, H, yrow.data());
      for (std::int64_t h = 0; h < H; ++h) acc[h] += w[j] * yrow[h];
    }
    store_row(a.out, p.out_stride, t, H, acc.data());
  }
}

void combine_backward_cpu(const MoeCombineBackwardArgs& a, const CombineProblem& p) {
  const std::int64_t H = p.hidden;
  const int k = p.top_k;
  std::vector<float> dout(H), yrow(H), scaled(H), zeros(H, 0.0f), w(k);
  for (std::int64_t r = 0; r < p.rows; ++r) store_row(a.dy, p.dy_stride, r, H, zeros.data());
  const std::int32_t* rows = a.row_of_slot.ptr<std::int32_t>();
  float* dweights = a.dweights.ptr<float>();
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    load_row(a.dout, p.dout_stride, t, H, dout.data());
    load_row(a.weights, p.weight_stride, t, k, w.data());
    for (int j = 0; j < k; ++j) {
      const std::int64_t r = rows[t * k + j];
      if (r < 0 || r >= p.rows) {
        dweights[t * k + j] = kNaN;
        continue;
      }
      load_row(a.y, p.y_stride, r, H, yrow.data());
      float dot = 0.0f;
      for (std::int64_t h = 0; h < H; ++h) {
        dot += dout[h] * yrow[h];
        scaled[h] = w[j] * dout[h];
      }
      dweights[t * k + j] = dot;
      store_row(a.dy, p.dy_stride, r, H, scaled.data());
    }
  }
}

namespace {

// Expert weights as float32 (they are read many times).
std::vector<float> load_all(const Tensor& t) {
  std::vector<float> out(t.numel());
  dispatch(t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = t.ptr<T>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_float(p[i]);
  });
  return out;
}

float silu(float v) { return v * sigmoid(v); }

}  // namespace

void experts_forward_cpu(const MoeExpertsForwardArgs& a, const ExpertsProblem& p) {
  const std::int64_t H = p.hidden, I = p.inter;
  const DType dt = a.x.dtype;
  const std::vector<float> gate = load_all(a.gate), up = load_all(a.up), down = load_all(a.down);
  const std::int32_t* offsets = a.offsets.ptr<std::int32_t>();
  std::vector<float> x(H), av(I), bv(I), hv(I), y(H);
  for (int e = 0; e < p.experts; ++e) {
    const Segment seg = segment_of(offsets, e, p.rows);
    const float* g = gate.data() + e * I * H;
    const float* u = up.data() + e * I * H;
    const float* d = down.data() + e * H * I;
    for (std::int64_t n = seg.begin; n < seg.end; ++n) {
      load_row(a.x, p.x_stride, n, H, x.data());
      for (std::int64_t i = 0; i < I; ++i) {
        float ga = 0.0f, ub = 0.0f;
        for (std::int64_t h = 0; h < H; ++h) {
          ga += x[h] * g[i * H + h];
          ub += x[h] * u[i * H + h];
        }
        av[i] = round_to(dt, ga);
        bv[i] = round_to(dt, ub);
        hv[i] = round_to(dt, silu(av[i]) * bv[i]);
      }
      if (a.gate_pre) {
        store_row(*a.gate_pre, I, n, I, av.data());
        store_row(*a.up_pre, I, n, I, bv.data());
      }
      for (std::int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (std::int64_t i = 0; i < I; ++i) acc += hv[i] * d[h * I + i];
        y[h] = acc;
      }
      store_row(a.y, p.y_stride, n, H, y.data());
    }
  }
}

void experts_backward_cpu(const MoeExpertsBackwardArgs& a, const ExpertsProblem& p) {
  const std::int64_t H = p.hidden, I = p.inter;
  const DType dt = a.x.dtype;
  const std::vector<float> gate = load_all(a.gate), up = load_all(a.up), down = load_all(a.down);
  const std::int32_t* offsets = a.offsets.ptr<std::int32_t>();
  float* dgate = a.dgate.ptr<float>();
  float* dup = a.dup.ptr<float>();
  float* ddown = a.ddown.ptr<float>();
  std::fill(dgate, dgate + a.dgate.numel(), 0.0f);
  std::fill(dup, dup + a.dup.numel(), 0.0f);
  std::fill(ddown, ddown + a.ddown.numel(), 0.0f);
  std::vector<float> x(H), dy(H), av(I), bv(I), hv(I), da(I), db(I), dx(H);
  for (int e = 0; e < p.experts; ++e) {
    const Segment seg = segment_of(offsets, e, p.rows);
    const float* g = gate.data() + e * I * H;
    const float* u = up.data() + e * I * H;
    const float* d = down.data() + e * H * I;
    float* dg = dgate + e * I * H;
    float* du = dup + e * I * H;
    float* dd = ddown + e * H * I;
    for (std::int64_t n = seg.begin; n < seg.end; ++n) {
      load_row(a.x, p.x_stride, n, H, x.data());
      load_row(a.dy, p.dy_stride, n, H, dy.data());
      load_row(a.gate_pre, I, n, I, av.data());
      load_row(a.up_pre, I, n, I, bv.data());
      for (std::int64_t i = 0; i < I; ++i) {
        const float sig = sigmoid(av[i]);
        hv[i] = round_to(dt, av[i] * sig * bv[i]);
        float dh = 0.0f;
        for (std::int64_t h = 0; h < H; ++h) dh += dy[h] * d[h * I + i];
        da[i] = round_to(dt, dh * bv[i] * sig * (1.0f + av[i] * (1.0f - sig)));
        db[i] = round_to(dt, dh * av[i] * sig);
      }
      for (std::int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (std::int64_t i = 0; i < I; ++i) {
          acc += da[i] * g[i * H + h] + db[i] * u[i * H + h];
          dd[h * I + i] += dy[h] * hv[i];
        }
        dx[h] = acc;
      }
      for (std::int64_t i = 0; i < I; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
          dg[i * H + h] += da[i] * x[h];
          du[i * H + h] += db[i] * x[h];
        }
      store_row(a.dx, p.y_stride, n, H, dx.data());
    }
  }
}

// Dense arrays: block b of 64 rows of gate (counted over all experts: e * I / 64 + j) is block 2 b
// of gate_up and block b of up is block 2 b + 1, each one contiguous run of bytes.
void interleave_gate_up_cpu(const Tensor& gate, const Tensor& up, const Tensor& gate_up, const InterleaveProblem& p) {
  const std::size_t block = std::size_t(kMoeGateUpBlock * p.hidden) * dtype_size(gate.dtype);
  const std::int64_t blocks = p.experts * (p.inter / kMoeGateUpBlock);  // per source, over all experts
  const char* g = static_cast<const char*>(gate.data);
  const char* u = static_cast<const char*>(up.data);
  char* out = static_cast<char*>(gate_up.data);
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::memcpy(out + std::size_t(2 * b) * block, g + std::size_t(b) * block, block);
    std::memcpy(out + std::size_t(2 * b + 1) * block, u + std::size_t(b) * block, block);
  }
}

namespace {

// Scores p of one logits row: softmax over all experts or elementwise sigmoid.
void scores(const float* l, int E, MoeScoring scoring, float* out) {
  if (scoring == MoeScoring::sigmoid) {
    for (int e = 0; e < E; ++e) out[e] = sigmoid(l[e]);
    return;
  }
  float m = kNegInf;
  for (int e = 0; e < E; ++e) m = std::max(m, l[e]);
  if (std::isnan(m)) m = kNaN;
  float z = 0.0f;
  for (int e = 0; e < E; ++e) z += std::exp(l[e] - m);
  for (int e = 0; e < E; ++e) out[e] = std::exp(l[e] - m) / z;
}

// The row's indices, or false when one is outside [0, E).
bool load_indices(const Tensor& t, std::int64_t stride, std::int64_t row, int k, int E, int* out) {
  bool ok = true;
  for (int j = 0; j < k; ++j) {
    const std::int64_t e = read_index(t, row * stride + j);
    ok &= e >= 0 && e < E;
    out[j] = int(e);
  }
  return ok;
}

}  // namespace

void selected_router_cpu(const MoeSelectedRouterArgs& a, const SelectedRouterProblem& p) {
  const int E = p.experts, k = p.top_k;
  std::vector<float> l(E), s(E);
  std::vector<int> idx(k);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    float* w = a.weights.ptr<float>() + t * k;
    if (!load_indices(a.indices, p.index_stride, t, k, E, idx.data())) {
      std::fill(w, w + k, kNaN);
      continue;
    }
    load_row(a.logits, p.logits_stride, t, E, l.data());
    scores(l.data(), E, a.scoring, s.data());
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += s[idx[j]];
    for (int j = 0; j < k; ++j) w[j] = (a.renormalize ? s[idx[j]] / sum : s[idx[j]]) * a.scale;
  }
}

void selected_router_backward_cpu(const MoeSelectedRouterBackwardArgs& a, const SelectedRouterProblem& p) {
  const int E = p.experts, k = p.top_k;
  std::vector<float> l(E), s(E), gp(E), g(k), dl(E);
  std::vector<int> idx(k);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    if (!load_indices(a.indices, p.index_stride, t, k, E, idx.data())) {
      std::fill(dl.begin(), dl.end(), kNaN);
      store_row(a.dlogits, p.dlogits_stride, t, E, dl.data());
      continue;
    }
    load_row(a.logits, p.logits_stride, t, E, l.data());
    load_row(a.grad_weights, p.grad_stride, t, k, g.data());
    scores(l.data(), E, a.scoring, s.data());
    // d(weights_j)/d(p_m): scale * (delta_jm - q_j) / S with renormalization (q = p / S).
    float sum = 0.0f, gq = 0.0f;
    for (int j = 0; j < k; ++j) sum += s[idx[j]];
    // q_j = p_j / S as the forward forms it (k = 1: q = 1 exactly, so g - gq is exactly 0).
    for (int j = 0; j < k; ++j) gq += g[j] * (s[idx[j]] / sum);
    std::fill(gp.begin(), gp.end(), 0.0f);
    for (int j = 0; j < k; ++j)
      gp[idx[j]] += a.renormalize ? a.scale * (g[j] - gq) / sum : a.scale * g[j];
    if (a.scoring == MoeScoring::softmax) {
      float dot = 0.0f;
      for (int e = 0; e < E; ++e) dot += gp[e] * s[e];
      for (int e = 0; e < E; ++e) dl[e] = s[e] * (gp[e] - dot);
    } else {
      for (int e = 0; e < E; ++e) dl[e] = gp[e] * s[e] * (1.0f - s[e]);
    }
    store_row(a.dlogits, p.dlogits_stride, t, E, dl.data());
  }
}

}  // namespace rudnn::moe
