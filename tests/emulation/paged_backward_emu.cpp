// Host emulator of the paged backward CUDA kernels (tests/test_paged_backward_emulation.py builds
// and runs it). The kernels' own source (cpp/src/paged/backward_cuda.cu up to its launch code,
// extracted by the test into kernels.inc with one edit: the dynamic shared-memory pointer; its
// helpers from paged/cuda_common.cuh are compiled in as they are) runs
// on the CPU through emu_runtime.hpp, a std::thread per CUDA thread, launched in the order the
// launch code uses (zero fill or float32 workspace, the row pass, the ordered history pass, the
// store). Each case compares with the C++ CPU backend (tests/test_paged_backward.py and
// tests/test_paged_ordered.py check that against torch autograd):
//   atomic:  every gradient against backward_cpu, to a few ulps of the dtype (the emulated float32
//            atomics land in whatever order the threads run);
//   ordered: every gradient against backward_ordered_cpu to a few ulps, and bitwise identical over
//            two runs and across the options (row cache on, pruning off with compaction on), which
//            the ordered algorithm promises.
// Prints one line per case and mode; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include <cute/arch/copy_sm80.hpp>  // named by paged/cuda_common.cuh's staging (not run here)

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "paged/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "paged/cpu.cpp"
#include "paged/validate.cpp"

#include "emu_keywords.hpp"

#include "core/convert.cuh"
#include "paged/cuda_common.cuh"  // row_history, page_of, group_sum: the kernels' shared helpers

// namespace rudnn::paged::cuda { namespace emu_k { ...the kernels of backward_cuda.cu... } }
#include "kernels.inc"

#include "emu_arrays.hpp"

namespace {

using namespace rudnn;
using namespace rudnn::paged;
using emu::Array;
using emu::make;
using i64 = std::int64_t;

using emu::value_at;

// |a - b| <= tol * max(1, max |b|) with tol a few ulps of the dtype.
bool close(const Array& a, const Array& b, float& worst) {
  const i64 n = a.t.numel();
  float scale = 1.0f;
  for (i64 i = 0; i < n; ++i) scale = std::fmax(scale, std::fabs(value_at(b.t, i)));
  const float tol = a.t.dtype == DType::f32 ? 2e-5f : a.t.dtype == DType::f16 ? 4e-3f : 2e-2f;
  worst = 0.0f;
  for (i64 i = 0; i < n; ++i) {
    const float d = std::fabs(value_at(a.t, i) - value_at(b.t, i));
    if (!(d <= tol * scale)) worst = std::isnan(d) ? INFINITY : std::fmax(worst, d / scale);
  }
  return worst == 0.0f;
}

struct Case {
  const char* name;
  DType dtype;
  bool mla;
  i64 page_size;
  std::vector<i64> lengths;
  std::vector<int> queries;  // query rows per sequence, at its last positions
  i64 hq, hkv, d, dv, d2;    // MLA: hkv 1, dv = d = R, d2 = P
  bool causal, dlse, shared_prefix;
  unsigned need;             // bit g: gradient g of (dq, dk, dv) / (dq, dqp, dlatent, dkp)
  bool rerun;                // run the ordered mode twice more (bitwise equal)
};

struct Schedule64 {
  std::vector<i64> tables, lengths, seq, pos;
  i64 num_seqs = 0, width = 0, pages = 0;
  std::vector<std::int32_t> t32, l32, s32, p32;
  PagedScheduleArgs args() {
    PagedScheduleArgs a;
    a.page_size = 0;
    const i64 ts[2] = {num_seqs, width}, ls[1] = {num_seqs}, qs[1] = {i64(seq.size())};
    a.pages = pages;
    a.tables = Tensor::contiguous(tables.data(), DType::i64, Device{}, ts, 2);
    a.lengths = Tensor::contiguous(lengths.data(), DType::i64, Device{}, ls, 1);
    a.sequence_ids = Tensor::contiguous(seq.data(), DType::i64, Device{}, qs, 1);
    a.positions = Tensor::contiguous(pos.data(), DType::i64, Device{}, qs, 1);
    return a;
  }
};

// Pages dealt from a fixed permutation, spare pages nobody reads, rows interleaved.
Schedule64 schedule_of(const Case& c) {
  Schedule64 s;
  s.num_seqs = i64(c.lengths.size());
  for (i64 n : c.lengths) s.width = std::max(s.width, (n + c.page_size - 1) / c.page_size);
  for (i64 n : c.lengths) s.pages += (n + c.page_size - 1) / c.page_size;
  s.pages += 2;
  std::vector<i64> pool(std::size_t(s.pages));
  for (i64 i = 0; i < s.pages; ++i) pool[std::size_t(i)] = (i * 7 + 3) % s.pages;  // 7 is prime to the counts used
  s.tables.assign(std::size_t(s.num_seqs * std::max<i64>(s.width, 1)), 0);
  std::size_t next = 0;
  for (i64 q = 0; q < s.num_seqs; ++q)
    for (i64 j = 0; j < (c.lengths[q] + c.page_size - 1) / c.page_size; ++j)
      s.tables[std::size_t(q * s.width + j)] = pool[next++];
  if (c.shared_prefix)
    for (i64 q = 1; q < s.num_seqs; ++q)
      if (c.lengths[q] > 0) s.tables[std::size_t(q * s.width)] = s.tables[0];
  s.lengths = c.lengths;
  std::vector<std::pair<i64, i64>> rows;
  for (i64 q = 0; q < s.num_seqs; ++q)
    for (int i = 0; i < c.queries[q]; ++i) rows.push_back({q, c.lengths[q] - c.queries[q] + i});
  for (std::size_t i = 0; i < rows.size(); ++i) std::swap(rows[i], rows[(i * 5 + 1) % rows.size()]);
  for (auto [q, t] : rows) {
    s.seq.push_back(q);
    s.pos.push_back(t);
  }
  return s;
}

struct Operands {
  Schedule64 sched;
  PagedScheduleArgs host;
  PagedMetadata meta;
  Array q, k, v, q2, k2, dout, dlse;
};

void build(const Case& c, Operands& o) {
  o.sched = schedule_of(c);
  o.host = o.sched.args();
  o.host.page_size = c.page_size;
  Schedule64& s = o.sched;
  const i64 Q = i64(s.seq.size());
  s.t32.assign(std::size_t(s.num_seqs * std::max<i64>(s.width, 1)), 0);
  s.l32.assign(std::size_t(s.num_seqs), 0);
  s.s32.assign(std::size_t(Q), 0);
  s.p32.assign(std::size_t(Q), 0);
  const i64 ts[2] = {s.num_seqs, s.width}, ls[1] = {s.num_seqs}, qs[1] = {Q};
  o.meta.page_size = c.page_size;
  o.meta.tables = Tensor::contiguous(s.t32.data(), DType::i32, Device{}, ts, 2);
  o.meta.lengths = Tensor::contiguous(s.l32.data(), DType::i32, Device{}, ls, 1);
  o.meta.sequence_ids = Tensor::contiguous(s.s32.data(), DType::i32, Device{}, qs, 1);
  o.meta.positions = Tensor::contiguous(s.p32.data(), DType::i32, Device{}, qs, 1);
  paged_pack_schedule(o.host, o.meta);
  const float scale = 0.5f;
  o.q = make(c.dtype, {Q, c.hq, c.d}, 1, true, scale);
  o.k = make(c.dtype, {s.pages, c.page_size, c.hkv, c.d}, 2, true, scale);
  o.v = make(c.dtype, {s.pages, c.page_size, c.hkv, c.dv}, 3, true, scale);
  if (c.mla) {
    o.q2 = make(c.dtype, {Q, c.hq, c.d2}, 4, true, scale);
    o.k2 = make(c.dtype, {s.pages, c.page_size, 1, c.d2}, 5, true, scale);
  }
  o.dout = make(c.dtype, {Q, c.hq, c.dv}, 6, true, scale);
  if (Q > 1) std::memset(o.dout.t.ptr<unsigned char>() + dtype_size(c.dtype) * c.hq * c.dv,
                         0, std::size_t(dtype_size(c.dtype) * c.hq * c.dv));  // row 1: zero dout (pruned)
  o.dlse = make(DType::f32, {Q, c.hq}, 7, true, 0.25f);
}

// The gradient arrays of a case (empty where not in need) and the validated problem over them.
struct Grads {
  std::vector<Array> g;  // attention: dq, dk, dv; MLA: dq, dqp, dlatent, dkp
  BackwardProblem b;
  std::vector<std::uint64_t> ws_storage;
  PagedOrderedWorkspace ws;
};

void make_grads(const Case& c, Operands& o, const PagedOrderedOptions* ordered, Grads& r) {
  const int n = c.mla ? 4 : 3;
  r.g.clear();
  const Array* like_mla[4] = {&o.q, &o.q2, &o.k, &o.k2};
  const Array* like_att[3] = {&o.q, &o.k, &o.v};
  for (int i = 0; i < n; ++i) {
    const Tensor& like = (c.mla ? like_mla[i] : like_att[i])->t;
    r.g.push_back(make(c.dtype, std::vector<i64>(like.shape, like.shape + like.rank), 0, false));
    // poison: a slot the backward forgets to write shows
    std::memset(r.g.back().t.data, 0x7f, std::size_t(like.numel()) * dtype_size(c.dtype));
  }
  auto want = [&](int i) { return (c.need >> i) & 1u ? &r.g[std::size_t(i)].t : nullptr; };
  const PagedOrderedWorkspace* w = nullptr;
  if (ordered) {
    r.ws.layout = paged_ordered_layout(o.host, c.hq, *ordered);
    r.ws_storage.assign(r.ws.layout.bytes / 8 + 2, 0);
    const i64 bytes = i64(r.ws.layout.bytes);
    r.ws.buffer = Tensor::contiguous(r.ws_storage.data(), DType::u8, Device{}, &bytes, 1);
    paged_ordered_pack(o.host, r.ws.layout, r.ws.buffer);
    w = &r.ws;
  }
  if (c.mla) {
    PagedMlaBackwardArgs a;
    a.plan = o.meta;
    a.q = o.q.t, a.qp = o.q2.t, a.latent = o.k.t, a.kp = o.k2.t, a.dout = o.dout.t;
    a.scale = 0.3, a.causal = c.causal;
    a.dq = want(0), a.dqp = want(1), a.dlatent = want(2), a.dkp = want(3);
    a.dlse = c.dlse ? &o.dlse.t : nullptr;
    a.ordered = w;
    r.b = validate_mla_backward(a);
  } else {
    PagedAttentionBackwardArgs a;
    a.plan = o.meta;
    a.q = o.q.t, a.k_cache = o.k.t, a.v_cache = o.v.t, a.dout = o.dout.t;
    a.scale = 0.3, a.causal = c.causal;
    a.dq = want(0), a.dk_cache = want(1), a.dv_cache = want(2);
    a.dlse = c.dlse ? &o.dlse.t : nullptr;
    a.ordered = w;
    r.b = validate_attention_backward(a);
  }
}

// What backward_cuda's run<T> launches, through the emulator.
template <class T>
void emulate(const BackwardProblem& b) {
  using namespace rudnn::paged::cuda::emu_k;
  const Problem& p = b.fwd;
  const i64 ps = p.sched.page_size;
  struct Part {
    void* out;
    CacheStrides at;
    i64 heads, dim;
    float** hist;
    CacheStrides* hist_at;
  };
  History hist;
  std::vector<Part> parts;
  if (b.dk) parts.push_back({b.dk, b.dk_at, p.hkv, p.d, &hist.dk, &hist.dk_at});
  if (b.dv) parts.push_back({b.dv, b.dv_at, p.hkv, p.dv, &hist.dv, &hist.dv_at});
  if (b.dk2) parts.push_back({b.dk2, b.dk2_at, 1, p.d2, &hist.dk2, &hist.dk2_at});
  const bool direct = std::is_same_v<T, float>;
  std::vector<std::vector<float>> ws(parts.size());
  auto store = [&](const Part& part, const float* src, CacheStrides src_at, const std::int32_t* ids, i64 grid_pages) {
    const i64 count = grid_pages * ps * part.heads * part.dim;
    if (count == 0) return;
    emu_launch(EmuDim3{3, 1, 1}, kThreads, 1, 0, [&] {
      paged_bwd_store_kernel<T>(static_cast<T*>(part.out), part.at, src, src_at, ids, p.pages, ps, part.heads,
                                part.dim, count);
    });
  };
  auto dense = [&](const Part& part) { return CacheStrides{ps * part.heads * part.dim, part.heads * part.dim, part.dim}; };
  if (!b.ordered)
    for (std::size_t k = 0; k < parts.size(); ++k) {
      if (direct) {
        store(parts[k], nullptr, CacheStrides{}, nullptr, p.pages);
        *parts[k].hist = static_cast<float*>(parts[k].out);
        *parts[k].hist_at = parts[k].at;
      } else {
        ws[k].assign(std::size_t(p.pages * ps * parts[k].heads * parts[k].dim) + 1, 0.0f);
        *parts[k].hist = ws[k].data();
        *parts[k].hist_at = dense(parts[k]);
      }
    }
  if (p.sched.queries > 0) {
    const std::size_t smem = std::size_t(kWarps) * std::size_t(2 * p.d + 2 * p.d2 + p.dv) * sizeof(float);
    emu_launch(EmuDim3{unsigned(p.sched.queries), unsigned(p.hkv), 1}, kThreads, 1, smem,
               [&] { paged_bwd_rows_kernel<T>(b, hist); });
  }
  if (!b.ordered) {
    if (!direct)
      for (std::size_t k = 0; k < parts.size(); ++k) store(parts[k], ws[k].data(), dense(parts[k]), nullptr, p.pages);
    return;
  }
  if (!parts.empty() && b.order.listed > 0) {
    const std::size_t smem = std::size_t(kWarps) * std::size_t(p.d + p.dv + p.d2) * sizeof(float);
    emu_launch(EmuDim3{unsigned(b.order.listed), unsigned(p.hkv), 1}, kThreads, 1, smem,
               [&] { paged_bwd_history_kernel<T>(b); });
  }
  for (const Part& part : parts) store(part, nullptr, CacheStrides{}, b.order.inactive_ids, b.order.inactive);
}

void emulate_any(const BackwardProblem& b) {
  core::dispatch_float<__half, __nv_bfloat16>(b.fwd.dtype, [&](auto tag) { emulate<typename decltype(tag)::type>(b); });
}

bool compare(const Case& c, const char* mode, const Grads& ours, const Grads& ref) {
  bool ok = true;
  std::string detail;
  for (std::size_t i = 0; i < ours.g.size(); ++i) {
    if (!((c.need >> i) & 1u)) continue;
    float worst = 0.0f;
    if (!close(ours.g[i], ref.g[i], worst)) {
      ok = false;
      detail += " grad" + std::to_string(i) + " off by " + std::to_string(worst);
    }
  }
  std::printf("%s %s%s %s\n", c.name, mode, detail.c_str(), ok ? "ok" : "MISMATCH");
  return ok;
}

bool same_bits(const Case& c, const char* mode, const Grads& a, const Grads& b) {
  bool ok = true;
  for (std::size_t i = 0; i < a.g.size(); ++i)
    if ((c.need >> i) & 1u) ok = emu::same_bytes(a.g[i].t, b.g[i].t) && ok;
  std::printf("%s %s %s\n", c.name, mode, ok ? "ok" : "MISMATCH");
  return ok;
}

bool run_case(const Case& c) {
  Operands o;
  build(c, o);
  bool ok = true;
  Grads cpu, emu_atomic, cpu_ordered, emu_ordered, emu_again, emu_cached, emu_compact;
  make_grads(c, o, nullptr, cpu);
  backward_cpu(cpu.b);
  make_grads(c, o, nullptr, emu_atomic);
  emulate_any(emu_atomic.b);
  ok = compare(c, "atomic-vs-cpu", emu_atomic, cpu) && ok;

  PagedOrderedOptions plain, cached, compact;
  cached.history_row_cache = true;
  compact.query_pruning = false;
  compact.history_compaction = true;
  make_grads(c, o, &plain, cpu_ordered);
  backward_ordered_cpu(cpu_ordered.b);
  ok = compare(c, "ordered-cpu-vs-cpu", cpu_ordered, cpu) && ok;
  make_grads(c, o, &plain, emu_ordered);
  emulate_any(emu_ordered.b);
  ok = compare(c, "ordered-vs-ordered-cpu", emu_ordered, cpu_ordered) && ok;
  if (c.rerun) {
    make_grads(c, o, &plain, emu_again);
    emulate_any(emu_again.b);
    ok = same_bits(c, "ordered-bitwise-rerun", emu_again, emu_ordered) && ok;
  }
  make_grads(c, o, &cached, emu_cached);
  emulate_any(emu_cached.b);
  ok = same_bits(c, "ordered-bitwise-row-cache", emu_cached, emu_ordered) && ok;
  make_grads(c, o, &compact, emu_compact);
  emulate_any(emu_compact.b);
  ok = same_bits(c, "ordered-bitwise-unpruned-compacted", emu_compact, emu_ordered) && ok;
  return ok;
}

}  // namespace

int main() {
  const DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
  // name, dtype, mla, page_size, lengths, queries per sequence (0: a sequence nobody queries,
  // its pages inactive), Hq, Hkv, D, Dv, P, causal, dlse, shared prefix, need, rerun
  const std::vector<Case> cases = {
      {"attn_f32_gqa4_ps16_causal_shared", f32, false, 16, {19, 6, 3}, {2, 1, 0}, 4, 1, 40, 24, 0, true, false, true, 7, true},
      {"attn_bf16_mha_ps1", bf16, false, 1, {4, 3}, {1, 1}, 2, 2, 8, 8, 0, false, false, false, 7, false},
      {"attn_f16_gqa4_ps16_dlse_dk_only", f16, false, 16, {9, 5}, {1, 1}, 4, 1, 16, 40, 0, true, true, true, 2, false},
      {"attn_f32_gqa1_ps1_dq_dv", f32, false, 1, {5, 3}, {1, 1}, 2, 2, 33, 7, 0, false, true, false, 5, false},
      {"mla_f32_ps16_causal_shared", f32, true, 16, {17, 5}, {2, 1}, 2, 1, 64, 64, 16, true, false, true, 15, true},
      {"mla_bf16_ps1_dlse", bf16, true, 1, {5, 3}, {1, 1}, 2, 1, 32, 32, 8, false, true, false, 15, false},
      {"mla_f16_ps16_dlatent_dqp", f16, true, 16, {9}, {2}, 2, 1, 48, 48, 24, true, false, false, 6, false},
  };
  bool ok = true;
  for (const Case& c : cases) ok = run_case(c) && ok;
  return ok ? 0 : 1;
}
