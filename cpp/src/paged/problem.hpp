// The validated form of a paged call, shared by the backends. validate.cpp builds it after
// every check has passed. Attention and MLA are one problem: MLA is attention with one KV head,
// a second (rotary) score term and the key operand read again as the value.
#pragma once

#include <cstdint>

#include "core/rows.hpp"  // RUDNN_HD
#include "rudnn/paged.hpp"

namespace rudnn::paged {

// The int32 metadata as pointers and element strides.
struct Schedule {
  std::int64_t page_size = 1, num_seqs = 0, queries = 0, width = 0;
  const std::int32_t* tables = nullptr;
  const std::int32_t* lengths = nullptr;
  const std::int32_t* sequence_ids = nullptr;
  const std::int32_t* positions = nullptr;
  std::int64_t table_s = 0, table_j = 0, length_s = 0, seq_s = 0, pos_s = 0;

  RUDNN_HD std::int32_t page(std::int64_t s, std::int64_t j) const { return tables[s * table_s + j * table_j]; }
  RUDNN_HD std::int32_t length(std::int64_t s) const { return lengths[s * length_s]; }
  RUDNN_HD std::int32_t sequence(std::int64_t r) const { return sequence_ids[r * seq_s]; }
  RUDNN_HD std::int32_t position(std::int64_t r) const { return positions[r * pos_s]; }
};

// Strides of a cache [pages, page_size, heads, dim] and of a packed [rows, heads, dim] operand.
struct CacheStrides {
  std::int64_t page = 0, slot = 0, head = 0;
  RUDNN_HD std::int64_t at(std::int64_t p, std::int64_t s, std::int64_t h) const { return p * page + s * slot + h * head; }
};
struct RowStrides {
  std::int64_t row = 0, head = 0;
  RUDNN_HD std::int64_t at(std::int64_t r, std::int64_t h) const { return r * row + h * head; }
};

struct Problem {
  bool mla = false;
  Schedule sched;
  std::int64_t pages = 0;
  std::int64_t hq = 0, hkv = 0, group = 1;
  std::int64_t d = 0, dv = 0;   // score dim of q/k (MLA: R), value dim (MLA: R)
  std::int64_t d2 = 0;          // MLA: the rotary dim P (0 for attention)
  DType dtype = DType::f32;
  float scale = 1.0f;
  bool causal = false;
  int splits = 1;
  // Operands: q / k (score), q2 / k2 (MLA rotary score term), v (value: MLA's latent = k).
  const void *q = nullptr, *k = nullptr, *v = nullptr, *q2 = nullptr, *k2 = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  RowStrides q_at, q2_at, out_at, lse_at;
  CacheStrides k_at, v_at, k2_at;

  // KV positions [0, n) that query row r sees, and its sequence.
  RUDNN_HD std::int64_t visible(std::int64_t r, std::int64_t& seq) const {
    seq = sched.sequence(r);
    const std::int64_t len = sched.length(seq);
    return causal ? (sched.position(r) + 1 < len ? sched.position(r) + 1 : len) : len;
  }
};

struct AppendProblem {
  Schedule sched;
  std::int64_t pages = 0, hkv = 0, d = 0, dv = 0;
  DType dtype = DType::f32;
  RowStrides k_at, v_at;
  CacheStrides kc_at, vc_at;
};

// A checked schedule view of host or device metadata; on the CPU its values are checked too.
Schedule check_metadata(const PagedMetadata& m, const Tensor& q, std::int64_t pages, const std::string& op,
                        const char* q_name = "q");
// backward: the checks of the forward with dout in place of out (an input: it may be expanded).
Problem validate_attention(const PagedAttentionArgs& a, const Tensor* workspace,
                           const std::string& op = "paged_attention", bool backward = false);
Problem validate_mla(const PagedMlaArgs& a, const Tensor* workspace, const std::string& op = "paged_mla",
                     bool backward = false);

// Word offsets (4-byte words) of the parts of an ordered workspace buffer (paged.hpp).
struct OrderedOffsets {
  std::int64_t listed_ids = 0, page_start = 0, causal_end = 0, entry_row = 0, entry_index = 0, inactive_ids = 0,
               row_start = 0, stats = 0, cache = 0, words = 0;
};
inline OrderedOffsets ordered_offsets(const PagedOrderedLayout& l) {
  OrderedOffsets o;
  o.listed_ids = 0;
  o.page_start = o.listed_ids + l.listed;
  o.causal_end = o.page_start + l.listed + 1;
  o.entry_row = o.causal_end + l.listed;
  o.entry_index = o.entry_row + l.readers;
  o.inactive_ids = o.entry_index + l.readers;
  o.row_start = o.inactive_ids + l.inactive;
  o.stats = o.row_start + (l.options.history_row_cache ? l.queries + 1 : 0);
  o.cache = o.stats + l.queries * l.heads * 2;
  o.words = o.cache + (l.options.history_row_cache ? l.cached * l.heads * 2 : 0);
  return o;
}

// The ordered workspace as the kernels read it (pointers into its buffer).
struct Ordered {
  std::int64_t listed = 0, inactive = 0, cached = 0;
  bool pruning = true, row_cache = false;
  const std::int32_t *listed_ids = nullptr, *page_start = nullptr, *causal_end = nullptr, *entry_row = nullptr,
                     *entry_index = nullptr, *inactive_ids = nullptr, *row_start = nullptr;
  float* stats = nullptr;  // [queries, heads, 2]: lse (+inf: a pruned pair), delta
  float* cache = nullptr;  // [cached, heads, 2]: P, dS
};

// The gradients of a backward call (null where not requested). For MLA, dk is dlatent (key
// and value contributions), dk2 dkp, dq2 dqp; attention's value gradient is dv.
struct BackwardProblem {
  Problem fwd;  // fwd.out / fwd.out_at are dout
  void *dq = nullptr, *dq2 = nullptr, *dk = nullptr, *dk2 = nullptr, *dv = nullptr;
  RowStrides dq_at, dq2_at;
  CacheStrides dk_at, dk2_at, dv_at;
  const float* dlse = nullptr;  // the gradient through lse (d lse / d s_t = P_t), or null
  RowStrides dlse_at;
  bool ordered = false;         // the ordered mode (`order`), else the default (atomics on CUDA)
  Ordered order;
};
BackwardProblem validate_attention_backward(const PagedAttentionBackwardArgs& a);
BackwardProblem validate_mla_backward(const PagedMlaBackwardArgs& a);
void backward_cpu(const BackwardProblem& p);
// The ordered algorithm on the CPU (the reference of the CUDA ordered kernels).
void backward_ordered_cpu(const BackwardProblem& p);
// (The CUDA backward: paged/cuda_backend.hpp.)
AppendProblem validate_append(const PagedAppendArgs& a);
// The first pair of rows naming the same physical slot of a host schedule; message empty when none.
void find_duplicate_slot(const Schedule& s, std::int64_t& row, std::int64_t& of, std::string& message);

// CPU reference backend (cpu.cpp).
void forward_cpu(const Problem& p, const Tensor* workspace);
void append_cpu(const PagedAppendArgs& a, const AppendProblem& p);

}  // namespace rudnn::paged
