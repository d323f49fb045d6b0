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
Problem validate_attention(const PagedAttentionArgs& a, const Tensor* workspace);
Problem validate_mla(const PagedMlaArgs& a, const Tensor* workspace);
AppendProblem validate_append(const PagedAppendArgs& a);
// The first pair of rows naming the same physical slot of a host schedule; message empty when none.
void find_duplicate_slot(const Schedule& s, std::int64_t& row, std::int64_t& of, std::string& message);

// CPU reference backend (cpu.cpp).
void forward_cpu(const Problem& p, const Tensor* workspace);
void append_cpu(const PagedAppendArgs& a, const AppendProblem& p);

}  // namespace rudnn::paged
