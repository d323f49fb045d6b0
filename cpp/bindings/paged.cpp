// Bindings of the paged family (rudnn._C.paged_*). The plan's metadata arrives as four
// int32 arrays plus the page size (python/rudnn/paged.py's DevicePlan).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "families.hpp"
#include "paged_args.hpp"
#include "rudnn/paged.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

using Info = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::string>;

Info info_tuple(const PagedScheduleInfo& i) {
  return {i.num_seqs, i.queries, i.max_pages, i.max_length, i.duplicate_row, i.duplicate_of, i.duplicate_message};
}

PagedScheduleArgs schedule(std::int64_t page_size, std::int64_t pages, const In& tables, const OptIn& table_sizes,
                           const In& lengths, const In& sequence_ids, const In& positions,
                           std::optional<Tensor>& keep_sizes) {
  PagedScheduleArgs a;
  a.page_size = page_size;
  a.pages = pages;
  a.tables = to_tensor(tables, "tables");
  a.table_sizes = opt_tensor(table_sizes, "table_sizes", keep_sizes);
  a.lengths = to_tensor(lengths, "lengths");
  a.sequence_ids = to_tensor(sequence_ids, "sequence_ids");
  a.positions = to_tensor(positions, "positions");
  return a;
}

PagedMetadata metadata(std::int64_t page_size, const In& tables, const In& lengths, const In& sequence_ids,
                       const In& positions) {
  PagedMetadata m;
  m.page_size = page_size;
  m.tables = to_tensor(tables, "plan.tables");
  m.lengths = to_tensor(lengths, "plan.lengths");
  m.sequence_ids = to_tensor(sequence_ids, "plan.sequence_ids");
  m.positions = to_tensor(positions, "plan.positions");
  return m;
}

// An ordered workspace's layout crosses to Python as a tuple (python/rudnn/paged.py keeps it):
// (query_pruning, history_row_cache, history_compaction, queries, heads, pages, page_size,
//  listed, inactive, readers, cached, bytes).
using LayoutTuple = std::tuple<bool, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                               std::int64_t, std::int64_t, std::int64_t, std::size_t>;

LayoutTuple layout_tuple(const PagedOrderedLayout& l) {
  return {l.options.query_pruning, l.options.history_row_cache, l.options.history_compaction, l.queries, l.heads,
          l.pages, l.page_size, l.listed, l.inactive, l.readers, l.cached, l.bytes};
}

PagedOrderedLayout layout_of(const LayoutTuple& t) {
  PagedOrderedLayout l;
  std::tie(l.options.query_pruning, l.options.history_row_cache, l.options.history_compaction, l.queries, l.heads,
           l.pages, l.page_size, l.listed, l.inactive, l.readers, l.cached, l.bytes) = t;
  return l;
}

// The ordered workspace of a backward call (null when `layout` is None).
const PagedOrderedWorkspace* ordered_of(const std::optional<LayoutTuple>& layout, const OptOut& buffer,
                                        std::optional<PagedOrderedWorkspace>& slot) {
  if (!layout) return nullptr;
  if (!buffer) throw Error(ErrorKind::value, "ordered workspace: a layout without its buffer");
  slot.emplace();
  slot->layout = layout_of(*layout);
  slot->buffer = to_tensor(*buffer, "workspace");
  return &*slot;
}

#define RUDNN_PAGED_PLAN_ARGS \
  nb::arg("page_size"), nb::arg("tables"), nb::arg("lengths"), nb::arg("sequence_ids"), nb::arg("positions")

}  // namespace

void register_paged(nb::module_& m) {
  m.def(
      "paged_schedule_info",
      [](std::int64_t page_size, std::int64_t pages, const In& tables, const OptIn& table_sizes, const In& lengths,
         const In& sequence_ids, const In& positions) {
        std::optional<Tensor> keep;
        const PagedScheduleArgs a =
            schedule(page_size, pages, tables, table_sizes, lengths, sequence_ids, positions, keep);
        return info_tuple(paged_validate_schedule(a));
      },
      nb::arg("page_size"), nb::arg("pages"), nb::arg("tables"), nb::arg("table_sizes").none(), nb::arg("lengths"),
      nb::arg("sequence_ids"), nb::arg("positions"),
      "Validates a host schedule; (num_seqs, queries, max_pages, max_length, duplicate_row, duplicate_of, message).");

  m.def(
      "paged_pack_schedule",
      [](std::int64_t page_size, std::int64_t pages, const In& tables, const OptIn& table_sizes, const In& lengths,
         const In& sequence_ids, const In& positions, const Out& out_tables, const Out& out_lengths,
         const Out& out_sequence_ids, const Out& out_positions) {
        std::optional<Tensor> keep;
        const PagedScheduleArgs a =
            schedule(page_size, pages, tables, table_sizes, lengths, sequence_ids, positions, keep);
        PagedMetadata out;
        out.page_size = page_size;
        out.tables = to_tensor(out_tables, "out_tables");
        out.lengths = to_tensor(out_lengths, "out_lengths");
        out.sequence_ids = to_tensor(out_sequence_ids, "out_sequence_ids");
        out.positions = to_tensor(out_positions, "out_positions");
        return info_tuple(paged_pack_schedule(a, out));
      },
      nb::arg("page_size"), nb::arg("pages"), nb::arg("tables"), nb::arg("table_sizes").none(), nb::arg("lengths"),
      nb::arg("sequence_ids"), nb::arg("positions"), nb::arg("out_tables"), nb::arg("out_lengths"),
      nb::arg("out_sequence_ids"), nb::arg("out_positions"));

  m.def("paged_split_workspace_bytes", &paged_split_workspace_bytes, nb::arg("queries"), nb::arg("heads"),
        nb::arg("value_dim"), nb::arg("splits"));

  m.def(
      "paged_attention",
      [](std::int64_t page_size, const In& tables, const In& lengths, const In& sequence_ids, const In& positions,
         const In& q, const In& k_cache, const In& v_cache, double scale, bool causal, const Out& out,
         const OptOut& lse, int splits, const OptOut& workspace, std::uintptr_t stream, std::int64_t max_length,
         const nb::object& workspace_alloc) {
        PagedAttentionArgs a;
        a.plan = metadata(page_size, tables, lengths, sequence_ids, positions);
        a.q = to_tensor(q, "q");
        a.k_cache = to_tensor(k_cache, "k_cache");
        a.v_cache = to_tensor(v_cache, "v_cache");
        a.scale = scale;
        a.causal = causal;
        a.out = to_tensor(out, "out");
        std::optional<Tensor> keep_lse, keep_ws;
        a.lse = opt_tensor(lse, "lse", keep_lse);
        a.splits = splits;
        std::optional<Out> held;
        const Tensor* ws = workspace_from(
            workspace, workspace_alloc, [&] { return paged_args::auto_split_bytes(a, max_length); }, held, keep_ws);
        nb::gil_scoped_release release;
        paged_attention(a, ws, as_stream(stream));
      },
      RUDNN_PAGED_PLAN_ARGS, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("scale"),
      nb::arg("causal"), nb::arg("out"), nb::arg("lse").none(), nb::arg("splits"), nb::arg("workspace").none(),
      nb::arg("stream"), nb::arg("max_length") = -1, nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "paged_mla",
      [](std::int64_t page_size, const In& tables, const In& lengths, const In& sequence_ids, const In& positions,
         const In& q, const In& qp, const In& latent, const In& kp, double scale, bool causal, const Out& out,
         const OptOut& lse, int splits, const OptOut& workspace, std::uintptr_t stream, std::int64_t max_length,
         const nb::object& workspace_alloc) {
        PagedMlaArgs a;
        a.plan = metadata(page_size, tables, lengths, sequence_ids, positions);
        a.q = to_tensor(q, "q");
        a.qp = to_tensor(qp, "qp");
        a.latent = to_tensor(latent, "latent");
        a.kp = to_tensor(kp, "kp");
        a.scale = scale;
        a.causal = causal;
        a.out = to_tensor(out, "out");
        std::optional<Tensor> keep_lse, keep_ws;
        a.lse = opt_tensor(lse, "lse", keep_lse);
        a.splits = splits;
        std::optional<Out> held;
        const Tensor* ws = workspace_from(
            workspace, workspace_alloc, [&] { return paged_args::auto_split_bytes(a, max_length); }, held, keep_ws);
        nb::gil_scoped_release release;
        paged_mla(a, ws, as_stream(stream));
      },
      RUDNN_PAGED_PLAN_ARGS, nb::arg("q"), nb::arg("qp"), nb::arg("latent"), nb::arg("kp"), nb::arg("scale"),
      nb::arg("causal"), nb::arg("out"), nb::arg("lse").none(), nb::arg("splits"), nb::arg("workspace").none(),
      nb::arg("stream"), nb::arg("max_length") = -1, nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "paged_ordered_env",
      [] {
        bool rows = false, compact = false;
        paged_ordered_env(rows, compact);
        return std::make_tuple(rows, compact);
      },
      "(history_row_cache, history_compaction) from RUDNN_PAGED_ORDERED_CACHE_ROWS / _COMPACT_HISTORY.");

  m.def(
      "paged_ordered_layout",
      [](std::int64_t page_size, std::int64_t pages, const In& tables, const OptIn& table_sizes, const In& lengths,
         const In& sequence_ids, const In& positions, std::int64_t heads, bool query_pruning, bool history_row_cache,
         bool history_compaction) {
        std::optional<Tensor> keep;
        const PagedScheduleArgs a =
            schedule(page_size, pages, tables, table_sizes, lengths, sequence_ids, positions, keep);
        PagedOrderedOptions o;
        o.query_pruning = query_pruning;
        o.history_row_cache = history_row_cache;
        o.history_compaction = history_compaction;
        return layout_tuple(paged_ordered_layout(a, heads, o));
      },
      nb::arg("page_size"), nb::arg("pages"), nb::arg("tables"), nb::arg("table_sizes").none(), nb::arg("lengths"),
      nb::arg("sequence_ids"), nb::arg("positions"), nb::arg("heads"), nb::arg("query_pruning"),
      nb::arg("history_row_cache"), nb::arg("history_compaction"));

  m.def(
      "paged_ordered_pack",
      [](std::int64_t page_size, std::int64_t pages, const In& tables, const OptIn& table_sizes, const In& lengths,
         const In& sequence_ids, const In& positions, const LayoutTuple& layout, const Out& out) {
        std::optional<Tensor> keep;
        const PagedScheduleArgs a =
            schedule(page_size, pages, tables, table_sizes, lengths, sequence_ids, positions, keep);
        paged_ordered_pack(a, layout_of(layout), to_tensor(out, "out"));
      },
      nb::arg("page_size"), nb::arg("pages"), nb::arg("tables"), nb::arg("table_sizes").none(), nb::arg("lengths"),
      nb::arg("sequence_ids"), nb::arg("positions"), nb::arg("layout"), nb::arg("out"));

  m.def(
      "paged_attention_backward",
      [](std::int64_t page_size, const In& tables, const In& lengths, const In& sequence_ids, const In& positions,
         const In& q, const In& k_cache, const In& v_cache, const In& dout, double scale, bool causal,
         const OptOut& dq, const OptOut& dk_cache, const OptOut& dv_cache, const OptIn& dlse,
         const std::optional<LayoutTuple>& ordered_layout, const OptOut& ordered_buffer, std::uintptr_t stream,
         const nb::object& workspace_alloc) {
        PagedAttentionBackwardArgs a;
        a.plan = metadata(page_size, tables, lengths, sequence_ids, positions);
        a.q = to_tensor(q, "q");
        a.k_cache = to_tensor(k_cache, "k_cache");
        a.v_cache = to_tensor(v_cache, "v_cache");
        a.dout = to_tensor(dout, "dout");
        a.scale = scale;
        a.causal = causal;
        std::optional<Tensor> keep[4], ws;
        std::optional<PagedOrderedWorkspace> ordered;
        std::optional<Out> held;
        a.dq = opt_tensor(dq, "dq", keep[0]);
        a.dk_cache = opt_tensor(dk_cache, "dk_cache", keep[1]);
        a.dv_cache = opt_tensor(dv_cache, "dv_cache", keep[2]);
        a.dlse = opt_tensor(dlse, "dlse", keep[3]);
        a.ordered = ordered_of(ordered_layout, ordered_buffer, ordered);
        const Tensor* w = workspace_from(std::nullopt, workspace_alloc,
                                         [&] { return paged_attention_backward_workspace_bytes(a); }, held, ws);
        nb::gil_scoped_release release;
        paged_attention_backward(a, w, as_stream(stream));
      },
      RUDNN_PAGED_PLAN_ARGS, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("dout"), nb::arg("scale"),
      nb::arg("causal"), nb::arg("dq").none(), nb::arg("dk_cache").none(), nb::arg("dv_cache").none(),
      nb::arg("dlse").none(), nb::arg("ordered_layout").none(), nb::arg("ordered_buffer").none(), nb::arg("stream"),
      nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "paged_mla_backward",
      [](std::int64_t page_size, const In& tables, const In& lengths, const In& sequence_ids, const In& positions,
         const In& q, const In& qp, const In& latent, const In& kp, const In& dout, double scale, bool causal,
         const OptOut& dq, const OptOut& dqp, const OptOut& dlatent, const OptOut& dkp, const OptIn& dlse,
         const std::optional<LayoutTuple>& ordered_layout, const OptOut& ordered_buffer, std::uintptr_t stream,
         const nb::object& workspace_alloc) {
        PagedMlaBackwardArgs a;
        a.plan = metadata(page_size, tables, lengths, sequence_ids, positions);
        a.q = to_tensor(q, "q");
        a.qp = to_tensor(qp, "qp");
        a.latent = to_tensor(latent, "latent");
        a.kp = to_tensor(kp, "kp");
        a.dout = to_tensor(dout, "dout");
        a.scale = scale;
        a.causal = causal;
        std::optional<Tensor> keep[5], ws;
        std::optional<PagedOrderedWorkspace> ordered;
        std::optional<Out> held;
        a.dq = opt_tensor(dq, "dq", keep[0]);
        a.dqp = opt_tensor(dqp, "dqp", keep[1]);
        a.dlatent = opt_tensor(dlatent, "dlatent", keep[2]);
        a.dkp = opt_tensor(dkp, "dkp", keep[3]);
        a.dlse = opt_tensor(dlse, "dlse", keep[4]);
        a.ordered = ordered_of(ordered_layout, ordered_buffer, ordered);
        const Tensor* w = workspace_from(std::nullopt, workspace_alloc,
                                         [&] { return paged_mla_backward_workspace_bytes(a); }, held, ws);
        nb::gil_scoped_release release;
        paged_mla_backward(a, w, as_stream(stream));
      },
      RUDNN_PAGED_PLAN_ARGS, nb::arg("q"), nb::arg("qp"), nb::arg("latent"), nb::arg("kp"), nb::arg("dout"),
      nb::arg("scale"), nb::arg("causal"), nb::arg("dq").none(), nb::arg("dqp").none(), nb::arg("dlatent").none(),
      nb::arg("dkp").none(), nb::arg("dlse").none(), nb::arg("ordered_layout").none(),
      nb::arg("ordered_buffer").none(), nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "paged_append",
      [](std::int64_t page_size, const In& tables, const In& lengths, const In& sequence_ids, const In& positions,
         const In& k, const In& v, const Out& k_cache, const Out& v_cache, std::uintptr_t stream) {
        PagedAppendArgs a;
        a.plan = metadata(page_size, tables, lengths, sequence_ids, positions);
        a.k = to_tensor(k, "k");
        a.v = to_tensor(v, "v");
        a.k_cache = to_tensor(k_cache, "k_cache");
        a.v_cache = to_tensor(v_cache, "v_cache");
        nb::gil_scoped_release release;
        paged_append(a, as_stream(stream));
      },
      RUDNN_PAGED_PLAN_ARGS, nb::arg("k"), nb::arg("v"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("stream"));

  m.def("paged_last_algorithm", [] { return std::string(paged_last_algorithm()); },
        "The backend the last paged call on this thread ran (cpu, ...).");
}

}  // namespace rudnn::bindings
