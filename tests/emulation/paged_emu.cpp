// Host emulator of the paged family's CUDA kernels (tests/test_paged_emulation.py builds and runs
// it). The kernels' own source runs on the CPU through emu_runtime.hpp (a std::thread per CUDA
// thread, barriers for __syncthreads and the warp shuffles): cpp/src/paged/cuda_common.cuh from
// its marker line and the anonymous namespaces of cpp/src/paged/forward_cuda.cu and
// prefill_cuda.cu (with the kernels of attention/flash_sm80.cuh the prefill kernel builds on),
// extracted by the test into kernels.inc with cp.async, ldmatrix and mma.sync replaced by the
// stand-ins of emu_sm80_atoms.hpp (copies land only when waited for, so a tile read too early
// reads poison) and the shared-memory pointer.
//
// Each case builds a paged schedule (shuffled physical pages, optionally a shared prefix page),
// validates it with the C++ core's validation, runs the CPU backend (the reference here, which
// tests/test_paged.py checks against the float64 reference) and the emulated kernels on the same
// Problem, launched as forward_cuda launches them, and compares: out within one rounding of the
// dtype (the kernels sum in float32 in another order), lse within float32 rounding, append
// bitwise. The caches sit between NaN guards, so that a read outside them shows. Corrupted
// device metadata (page ids out of range, a sequence id out of range, a length past the table)
// must stay inside the caches. Prints one line per case; exits 1 on a mismatch.
#include "emu_runtime.hpp"

#include "emu_sm80_atoms.hpp"

#include "core/dispatch.hpp"
#include "core/half.hpp"
#include "paged/problem.hpp"

// The C++ core's validation and CPU backend (the reference here), compiled into the emulator.
#include "paged/cpu.cpp"
#include "paged/validate.cpp"

#include "emu_keywords.hpp"

#include "attention/cuda_common.cuh"
#include "core/convert.cuh"
#include "core/pack.cuh"  // flash_sm80.cuh's output stores

// namespace rudnn::paged::cuda { ...cuda_common.cuh... namespace emu_k { ...forward_cuda.cu's kernels... } }
#include "kernels.inc"

namespace {

using namespace rudnn;
using namespace rudnn::paged;
using i64 = std::int64_t;
namespace K = rudnn::paged::cuda::emu_k;
namespace PC = rudnn::paged::cuda;

std::uint32_t next_random(std::uint32_t& state) { return state = state * 1664525u + 1013904223u; }

// A dense array with `guard` NaN elements on either side of its data (16-byte aligned).
struct Array {
  Tensor t;
  std::vector<std::uint64_t> storage;
  i64 guard = 0;
};

Array make(DType dtype, const std::vector<i64>& shape, std::uint32_t seed, i64 guard = 0) {
  Array a;
  i64 n = 1;
  for (i64 d : shape) n *= d;
  const std::size_t elem = dtype_size(dtype);
  const i64 guard_bytes = (guard * i64(elem) + 15) / 16 * 16;
  a.storage.assign(std::size_t((2 * guard_bytes + n * i64(elem)) / 8 + 4), 0);
  auto* base = reinterpret_cast<unsigned char*>(a.storage.data());
  a.guard = guard_bytes / i64(elem);
  a.t = Tensor::contiguous(base + guard_bytes, dtype, Device{}, shape.data(), int(shape.size()));
  std::uint32_t state = seed * 2654435761u + 1;
  auto put = [&](unsigned char* at, i64 i, float v) {
    switch (dtype) {
      case DType::f32: reinterpret_cast<float*>(at)[i] = v; break;
      case DType::f16: reinterpret_cast<host::f16*>(at)[i] = host::from_float<host::f16>(v); break;
      case DType::bf16: reinterpret_cast<host::bf16*>(at)[i] = host::from_float<host::bf16>(v); break;
      case DType::i32: reinterpret_cast<std::int32_t*>(at)[i] = std::int32_t(v); break;
      default: break;
    }
  };
  for (i64 i = 0; i < n; ++i) put(base + guard_bytes, i, float(int(next_random(state) >> 24) - 128) / 64.0f);
  if (dtype != DType::i32)
    for (i64 i = 0; i < a.guard; ++i) {
      put(base, i, NAN);
      put(base + guard_bytes + n * i64(elem), i, NAN);
    }
  return a;
}

float at(const Tensor& t, i64 i) {
  switch (t.dtype) {
    case DType::f32: return t.ptr<float>()[i];
    case DType::f16: return host::to_float(t.ptr<host::f16>()[i]);
    case DType::bf16: return host::to_float(t.ptr<host::bf16>()[i]);
    default: return 0.0f;
  }
}

// One rounding of the dtype at v (the relative step of its mantissa), plus a float32 floor.
float tolerance(DType dtype, float v) {
  const float rel = dtype == DType::bf16 ? 1.0f / 128 : dtype == DType::f16 ? 1.0f / 1024 : 4e-6f;
  return rel * std::fabs(v) + (dtype == DType::f32 ? 1e-6f : rel * 1e-2f);
}

struct Case {
  const char* name;
  DType dtype;
  bool mla;
  i64 page_size, hq, hkv, d, dv, d2;
  bool causal, lse;
  int splits;
  std::vector<i64> lengths;
  std::vector<std::pair<i64, i64>> rows;  // (sequence, position); position -1: every position of it,
                                          // -n < -1: its last n positions (chunked prefill)
  bool shared_prefix = false;
  enum Corrupt { none, pages, sequence, length } corrupt = none;
};

struct Schedule_ {
  Array tables, lengths, seqs, positions;
  i64 pages = 0, width = 0, queries = 0;
};

Schedule_ build_schedule(const Case& c, std::uint32_t seed) {
  Schedule_ s;
  std::vector<std::pair<i64, i64>> rows;
  for (auto [seq, pos] : c.rows)
    if (pos >= 0)
      rows.push_back({seq, pos});
    else
      for (i64 len = c.lengths[std::size_t(seq)], t = pos == -1 ? 0 : len + pos; t < len; ++t) rows.push_back({seq, t});
  const i64 n = i64(c.lengths.size());
  std::vector<i64> counts;
  for (i64 len : c.lengths) {
    counts.push_back((len + c.page_size - 1) / c.page_size);
    s.width = std::max(s.width, counts.back());
  }
  s.width = std::max<i64>(s.width, 1);
  for (i64 k : counts) s.pages += k;
  s.pages += 2;  // spare pages no table names
  std::vector<i64> perm(std::size_t(s.pages));
  for (i64 i = 0; i < s.pages; ++i) perm[std::size_t(i)] = i;
  std::uint32_t state = seed;
  for (i64 i = s.pages - 1; i > 0; --i) std::swap(perm[std::size_t(i)], perm[next_random(state) % std::uint32_t(i + 1)]);
  s.tables = make(DType::i32, {n, s.width}, 1);
  s.lengths = make(DType::i32, {n}, 1);
  s.queries = i64(rows.size());
  s.seqs = make(DType::i32, {s.queries}, 1);
  s.positions = make(DType::i32, {s.queries}, 1);
  i64 next = 0;
  for (i64 q = 0; q < n; ++q) {
    s.lengths.t.ptr<std::int32_t>()[q] = std::int32_t(c.lengths[std::size_t(q)]);
    for (i64 j = 0; j < s.width; ++j)
      s.tables.t.ptr<std::int32_t>()[q * s.width + j] = j < counts[std::size_t(q)] ? std::int32_t(perm[std::size_t(next++)]) : 0;
  }
  if (c.shared_prefix && n >= 2 && counts[0] > 0 && counts[1] > 0)
    s.tables.t.ptr<std::int32_t>()[s.width] = s.tables.t.ptr<std::int32_t>()[0];
  for (i64 r = 0; r < s.queries; ++r) {
    s.seqs.t.ptr<std::int32_t>()[r] = std::int32_t(rows[std::size_t(r)].first);
    s.positions.t.ptr<std::int32_t>()[r] = std::int32_t(rows[std::size_t(r)].second);
  }
  return s;
}

PagedMetadata metadata(const Case& c, const Schedule_& s) {
  return PagedMetadata{c.page_size, s.tables.t, s.lengths.t, s.seqs.t, s.positions.t};
}

// prefill_cuda's launch, through the emulator: whether the prefill kernel serves p.
template <class T>
bool run_prefill(const Problem& p, float* part_out, float* part_lse) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    if (!K::prefill_serves(p)) return false;
    using Element = std::conditional_t<std::is_same_v<T, __half>, cute::half_t, cute::bfloat16_t>;
    auto launch = [&](auto head_dim) {
      constexpr int D = decltype(head_dim)::value;
      using Cfg = K::PrefillConfig<Element, D>;
      emu_launch(EmuDim3{unsigned((p.sched.queries + PC::kPrefillRows - 1) / PC::kPrefillRows), unsigned(p.hq), 1},
                 Cfg::kThreads, 1, K::prefill_smem_bytes<Cfg>(),
                 [&] { K::paged_prefill_kernel<Element, D>(p, part_out, part_lse); });
    };
    if (p.d == 64)
      launch(cute::Int<64>{});
    else
      launch(cute::Int<128>{});
    return true;
  }
}

// The rows the prefill kernel takes (cuda_common.cuh's rule on the host, on the ids the device sees).
std::vector<bool> prefill_row_mask(const Problem& p) {
  std::vector<bool> taken(std::size_t(p.sched.queries), false);
  for (i64 w0 = 0; w0 < p.sched.queries; w0 += PC::kPrefillRows) {
    int seq[PC::kPrefillRows];
    for (int i = 0; i < PC::kPrefillRows; ++i) PC::load_window_sequences(p.sched, w0, seq, i);
    for (int i = 0; i < PC::kPrefillRows && w0 + i < p.sched.queries; ++i)
      taken[std::size_t(w0 + i)] = PC::in_prefill_run(p.sched, seq, i);
  }
  return taken;
}

// The prefill kernel's extra error: like the dense flash kernels it rounds the probabilities P_t
// (at most 1) to the 16-bit dtype before O += P V (the CPU backend and the decode kernel keep them
// in float32) while the row sum l adds the unrounded ones, so out moves by at most
// |sum_t dP_t v_t| / l <= u sum_t P_t |v_t| / l <= u max|v|, u the dtype's unit roundoff.
float p_rounding_bound(DType dtype, float v_max) {
  return (dtype == DType::bf16 ? 1.0f / 256 : dtype == DType::f16 ? 1.0f / 2048 : 0.0f) * v_max;
}

// The tensor-core MLA decode kernel's launch (mla_decode_cuda), through the emulator: whether it
// serves p (it then computes every row).
template <class T>
bool run_mla(const Problem& p, float* part_out, float* part_lse) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    if (!K::mla_decode_serves(p)) return false;
    using Element = std::conditional_t<std::is_same_v<T, __half>, cute::half_t, cute::bfloat16_t>;
    using Cfg = K::MlaConfig<Element>;
    // as mla_decode_cuda: a row's head blocks adjacent in x
    emu_launch(EmuDim3{unsigned(p.sched.queries * ((p.hq + Cfg::kHeads - 1) / Cfg::kHeads)), 1, unsigned(p.splits)},
               Cfg::kThreads, 1, Cfg::kSmemBytes, [&] { K::paged_mla_decode_kernel<Element>(p, part_out, part_lse); });
    return true;
  }
}

// forward_cuda's launches, through the emulator.
template <class T>
void run_kernels(const Problem& p, float* part_out, float* part_lse) {
  if (run_mla<T>(p, part_out, part_lse)) {
    if (p.splits > 1)
      emu_launch(EmuDim3{unsigned(p.sched.queries * p.hq), 1, 1}, K::kMergeThreads, 1, 0,
                 [&] { K::merge_splits_kernel<T>(p, part_out, part_lse); });
    return;
  }
  K::DecodeShape sh = K::decode_shape<T>(p);
  sh.skip_prefill_rows = run_prefill<T>(p, part_out, part_lse);
  emu_launch(EmuDim3{unsigned(p.sched.queries), unsigned(p.hkv * sh.head_blocks), unsigned(p.splits)},
             K::kThreads, 1, sh.smem, [&] {
               if (sh.acc_groups == K::kSmallAccGroups)
                 K::paged_decode_kernel<T, K::kSmallAccGroups>(p, sh, part_out, part_lse);
               else
                 K::paged_decode_kernel<T, K::kAccGroups>(p, sh, part_out, part_lse);
             });
  if (p.splits > 1)
    emu_launch(EmuDim3{unsigned(p.sched.queries * p.hq), 1, 1}, K::kMergeThreads, 1, 0,
               [&] { K::merge_splits_kernel<T>(p, part_out, part_lse); });
}

bool run_forward(const Case& c) {
  const std::uint32_t seed = 17;
  Schedule_ s = build_schedule(c, seed);
  const i64 Q = s.queries, ps = c.page_size;
  const i64 kv_heads = c.mla ? 1 : c.hkv;
  Array q = make(c.dtype, {Q, c.hq, c.d}, 2);
  Array k = make(c.dtype, {s.pages, ps, kv_heads, c.d}, 3, 4096);
  Array v = make(c.dtype, {s.pages, ps, kv_heads, c.mla ? c.d2 : c.dv}, 4, 4096);  // MLA: kp
  Array q2 = make(c.dtype, {Q, c.hq, c.mla ? c.d2 : 1}, 5);
  const i64 dv = c.mla ? c.d : c.dv;
  Array out_cpu = make(c.dtype, {Q, c.hq, dv}, 6), out_emu = make(c.dtype, {Q, c.hq, dv}, 7);
  Array lse_cpu = make(DType::f32, {Q, c.hq}, 8), lse_emu = make(DType::f32, {Q, c.hq}, 9);
  std::vector<std::uint64_t> ws_cpu, ws_emu;
  Tensor ws_t_cpu, ws_t_emu;
  if (c.splits > 1) {
    const std::size_t bytes = paged_split_workspace_bytes(Q, c.hq, dv, c.splits);
    ws_cpu.assign(bytes / 8 + 2, 0);
    ws_emu.assign(bytes / 8 + 2, ~std::uint64_t(0));  // poisoned: every partial is written
    const i64 shape[] = {i64(bytes)};
    ws_t_cpu = Tensor::contiguous(ws_cpu.data(), DType::u8, Device{}, shape, 1);
    ws_t_emu = Tensor::contiguous(ws_emu.data(), DType::u8, Device{}, shape, 1);
  }
  auto problem = [&](const Array& out, const Array& lse, const Tensor* ws) {
    if (c.mla) {
      PagedMlaArgs a;
      a.plan = metadata(c, s);
      a.q = q.t, a.qp = q2.t, a.latent = k.t, a.kp = v.t;
      a.scale = 0.125, a.causal = c.causal, a.out = out.t, a.lse = c.lse ? &lse.t : nullptr, a.splits = c.splits;
      return validate_mla(a, ws);
    }
    PagedAttentionArgs a;
    a.plan = metadata(c, s);
    a.q = q.t, a.k_cache = k.t, a.v_cache = v.t;
    a.scale = 1.0 / std::sqrt(double(c.d)), a.causal = c.causal, a.out = out.t, a.lse = c.lse ? &lse.t : nullptr;
    a.splits = c.splits;
    return validate_attention(a, ws);
  };
  const Problem p_cpu = problem(out_cpu, lse_cpu, c.splits > 1 ? &ws_t_cpu : nullptr);
  forward_cpu(p_cpu, c.splits > 1 ? &ws_t_cpu : nullptr);
  const Problem p_emu = problem(out_emu, lse_emu, c.splits > 1 ? &ws_t_emu : nullptr);

  // Corrupted device metadata, after validation (as a device plan overwritten behind the host's back).
  std::vector<bool> lost(std::size_t(Q), false), unchecked(std::size_t(Q), false);
  auto* tables = s.tables.t.ptr<std::int32_t>();
  if (c.corrupt == Case::pages) {  // every page of sequence 0 out of range, one page of sequence 1 too
    const std::int32_t bad[] = {-7, std::int32_t(s.pages), std::int32_t(s.pages + 100000), -2147483647 - 1};
    for (i64 j = 0; j < s.width; ++j) tables[j] = bad[j % 4];
    tables[s.width] = -1;
  } else if (c.corrupt == Case::sequence) {
    s.seqs.t.ptr<std::int32_t>()[0] = std::int32_t(c.lengths.size());
    s.seqs.t.ptr<std::int32_t>()[Q - 1] = -3;
  } else if (c.corrupt == Case::length) {
    s.lengths.t.ptr<std::int32_t>()[0] = 2147483647;
  }
  for (i64 r = 0; r < Q; ++r) {
    const i64 seq = i64(s.seqs.t.ptr<std::int32_t>()[r]);
    if (c.corrupt == Case::pages) lost[std::size_t(r)] = seq == 0, unchecked[std::size_t(r)] = seq == 1;
    if (c.corrupt == Case::sequence) lost[std::size_t(r)] = seq < 0 || seq >= i64(c.lengths.size());
    if (c.corrupt == Case::length) unchecked[std::size_t(r)] = seq == 0 && !c.causal;
  }

  core::dispatch_float<__half, __nv_bfloat16>(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    float* part_out = c.splits > 1 ? ws_t_emu.ptr<float>() : nullptr;
    float* part_lse = part_out ? part_out + i64(c.splits) * Q * c.hq * dv : nullptr;
    run_kernels<T>(p_emu, part_out, part_lse);
  });

  const bool prefill = c.dtype != DType::f32 && K::prefill_serves(p_emu);
  const bool mla_tc = c.dtype != DType::f32 && K::mla_decode_serves(p_emu);  // every row on tensor cores
  std::vector<bool> by_prefill = prefill ? prefill_row_mask(p_emu) : std::vector<bool>(std::size_t(Q), false);
  std::vector<bool> rounds_p = mla_tc ? std::vector<bool>(std::size_t(Q), true) : by_prefill;
  float v_max = 0.0f;  // of the value cache's data (MLA: the latent; the guards are NaN)
  for (i64 i = 0, n = s.pages * ps * kv_heads * (c.mla ? c.d : c.dv); i < n; ++i)
    v_max = std::max(v_max, std::fabs(at(c.mla ? k.t : v.t, i)));
  bool ok = emu_hazards.load() == 0;
  int shown = 0;
  for (i64 r = 0; r < Q; ++r)
    for (i64 h = 0; h < c.hq; ++h) {
      const i64 i = r * c.hq + h;
      bool good = true;
      for (i64 e = 0; e < dv; ++e) {
        const float got = at(out_emu.t, i * dv + e), want = lost[std::size_t(r)] ? 0.0f : at(out_cpu.t, i * dv + e);
        const float tol = tolerance(c.dtype, want) + (rounds_p[std::size_t(r)] ? p_rounding_bound(c.dtype, v_max) : 0.0f);
        if (unchecked[std::size_t(r)] ? !std::isfinite(got) : !(std::fabs(got - want) <= tol))
          good = false;
        if (!good && shown++ < 4)
          std::printf("  row %lld head %lld value %lld: kernel %.8g, cpu %.8g\n", (long long)r, (long long)h,
                      (long long)e, got, want);
        if (!good) break;
      }
      if (c.lse) {
        const float got = lse_emu.t.ptr<float>()[i];
        const float want = lost[std::size_t(r)] ? -INFINITY : lse_cpu.t.ptr<float>()[i];
        const bool same = unchecked[std::size_t(r)] ? !std::isnan(got)
                          : std::isinf(want)        ? got == want
                                                    : std::fabs(got - want) <= 2e-5f * std::fabs(want) + 2e-5f;
        if (!same && shown++ < 4)
          std::printf("  row %lld head %lld lse: kernel %.8g, cpu %.8g\n", (long long)r, (long long)h, got, want);
        good = good && same;
      }
      ok = ok && good;
    }
  const K::DecodeShape sh = core::dispatch_float<__half, __nv_bfloat16>(
      c.dtype, [&](auto tag) { return K::decode_shape<typename decltype(tag)::type>(p_emu); });
  std::printf("%s queries=%lld d=%lld splits=%d tile=%d heads=%d head_blocks=%d acc_groups=%d staging=%s prefill_rows=%lld mla_tc=%d %s\n",
              c.name, (long long)Q, (long long)c.d, c.splits, sh.tile, sh.heads, sh.head_blocks, sh.acc_groups,
              sh.k_vec ? "cp.async" : "scalar", (long long)std::count(by_prefill.begin(), by_prefill.end(), true),
              int(mla_tc), ok ? "ok" : "MISMATCH");
  return ok;
}

// Append: the kernel's caches equal the CPU backend's bitwise; with a corrupted schedule, rows whose
// sequence or page is out of range write nothing and nothing outside the caches changes.
bool run_append(const Case& c) {
  Schedule_ s = build_schedule(c, 23);
  const i64 Q = s.queries, ps = c.page_size;
  Array k = make(c.dtype, {Q, c.hkv, c.d}, 11), v = make(c.dtype, {Q, c.hkv, c.dv}, 12);
  Array kc_cpu = make(c.dtype, {s.pages, ps, c.hkv, c.d}, 13, 64), vc_cpu = make(c.dtype, {s.pages, ps, c.hkv, c.dv}, 14, 64);
  Array kc_emu = make(c.dtype, {s.pages, ps, c.hkv, c.d}, 13, 64), vc_emu = make(c.dtype, {s.pages, ps, c.hkv, c.dv}, 14, 64);
  PagedAppendArgs a{metadata(c, s), k.t, v.t, kc_cpu.t, vc_cpu.t};
  append_cpu(a, validate_append(a));
  PagedAppendArgs b{metadata(c, s), k.t, v.t, kc_emu.t, vc_emu.t};
  const AppendProblem p = validate_append(b);
  if (c.corrupt != Case::none) {  // row 0: a sequence out of range; the last row: a page out of range
    // The CPU reference without those rows: undo their writes from a fresh copy of the caches.
    Array kc0 = make(c.dtype, {s.pages, ps, c.hkv, c.d}, 13, 64), vc0 = make(c.dtype, {s.pages, ps, c.hkv, c.dv}, 14, 64);
    const std::size_t elem = dtype_size(c.dtype);
    for (i64 r : {i64(0), Q - 1}) {
      const i64 seq = s.seqs.t.ptr<std::int32_t>()[r], t = s.positions.t.ptr<std::int32_t>()[r];
      const i64 page = s.tables.t.ptr<std::int32_t>()[seq * s.width + t / ps];
      const i64 ko = page * ps * c.hkv * c.d + (t % ps) * c.hkv * c.d, vo = page * ps * c.hkv * c.dv + (t % ps) * c.hkv * c.dv;
      std::memcpy(static_cast<char*>(kc_cpu.t.data) + ko * elem, static_cast<char*>(kc0.t.data) + ko * elem, c.hkv * c.d * elem);
      std::memcpy(static_cast<char*>(vc_cpu.t.data) + vo * elem, static_cast<char*>(vc0.t.data) + vo * elem, c.hkv * c.dv * elem);
    }
    s.seqs.t.ptr<std::int32_t>()[0] = -1;
    const i64 last_seq = s.seqs.t.ptr<std::int32_t>()[Q - 1], last_t = s.positions.t.ptr<std::int32_t>()[Q - 1];
    s.tables.t.ptr<std::int32_t>()[last_seq * s.width + last_t / ps] = std::int32_t(s.pages);
  }
  const i64 blocks = Q * c.hkv;
  auto launch = [&](auto bits) {
    using E = decltype(bits);
    emu_launch(EmuDim3{unsigned(blocks), 1, 1}, K::kThreads, 1, 0, [&] {
      K::paged_append_kernel<E>(p, k.t.ptr<const E>(), v.t.ptr<const E>(), kc_emu.t.ptr<E>(), vc_emu.t.ptr<E>());
    });
  };
  if (dtype_size(c.dtype) == 4)
    launch(std::uint32_t{});
  else
    launch(std::uint16_t{});
  const bool ok = kc_cpu.storage == kc_emu.storage && vc_cpu.storage == vc_emu.storage;
  std::printf("%s queries=%lld %s\n", c.name, (long long)Q, ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  using C = Case;
  const DType f32 = DType::f32, f16 = DType::f16, bf16 = DType::bf16;
  // name, dtype, mla, page_size, hq, hkv, d, dv, d2, causal, lse, splits, lengths, rows
  std::vector<Case> forward = {
      {"attn_f32_gqa1_page1_decode", f32, false, 1, 2, 2, 8, 8, 0, false, true, 1, {5, 9, 1}, {{0, 4}, {1, 8}, {2, 0}}},
      {"attn_bf16_gqa4_page16_mixed_causal", bf16, false, 16, 8, 2, 64, 64, 0, true, true, 1, {40, 21},
       {{0, 39}, {1, -1}}, true},
      {"attn_f16_gqa8_page64_split4", f16, false, 64, 8, 1, 128, 128, 0, false, true, 4, {150, 70}, {{0, 149}, {1, 69}}},
      {"attn_f32_scalar_d5_dv3_split3_causal", f32, false, 16, 8, 2, 5, 3, 0, true, true, 3, {37, 12},
       {{0, 36}, {0, 20}, {1, -1}}},
      {"attn_bf16_d40_dv24_split32_short", bf16, false, 16, 4, 1, 40, 24, 0, true, true, 32, {45, 3, 0},
       {{0, 44}, {0, 0}, {1, 2}}},
      {"attn_f32_mqa32_d16_two_head_blocks", f32, false, 16, 32, 1, 16, 8, 0, false, false, 1, {33}, {{0, 32}}},
      {"attn_f32_d1024_dv1024_gqa8", f32, false, 16, 8, 1, 1024, 1024, 0, false, true, 1, {20}, {{0, 19}}},
      {"mla_bf16_r64_p16_h20_causal", bf16, true, 16, 20, 1, 64, 64, 16, true, true, 1, {30, 17}, {{0, 29}, {1, -1}}},
      {"mla_bf16_r64_p16_h20_split2", bf16, true, 16, 20, 1, 64, 64, 16, false, true, 2, {30, 17}, {{0, 29}, {1, 5}}},
      {"mla_f32_scalar_r33_p7_page1_split5", f32, true, 1, 4, 1, 33, 33, 7, true, true, 5, {23}, {{0, 22}, {0, 3}}},
      {"mla_bf16_deepseek_r512_p64_h16_page64", bf16, true, 64, 16, 1, 512, 512, 64, false, true, 1, {100}, {{0, 99}}},
      {"corrupt_pages", bf16, false, 16, 4, 2, 32, 32, 0, false, true, 1, {40, 40, 9}, {{0, 39}, {1, 39}, {2, 8}}},
      {"corrupt_sequence_ids", f32, false, 16, 4, 2, 32, 32, 0, true, true, 2, {40, 9}, {{0, 39}, {1, 8}, {1, 3}}},
      {"corrupt_length", f32, false, 16, 4, 2, 8, 8, 0, false, true, 1, {20, 9}, {{0, 19}, {1, 8}}},
      {"attn_zero_queries", f32, false, 16, 4, 2, 8, 8, 0, false, true, 1, {20}, {}},
      // The tensor-core prefill kernel (prefill_cuda.cu) beside the decode kernel: two windows of
      // one sequence; a mixed batch whose short runs (6 rows of sequence 0 in the second window,
      // single decode rows) stay with the decode kernel; chunked prefill (the last 20 positions
      // of 150) with splits; GQA 8 without causal; then corrupted tables under prefill runs.
      {"prefill_bf16_d128_page16_causal", bf16, false, 16, 2, 1, 128, 128, 0, true, true, 1, {100}, {{0, -1}}},
      {"mixed_f16_d64_page1_gqa4_causal", f16, false, 1, 8, 2, 64, 64, 0, true, true, 1, {70, 5, 33, 12},
       {{0, -1}, {1, 4}, {2, -1}, {3, 11}}},
      {"chunked_bf16_d64_page64_split3", bf16, false, 64, 4, 4, 64, 64, 0, true, true, 3, {150, 40},
       {{0, -20}, {1, 39}}},
      {"prefill_f16_d128_gqa8_shared_prefix", f16, false, 16, 8, 1, 128, 128, 0, false, false, 1, {40, 20},
       {{0, -1}, {1, 19}}, true},
      {"corrupt_pages_prefill", bf16, false, 16, 2, 1, 64, 64, 0, false, true, 1, {40, 40, 9},
       {{0, -1}, {1, -1}, {2, 8}}},
      {"corrupt_sequence_ids_prefill_split2", f16, false, 16, 2, 2, 64, 64, 0, true, true, 2, {40, 20},
       {{0, -1}, {1, -1}}},
      {"corrupt_length_prefill", bf16, false, 16, 2, 1, 64, 64, 0, false, true, 1, {20, 30}, {{0, -1}, {1, -1}}},
      // The tensor-core MLA decode kernel (mla_decode_cuda.cu: R = 512, P = 64, f16/bf16; the
      // DeepSeek case above runs on it too): histories that are no multiple of its 32-slot tile,
      // several rows of one sequence (the last positions of a history, causal), H = 128 over two
      // 64-head blocks, H = 20 (a partial block), page sizes 1/16/64, an empty history, splits
      // (3, and 32 with empty chunks), corrupted page tables.
      {"mla_tc_bf16_h64_page64_rows_causal", bf16, true, 64, 64, 1, 512, 512, 64, true, true, 1, {100, 37},
       {{0, 99}, {0, 40}, {1, -3}}},
      {"mla_tc_f16_h128_page16_split3", f16, true, 16, 128, 1, 512, 512, 64, false, true, 3, {75, 20},
       {{0, 74}, {1, 19}}},
      {"mla_tc_bf16_h20_page1_empty", bf16, true, 1, 20, 1, 512, 512, 64, false, true, 1, {33, 0, 5},
       {{0, 32}, {2, 4}}},
      {"mla_tc_f16_h16_split32_causal", f16, true, 16, 16, 1, 512, 512, 64, true, true, 32, {45, 9},
       {{0, 44}, {1, 8}}},
      {"corrupt_pages_mla_tc", bf16, true, 16, 16, 1, 512, 512, 64, false, true, 2, {40, 40, 9},
       {{0, 39}, {1, 39}, {2, 8}}},
  };
  forward[11].corrupt = C::pages;
  forward[12].corrupt = C::sequence;
  forward[13].corrupt = C::length;
  forward[19].corrupt = C::pages;
  forward[20].corrupt = C::sequence;
  forward[21].corrupt = C::length;
  forward[26].corrupt = C::pages;
  std::vector<Case> append = {
      {"append_bf16_page16_decode", bf16, false, 16, 0, 2, 64, 32, 0, false, false, 1, {17, 33, 1}, {{0, 16}, {1, 32}, {2, 0}}},
      {"append_f32_page1_prefill_d5", f32, false, 1, 0, 3, 5, 3, 0, false, false, 1, {7}, {{0, -1}}},
      {"append_f16_corrupt", f16, false, 16, 0, 1, 8, 8, 0, false, false, 1, {17, 20}, {{0, 16}, {1, 19}, {1, 3}}},
  };
  append[2].corrupt = C::pages;
  bool all = true;
  for (const Case& c : forward)
    if (only.empty() || only == c.name) all = run_forward(c) && all;
  for (const Case& c : append)
    if (only.empty() || only == c.name) all = run_append(c) && all;
  return all ? 0 : 1;
}
