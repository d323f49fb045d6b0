// Reverse-time gradient of the gated delta rule on CUDA (both entry points for now).
//
// A block owns the same [K, 32] column slice of one state as the forward kernel. It runs the
// forward once, keeping the state before every kBackwardChunk tokens (checkpoints), then walks
// the chunks backwards: recompute the chunk's states from its checkpoint into scratch, then
// walk its tokens backwards with dS = dL/dS_t in registers. With S' = a S_{t-1}, p = S'^T k,
// u = beta (v - p):
//   dq = scale S_t do;  dS += scale q do^T;  du = dS^T k;  dv = beta du;  dbeta = du.(v - p);
//   dp = -beta du;  dk = dS u + S' dp;  dS' = dS + k dp^T;  dg = sum(dS' * S');  dS_{t-1} = a dS'.
// dv is complete per column. dq, dk (sums over the value columns) and dbeta, dg are written
// as per-column-tile partials and summed in a fixed order by a second kernel, which also
// sums dq/dk over the value heads of a q/k head: no atomics, bitwise reproducible.
#include <algorithm>

#include "core/cuda_check.hpp"
#include "gated_delta/cuda_common.cuh"

namespace rudnn::gated_delta::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// One step of transpose_reduce: lanes that differ in bit `Half` swap halves of their first
// 2 * Half values and add, so each keeps Half partial sums (compile-time indices only, so the
// array stays in registers).
template <int Half>
__device__ __forceinline__ void transpose_reduce_step(float (&a)[kRowsPerThread], int lane) {
  const bool upper = lane & Half;
#pragma unroll
  for (int i = 0; i < Half; ++i) {
    const float lo = a[i], hi = a[i + Half];
    const float send = upper ? lo : hi;
    const float keep = upper ? hi : lo;
    a[i] = keep + __shfl_xor_sync(kFullMask, send, Half);
  }
  if constexpr (Half > 1) transpose_reduce_step<Half / 2>(a, lane);
}

// In: a[r] of every lane. Out: the sum over the warp's lanes of a[lane] (a transpose-reduce:
// each of the 5 steps exchanges half of the remaining values, 31 shuffles for 32 sums).
__device__ __forceinline__ float transpose_reduce(float (&a)[kRowsPerThread], int lane) {
  transpose_reduce_step<kRowsPerThread / 2>(a, lane);
  return a[0];
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int step = 0; step < 5; ++step) x += __shfl_xor_sync(kFullMask, x, 16 >> step);
  return x;
}

struct Shared {
  float k[kMaxK], q[kMaxK];
  float part[kMaxRowGroups][kColsPerBlock];
  float resid[kBackwardChunk][kColsPerBlock];  // v - S'^T k of each token of the chunk
  float dg[kMaxRowGroups];
};

struct Slice {
  i64 n, h, hk, vt, j;
  int lane, warp, groups, row0;
  bool col_ok;
  Sequence s;
};

// One forward step of the slice's state. When resid is given, warp 0 stores v - S'^T k there.
template <class T>
__device__ __forceinline__ void advance(float (&S)[kRowsPerThread], const Params& p, const Slice& c, Shared& sh,
                                        i64 t, float* resid) {
  const int row = c.row0 + c.lane;
  sh.k[row] = row < p.K ? load<T>(p.k, p.sk, c.s.b, c.hk, t, row) : 0.0f;
  const float decay = expf(p.g[c.s.b * p.sg.b + c.h * p.sg.h + t * p.sg.t]);
  const float beta = load<T>(p.beta, p.sbeta, c.s.b, c.h, t);
  const float vj = c.col_ok ? load<T>(p.v, p.sv, c.s.b, c.h, t, c.j) : 0.0f;
  __syncthreads();
  float partial = 0.0f;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    S[r] *= decay;
    partial += S[r] * sh.k[c.row0 + r];
  }
  sh.part[c.warp][c.lane] = partial;
  __syncthreads();
  float pred = 0.0f;
  for (int w = 0; w < c.groups; ++w) pred += sh.part[w][c.lane];
  const float u = beta * (vj - pred);
  if (resid && c.warp == 0) resid[c.lane] = vj - pred;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) S[r] += sh.k[c.row0 + r] * u;
  __syncthreads();  // sh.k and sh.part are rewritten by the next step
}

// This thread's 32 values of a state kept in global scratch (read back by the same thread).
__device__ __forceinline__ void put(float* slot, const float (&S)[kRowsPerThread], const Slice& c) {
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) slot[(c.row0 + r) * kColsPerBlock + c.lane] = S[r];
}
__device__ __forceinline__ void get(const float* slot, float (&S)[kRowsPerThread], const Slice& c) {
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) S[r] = slot[(c.row0 + r) * kColsPerBlock + c.lane];
}

template <class T>
__global__ void __launch_bounds__(kColsPerBlock * kMaxRowGroups)
    recurrent_backward_kernel(Params p, BackwardWorkspace ws, i64 vtiles) {
  __shared__ Shared sh;
  Slice c;
  c.lane = threadIdx.x;
  c.warp = threadIdx.y;
  c.groups = blockDim.y;
  c.row0 = c.warp * kRowsPerThread;
  const i64 block = blockIdx.x;
  c.vt = block % vtiles;
  c.h = (block / vtiles) % p.Hv;
  c.n = block / vtiles / p.Hv;
  c.hk = c.h / p.group;
  c.j = c.vt * kColsPerBlock + c.lane;
  c.col_ok = c.j < p.V;
  c.s = sequence(p, c.n);
  const i64 len = c.s.eos - c.s.bos;
  const i64 chunks = (len + kBackwardChunk - 1) / kBackwardChunk;
  const i64 slot_floats = i64(c.groups) * kRowsPerThread * kColsPerBlock;
  // Checkpoint slots: without varlen, ceil(T / C) per batch row; with varlen, sequence n starts
  // at slot bos / C + n, which never overlaps the previous sequence's slots.
  const i64 first_slot = p.cu_seqlens ? c.s.bos / kBackwardChunk + c.n : c.n * ws.chunks_per_batch;
  float* checkpoints = ws.checkpoints + ((c.h * vtiles + c.vt) * ws.slots + first_slot) * slot_floats;
  float* states = ws.chunk_states + block * (kBackwardChunk + 1) * slot_floats;

  float S[kRowsPerThread];
  load_state_slice(S, p.initial, p.sinit, c.n, c.h, c.row0, c.j, p.K, p.V);
  for (i64 ch = 0; ch < chunks; ++ch) {
    put(checkpoints + ch * slot_floats, S, c);
    const i64 t0 = c.s.bos + ch * kBackwardChunk, t1 = min(c.s.eos, t0 + kBackwardChunk);
    for (i64 t = t0; t < t1; ++t) advance<T>(S, p, c, sh, t, nullptr);
  }

  float dS[kRowsPerThread];
  load_state_slice(dS, p.dfinal, p.sdfinal, c.n, c.h, c.row0, c.j, p.K, p.V);
  const int row = c.row0 + c.lane;  // the row whose dq / dk this thread writes
  for (i64 ch = chunks - 1; ch >= 0; --ch) {
    const i64 t0 = c.s.bos + ch * kBackwardChunk, t1 = min(c.s.eos, t0 + kBackwardChunk);
    get(checkpoints + ch * slot_floats, S, c);
    put(states, S, c);
    for (i64 t = t0; t < t1; ++t) {
      advance<T>(S, p, c, sh, t, sh.resid[t - t0]);
      put(states + (t - t0 + 1) * slot_floats, S, c);
    }
    for (i64 t = t1 - 1; t >= t0; --t) {
      const i64 i = t - t0;
      sh.k[row] = row < p.K ? load<T>(p.k, p.sk, c.s.b, c.hk, t, row) : 0.0f;
      sh.q[row] = row < p.K ? p.scale * load<T>(p.q, p.sq, c.s.b, c.hk, t, row) : 0.0f;
      const float decay = expf(p.g[c.s.b * p.sg.b + c.h * p.sg.h + t * p.sg.t]);
      const float beta = load<T>(p.beta, p.sbeta, c.s.b, c.h, t);
      const float dout = c.col_ok ? load<T>(p.dout, p.sdout, c.s.b, c.h, t, c.j) : 0.0f;
      const i64 part_row = ((c.vt * p.B + c.s.b) * p.Hv + c.h) * p.T + t;  // [vtiles, B, Hv, T]
      __syncthreads();
      const float resid = sh.resid[i][c.lane];
      const float u = beta * resid;

      // Output o = S_t^T (scale q): dq and the dS contribution.
      float a[kRowsPerThread];
      get(states + (i + 1) * slot_floats, a, c);
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) a[r] *= dout;
      const float dq = p.scale * transpose_reduce(a, c.lane);
      if (row < p.K) ws.dq_part[part_row * p.K + row] = dq;
      float partial = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        dS[r] += sh.q[c.row0 + r] * dout;
        partial += dS[r] * sh.k[c.row0 + r];
      }
      sh.part[c.warp][c.lane] = partial;
      __syncthreads();
      float du = 0.0f;
      for (int w = 0; w < c.groups; ++w) du += sh.part[w][c.lane];
      if (c.warp == 0) {
        if (c.col_ok) static_cast<T*>(p.out)[c.s.b * p.sout.b + c.h * p.sout.h + t * p.sout.t + c.j] =
            from_float<T>(beta * du);
        const float dbeta = warp_sum(c.col_ok ? du * resid : 0.0f);
        if (c.lane == 0) ws.dbeta_part[part_row] = dbeta;
      }
      const float dp = -beta * du;

      // Write S_t = S' + k u^T and read p = S'^T k: dk, then dS' and dg, then through the decay.
      float prev[kRowsPerThread];
      get(states + i * slot_floats, prev, c);
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        prev[r] *= decay;  // S'
        a[r] = dS[r] * u + prev[r] * dp;
      }
      const float dk = transpose_reduce(a, c.lane);
      if (row < p.K) ws.dk_part[part_row * p.K + row] = dk;
      float dg = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        dS[r] += sh.k[c.row0 + r] * dp;
        dg += dS[r] * prev[r];
        dS[r] *= decay;
      }
      dg = warp_sum(dg);
      if (c.lane == 0) sh.dg[c.warp] = dg;
      __syncthreads();
      if (c.warp == 0 && c.lane == 0) {
        float sum = 0.0f;
        for (int w = 0; w < c.groups; ++w) sum += sh.dg[w];
        ws.dg_part[part_row] = sum;
      }
    }
  }
  store_state_slice(dS, p.final_state, p.sfinal, c.n, c.h, c.row0, c.j, p.K, p.V);
}

// dq, dk: sum over the value heads of each q/k head and over column tiles; dbeta, dlog_decay:
// sum over column tiles. Fixed order. One thread per output element.
template <class T>
__global__ void reduce_partials_kernel(Params p, BackwardWorkspace ws, i64 vtiles, T* dq, SeqStrides sdq, T* dk,
                                       SeqStrides sdk, T* dbeta, SeqStrides sdbeta, float* dg, SeqStrides sdg) {
  const i64 qk_elems = p.B * p.Hk * p.T * p.K, head_elems = p.B * p.Hv * p.T;
  const i64 stride = i64(gridDim.x) * blockDim.x;
  for (i64 e = i64(blockIdx.x) * blockDim.x + threadIdx.x; e < qk_elems; e += stride) {
    const i64 i = e % p.K, t = (e / p.K) % p.T, hk = (e / p.K / p.T) % p.Hk, b = e / p.K / p.T / p.Hk;
    float sq = 0.0f, sk = 0.0f;
    for (i64 vt = 0; vt < vtiles; ++vt)
      for (i64 h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        const i64 at = (((vt * p.B + b) * p.Hv + h) * p.T + t) * p.K + i;
        sq += ws.dq_part[at];
        sk += ws.dk_part[at];
      }
    dq[b * sdq.b + hk * sdq.h + t * sdq.t + i] = from_float<T>(sq);
    dk[b * sdk.b + hk * sdk.h + t * sdk.t + i] = from_float<T>(sk);
  }
  for (i64 e = i64(blockIdx.x) * blockDim.x + threadIdx.x; e < head_elems; e += stride) {
    const i64 t = e % p.T, h = (e / p.T) % p.Hv, b = e / p.T / p.Hv;
    float sb = 0.0f, sg = 0.0f;
    for (i64 vt = 0; vt < vtiles; ++vt) {
      sb += ws.dbeta_part[vt * head_elems + e];
      sg += ws.dg_part[vt * head_elems + e];
    }
    dbeta[b * sdbeta.b + h * sdbeta.h + t * sdbeta.t] = from_float<T>(sb);
    dg[b * sdg.b + h * sdg.h + t * sdg.t] = sg;
  }
}

}  // namespace

BackwardLayout backward_layout(const Problem& p) {
  BackwardLayout l{};
  const i64 vtiles = value_tiles(p.V);
  const i64 slot_floats = i64(row_groups(p.K)) * kRowsPerThread * kColsPerBlock;
  l.chunks_per_batch = (p.T + kBackwardChunk - 1) / kBackwardChunk;
  l.slots = p.varlen ? p.T / kBackwardChunk + p.N : p.N * l.chunks_per_batch;
  l.checkpoints = p.Hv * vtiles * l.slots * slot_floats;
  l.chunk_states = p.N * p.Hv * vtiles * (kBackwardChunk + 1) * slot_floats;
  l.dq_part = l.dk_part = vtiles * p.B * p.Hv * p.T * p.K;
  l.dbeta_part = l.dg_part = vtiles * p.B * p.Hv * p.T;
  return l;
}

void recurrent_backward(const Params& params, const BackwardWorkspace& ws, DType dtype, void* dq, SeqStrides sdq,
                        void* dk, SeqStrides sdk, void* dbeta, SeqStrides sdbeta, float* dg, SeqStrides sdg,
                        cudaStream_t stream) {
  const i64 vtiles = value_tiles(params.V);
  const i64 blocks = params.N * params.Hv * vtiles;
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (blocks > 0) {
      const dim3 block(kColsPerBlock, row_groups(params.K));
      recurrent_backward_kernel<T><<<unsigned(blocks), block, 0, stream>>>(params, ws, vtiles);
      RUDNN_CUDA_CHECK_LAUNCH(recurrent_backward_kernel);
    }
    const i64 elems = std::max(params.B * params.Hk * params.T * params.K, params.B * params.Hv * params.T);
    if (elems > 0) {
      const int threads = 256;
      const i64 grid = std::min<i64>((elems + threads - 1) / threads, 65536);
      reduce_partials_kernel<T><<<unsigned(grid), threads, 0, stream>>>(
          params, ws, vtiles, static_cast<T*>(dq), sdq, static_cast<T*>(dk), sdk, static_cast<T*>(dbeta), sdbeta, dg,
          sdg);
      RUDNN_CUDA_CHECK_LAUNCH(reduce_partials_kernel);
    }
  });
}

}  // namespace rudnn::gated_delta::cuda
