// XLA FFI handlers of the paged family (rudnn.jax.paged), on the "cpu" platform (this release
// has the CPU backend only). The plan's four int32 metadata arrays come first.
//
// Targets (attributes: page_size, scale, causal, splits):
//   rudnn_paged_attention (tables, lengths, sequence_ids, positions, q, k_cache, v_cache) -> (out, lse)
//   rudnn_paged_mla       (tables, lengths, sequence_ids, positions, q, qp, latent, kp) -> (out, lse)
//   rudnn_paged_append    (tables, lengths, sequence_ids, positions, k, v, k_cache, v_cache) -> (k_cache, v_cache)
//                         (attribute page_size only; the caches alias the results: donation-friendly)
//   rudnn_paged_attention_backward (tables, ..., q, k_cache, v_cache, dout, dlse) -> (dq, dk_cache, dv_cache)
//   rudnn_paged_mla_backward       (tables, ..., q, qp, latent, kp, dout, dlse) -> (dq, dqp, dlatent, dkp)
//                         (attributes page_size, scale, causal)
//   rudnn_paged_attention_backward_ordered / rudnn_paged_mla_backward_ordered: the same with the
//                         OrderedBackwardWorkspace's index (uint8) after dlse and its layout as
//                         attributes (query_pruning, history_row_cache, history_compaction, queries,
//                         heads, pages, listed, inactive, readers, cached); the handler copies the
//                         index into memory of its own, where the backward writes its scratch
// The checks run as XLA runs the call (rudnn.jax raises them as rudnn errors when eager).
#include <cstdint>
#include <cstring>
#include <vector>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/paged.hpp"

namespace rudnn::jax_ffi {

namespace {

PagedMetadata metadata(const Place& place, std::int64_t page_size, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                       ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, const std::string& op) {
  PagedMetadata m;
  m.page_size = page_size;
  m.tables = view(tables, place, op + ": plan.tables");
  m.lengths = view(lengths, place, op + ": plan.lengths");
  m.sequence_ids = view(sequence_ids, place, op + ": plan.sequence_ids");
  m.positions = view(positions, place, op + ": plan.positions");
  return m;
}

// The split-KV workspace for the output `out` [queries, heads, value_dim], in host memory of the
// handler's own (CPU platform).
const Tensor* split_workspace(int splits, const Tensor& out, std::vector<std::uint64_t>& storage, Tensor& slot) {
  if (splits == 1) return nullptr;
  const bool rows = out.rank == 3;
  const std::size_t bytes = paged_split_workspace_bytes(rows ? out.shape[0] : 0, rows ? out.shape[1] : 1,
                                                        rows ? out.shape[2] : 1, splits);
  storage.assign(bytes / 8 + 2, 0);
  const std::int64_t size = std::int64_t(bytes);
  slot = Tensor::contiguous(storage.data(), DType::u8, Device{DeviceType::cpu, 0}, &size, 1);
  return &slot;
}

ffi::Error attention(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths, ffi::AnyBuffer sequence_ids,
                     ffi::AnyBuffer positions, ffi::AnyBuffer q, ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, std::int64_t page_size,
                     double scale, bool causal, std::int32_t splits) {
  return guarded([&] {
    const std::string op = "paged_attention";
    PagedAttentionArgs a;
    a.plan = metadata(place, page_size, tables, lengths, sequence_ids, positions, op);
    a.q = view(q, place, op + ": q");
    a.k_cache = view(k_cache, place, op + ": k_cache");
    a.v_cache = view(v_cache, place, op + ": v_cache");
    a.scale = scale;
    a.causal = causal;
    a.out = view(*out, place, op + ": out");
    const Tensor l = view(*lse, place, op + ": lse");
    a.lse = &l;
    a.splits = splits;
    std::vector<std::uint64_t> storage;
    Tensor ws;
    paged_attention(a, split_workspace(splits, a.out, storage, ws), place.stream);
  });
}

ffi::Error mla(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths, ffi::AnyBuffer sequence_ids,
               ffi::AnyBuffer positions, ffi::AnyBuffer q, ffi::AnyBuffer qp, ffi::AnyBuffer latent, ffi::AnyBuffer kp,
               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, std::int64_t page_size, double scale,
               bool causal, std::int32_t splits) {
  return guarded([&] {
    const std::string op = "paged_mla";
    PagedMlaArgs a;
    a.plan = metadata(place, page_size, tables, lengths, sequence_ids, positions, op);
    a.q = view(q, place, op + ": q");
    a.qp = view(qp, place, op + ": qp");
    a.latent = view(latent, place, op + ": latent");
    a.kp = view(kp, place, op + ": kp");
    a.scale = scale;
    a.causal = causal;
    a.out = view(*out, place, op + ": out");
    const Tensor l = view(*lse, place, op + ": lse");
    a.lse = &l;
    a.splits = splits;
    std::vector<std::uint64_t> storage;
    Tensor ws;
    paged_mla(a, split_workspace(splits, a.out, storage, ws), place.stream);
  });
}

// The ordered workspace of a *_backward_ordered call: the layout from the attributes, the buffer a
// host copy of the index operand (the handler's own memory: the backward writes its scratch).
struct OrderedCopy {
  std::vector<std::uint64_t> storage;
  PagedOrderedWorkspace ws;
};

void ordered_from(OrderedCopy& o, ffi::AnyBuffer index, bool pruning, bool row_cache, bool compaction,
                  std::int64_t queries, std::int64_t heads, std::int64_t pages, std::int64_t page_size,
                  std::int64_t listed, std::int64_t inactive, std::int64_t readers, std::int64_t cached) {
  PagedOrderedLayout& l = o.ws.layout;
  l.options.query_pruning = pruning;
  l.options.history_row_cache = row_cache;
  l.options.history_compaction = compaction;
  l.queries = queries, l.heads = heads, l.pages = pages, l.page_size = page_size;
  l.listed = listed, l.inactive = inactive, l.readers = readers, l.cached = cached;
  l.bytes = index.size_bytes();
  o.storage.assign(l.bytes / 8 + 1, 0);
  std::memcpy(o.storage.data(), index.untyped_data(), l.bytes);
  const std::int64_t n = std::int64_t(l.bytes);
  o.ws.buffer = Tensor::contiguous(o.storage.data(), DType::u8, Device{DeviceType::cpu, 0}, &n, 1);
}

ffi::Error attention_backward_impl(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                                   ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, ffi::AnyBuffer q,
                                   ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache, ffi::AnyBuffer dout,
                                   ffi::AnyBuffer dlse, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                   ffi::Result<ffi::AnyBuffer> dv, std::int64_t page_size, double scale, bool causal,
                                   const PagedOrderedWorkspace* ordered) {
  return guarded([&] {
    const std::string op = "paged_attention_backward";
    PagedAttentionBackwardArgs a;
    a.plan = metadata(place, page_size, tables, lengths, sequence_ids, positions, op);
    a.q = view(q, place, op + ": q");
    a.k_cache = view(k_cache, place, op + ": k_cache");
    a.v_cache = view(v_cache, place, op + ": v_cache");
    a.dout = view(dout, place, op + ": dout");
    a.scale = scale;
    a.causal = causal;
    const Tensor l = view(dlse, place, op + ": dlse"), gq = view(*dq, place, op + ": dq"),
                 gk = view(*dk, place, op + ": dk_cache"), gv = view(*dv, place, op + ": dv_cache");
    a.dlse = &l;
    a.dq = &gq;
    a.dk_cache = &gk;
    a.dv_cache = &gv;
    a.ordered = ordered;
    paged_attention_backward(a, nullptr, place.stream);
  });
}

ffi::Error attention_backward(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                              ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, ffi::AnyBuffer q,
                              ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache, ffi::AnyBuffer dout, ffi::AnyBuffer dlse,
                              ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, std::int64_t page_size, double scale, bool causal) {
  return attention_backward_impl(place, tables, lengths, sequence_ids, positions, q, k_cache, v_cache, dout, dlse, dq,
                                 dk, dv, page_size, scale, causal, nullptr);
}

ffi::Error attention_backward_ordered(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                                      ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, ffi::AnyBuffer q,
                                      ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache, ffi::AnyBuffer dout,
                                      ffi::AnyBuffer dlse, ffi::AnyBuffer index, ffi::Result<ffi::AnyBuffer> dq,
                                      ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                                      std::int64_t page_size, double scale, bool causal, bool pruning, bool row_cache,
                                      bool compaction, std::int64_t queries, std::int64_t heads, std::int64_t pages,
                                      std::int64_t listed, std::int64_t inactive, std::int64_t readers,
                                      std::int64_t cached) {
  OrderedCopy o;
  ordered_from(o, index, pruning, row_cache, compaction, queries, heads, pages, page_size, listed, inactive, readers,
               cached);
  return attention_backward_impl(place, tables, lengths, sequence_ids, positions, q, k_cache, v_cache, dout, dlse, dq,
                                 dk, dv, page_size, scale, causal, &o.ws);
}

ffi::Error mla_backward_impl(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                             ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, ffi::AnyBuffer q, ffi::AnyBuffer qp,
                             ffi::AnyBuffer latent, ffi::AnyBuffer kp, ffi::AnyBuffer dout, ffi::AnyBuffer dlse,
                             ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dqp,
                             ffi::Result<ffi::AnyBuffer> dlatent, ffi::Result<ffi::AnyBuffer> dkp,
                             std::int64_t page_size, double scale, bool causal, const PagedOrderedWorkspace* ordered) {
  return guarded([&] {
    const std::string op = "paged_mla_backward";
    PagedMlaBackwardArgs a;
    a.plan = metadata(place, page_size, tables, lengths, sequence_ids, positions, op);
    a.q = view(q, place, op + ": q");
    a.qp = view(qp, place, op + ": qp");
    a.latent = view(latent, place, op + ": latent");
    a.kp = view(kp, place, op + ": kp");
    a.dout = view(dout, place, op + ": dout");
    a.scale = scale;
    a.causal = causal;
    const Tensor l = view(dlse, place, op + ": dlse"), g0 = view(*dq, place, op + ": dq"),
                 g1 = view(*dqp, place, op + ": dqp"), g2 = view(*dlatent, place, op + ": dlatent"),
                 g3 = view(*dkp, place, op + ": dkp");
    a.dlse = &l;
    a.dq = &g0;
    a.dqp = &g1;
    a.dlatent = &g2;
    a.dkp = &g3;
    a.ordered = ordered;
    paged_mla_backward(a, nullptr, place.stream);
  });
}

ffi::Error mla_backward(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                        ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, ffi::AnyBuffer q, ffi::AnyBuffer qp,
                        ffi::AnyBuffer latent, ffi::AnyBuffer kp, ffi::AnyBuffer dout, ffi::AnyBuffer dlse,
                        ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dqp,
                        ffi::Result<ffi::AnyBuffer> dlatent, ffi::Result<ffi::AnyBuffer> dkp, std::int64_t page_size,
                        double scale, bool causal) {
  return mla_backward_impl(place, tables, lengths, sequence_ids, positions, q, qp, latent, kp, dout, dlse, dq, dqp,
                           dlatent, dkp, page_size, scale, causal, nullptr);
}

ffi::Error mla_backward_ordered(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths,
                                ffi::AnyBuffer sequence_ids, ffi::AnyBuffer positions, ffi::AnyBuffer q,
                                ffi::AnyBuffer qp, ffi::AnyBuffer latent, ffi::AnyBuffer kp, ffi::AnyBuffer dout,
                                ffi::AnyBuffer dlse, ffi::AnyBuffer index, ffi::Result<ffi::AnyBuffer> dq,
                                ffi::Result<ffi::AnyBuffer> dqp, ffi::Result<ffi::AnyBuffer> dlatent,
                                ffi::Result<ffi::AnyBuffer> dkp, std::int64_t page_size, double scale, bool causal,
                                bool pruning, bool row_cache, bool compaction, std::int64_t queries,
                                std::int64_t heads, std::int64_t pages, std::int64_t listed, std::int64_t inactive,
                                std::int64_t readers, std::int64_t cached) {
  OrderedCopy o;
  ordered_from(o, index, pruning, row_cache, compaction, queries, heads, pages, page_size, listed, inactive, readers,
               cached);
  return mla_backward_impl(place, tables, lengths, sequence_ids, positions, q, qp, latent, kp, dout, dlse, dq, dqp,
                           dlatent, dkp, page_size, scale, causal, &o.ws);
}

ffi::Error append(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths, ffi::AnyBuffer sequence_ids,
                  ffi::AnyBuffer positions, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer k_cache,
                  ffi::AnyBuffer v_cache, ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out,
                  std::int64_t page_size) {
  return guarded([&] {
    const std::string op = "paged_append";
    PagedAppendArgs a;
    a.plan = metadata(place, page_size, tables, lengths, sequence_ids, positions, op);
    a.k = view(k, place, op + ": k");
    a.v = view(v, place, op + ": v");
    // The results start as the caches (nothing to copy when XLA aliased them: a donated cache),
    // then take the rows. A failed call leaves the input caches untouched: when they alias the
    // results, the checks of paged_append run before its first write.
    a.k_cache = view(*k_out, place, op + ": k_cache");
    a.v_cache = view(*v_out, place, op + ": v_cache");
    if (k_cache.untyped_data() != k_out->untyped_data())
      std::memcpy(k_out->untyped_data(), k_cache.untyped_data(), k_cache.size_bytes());
    if (v_cache.untyped_data() != v_out->untyped_data())
      std::memcpy(v_out->untyped_data(), v_cache.untyped_data(), v_cache.size_bytes());
    paged_append(a, place.stream);
  });
}

template <class B>
auto plan_args(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>();
}

template <class B>
auto forward_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<std::int64_t>("page_size")
      .template Attr<double>("scale")
      .template Attr<bool>("causal")
      .template Attr<std::int32_t>("splits");
}

RUDNN_FFI_HANDLER(attention_cpu,
                  forward_attrs(plan_args(cpu_binding())
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()),
                  on_cpu, attention)
RUDNN_FFI_HANDLER(mla_cpu,
                  forward_attrs(plan_args(cpu_binding())
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()),
                  on_cpu, mla)
template <class B>
auto backward_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<std::int64_t>("page_size")
      .template Attr<double>("scale")
      .template Attr<bool>("causal");
}

RUDNN_FFI_HANDLER(attention_backward_cpu,
                  backward_attrs(plan_args(cpu_binding())
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()),
                  on_cpu, attention_backward)
RUDNN_FFI_HANDLER(mla_backward_cpu,
                  backward_attrs(plan_args(cpu_binding())
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Arg<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()
                                     .template Ret<ffi::AnyBuffer>()),
                  on_cpu, mla_backward)
template <class B>
auto ordered_attrs(B&& b) {
  return backward_attrs(std::forward<B>(b))
      .template Attr<bool>("query_pruning")
      .template Attr<bool>("history_row_cache")
      .template Attr<bool>("history_compaction")
      .template Attr<std::int64_t>("queries")
      .template Attr<std::int64_t>("heads")
      .template Attr<std::int64_t>("pages")
      .template Attr<std::int64_t>("listed")
      .template Attr<std::int64_t>("inactive")
      .template Attr<std::int64_t>("readers")
      .template Attr<std::int64_t>("cached");
}

RUDNN_FFI_HANDLER(attention_backward_ordered_cpu,
                  ordered_attrs(plan_args(cpu_binding())
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()),
                  on_cpu, attention_backward_ordered)
RUDNN_FFI_HANDLER(mla_backward_ordered_cpu,
                  ordered_attrs(plan_args(cpu_binding())
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Arg<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()
                                    .template Ret<ffi::AnyBuffer>()),
                  on_cpu, mla_backward_ordered)
RUDNN_FFI_HANDLER(append_cpu,
                  plan_args(cpu_binding())
                      .template Arg<ffi::AnyBuffer>()
                      .template Arg<ffi::AnyBuffer>()
                      .template Arg<ffi::AnyBuffer>()
                      .template Arg<ffi::AnyBuffer>()
                      .template Ret<ffi::AnyBuffer>()
                      .template Ret<ffi::AnyBuffer>()
                      .template Attr<std::int64_t>("page_size"),
                  on_cpu, append)

}  // namespace

void add_paged_targets(nb::dict& cpu, nb::dict& cuda) {
  (void)cuda;
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_paged_attention"] = capsule(attention_cpu);
  cpu["rudnn_paged_mla"] = capsule(mla_cpu);
  cpu["rudnn_paged_append"] = capsule(append_cpu);
  cpu["rudnn_paged_attention_backward"] = capsule(attention_backward_cpu);
  cpu["rudnn_paged_mla_backward"] = capsule(mla_backward_cpu);
  cpu["rudnn_paged_attention_backward_ordered"] = capsule(attention_backward_ordered_cpu);
  cpu["rudnn_paged_mla_backward_ordered"] = capsule(mla_backward_ordered_cpu);
}

}  // namespace rudnn::jax_ffi
