// Every check of the paged family, run once before either backend: the host schedule
// (HostPlan), the packed metadata every op takes, and each op's operands.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>
#include <cstdlib>

#include "core/aliasing.hpp"
#include "core/check.hpp"
#include "core/checked_math.hpp"
#include "paged/problem.hpp"

namespace rudnn::paged {

using core::fail;

namespace {

constexpr std::int64_t kMaxDim = 1024;      // D, Dv, R
constexpr std::int64_t kMaxRotary = 256;    // P
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::size_t kSplitCap = std::size_t(64) << 20;

std::string str(std::int64_t v) { return std::to_string(v); }

std::string shape_str_rows(const Problem& p) {
  return str(p.sched.queries) + " queries x " + str(p.hq) + " heads x " + str(p.dv) + " values";
}

// The first two rows whose (sequence, position) name the same physical slot.
template <class Seq, class Pos, class Page>
void first_duplicate(std::int64_t queries, std::int64_t page_size, Seq&& seq, Pos&& pos, Page&& page,
                     std::int64_t& row, std::int64_t& of, std::string& message) {
  row = of = -1;
  std::unordered_map<std::int64_t, std::int64_t> owner;
  owner.reserve(std::size_t(queries));
  for (std::int64_t r = 0; r < queries; ++r) {
    const std::int64_t s = seq(r), t = pos(r);
    const std::int64_t pg = page(s, t / page_size), slot = t % page_size;
    const auto [it, fresh] = owner.emplace(pg * page_size + slot, r);
    if (!fresh) {
      of = it->second;
      row = r;
      message = "rows " + str(of) + " and " + str(r) + " both write page " + str(pg) + " slot " + str(slot) +
                " (sequence " + str(seq(of)) + " position " + str(pos(of)) + " and sequence " + str(s) +
                " position " + str(t) + ")";
      return;
    }
  }
}

bool is_integer(DType d) { return d == DType::i32 || d == DType::i64 || d == DType::u32 || d == DType::u8; }

// Element (i, j) of a host integer array of rank 1 or 2, as int64.
struct IntReader {
  const void* data = nullptr;
  DType dtype = DType::i64;
  std::int64_t s0 = 0, s1 = 0;
  std::int64_t operator()(std::int64_t i, std::int64_t j = 0) const {
    const std::int64_t o = i * s0 + j * s1;
    switch (dtype) {
      case DType::i32: return static_cast<const std::int32_t*>(data)[o];
      case DType::i64: return static_cast<const std::int64_t*>(data)[o];
      case DType::u32: return static_cast<const std::uint32_t*>(data)[o];
      case DType::u8: return static_cast<const std::uint8_t*>(data)[o];
      default: return 0;
    }
  }
};

IntReader reader(const Tensor& t) {
  IntReader r;
  r.data = t.data;
  r.dtype = t.dtype;
  r.s0 = t.rank > 0 ? t.strides[0] : 0;
  r.s1 = t.rank > 1 ? t.strides[1] : 0;
  return r;
}

// rank, and no null data.
void expect_rank(const Tensor& t, int rank, const std::string& name, const char* layout) {
  if (t.rank != rank)
    fail(ErrorKind::shape, name + ": expected rank " + str(rank) + " " + layout + ", got shape " + t.shape_str());
  core::expect_data(t, name);
}

void expect_host_integer(const Tensor& t, const std::string& name) {
  if (t.device.is_cuda())
    fail(ErrorKind::device, name + ": expected a host (CPU) array or a list, got an array on " + t.device.str());
  if (!is_integer(t.dtype))
    fail(ErrorKind::dtype, name + ": expected an integer dtype (int32, int64, uint32 or uint8), got " +
                               dtype_name(t.dtype));
}

// The value checks shared by HostPlan and by the CPU backend's metadata: `pre` prefixes every
// argument name ("" for HostPlan, "plan." for the metadata). capacity(s) is the number of table
// entries of row s. Fills info (max pages, max length) when given.
template <class Capacity>
void check_values(const std::string& op, const std::string& pre, std::int64_t page_size, std::int64_t pages,
                  std::int64_t num_seqs, std::int64_t queries, const IntReader& tables, Capacity&& capacity,
                  const IntReader& lengths, const IntReader& seq, const IntReader& pos, PagedScheduleInfo* info) {
  const std::string p = op + ": " + pre;
  for (std::int64_t s = 0; s < num_seqs; ++s) {
    const std::int64_t len = lengths(s);
    if (len < 0 || len > kInt32Max)
      fail(ErrorKind::value, p + "lengths[" + str(s) + "] = " + str(len) + ": expected a length in [0, 2^31 - 1]");
    const std::int64_t cap = capacity(s);
    const std::int64_t need = (len + page_size - 1) / page_size;
    if (need > cap)
      fail(ErrorKind::shape, p + "lengths[" + str(s) + "] = " + str(len) + " needs " + str(need) +
                                 " pages of page_size " + str(page_size) + ", but " + pre + "tables[" + str(s) +
                                 "] holds " + str(cap) + " (capacity " + str(cap * page_size) + ")");
    for (std::int64_t j = 0; j < need; ++j) {
      const std::int64_t id = tables(s, j);
      if (id < 0 || id >= pages)
        fail(ErrorKind::value, p + "tables[" + str(s) + "][" + str(j) + "] = " + str(id) +
                                   (id < 0 ? " < 0" : " >= pages = " + str(pages)));
    }
    if (info) {
      info->max_pages = std::max(info->max_pages, need);
      info->max_length = std::max(info->max_length, len);
    }
  }
  for (std::int64_t r = 0; r < queries; ++r) {
    const std::int64_t s = seq(r);
    if (s < 0 || s >= num_seqs)
      fail(ErrorKind::value, p + "sequence_ids[" + str(r) + "] = " + str(s) +
                                 (s < 0 ? " < 0" : " >= num_seqs = " + str(num_seqs)));
    const std::int64_t t = pos(r);
    if (t < 0)
      fail(ErrorKind::value, p + "positions[" + str(r) + "] = " + str(t) + " < 0");
    if (t >= lengths(s))
      fail(ErrorKind::value, p + "positions[" + str(r) + "] = " + str(t) + " >= " + pre + "lengths[" + str(s) +
                                 "] = " + str(lengths(s)) + " (the length of sequence " + pre + "sequence_ids[" +
                                 str(r) + "] = " + str(s) + ")");
  }
}

Schedule schedule_of(const PagedMetadata& m) {
  Schedule s;
  s.page_size = m.page_size;
  s.num_seqs = m.lengths.shape[0];
  s.queries = m.positions.shape[0];
  s.width = m.tables.shape[1];
  s.tables = m.tables.ptr<const std::int32_t>();
  s.lengths = m.lengths.ptr<const std::int32_t>();
  s.sequence_ids = m.sequence_ids.ptr<const std::int32_t>();
  s.positions = m.positions.ptr<const std::int32_t>();
  s.table_s = m.tables.strides[0];
  s.table_j = m.tables.strides[1];
  s.length_s = m.lengths.strides[0];
  s.seq_s = m.sequence_ids.strides[0];
  s.pos_s = m.positions.strides[0];
  return s;
}

// A packed [rows, heads, dim] operand.
RowStrides check_rows(const Tensor& t, const Tensor& q, std::int64_t rows, std::int64_t heads, std::int64_t dim,
                      const std::string& name, const char* layout, const char* q_name = "q") {
  core::expect_same_device(t, q, name, q_name);
  core::expect_dtype_of(t, q, name, q_name);
  if (t.rank != 3)
    fail(ErrorKind::shape, name + ": expected rank 3 " + layout + ", got shape " + t.shape_str());
  core::expect_shape(t, {rows, heads, dim}, name, layout);
  core::expect_last_dim_contiguous(t, name);
  core::expect_data(t, name);
  return RowStrides{t.strides[0], t.strides[1]};
}

// A cache [pages, page_size, heads, dim]; returns its strides and sets pages / heads / dim.
CacheStrides check_cache(const Tensor& t, const Tensor& q, std::int64_t page_size, const std::string& name,
                         const char* layout, std::int64_t& pages, std::int64_t& heads, std::int64_t& dim,
                         const char* q_name = "q") {
  core::expect_same_device(t, q, name, q_name);
  core::expect_dtype_of(t, q, name, q_name);
  if (t.rank != 4)
    fail(ErrorKind::shape, name + ": expected rank 4 " + layout + ", got shape " + t.shape_str());
  if (t.shape[1] != page_size)
    fail(ErrorKind::shape, name + ": expected page_size = " + str(page_size) + " slots per page (axis 1, the plan's "
                               "page_size), got shape " + t.shape_str());
  core::expect_last_dim_contiguous(t, name);
  core::expect_data(t, name);
  pages = t.shape[0];
  heads = t.shape[2];
  dim = t.shape[3];
  return CacheStrides{t.strides[0], t.strides[1], t.strides[2]};
}

void check_dim(std::int64_t v, std::int64_t hi, const std::string& name, const std::string& what, const Tensor& t) {
  if (v < 1 || v > hi)
    fail(ErrorKind::shape, name + ": the " + what + " (last axis) must be in 1.." + str(hi) + ", got shape " +
                               t.shape_str());
}

// out (forward), or dout (backward: an input, which may be expanded).
void check_outputs(Problem& p, const Tensor& q, const Tensor& out, const Tensor* lse, const std::string& op,
                   bool backward) {
  const std::string name = op + (backward ? ": dout" : ": out");
  p.out_at = check_rows(out, q, p.sched.queries, p.hq, p.dv, name,
                        p.mla ? "[queries, H, R] (q's dtype)" : "[queries, Hq, Dv] (q's dtype)");
  p.out = out.data;
  if (lse) {
    core::expect_same_device(*lse, q, op + ": lse", "q");
    core::expect_dtype(*lse, DType::f32, op + ": lse");
    core::expect_shape(*lse, {p.sched.queries, p.hq}, op + ": lse", "([queries, heads])");
    core::expect_data(*lse, op + ": lse");
    p.lse = lse->ptr<float>();
    p.lse_at = RowStrides{lse->strides[0], lse->strides[1]};
  }
}

void check_scale(Problem& p, double scale, const std::string& op) {
  core::expect_positive_finite(scale, op + ": scale");
  p.scale = float(scale);
  if (!(p.scale > 0 && std::isfinite(p.scale)))
    fail(ErrorKind::value, op + ": scale: expected a value > 0 that float32 represents, got " + std::to_string(scale));
}

void check_splits(Problem& p, int splits, const Tensor* workspace, const Tensor& q, const std::string& op) {
  if (splits == 1) {
    p.splits = 1;
    return;
  }
  const std::size_t need = paged_split_workspace_bytes(p.sched.queries, p.hq, p.dv, splits);
  if (workspace == nullptr)
    fail(ErrorKind::value, op + ": workspace: splits = " + std::to_string(splits) + " needs a split workspace of " +
                               std::to_string(need) + " bytes (SplitWorkspace), got none");
  core::expect_same_device(*workspace, q, op + ": workspace", "q");
  core::expect_dtype(*workspace, DType::u8, op + ": workspace");
  if (!workspace->is_contiguous())
    fail(ErrorKind::shape, op + ": workspace: expected a contiguous array");
  if (std::size_t(workspace->numel()) < need)
    fail(ErrorKind::value, op + ": workspace: expected at least " + std::to_string(need) + " bytes for " +
                               std::to_string(splits) + " splits of " + shape_str_rows(p) + ", got " +
                               std::to_string(workspace->numel()));
  p.splits = splits;
}

PagedScheduleInfo validate_schedule_values(const PagedScheduleArgs& a, const std::string& op) {
  if (a.page_size < 1 || a.page_size > kInt32Max)
    fail(ErrorKind::value, op + ": page_size: expected an integer in [1, 2^31 - 1], got " + str(a.page_size));
  if (a.pages < 0 || a.pages > kInt32Max)
    fail(ErrorKind::value, op + ": pages: expected an integer in [0, 2^31 - 1], got " + str(a.pages));
  const std::pair<const Tensor*, const char*> arrays[] = {
      {&a.tables, "tables"}, {&a.lengths, "lengths"}, {&a.sequence_ids, "sequence_ids"}, {&a.positions, "positions"}};
  for (const auto& [t, name] : arrays) expect_host_integer(*t, op + ": " + name);
  expect_rank(a.tables, 2, op + ": tables", "[num_seqs, max_pages] (or a list of per-sequence page lists)");
  expect_rank(a.lengths, 1, op + ": lengths", "[num_seqs]");
  expect_rank(a.sequence_ids, 1, op + ": sequence_ids", "[queries]");
  expect_rank(a.positions, 1, op + ": positions", "[queries]");
  const std::int64_t num_seqs = a.tables.shape[0], width = a.tables.shape[1], queries = a.sequence_ids.shape[0];
  if (a.lengths.shape[0] != num_seqs)
    fail(ErrorKind::shape, op + ": lengths: expected one length per sequence of tables ([" + str(num_seqs) +
                               "]), got shape " + a.lengths.shape_str());
  if (a.positions.shape[0] != queries)
    fail(ErrorKind::shape, op + ": positions: expected one position per query row of sequence_ids ([" + str(queries) +
                               "]), got shape " + a.positions.shape_str());
  if (queries > kInt32Max || num_seqs > kInt32Max)
    fail(ErrorKind::value, op + ": at most 2^31 - 1 queries and sequences, got " + str(queries) + " and " +
                               str(num_seqs));
  IntReader sizes;
  if (a.table_sizes) {
    expect_host_integer(*a.table_sizes, op + ": table_sizes");
    expect_rank(*a.table_sizes, 1, op + ": table_sizes", "[num_seqs]");
    if (a.table_sizes->shape[0] != num_seqs)
      fail(ErrorKind::shape, op + ": table_sizes: expected shape [" + str(num_seqs) + "], got " +
                                 a.table_sizes->shape_str());
    sizes = reader(*a.table_sizes);
    for (std::int64_t s = 0; s < num_seqs; ++s)
      if (sizes(s) < 0 || sizes(s) > width)
        fail(ErrorKind::value, op + ": table_sizes[" + str(s) + "] = " + str(sizes(s)) + ": expected a size in [0, " +
                                   str(width) + "]");
  }
  PagedScheduleInfo info;
  info.num_seqs = num_seqs;
  info.queries = queries;
  auto capacity = [&](std::int64_t s) { return a.table_sizes ? sizes(s) : width; };
  check_values(op, "", a.page_size, a.pages, num_seqs, queries, reader(a.tables), capacity, reader(a.lengths),
               reader(a.sequence_ids), reader(a.positions), &info);
  return info;
}

}  // namespace

}  // namespace rudnn::paged

namespace rudnn {

using core::fail;
using paged::str;

PagedScheduleInfo paged_validate_schedule(const PagedScheduleArgs& a, const std::string& op) {
  PagedScheduleInfo info = paged::validate_schedule_values(a, op);
  const paged::IntReader tables = paged::reader(a.tables), seq = paged::reader(a.sequence_ids), pos = paged::reader(a.positions);
  paged::first_duplicate(info.queries, a.page_size, seq, pos, tables, info.duplicate_row, info.duplicate_of,
                         info.duplicate_message);
  return info;
}

PagedScheduleInfo paged_pack_schedule(const PagedScheduleArgs& a, const PagedMetadata& out) {
  using paged::IntReader;
  using paged::reader;
  const std::string op = "HostPlan";
  PagedScheduleInfo info = paged_validate_schedule(a, op);
  const std::pair<const Tensor*, const char*> outs[] = {{&out.tables, "tables (packed)"},
                                                        {&out.lengths, "lengths (packed)"},
                                                        {&out.sequence_ids, "sequence_ids (packed)"},
                                                        {&out.positions, "positions (packed)"}};
  for (const auto& [t, name] : outs) {
    if (t->device.is_cuda()) fail(ErrorKind::device, op + ": " + name + ": expected a host array");
    core::expect_dtype(*t, DType::i32, op + ": " + name);
    core::expect_data(*t, op + ": " + name);
  }
  if (out.tables.rank != 2 || out.tables.shape[0] < info.num_seqs || out.tables.shape[1] < info.max_pages)
    fail(ErrorKind::shape, op + ": tables (packed): expected at least [" + str(info.num_seqs) + ", " +
                               str(info.max_pages) + "], got " + out.tables.shape_str());
  if (out.lengths.rank != 1 || out.lengths.shape[0] < info.num_seqs)
    fail(ErrorKind::shape, op + ": lengths (packed): expected at least [" + str(info.num_seqs) + "], got " +
                               out.lengths.shape_str());
  if (out.sequence_ids.rank != 1 || out.sequence_ids.shape[0] < info.queries || out.positions.rank != 1 ||
      out.positions.shape[0] < info.queries)
    fail(ErrorKind::shape, op + ": sequence_ids/positions (packed): expected at least [" + str(info.queries) + "]");
  const IntReader tables = reader(a.tables), lengths = reader(a.lengths), seq = reader(a.sequence_ids),
                  pos = reader(a.positions);
  std::int32_t* T = out.tables.ptr<std::int32_t>();
  const std::int64_t ts = out.tables.strides[0], tj = out.tables.strides[1];
  for (std::int64_t s = 0; s < out.tables.shape[0]; ++s) {
    const std::int64_t len = s < info.num_seqs ? lengths(s) : 0;
    const std::int64_t need = (len + a.page_size - 1) / a.page_size;
    for (std::int64_t j = 0; j < out.tables.shape[1]; ++j) T[s * ts + j * tj] = j < need ? std::int32_t(tables(s, j)) : 0;
  }
  for (std::int64_t s = 0; s < out.lengths.shape[0]; ++s)
    out.lengths.ptr<std::int32_t>()[s * out.lengths.strides[0]] = s < info.num_seqs ? std::int32_t(lengths(s)) : 0;
  for (std::int64_t r = 0; r < out.sequence_ids.shape[0]; ++r)
    out.sequence_ids.ptr<std::int32_t>()[r * out.sequence_ids.strides[0]] = r < info.queries ? std::int32_t(seq(r)) : 0;
  for (std::int64_t r = 0; r < out.positions.shape[0]; ++r)
    out.positions.ptr<std::int32_t>()[r * out.positions.strides[0]] = r < info.queries ? std::int32_t(pos(r)) : 0;
  return info;
}

std::size_t paged_split_workspace_bytes(std::int64_t queries, std::int64_t heads, std::int64_t value_dim, int splits) {
  const std::string op = "SplitWorkspace";
  if (splits < 2 || splits > 32)
    fail(ErrorKind::value, op + ": splits: expected an integer in 2..32, got " + std::to_string(splits));
  if (queries < 0 || heads < 1 || value_dim < 1)
    fail(ErrorKind::value, op + ": expected queries >= 0, heads >= 1 and value_dim >= 1, got " + str(queries) + ", " +
                               str(heads) + ", " + str(value_dim));
  // float32 partial out [splits, queries, heads, value_dim] and lse [splits, queries, heads].
  const std::int64_t rows = core::checked_mul(core::checked_mul(queries, heads, op + ": size"), splits, op + ": size");
  const std::int64_t floats = core::checked_mul(rows, core::checked_add(value_dim, 1, op + ": size"), op + ": size");
  const std::int64_t bytes = core::checked_mul(floats, 4, op + ": size");
  if (std::size_t(bytes) > paged::kSplitCap)
    fail(ErrorKind::value, op + ": " + std::to_string(splits) + " splits of " + str(queries) + " queries x " +
                               str(heads) + " heads x " + str(value_dim) + " values need " + str(bytes) +
                               " bytes, above the 64 MiB cap of a split workspace (use fewer splits)");
  return std::size_t(bytes);
}

namespace {

// The ordered workspace's reader entries of a host schedule: for every query row r, one entry per
// page j < ceil(length / page_size) of its sequence, bucketed by physical page; within a page the
// entries that see it under causal masking (positions[r] >= j * page_size) come first, each group
// in (row, j) order.
struct ReaderIndex {
  std::vector<std::int64_t> start, causal_end;  // per physical page: [start, causal_end) visible, then to start[pg+1]
  std::vector<std::int32_t> row, index;
  std::vector<char> active;  // per physical page: read by a sequence that has query rows
};

ReaderIndex reader_index(const PagedScheduleArgs& a, const PagedScheduleInfo& info) {
  const paged::IntReader tables = paged::reader(a.tables), lengths = paged::reader(a.lengths),
                         seq = paged::reader(a.sequence_ids), pos = paged::reader(a.positions);
  const std::int64_t ps = a.page_size;
  auto pages_of = [&](std::int64_t s) { return (lengths(s) + ps - 1) / ps; };
  ReaderIndex x;
  x.active.assign(std::size_t(a.pages), 0);
  std::vector<std::int64_t> visible(std::size_t(a.pages) + 1, 0), total(std::size_t(a.pages) + 1, 0);
  for (std::int64_t r = 0; r < info.queries; ++r) {
    const std::int64_t s = seq(r);
    for (std::int64_t j = 0; j < pages_of(s); ++j) {
      const std::int64_t pg = tables(s, j);
      x.active[std::size_t(pg)] = 1;
      ++total[std::size_t(pg) + 1];
      if (pos(r) >= j * ps) ++visible[std::size_t(pg) + 1];
    }
  }
  x.start.assign(std::size_t(a.pages) + 1, 0);
  x.causal_end.assign(std::size_t(a.pages), 0);
  for (std::int64_t pg = 0; pg < a.pages; ++pg) {
    x.start[std::size_t(pg) + 1] = x.start[std::size_t(pg)] + total[std::size_t(pg) + 1];
    x.causal_end[std::size_t(pg)] = x.start[std::size_t(pg)] + visible[std::size_t(pg) + 1];
  }
  const std::int64_t n = x.start.back();
  x.row.assign(std::size_t(n), 0);
  x.index.assign(std::size_t(n), 0);
  std::vector<std::int64_t> next_visible(x.start.begin(), x.start.end() - 1), next_hidden(x.causal_end);
  for (std::int64_t r = 0; r < info.queries; ++r) {
    const std::int64_t s = seq(r);
    for (std::int64_t j = 0; j < pages_of(s); ++j) {
      const std::size_t pg = std::size_t(tables(s, j));
      const std::int64_t at = pos(r) >= j * ps ? next_visible[pg]++ : next_hidden[pg]++;
      x.row[std::size_t(at)] = std::int32_t(r);
      x.index[std::size_t(at)] = std::int32_t(j);
    }
  }
  return x;
}

constexpr std::size_t kOrderedBudget = std::size_t(64) << 20;

bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (!v || std::string(v).empty() || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  fail(ErrorKind::value, std::string("OrderedBackwardWorkspace: ") + name + "=" + v +
                             ": expected unset, 0 (off) or 1 (on)");
}

}  // namespace

void paged_ordered_env(bool& cache_rows, bool& compact_history) {
  cache_rows = env_switch("RUDNN_PAGED_ORDERED_CACHE_ROWS");
  compact_history = env_switch("RUDNN_PAGED_ORDERED_COMPACT_HISTORY");
}

PagedOrderedLayout paged_ordered_layout(const PagedScheduleArgs& a, std::int64_t heads,
                                        const PagedOrderedOptions& options) {
  const std::string op = "OrderedBackwardWorkspace";
  const PagedScheduleInfo info = paged_validate_schedule(a, op);
  if (heads < 1) fail(ErrorKind::shape, op + ": q: expected at least one head, got " + str(heads));
  const paged::IntReader lengths = paged::reader(a.lengths), seq = paged::reader(a.sequence_ids);
  PagedOrderedLayout l;
  l.options = options;
  l.queries = info.queries;
  l.heads = heads;
  l.pages = a.pages;
  l.page_size = a.page_size;
  std::vector<char> active(std::size_t(a.pages), 0);
  const paged::IntReader tables = paged::reader(a.tables);
  for (std::int64_t r = 0; r < info.queries; ++r) {
    const std::int64_t s = seq(r), len = lengths(s), n = (len + a.page_size - 1) / a.page_size;
    l.readers = core::checked_add(l.readers, n, op + ": size");
    l.cached = core::checked_add(l.cached, len, op + ": size");
    for (std::int64_t j = 0; j < n; ++j) active[std::size_t(tables(s, j))] = 1;
  }
  const std::int64_t act = std::int64_t(std::count(active.begin(), active.end(), 1));
  l.listed = options.history_compaction ? act : a.pages;
  l.inactive = a.pages - l.listed;
  if (!options.history_row_cache) l.cached = 0;
  // In bytes, overflow-checked part by part (the offsets below are then safe).
  const std::int64_t index = core::checked_mul(
      core::checked_add(core::checked_add(3 * l.listed + 1, 2 * l.readers, op + ": size"),
                        l.inactive + (options.history_row_cache ? l.queries + 1 : 0), op + ": size"),
      4, op + ": size");
  const std::int64_t stats = core::checked_mul(core::checked_mul(l.queries, heads, op + ": size"), 8, op + ": size");
  const std::int64_t cache = core::checked_mul(core::checked_mul(l.cached, heads, op + ": size"), 8, op + ": size");
  const std::int64_t bytes = core::checked_add(core::checked_add(index, stats, op + ": size"), cache, op + ": size");
  if (std::size_t(bytes) > kOrderedBudget)
    fail(ErrorKind::value, op + ": needs " + str(bytes) + " bytes (index " + str(index) + ", row statistics " +
                               str(stats) + ", history row cache " + str(cache) +
                               "), above the 64 MiB budget of an ordered workspace" +
                               (cache > 0 ? " (turn history_row_cache off)" : " (split the batch)"));
  l.bytes = std::size_t(bytes);
  return l;
}

void paged_ordered_pack(const PagedScheduleArgs& a, const PagedOrderedLayout& l, const Tensor& out) {
  const std::string op = "OrderedBackwardWorkspace";
  const PagedScheduleInfo info = paged_validate_schedule(a, op);
  if (out.device.is_cuda()) fail(ErrorKind::device, op + ": buffer: expected a host array");
  core::expect_dtype(out, DType::u8, op + ": buffer");
  if (out.rank != 1 || std::size_t(out.shape[0]) < l.bytes || out.strides[0] != 1)
    fail(ErrorKind::shape, op + ": buffer: expected a dense [" + std::to_string(l.bytes) + "] array, got " +
                               out.shape_str());
  if (info.queries != l.queries || a.pages != l.pages || a.page_size != l.page_size)
    fail(ErrorKind::value, op + ": the layout was made for another schedule");
  core::expect_data(out, op + ": buffer");
  const ReaderIndex x = reader_index(a, info);
  const paged::OrderedOffsets o = paged::ordered_offsets(l);
  auto* w = reinterpret_cast<std::int32_t*>(out.data);
  std::int64_t listed = 0, inactive = 0, entries = 0;
  w[o.page_start] = 0;
  for (std::int64_t pg = 0; pg < a.pages; ++pg) {
    const std::size_t p = std::size_t(pg);
    if (l.options.history_compaction && !x.active[p]) {
      w[o.inactive_ids + inactive++] = std::int32_t(pg);
      continue;
    }
    w[o.listed_ids + listed] = std::int32_t(pg);
    for (std::int64_t e = x.start[p]; e < x.start[p + 1]; ++e, ++entries) {
      w[o.entry_row + entries] = x.row[std::size_t(e)];
      w[o.entry_index + entries] = x.index[std::size_t(e)];
    }
    w[o.causal_end + listed] = std::int32_t(entries - (x.start[p + 1] - x.causal_end[p]));
    w[o.page_start + ++listed] = std::int32_t(entries);
  }
  if (listed != l.listed || inactive != l.inactive || entries != l.readers)
    fail(ErrorKind::value, op + ": the layout was made for another schedule");
  if (l.options.history_row_cache) {
    const paged::IntReader lengths = paged::reader(a.lengths), seq = paged::reader(a.sequence_ids);
    std::int64_t at = 0;
    for (std::int64_t r = 0; r < l.queries; ++r) {
      w[o.row_start + r] = std::int32_t(at);
      at += lengths(seq(r));
    }
    w[o.row_start + l.queries] = std::int32_t(at);
  }
}

}  // namespace rudnn

namespace rudnn::paged {

Schedule check_metadata(const PagedMetadata& m, const Tensor& q, std::int64_t pages, const std::string& op,
                        const char* q_name) {
  const std::pair<const Tensor*, const char*> arrays[] = {{&m.tables, "plan.tables"},
                                                          {&m.lengths, "plan.lengths"},
                                                          {&m.sequence_ids, "plan.sequence_ids"},
                                                          {&m.positions, "plan.positions"}};
  for (const auto& [t, name] : arrays) {
    core::expect_same_device(*t, q, op + ": " + name, q_name);
    core::expect_dtype(*t, DType::i32, op + ": " + name);
  }
  if (m.page_size < 1 || m.page_size > kInt32Max)
    fail(ErrorKind::value, op + ": plan.page_size: expected an integer in [1, 2^31 - 1], got " + str(m.page_size));
  expect_rank(m.tables, 2, op + ": plan.tables", "[num_seqs, max_pages]");
  expect_rank(m.lengths, 1, op + ": plan.lengths", "[num_seqs]");
  expect_rank(m.sequence_ids, 1, op + ": plan.sequence_ids", "[queries]");
  expect_rank(m.positions, 1, op + ": plan.positions", "[queries]");
  if (m.lengths.shape[0] != m.tables.shape[0])
    fail(ErrorKind::shape, op + ": plan.lengths: expected shape [" + str(m.tables.shape[0]) + "] (one per row of "
                               "plan.tables), got " + m.lengths.shape_str());
  if (m.sequence_ids.shape[0] != m.positions.shape[0])
    fail(ErrorKind::shape, op + ": plan.sequence_ids: expected the shape of plan.positions " +
                               m.positions.shape_str() + ", got " + m.sequence_ids.shape_str());
  if (q.rank >= 1 && q.shape[0] != m.positions.shape[0])
    fail(ErrorKind::shape, op + ": " + q_name + ": expected " + str(m.positions.shape[0]) +
                               " query rows (the plan's queries) on axis 0, got shape " + q.shape_str());
  Schedule s = schedule_of(m);
  if (!q.device.is_cuda()) {  // on the host the values are checked again (cheap): no read outside a cache
    const std::int64_t width = s.width;
    check_values(op, "plan.", m.page_size, pages, s.num_seqs, s.queries, reader(m.tables),
                 [width](std::int64_t) { return width; }, reader(m.lengths), reader(m.sequence_ids),
                 reader(m.positions), nullptr);
  }
  return s;
}

namespace {

// The checks attention and MLA share once their operands are known.
Problem check_common(const PagedMetadata& plan, const Tensor& q, std::int64_t pages, const std::string& op) {
  core::expect_float(q, op + ": q");
  if (q.rank != 3) fail(ErrorKind::shape, op + ": q: expected rank 3 [queries, heads, dim], got shape " + q.shape_str());
  Problem p;
  p.pages = pages;
  p.sched = check_metadata(plan, q, pages, op);
  p.dtype = q.dtype;
  return p;
}

}  // namespace

Problem validate_attention(const PagedAttentionArgs& a, const Tensor* workspace, const std::string& op,
                           bool backward) {
  core::expect_float(a.q, op + ": q");
  if (a.q.rank != 3)
    fail(ErrorKind::shape, op + ": q: expected rank 3 [queries, Hq, D], got shape " + a.q.shape_str());
  std::int64_t pages = 0, hkv = 0, d = 0, pages_v = 0, hkv_v = 0, dv = 0;
  const CacheStrides k_at = check_cache(a.k_cache, a.q, a.plan.page_size, op + ": k_cache",
                                        "[pages, page_size, Hkv, D]", pages, hkv, d);
  const CacheStrides v_at = check_cache(a.v_cache, a.q, a.plan.page_size, op + ": v_cache",
                                        "[pages, page_size, Hkv, Dv]", pages_v, hkv_v, dv);
  if (pages_v != pages || hkv_v != hkv)
    fail(ErrorKind::shape, op + ": v_cache: expected " + str(pages) + " pages and Hkv = " + str(hkv) +
                               " heads (like k_cache " + a.k_cache.shape_str() + "), got shape " + a.v_cache.shape_str());
  Problem p = check_common(a.plan, a.q, pages, op);
  p.hq = a.q.shape[1];
  p.hkv = hkv;
  p.d = a.q.shape[2];
  p.dv = dv;
  check_dim(p.d, kMaxDim, op + ": q", "head dim D", a.q);
  check_dim(dv, kMaxDim, op + ": v_cache", "head dim Dv", a.v_cache);
  if (d != p.d)
    fail(ErrorKind::shape, op + ": k_cache: expected head dim D = " + str(p.d) + " (the last axis of q), got shape " +
                               a.k_cache.shape_str());
  if (hkv < 1) fail(ErrorKind::shape, op + ": k_cache: expected at least one key/value head, got shape " +
                                          a.k_cache.shape_str());
  if (p.hq % hkv != 0)
    fail(ErrorKind::shape, op + ": the number of query heads Hq = " + str(p.hq) +
                               " must be a multiple of the number of key/value heads Hkv = " + str(hkv));
  p.group = p.hq / hkv;
  core::expect_last_dim_contiguous(a.q, op + ": q");
  core::expect_data(a.q, op + ": q");
  p.q = a.q.data;
  p.k = a.k_cache.data;
  p.v = a.v_cache.data;
  p.q_at = RowStrides{a.q.strides[0], a.q.strides[1]};
  p.k_at = k_at;
  p.v_at = v_at;
  check_scale(p, a.scale, op);
  p.causal = a.causal;
  check_outputs(p, a.q, a.out, a.lse, op, backward);
  check_splits(p, a.splits, workspace, a.q, op);
  if (!backward)
    core::expect_outputs_apart({{a.out, op + ": out"}, {a.lse, op + ": lse"}, {workspace, op + ": workspace"}},
                               {{a.q, op + ": q"}, {a.k_cache, op + ": k_cache"}, {a.v_cache, op + ": v_cache"}});
  return p;
}

Problem validate_mla(const PagedMlaArgs& a, const Tensor* workspace, const std::string& op, bool backward) {
  core::expect_float(a.q, op + ": q");
  if (a.q.rank != 3)
    fail(ErrorKind::shape, op + ": q: expected rank 3 [queries, H, R], got shape " + a.q.shape_str());
  std::int64_t pages = 0, one = 0, r = 0, pages_p = 0, one_p = 0, pd = 0;
  const CacheStrides l_at = check_cache(a.latent, a.q, a.plan.page_size, op + ": latent", "[pages, page_size, 1, R]",
                                        pages, one, r);
  const CacheStrides kp_at = check_cache(a.kp, a.q, a.plan.page_size, op + ": kp", "[pages, page_size, 1, P]",
                                         pages_p, one_p, pd);
  if (one != 1) fail(ErrorKind::shape, op + ": latent: expected one shared head on axis 2 [pages, page_size, 1, R], "
                                            "got shape " + a.latent.shape_str());
  if (one_p != 1 || pages_p != pages)
    fail(ErrorKind::shape, op + ": kp: expected shape [" + str(pages) + ", " + str(a.plan.page_size) +
                               ", 1, P] (the pages of latent, one head), got " + a.kp.shape_str());
  Problem p = check_common(a.plan, a.q, pages, op);
  p.mla = true;
  p.hq = a.q.shape[1];
  p.hkv = 1;
  p.group = p.hq;
  p.d = a.q.shape[2];
  p.dv = p.d;
  check_dim(p.d, kMaxDim, op + ": q", "latent dim R", a.q);
  if (p.hq < 1) fail(ErrorKind::shape, op + ": q: expected at least one head, got shape " + a.q.shape_str());
  if (r != p.d)
    fail(ErrorKind::shape, op + ": latent: expected latent dim R = " + str(p.d) + " (the last axis of q), got shape " +
                               a.latent.shape_str());
  check_dim(pd, kMaxRotary, op + ": kp", "rotary dim P", a.kp);
  p.d2 = pd;
  const RowStrides qp_at = check_rows(a.qp, a.q, p.sched.queries, p.hq, pd, op + ": qp", "[queries, H, P]");
  core::expect_last_dim_contiguous(a.q, op + ": q");
  core::expect_data(a.q, op + ": q");
  p.q = a.q.data;
  p.k = a.latent.data;
  p.v = a.latent.data;
  p.q2 = a.qp.data;
  p.k2 = a.kp.data;
  p.q_at = RowStrides{a.q.strides[0], a.q.strides[1]};
  p.q2_at = qp_at;
  p.k_at = l_at;
  p.v_at = l_at;
  p.k2_at = kp_at;
  check_scale(p, a.scale, op);
  p.causal = a.causal;
  check_outputs(p, a.q, a.out, a.lse, op, backward);
  check_splits(p, a.splits, workspace, a.q, op);
  if (!backward)
    core::expect_outputs_apart({{a.out, op + ": out"}, {a.lse, op + ": lse"}, {workspace, op + ": workspace"}},
                               {{a.q, op + ": q"}, {a.qp, op + ": qp"}, {a.latent, op + ": latent"},
                                {a.kp, op + ": kp"}});
  return p;
}

namespace {

// An optional gradient output shaped and typed like its operand.
void check_grad(const Tensor* g, const Tensor& like, const Tensor& q, const std::string& name,
                const std::string& like_name) {
  if (!g) return;
  core::expect_same_device(*g, q, name, "q");
  core::expect_dtype_of(*g, like, name, like_name);
  core::expect_same_shape(*g, like, name, like_name);
  core::expect_last_dim_contiguous(*g, name);
  core::expect_data(*g, name);
}

void check_dlse(BackwardProblem& b, const Tensor* dlse, const Tensor& q, const std::string& op) {
  if (!dlse) return;
  const std::string name = op + ": dlse";
  core::expect_same_device(*dlse, q, name, "q");
  core::expect_dtype(*dlse, DType::f32, name);
  core::expect_shape(*dlse, {b.fwd.sched.queries, b.fwd.hq}, name, "([queries, heads], like lse)");
  core::expect_data(*dlse, name);
  b.dlse = dlse->ptr<const float>();
  b.dlse_at = RowStrides{dlse->strides[0], dlse->strides[1]};
}

RowStrides rows_of(const Tensor* g) { return g ? RowStrides{g->strides[0], g->strides[1]} : RowStrides{}; }
CacheStrides cache_of(const Tensor* g) {
  return g ? CacheStrides{g->strides[0], g->strides[1], g->strides[2]} : CacheStrides{};
}

// The ordered workspace of a backward call: its layout must be the call's (queries, heads, pages,
// page size), its buffer uint8 of layout.bytes on q's device. On the host the index values are
// checked too (on a device the kernels bound every index they read), so a scribbled buffer is an
// error, never a read outside an operand.
void check_ordered(BackwardProblem& b, const PagedOrderedWorkspace* w, const Tensor& q, const std::string& op) {
  if (!w) return;
  const std::string name = op + ": workspace";
  const PagedOrderedLayout& l = w->layout;
  const Problem& p = b.fwd;
  core::expect_same_device(w->buffer, q, name, "q");
  core::expect_dtype(w->buffer, DType::u8, name);
  if (l.queries != p.sched.queries || l.heads != p.hq || l.pages != p.pages || l.page_size != p.sched.page_size)
    fail(ErrorKind::shape, name + ": made for " + str(l.queries) + " queries x " + str(l.heads) + " heads over " +
                               str(l.pages) + " pages of page_size " + str(l.page_size) + ", the call has " +
                               str(p.sched.queries) + " queries x " + str(p.hq) + " heads over " + str(p.pages) +
                               " pages of page_size " + str(p.sched.page_size) +
                               " (an OrderedBackwardWorkspace serves the plan and heads it was made for)");
  const OrderedOffsets o = ordered_offsets(l);
  if (l.listed < 0 || l.inactive < 0 || l.listed + l.inactive != l.pages || l.readers < 0 || l.cached < 0 ||
      std::size_t(o.words) * 4 != l.bytes)
    fail(ErrorKind::value, name + ": an inconsistent layout (make it with paged_ordered_layout)");
  if (w->buffer.rank != 1 || std::size_t(w->buffer.shape[0]) != l.bytes || w->buffer.strides[0] != 1)
    fail(ErrorKind::shape, name + ": expected a dense buffer of " + std::to_string(l.bytes) + " bytes, got shape " +
                               w->buffer.shape_str());
  core::expect_data(w->buffer, name);
  auto* words = reinterpret_cast<std::int32_t*>(w->buffer.data);
  Ordered& d = b.order;
  d.listed = l.listed;
  d.inactive = l.inactive;
  d.cached = l.cached;
  d.pruning = l.options.query_pruning;
  d.row_cache = l.options.history_row_cache;
  d.listed_ids = words + o.listed_ids;
  d.page_start = words + o.page_start;
  d.causal_end = words + o.causal_end;
  d.entry_row = words + o.entry_row;
  d.entry_index = words + o.entry_index;
  d.inactive_ids = words + o.inactive_ids;
  d.row_start = d.row_cache ? words + o.row_start : nullptr;
  d.stats = reinterpret_cast<float*>(words + o.stats);
  d.cache = d.row_cache ? reinterpret_cast<float*>(words + o.cache) : nullptr;
  b.ordered = true;
  if (q.device.is_cuda()) return;
  auto bad = [&](const std::string& what) {
    fail(ErrorKind::value, name + ": its index is corrupted (" + what + "); make the workspace again");
  };
  std::vector<char> seen(std::size_t(l.pages), 0);
  auto mark = [&](std::int32_t pg) {
    if (pg < 0 || pg >= l.pages || seen[std::size_t(pg)]) bad("page id " + str(pg));
    seen[std::size_t(pg)] = 1;
  };
  for (std::int64_t i = 0; i < l.listed; ++i) mark(d.listed_ids[i]);
  for (std::int64_t i = 0; i < l.inactive; ++i) mark(d.inactive_ids[i]);
  if (d.page_start[0] != 0 || d.page_start[l.listed] != l.readers) bad("reader ranges");
  for (std::int64_t i = 0; i < l.listed; ++i)
    if (d.page_start[i + 1] < d.page_start[i] || d.causal_end[i] < d.page_start[i] ||
        d.causal_end[i] > d.page_start[i + 1])
      bad("reader range of listed page " + str(i));
  for (std::int64_t e = 0; e < l.readers; ++e)
    if (d.entry_row[e] < 0 || d.entry_row[e] >= l.queries || d.entry_index[e] < 0 || d.entry_index[e] >= p.sched.width)
      bad("reader entry " + str(e));
  if (d.row_cache) {
    if (d.row_start[0] != 0 || d.row_start[l.queries] > l.cached) bad("row cache starts");
    for (std::int64_t r = 0; r < l.queries; ++r) {
      std::int64_t seq = 0;
      p.visible(r, seq);
      if (d.row_start[r + 1] - d.row_start[r] < p.sched.length(seq)) bad("row cache start of row " + str(r));
    }
  }
}

}  // namespace

BackwardProblem validate_attention_backward(const PagedAttentionBackwardArgs& a) {
  const std::string op = "paged_attention_backward";
  PagedAttentionArgs f;
  f.plan = a.plan;
  f.q = a.q;
  f.k_cache = a.k_cache;
  f.v_cache = a.v_cache;
  f.scale = a.scale;
  f.causal = a.causal;
  f.out = a.dout;
  BackwardProblem b;
  b.fwd = validate_attention(f, nullptr, op, true);
  check_grad(a.dq, a.q, a.q, op + ": dq", "q");
  check_grad(a.dk_cache, a.k_cache, a.q, op + ": dk_cache", "k_cache");
  check_grad(a.dv_cache, a.v_cache, a.q, op + ": dv_cache", "v_cache");
  core::expect_outputs_apart({{a.dq, op + ": dq"}, {a.dk_cache, op + ": dk_cache"}, {a.dv_cache, op + ": dv_cache"}},
                             {{a.q, op + ": q"}, {a.k_cache, op + ": k_cache"}, {a.v_cache, op + ": v_cache"},
                              {a.dout, op + ": dout"}, {a.dlse, op + ": dlse"}});
  b.dq = a.dq ? a.dq->data : nullptr;
  b.dk = a.dk_cache ? a.dk_cache->data : nullptr;
  b.dv = a.dv_cache ? a.dv_cache->data : nullptr;
  b.dq_at = rows_of(a.dq);
  b.dk_at = cache_of(a.dk_cache);
  b.dv_at = cache_of(a.dv_cache);
  check_dlse(b, a.dlse, a.q, op);
  check_ordered(b, a.ordered, a.q, op);
  if (a.ordered)
    core::expect_outputs_apart({{&a.ordered->buffer, op + ": workspace"}},
                               {{a.dq, op + ": dq"}, {a.dk_cache, op + ": dk_cache"}, {a.dv_cache, op + ": dv_cache"},
                                {a.q, op + ": q"}, {a.k_cache, op + ": k_cache"}, {a.v_cache, op + ": v_cache"},
                                {a.dout, op + ": dout"}, {a.dlse, op + ": dlse"}});
  return b;
}

BackwardProblem validate_mla_backward(const PagedMlaBackwardArgs& a) {
  const std::string op = "paged_mla_backward";
  PagedMlaArgs f;
  f.plan = a.plan;
  f.q = a.q;
  f.qp = a.qp;
  f.latent = a.latent;
  f.kp = a.kp;
  f.scale = a.scale;
  f.causal = a.causal;
  f.out = a.dout;
  BackwardProblem b;
  b.fwd = validate_mla(f, nullptr, op, true);
  check_grad(a.dq, a.q, a.q, op + ": dq", "q");
  check_grad(a.dqp, a.qp, a.q, op + ": dqp", "qp");
  check_grad(a.dlatent, a.latent, a.q, op + ": dlatent", "latent");
  check_grad(a.dkp, a.kp, a.q, op + ": dkp", "kp");
  core::expect_outputs_apart({{a.dq, op + ": dq"}, {a.dqp, op + ": dqp"}, {a.dlatent, op + ": dlatent"},
                              {a.dkp, op + ": dkp"}},
                             {{a.q, op + ": q"}, {a.qp, op + ": qp"}, {a.latent, op + ": latent"}, {a.kp, op + ": kp"},
                              {a.dout, op + ": dout"}, {a.dlse, op + ": dlse"}});
  b.dq = a.dq ? a.dq->data : nullptr;
  b.dq2 = a.dqp ? a.dqp->data : nullptr;
  b.dk = a.dlatent ? a.dlatent->data : nullptr;
  b.dk2 = a.dkp ? a.dkp->data : nullptr;
  b.dq_at = rows_of(a.dq);
  b.dq2_at = rows_of(a.dqp);
  b.dk_at = cache_of(a.dlatent);
  b.dk2_at = cache_of(a.dkp);
  check_dlse(b, a.dlse, a.q, op);
  check_ordered(b, a.ordered, a.q, op);
  if (a.ordered)
    core::expect_outputs_apart({{&a.ordered->buffer, op + ": workspace"}},
                               {{a.dq, op + ": dq"}, {a.dqp, op + ": dqp"}, {a.dlatent, op + ": dlatent"},
                                {a.dkp, op + ": dkp"}, {a.q, op + ": q"}, {a.qp, op + ": qp"},
                                {a.latent, op + ": latent"}, {a.kp, op + ": kp"}, {a.dout, op + ": dout"},
                                {a.dlse, op + ": dlse"}});
  return b;
}

AppendProblem validate_append(const PagedAppendArgs& a) {
  const std::string op = "paged_append";
  core::expect_float(a.k, op + ": k");
  if (a.k.rank != 3) fail(ErrorKind::shape, op + ": k: expected rank 3 [queries, Hkv, D], got shape " + a.k.shape_str());
  AppendProblem p;
  std::int64_t pages = 0, hkv = 0, d = 0, pages_v = 0, hkv_v = 0, dv = 0;
  p.kc_at = check_cache(a.k_cache, a.k, a.plan.page_size, op + ": k_cache", "[pages, page_size, Hkv, D]", pages, hkv, d, "k");
  p.vc_at = check_cache(a.v_cache, a.k, a.plan.page_size, op + ": v_cache", "[pages, page_size, Hkv, Dv]", pages_v,
                        hkv_v, dv, "k");
  if (pages_v != pages || hkv_v != hkv)
    fail(ErrorKind::shape, op + ": v_cache: expected " + str(pages) + " pages and Hkv = " + str(hkv) +
                               " heads (like k_cache " + a.k_cache.shape_str() + "), got shape " + a.v_cache.shape_str());
  p.sched = check_metadata(a.plan, a.k, pages, op, "k");
  p.pages = pages;
  p.hkv = hkv;
  p.d = d;
  p.dv = dv;
  p.dtype = a.k.dtype;
  p.k_at = check_rows(a.k, a.k, p.sched.queries, hkv, d, op + ": k", "[queries, Hkv, D] (like k_cache)", "k");
  p.v_at = check_rows(a.v, a.k, p.sched.queries, hkv, dv, op + ": v", "[queries, Hkv, Dv] (like v_cache)", "k");
  if (a.k_cache.data == a.v_cache.data && a.k_cache.numel() > 0)
    fail(ErrorKind::value, op + ": v_cache: expected a cache apart from k_cache (the same memory was given twice)");
  core::expect_outputs_apart({{a.k_cache, op + ": k_cache"}, {a.v_cache, op + ": v_cache"}},
                             {{a.k, op + ": k"}, {a.v, op + ": v"}});
  if (!a.k.device.is_cuda()) {
    std::int64_t row = -1, of = -1;
    std::string message;
    find_duplicate_slot(p.sched, row, of, message);
    if (row >= 0) fail(ErrorKind::value, op + ": " + message + "; nothing was written");
  }
  return p;
}

void find_duplicate_slot(const Schedule& s, std::int64_t& row, std::int64_t& of, std::string& message) {
  first_duplicate(
      s.queries, s.page_size, [&](std::int64_t r) -> std::int64_t { return s.sequence(r); },
      [&](std::int64_t r) -> std::int64_t { return s.position(r); },
      [&](std::int64_t q, std::int64_t j) -> std::int64_t { return s.page(q, j); }, row, of, message);
}

}  // namespace rudnn::paged
