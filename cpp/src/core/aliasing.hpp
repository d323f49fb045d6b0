// Checks that an op's outputs can be written safely: no two elements of one output at one
// address, and no output sharing memory with an input or with another output (a kernel reads
// its inputs while it writes, so any overlap gives wrong results, on CUDA racing ones).
// Out of line (aliasing.cpp) and included only by validate steps, so that kernels do not
// recompile when it changes.
#pragma once

#include <initializer_list>
#include <utility>
#include <string>

#include "rudnn/tensor.hpp"

namespace rudnn::core {

// Whether an output may be exactly this input (same address, dtype, shape and strides): an op
// documented to work in place, whose kernels read each element before writing it.
enum class InPlace : bool { refused, allowed };

// One argument of an op for these checks; a null tensor (an optional argument not given) is
// skipped.
struct NamedTensor {
  const Tensor* tensor;
  std::string name;
  InPlace in_place = InPlace::refused;
  NamedTensor(const Tensor& t, std::string n, InPlace p = InPlace::refused)
      : tensor(&t), name(std::move(n)), in_place(p) {}
  NamedTensor(const Tensor* t, std::string n, InPlace p = InPlace::refused)
      : tensor(t), name(std::move(n)), in_place(p) {}
};

// The bytes t spans (lowest to one past the highest element) do not intersect those of other's
// on the same device. Range-based: two views that interleave without sharing an element (x[::2]
// and x[1::2]) are refused too; rudnn never needs them apart.
void expect_no_overlap(const Tensor& out, const std::string& out_name, const Tensor& other,
                       const std::string& other_name);

// The family-wide rule: every output has pairwise distinct elements, and no output overlaps
// another output or any input (inputs may overlap each other: they are only read). Distinct
// elements are proven when, with the axes of size > 1 sorted by |stride|, each |stride| exceeds
// the span of the axes before it; a layout that fails this (stride 0, as torch's expand gives,
// or an as_strided view whose rows interleave) is a ShapeError naming the argument, its shape and
// its strides.
void expect_outputs_apart(std::initializer_list<NamedTensor> outputs, std::initializer_list<NamedTensor> inputs);

}  // namespace rudnn::core
