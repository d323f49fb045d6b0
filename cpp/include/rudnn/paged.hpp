// Paged KV-cache attention and MLA over physical pages (SPEC section 3), forward and append.
//
// A schedule maps sequences to pages. Sequence s (0 <= s < num_seqs) has KV length lengths[s];
// its KV position t lives in physical page tables[s][t / page_size], slot t % page_size. Packed
// query row r (0 <= r < queries) belongs to sequence sequence_ids[r] at absolute zero-based
// position positions[r] < lengths[sequence_ids[r]]. A page may appear in several tables (a
// shared prefix). Entries of tables[s] past ceil(lengths[s] / page_size) are ignored.
//
//   attention: q [queries, Hq, D], k_cache [pages, page_size, Hkv, D],
//              v_cache [pages, page_size, Hkv, Dv] -> out [queries, Hq, Dv]
//              score(r, h, t) = scale * q[r, h] . k[t, h / (Hq / Hkv)]
//   mla:       q [queries, H, R] (absorbed), qp [queries, H, P] (rotary),
//              latent [pages, page_size, 1, R], kp [pages, page_size, 1, P] -> out [queries, H, R]
//              score(r, h, t) = scale * (q[r, h] . latent[t] + qp[r, h] . kp[t]); value = latent[t]
//   out[r, h] = sum_t softmax_t(score(r, h, t)) value[t] over the visible t of r's sequence:
//              every t < lengths[s], or with causal every t <= positions[r].
//   lse[r, h] (optional, float32 [queries, Hq]) = log sum_t exp(score(r, h, t)); a row without a
//              visible key (no such row exists in a valid schedule) gives out 0 and lse -inf.
//
// Split-KV: with splits = S in 2..32 the visible history of each row is cut into S equal chunks
// whose float32 partial results (out, lse) go to a caller-allocated workspace
// (paged_split_workspace_bytes, at most 64 MiB) and are merged by their log-sum-exp. splits = 1
// (the default) computes each row in one pass. The results agree to rounding.
//
// Append: row r of k [queries, Hkv, D] / v [queries, Hkv, Dv] is written to the slot of
// position positions[r] of sequence sequence_ids[r] in k_cache / v_cache. Two rows that name the
// same physical slot are an error raised before anything is written.
//
// Metadata: the host schedule (PagedScheduleArgs) is validated once on the host
// (paged_validate_schedule) and packed into int32 arrays (paged_pack_schedule) that the caller
// copies to the device of q: that is PagedMetadata, which every op takes. On the CPU the ops check
// the metadata values again (cheap there), so corrupted metadata is an error, never a read
// outside a cache.
//
// libruDNN never allocates device memory: outputs, metadata and workspaces come from the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn {

// The schedule as the caller gives it: host (CPU) tensors of an integer dtype
// (int32, int64, uint32 or uint8).
struct PagedScheduleArgs {
  std::int64_t page_size = 0;            // >= 1
  std::int64_t pages = 0;                // physical pages in the caches, >= 0
  Tensor tables;                         // [num_seqs, max_pages]
  const Tensor* table_sizes = nullptr;   // [num_seqs]: entries of each row that exist (ragged
                                         // per-sequence lists padded to a rectangle); default max_pages
  Tensor lengths;                        // [num_seqs], >= 0
  Tensor sequence_ids;                   // [queries]
  Tensor positions;                      // [queries]
};

struct PagedScheduleInfo {
  std::int64_t num_seqs = 0, queries = 0;
  std::int64_t max_pages = 0;            // the most pages any sequence uses: ceil(length / page_size)
  std::int64_t max_length = 0;
  // The first two query rows that name the same physical slot (-1 when none): append refuses
  // such a schedule, attention does not care.
  std::int64_t duplicate_row = -1, duplicate_of = -1;
  std::string duplicate_message;         // "rows 1 and 4 both write page 3 slot 0 (...)", or empty
};

// Every check of the schedule; throws rudnn::Error naming the argument and the row
// ("tables[3][7] = 912 >= pages = 900"). `op` prefixes the messages.
PagedScheduleInfo paged_validate_schedule(const PagedScheduleArgs& args, const std::string& op = "HostPlan");

// The metadata every paged op takes: int32 arrays on q's device (any strides).
struct PagedMetadata {
  std::int64_t page_size = 0;
  Tensor tables;        // int32 [num_seqs, width], width >= every sequence's page count
  Tensor lengths;       // int32 [num_seqs]
  Tensor sequence_ids;  // int32 [queries]
  Tensor positions;     // int32 [queries]
};

// Validates `args` and writes the packed int32 form into host tensors of `out` (tables of width
// >= info.max_pages; entries past each sequence's pages and rows past num_seqs become 0, lengths
// past num_seqs 0, so a larger reserved buffer holds a valid schedule too).
PagedScheduleInfo paged_pack_schedule(const PagedScheduleArgs& args, const PagedMetadata& out);

struct PagedAttentionArgs {
  PagedMetadata plan;
  Tensor q, k_cache, v_cache;   // f32/f16/bf16, one dtype; last axis contiguous
  double scale = 0.0;           // finite, > 0
  bool causal = false;
  Tensor out;                   // [queries, Hq, Dv], q's dtype
  const Tensor* lse = nullptr;  // float32 [queries, Hq]; optional output
  int splits = 1;               // 1, or 2..32 with a workspace
};

struct PagedMlaArgs {
  PagedMetadata plan;
  Tensor q, qp, latent, kp;     // q [queries, H, R], qp [queries, H, P], latent [pages, ps, 1, R], kp [pages, ps, 1, P]
  double scale = 0.0;
  bool causal = false;
  Tensor out;                   // [queries, H, R], q's dtype
  const Tensor* lse = nullptr;  // float32 [queries, H]
  int splits = 1;
};

// Bytes of the split-KV workspace for `queries` rows of `heads` heads of `value_dim` values and
// `splits` in 2..32 (ArgumentError outside that range or above the 64 MiB cap).
std::size_t paged_split_workspace_bytes(std::int64_t queries, std::int64_t heads, std::int64_t value_dim, int splits);

// The split count for a call without a workspace whose longest visible history is max_length
// positions (the host plan's max_length): on CUDA, when the (row, head block) grid of the decode
// kernel leaves SMs idle, enough splits of at least 256 positions each to give every SM two
// blocks, at most 32 and within the 64 MiB cap; 1 on the CPU and whenever splitting does not pay.
// The caller allocates paged_split_workspace_bytes for it (the Python layer: with q's framework).
int paged_attention_default_splits(const PagedAttentionArgs& args, std::int64_t max_length);
int paged_mla_default_splits(const PagedMlaArgs& args, std::int64_t max_length);

void paged_attention(const PagedAttentionArgs& args, const Tensor* workspace = nullptr, Stream stream = nullptr);
void paged_mla(const PagedMlaArgs& args, const Tensor* workspace = nullptr, Stream stream = nullptr);

// Ordered (bitwise run-to-run deterministic) backward: the state of an OrderedBackwardWorkspace.
// Its buffer (uint8 on q's device, at most 64 MiB) starts with an index of the schedule built on
// the host (paged_ordered_pack) and continues with float32 scratch the backward overwrites:
//   index:   listed page ids [listed], their reader ranges [listed + 1], causal ends [listed],
//            reader entries (row, table index) [readers] x 2, inactive page ids [inactive], and
//            with the row cache the first cached position of every row [queries + 1];
//   scratch: per (row, head) lse and delta = dout . out - dlse [queries, heads, 2], and with the
//            row cache per (row, KV position, head) the probability P and dS [cached, heads, 2].
// The history gradients are reduced per slot over the page's reader entries in index order (rows
// ascending; under causal masking the entries that see the page first), one writer per slot.
//   query_pruning:      causal calls visit only the entries that see the page (causal ends), and
//                       (row, head) pairs whose dout row is zero and dlse zero are skipped in both
//                       passes (their gradient terms are exactly zero); without it every entry
//                       and pair is computed and masked. The results are the same bits.
//   history_row_cache:  the row pass keeps P and dS of every (row, position, head) in the
//                       workspace and the history pass reads them instead of recomputing the two
//                       dot products per slot and head (same bits; the workspace grows by
//                       8 * sum over rows of the sequence length * heads bytes).
//   history_compaction: only pages reachable from sequences that have query rows are listed;
//                       the others are inactive and get zeros without being visited.
struct PagedOrderedOptions {
  bool query_pruning = true;
  bool history_row_cache = false;
  bool history_compaction = false;
};

// The environment switches RUDNN_PAGED_ORDERED_CACHE_ROWS and RUDNN_PAGED_ORDERED_COMPACT_HISTORY
// (unset or "0": false, "1": true, anything else an ArgumentError naming the variable).
void paged_ordered_env(bool& cache_rows, bool& compact_history);

struct PagedOrderedLayout {
  PagedOrderedOptions options;
  std::int64_t queries = 0, heads = 0, pages = 0, page_size = 1;
  std::int64_t listed = 0, inactive = 0, readers = 0, cached = 0;
  std::size_t bytes = 0;  // the whole buffer
};

// The layout of the workspace for a host schedule and q's `heads`; ArgumentError above the
// 64 MiB budget (naming the part that does not fit).
PagedOrderedLayout paged_ordered_layout(const PagedScheduleArgs& schedule, std::int64_t heads,
                                        const PagedOrderedOptions& options);
// Writes the index part of the layout into `out` (a host uint8 array of at least layout.bytes).
void paged_ordered_pack(const PagedScheduleArgs& schedule, const PagedOrderedLayout& layout, const Tensor& out);

struct PagedOrderedWorkspace {
  PagedOrderedLayout layout;
  Tensor buffer;  // uint8 [layout.bytes] on q's device, its index written by paged_ordered_pack
};

// Backward (probabilities recomputed from q and the caches). Gradient outputs are optional (the
// `need=` of the Python API): a null one is not computed. Cache gradients cover every slot
// (zero where no visible key lives) and sum the contributions of every sequence that reads the
// slot (a shared page gets them all). The CPU backend sums in double in a fixed order; with an
// ordered workspace both backends run the ordered algorithm above. Without one, the CUDA backend
// adds the history gradients by float32 atomics (into a float32 `workspace` of
// paged_*_backward_workspace_bytes when the caches are 16-bit; directly when float32).
struct PagedAttentionBackwardArgs {
  PagedMetadata plan;
  Tensor q, k_cache, v_cache, dout;  // dout [queries, Hq, Dv]
  double scale = 0.0;
  bool causal = false;
  const Tensor* dq = nullptr;        // like q
  const Tensor* dk_cache = nullptr;  // like k_cache
  const Tensor* dv_cache = nullptr;  // like v_cache
  const Tensor* dlse = nullptr;      // optional float32 [queries, Hq]: the gradient through lse (any strides)
  const PagedOrderedWorkspace* ordered = nullptr;  // the ordered mode, or null (atomics on CUDA)
};

struct PagedMlaBackwardArgs {
  PagedMetadata plan;
  Tensor q, qp, latent, kp, dout;    // dout [queries, H, R]
  double scale = 0.0;
  bool causal = false;
  const Tensor* dq = nullptr;        // like q
  const Tensor* dqp = nullptr;       // like qp
  const Tensor* dlatent = nullptr;   // like latent: the key and the value contributions
  const Tensor* dkp = nullptr;       // like kp
  const Tensor* dlse = nullptr;      // optional float32 [queries, H]
  const PagedOrderedWorkspace* ordered = nullptr;
};

// Bytes of the atomic mode's float32 scratch (0 on the CPU, in the ordered mode and for float32
// caches).
std::size_t paged_attention_backward_workspace_bytes(const PagedAttentionBackwardArgs& args);
std::size_t paged_mla_backward_workspace_bytes(const PagedMlaBackwardArgs& args);
void paged_attention_backward(const PagedAttentionBackwardArgs& args, const Tensor* workspace = nullptr,
                              Stream stream = nullptr);
void paged_mla_backward(const PagedMlaBackwardArgs& args, const Tensor* workspace = nullptr, Stream stream = nullptr);

struct PagedAppendArgs {
  PagedMetadata plan;
  Tensor k, v;                  // [queries, Hkv, D], [queries, Hkv, Dv] (MLA: latent rows and kp rows, Hkv = 1)
  Tensor k_cache, v_cache;      // written in place
};

void paged_append(const PagedAppendArgs& args, Stream stream = nullptr);

// The backend the last paged call on this thread ran: "cpu", "cuda_decode", "cuda_decode_split",
// "cuda_append".
const char* paged_last_algorithm();

}  // namespace rudnn
