#include "core/aliasing.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.hpp"

namespace rudnn::core {

namespace {

std::string strides_str(const Tensor& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.strides[d]);
  return s + "]";
}

std::int64_t magnitude(std::int64_t v) { return v < 0 ? -v : v; }

struct ByteRange {
  std::uintptr_t lo, hi;  // [lo, hi)
};

// Computed in unsigned arithmetic of the address space: spans of arrays that exist fit in it.
ByteRange byte_range(const Tensor& t) {
  const auto elem = static_cast<std::int64_t>(dtype_size(t.dtype));
  std::int64_t low = 0, high = 0;
  for (int d = 0; d < t.rank; ++d) {
    const std::int64_t reach = (t.shape[d] - 1) * t.strides[d] * elem;
    (reach < 0 ? low : high) += reach;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  return {base + static_cast<std::uintptr_t>(low), base + static_cast<std::uintptr_t>(high + elem)};
}

void expect_elements_distinct(const Tensor& t, const std::string& name) {
  if (t.numel() <= 1) return;
  std::vector<std::pair<std::int64_t, std::int64_t>> axes;  // (|stride|, size)
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) axes.emplace_back(magnitude(t.strides[d]), t.shape[d]);
  std::sort(axes.begin(), axes.end());
  std::int64_t span = 0;  // the largest offset the axes so far reach
  bool distinct = true;
  for (const auto& [stride, size] : axes) {
    if (stride <= span) {
      distinct = false;
      break;
    }
    span += (size - 1) * stride;
  }
  if (!distinct)
    fail(ErrorKind::shape, name + ": expected an output whose elements do not share memory " +
                               (axes.front().first == 0 ? "(no stride 0 on an axis of size > 1)"
                                                        : "(no axes that overlap in memory)") +
                               ", got shape " + t.shape_str() + " with strides " + strides_str(t));
}

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.device != b.device || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  return true;
}

}  // namespace

void expect_no_overlap(const Tensor& out, const std::string& out_name, const Tensor& other,
                       const std::string& other_name) {
  if (out.numel() == 0 || other.numel() == 0 || out.device != other.device) return;
  if (out.data == nullptr || other.data == nullptr) return;
  const ByteRange a = byte_range(out), b = byte_range(other);
  if (a.lo < b.hi && b.lo < a.hi)
    fail(ErrorKind::value, out_name + ": shares memory with " + other_name +
                               " (rudnn does not compute in place: give an output that overlaps no argument)");
}

void expect_outputs_apart(std::initializer_list<NamedTensor> outputs, std::initializer_list<NamedTensor> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (!o->tensor) continue;
    expect_elements_distinct(*o->tensor, o->name);
    for (auto p = outputs.begin(); p != o; ++p)
      if (p->tensor) expect_no_overlap(*o->tensor, o->name, *p->tensor, p->name);
    for (const NamedTensor& i : inputs)
      if (i.tensor && !(i.in_place == InPlace::allowed && same_view(*o->tensor, *i.tensor)))
        expect_no_overlap(*o->tensor, o->name, *i.tensor, i.name);
  }
}

}  // namespace rudnn::core
