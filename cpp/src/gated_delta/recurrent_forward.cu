// Token-by-token gated delta rule on CUDA: the decode path (T = 1) and, for now, the path of
// every CUDA forward. See cuda_common.cuh for the thread layout.
#include "core/cuda_check.hpp"
#include "gated_delta/cuda_common.cuh"

namespace rudnn::gated_delta::cuda {

namespace {

// One block per (sequence, value head, 32 value columns); blockDim = (32, ceil(K / 32)).
template <class T>
__global__ void __launch_bounds__(kColsPerBlock * kMaxRowGroups)
    recurrent_forward_kernel(Params p, i64 vtiles) {
  __shared__ float s_k[kMaxK], s_q[kMaxK];                       // this token's k and scale * q
  __shared__ float s_p[kMaxRowGroups][kColsPerBlock];            // per-warp partial S^T k
  __shared__ float s_o[kMaxRowGroups][kColsPerBlock];            // per-warp partial S^T q
  const int lane = threadIdx.x, warp = threadIdx.y, groups = blockDim.y;
  i64 id = blockIdx.x;
  const i64 vt = id % vtiles;
  id /= vtiles;
  const i64 h = id % p.Hv, n = id / p.Hv, hk = h / p.group;
  const i64 j = vt * kColsPerBlock + lane;
  const bool col_ok = j < p.V;
  const int row0 = warp * kRowsPerThread;
  const int staged_row = warp * kRowsPerThread + lane;  // the row of k / q this thread stages
  const Sequence s = sequence(p, n);

  float S[kRowsPerThread];
  load_state_slice(S, p.initial, p.sinit, n, h, row0, j, p.K, p.V);

  // This thread's inputs of one token, loaded one token ahead so that their latency overlaps
  // the current token's arithmetic.
  struct Token {
    float k, q, g, beta, v;
  };
  const bool row_ok = staged_row < p.K;
  auto fetch = [&](i64 t) {
    Token x;
    x.k = row_ok ? load<T>(p.k, p.sk, s.b, hk, t, staged_row) : 0.0f;
    x.q = row_ok ? load<T>(p.q, p.sq, s.b, hk, t, staged_row) : 0.0f;
    x.g = p.g[s.b * p.sg.b + h * p.sg.h + t * p.sg.t];
    x.beta = load<T>(p.beta, p.sbeta, s.b, h, t);
    x.v = col_ok ? load<T>(p.v, p.sv, s.b, h, t, j) : 0.0f;
    return x;
  };
  Token next = s.bos < s.eos ? fetch(s.bos) : Token{};

  for (i64 t = s.bos; t < s.eos; ++t) {
    const Token cur = next;
    if (t + 1 < s.eos) next = fetch(t + 1);
    s_k[staged_row] = cur.k;
    s_q[staged_row] = p.scale * cur.q;
    const float decay = expf(cur.g), beta = cur.beta, vj = cur.v;
    __syncthreads();

    // S = exp(g) S, then the prediction S^T k of this column, summed over the warps.
    float partial = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      S[r] *= decay;
      partial += S[r] * s_k[row0 + r];
    }
    s_p[warp][lane] = partial;
    __syncthreads();
    float pred = 0.0f;
    for (int w = 0; w < groups; ++w) pred += s_p[w][lane];

    // Delta-rule write of beta (v - S^T k), then the output S^T (scale q).
    const float u = beta * (vj - pred);
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      S[r] += s_k[row0 + r] * u;
      o += S[r] * s_q[row0 + r];
    }
    s_o[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col_ok) {
      float sum = 0.0f;
      for (int w = 0; w < groups; ++w) sum += s_o[w][lane];
      static_cast<T*>(p.out)[s.b * p.sout.b + h * p.sout.h + t * p.sout.t + j] = from_float<T>(sum);
    }
  }
  store_state_slice(S, p.final_state, p.sfinal, n, h, row0, j, p.K, p.V);
}

}  // namespace

void recurrent_forward(const Params& params, DType dtype, cudaStream_t stream) {
  const i64 vtiles = value_tiles(params.V);
  const i64 blocks = params.N * params.Hv * vtiles;
  if (blocks == 0) return;
  const dim3 block(kColsPerBlock, row_groups(params.K));
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    recurrent_forward_kernel<T><<<unsigned(blocks), block, 0, stream>>>(params, vtiles);
    RUDNN_CUDA_CHECK_LAUNCH(recurrent_forward_kernel);
  });
}

}  // namespace rudnn::gated_delta::cuda
