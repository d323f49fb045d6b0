// XLA FFI handlers of the paged family (rudnn.jax.paged), on the "cpu" and "CUDA" platforms (the
// same targets on both). The plan's four int32 metadata arrays come first.
//
// Targets:
//   rudnn_paged_attention (tables, lengths, sequence_ids, positions, q, k_cache, v_cache) -> (out, lse)
//   rudnn_paged_mla       (tables, lengths, sequence_ids, positions, q, qp, latent, kp) -> (out, lse)
//                         (attributes page_size, scale, causal, splits, max_length: with splits 1 a
//                         CUDA call picks its own split count for histories of at most max_length
//                         positions, -1 unknown; split partials in XLA's scratch memory on CUDA, in
//                         the handler's own host memory on the CPU)
//   rudnn_paged_append    (tables, lengths, sequence_ids, positions, k, v, k_cache, v_cache) -> (k_cache, v_cache)
//                         (attribute page_size only; the caches alias the results: donation-friendly)
//   rudnn_paged_attention_backward (tables, ..., q, k_cache, v_cache, dout, dlse) -> (dq, dk_cache, dv_cache)
//   rudnn_paged_mla_backward       (tables, ..., q, qp, latent, kp, dout, dlse) -> (dq, dqp, dlatent, dkp)
//                         (attributes page_size, scale, causal; on CUDA the float32 accumulators of
//                         16-bit caches' history gradients live in XLA's scratch memory)
//   rudnn_paged_attention_backward_ordered / rudnn_paged_mla_backward_ordered: the same with the
//                         OrderedBackwardWorkspace's index (uint8) after dlse, aliased to one more
//                         result (the backward writes its scratch there), and its layout as
//                         attributes (query_pruning, history_row_cache, history_compaction, queries,
//                         heads, pages, listed, inactive, readers, cached)
// The checks run as XLA runs the call (rudnn.jax raises them as rudnn errors when eager).
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "paged_args.hpp"
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

// A workspace of `bytes` (nullptr for 0): XLA's scratch memory on CUDA, host memory of the
// handler's own on the CPU.
const Tensor* workspace_of(const Place& place, std::size_t bytes, std::vector<std::uint64_t>& storage, Tensor& slot,
                           const std::string& op) {
  if (bytes == 0) return nullptr;
  if (place.device.is_cuda()) return scratch_workspace(place, bytes, slot, op + ": workspace");
  storage.assign(bytes / 8 + 2, 0);
  const std::int64_t size = std::int64_t(bytes);
  slot = Tensor::contiguous(storage.data(), DType::u8, place.device, &size, 1);
  return &slot;
}

// The split-KV workspace bytes of a forward call: for the splits asked, or with splits 1 for the
// count the CUDA default picks (set in `a`).
template <class Args>
std::size_t split_bytes(Args& a, std::int64_t max_length) {
  if (a.splits == 1) return bindings::paged_args::auto_split_bytes(a, max_length);
  const bool rows = a.out.rank == 3;
  return paged_split_workspace_bytes(rows ? a.out.shape[0] : 0, rows ? a.out.shape[1] : 1, rows ? a.out.shape[2] : 1,
                                     a.splits);
}

// A result XLA aliases to an operand (input_output_aliases in rudnn/jax/paged.py) holds the
// operand's memory. Should XLA ever hand another buffer, a CPU handler copies the operand over;
// on CUDA (no copy engine here) that is an error.
void alias_operand(const Place& place, ffi::AnyBuffer operand, ffi::AnyBuffer& result, const std::string& what) {
  if (operand.untyped_data() == result.untyped_data()) return;
  if (place.device.is_cuda())
    fail(ErrorKind::unsupported, what + ": internal: XLA did not alias the result to its operand");
  std::memcpy(result.untyped_data(), operand.untyped_data(), operand.size_bytes());
}

ffi::Error attention(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths, ffi::AnyBuffer sequence_ids,
                     ffi::AnyBuffer positions, ffi::AnyBuffer q, ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, std::int64_t page_size,
                     double scale, bool causal, std::int32_t splits, std::int64_t max_length) {
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
    const std::size_t bytes = split_bytes(a, max_length);
    paged_attention(a, workspace_of(place, bytes, storage, ws, op), place.stream);
  });
}

ffi::Error mla(const Place& place, ffi::AnyBuffer tables, ffi::AnyBuffer lengths, ffi::AnyBuffer sequence_ids,
               ffi::AnyBuffer positions, ffi::AnyBuffer q, ffi::AnyBuffer qp, ffi::AnyBuffer latent, ffi::AnyBuffer kp,
               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, std::int64_t page_size, double scale,
               bool causal, std::int32_t splits, std::int64_t max_length) {
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
    const std::size_t bytes = split_bytes(a, max_length);
    paged_mla(a, workspace_of(place, bytes, storage, ws, op), place.stream);
  });
}

// The ordered workspace of a *_backward_ordered call: the layout from the attributes, the buffer
// the result aliased to the index operand (the backward writes its scratch there).
PagedOrderedWorkspace ordered_from(const Place& place, ffi::AnyBuffer index, ffi::Result<ffi::AnyBuffer> scratch,
                                   bool pruning, bool row_cache, bool compaction, std::int64_t queries,
                                   std::int64_t heads, std::int64_t pages, std::int64_t page_size, std::int64_t listed,
                                   std::int64_t inactive, std::int64_t readers, std::int64_t cached,
                                   const std::string& op) {
  PagedOrderedWorkspace o;
  PagedOrderedLayout& l = o.layout;
  l.options.query_pruning = pruning;
  l.options.history_row_cache = row_cache;
  l.options.history_compaction = compaction;
  l.queries = queries, l.heads = heads, l.pages = pages, l.page_size = page_size;
  l.listed = listed, l.inactive = inactive, l.readers = readers, l.cached = cached;
  l.bytes = index.size_bytes();
  alias_operand(place, index, *scratch, op + ": workspace");
  o.buffer = view(*scratch, place, op + ": workspace");
  return o;
}

// Runs impl(&workspace) with the ordered workspace the attributes describe (its errors as ffi::Error).
template <class Impl>
ffi::Error with_ordered(const Place& place, ffi::AnyBuffer index, ffi::Result<ffi::AnyBuffer> scratch, bool pruning,
                        bool row_cache, bool compaction, std::int64_t queries, std::int64_t heads, std::int64_t pages,
                        std::int64_t page_size, std::int64_t listed, std::int64_t inactive, std::int64_t readers,
                        std::int64_t cached, const std::string& op, Impl&& impl) {
  std::optional<PagedOrderedWorkspace> o;
  if (ffi::Error e = guarded([&] {
        o = ordered_from(place, index, scratch, pruning, row_cache, compaction, queries, heads, pages, page_size,
                         listed, inactive, readers, cached, op);
      });
      e.failure())
    return e;
  return impl(&*o);
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
    // CUDA, atomic mode, 16-bit caches: float32 history accumulators (XLA's scratch memory)
    std::vector<std::uint64_t> host;
    Tensor ws;
    paged_attention_backward(a, workspace_of(place, paged_attention_backward_workspace_bytes(a), host, ws, op),
                             place.stream);
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
                                      ffi::Result<ffi::AnyBuffer> scratch, std::int64_t page_size, double scale,
                                      bool causal, bool pruning, bool row_cache, bool compaction, std::int64_t queries,
                                      std::int64_t heads, std::int64_t pages,
                                      std::int64_t listed, std::int64_t inactive, std::int64_t readers,
                                      std::int64_t cached) {
  return with_ordered(place, index, scratch, pruning, row_cache, compaction, queries, heads, pages, page_size, listed,
                      inactive, readers, cached, "paged_attention_backward", [&](const PagedOrderedWorkspace* o) {
                        return attention_backward_impl(place, tables, lengths, sequence_ids, positions, q, k_cache,
                                                       v_cache, dout, dlse, dq, dk, dv, page_size, scale, causal, o);
                      });
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
    // CUDA, atomic mode, 16-bit caches: float32 history accumulators (XLA's scratch memory)
    std::vector<std::uint64_t> host;
    Tensor ws;
    paged_mla_backward(a, workspace_of(place, paged_mla_backward_workspace_bytes(a), host, ws, op), place.stream);
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
                                ffi::Result<ffi::AnyBuffer> dkp, ffi::Result<ffi::AnyBuffer> scratch,
                                std::int64_t page_size, double scale, bool causal, bool pruning, bool row_cache,
                                bool compaction, std::int64_t queries, std::int64_t heads, std::int64_t pages,
                                std::int64_t listed, std::int64_t inactive, std::int64_t readers, std::int64_t cached) {
  return with_ordered(place, index, scratch, pruning, row_cache, compaction, queries, heads, pages, page_size, listed,
                      inactive, readers, cached, "paged_mla_backward", [&](const PagedOrderedWorkspace* o) {
                        return mla_backward_impl(place, tables, lengths, sequence_ids, positions, q, qp, latent, kp,
                                                 dout, dlse, dq, dqp, dlatent, dkp, page_size, scale, causal, o);
                      });
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
    alias_operand(place, k_cache, *k_out, op + ": k_cache");
    alias_operand(place, v_cache, *v_out, op + ": v_cache");
    paged_append(a, place.stream);
  });
}

// The bindings: the plan's 4 metadata arrays and the operands, the results, the attributes.
template <class B>
auto forward_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<std::int64_t>("page_size")
      .template Attr<double>("scale")
      .template Attr<bool>("causal")
      .template Attr<std::int32_t>("splits")
      .template Attr<std::int64_t>("max_length");
}

template <class B>
auto backward_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<std::int64_t>("page_size")
      .template Attr<double>("scale")
      .template Attr<bool>("causal");
}

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

// The handlers of one platform (binding: cpu_binding or cuda_binding; adapter: on_cpu or on_cuda).
#define RUDNN_PAGED_HANDLERS(suffix, binding, adapter)                                                              \
  RUDNN_FFI_HANDLER(attention_##suffix, (forward_attrs(buffers<4 + 3, 2>(binding()))), adapter, attention)         \
  RUDNN_FFI_HANDLER(mla_##suffix, (forward_attrs(buffers<4 + 4, 2>(binding()))), adapter, mla)                     \
  RUDNN_FFI_HANDLER(attention_backward_##suffix, (backward_attrs(buffers<4 + 5, 3>(binding()))), adapter,          \
                    attention_backward)                                                                            \
  RUDNN_FFI_HANDLER(mla_backward_##suffix, (backward_attrs(buffers<4 + 6, 4>(binding()))), adapter, mla_backward)  \
  RUDNN_FFI_HANDLER(attention_backward_ordered_##suffix, (ordered_attrs(buffers<4 + 6, 4>(binding()))), adapter,   \
                    attention_backward_ordered)                                                                    \
  RUDNN_FFI_HANDLER(mla_backward_ordered_##suffix, (ordered_attrs(buffers<4 + 7, 5>(binding()))), adapter,         \
                    mla_backward_ordered)                                                                          \
  RUDNN_FFI_HANDLER(append_##suffix, (buffers<4 + 4, 2>(binding()).template Attr<std::int64_t>("page_size")),      \
                    adapter, append)

RUDNN_PAGED_HANDLERS(cpu, cpu_binding, on_cpu)
RUDNN_PAGED_HANDLERS(cuda, cuda_binding, on_cuda)

}  // namespace

void add_paged_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  const auto add = [&](nb::dict& targets, auto attention, auto mla, auto append, auto attention_backward,
                       auto mla_backward, auto attention_backward_ordered, auto mla_backward_ordered) {
    targets["rudnn_paged_attention"] = capsule(attention);
    targets["rudnn_paged_mla"] = capsule(mla);
    targets["rudnn_paged_append"] = capsule(append);
    targets["rudnn_paged_attention_backward"] = capsule(attention_backward);
    targets["rudnn_paged_mla_backward"] = capsule(mla_backward);
    targets["rudnn_paged_attention_backward_ordered"] = capsule(attention_backward_ordered);
    targets["rudnn_paged_mla_backward_ordered"] = capsule(mla_backward_ordered);
  };
  add(cpu, attention_cpu, mla_cpu, append_cpu, attention_backward_cpu, mla_backward_cpu,
      attention_backward_ordered_cpu, mla_backward_ordered_cpu);
  add(cuda, attention_cuda, mla_cuda, append_cuda, attention_backward_cuda, mla_backward_cuda,
      attention_backward_ordered_cuda, mla_backward_ordered_cuda);
}

}  // namespace rudnn::jax_ffi
