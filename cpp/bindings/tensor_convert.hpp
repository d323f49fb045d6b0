// DLPack (via nanobind ndarray) -> rudnn::Tensor, and rudnn::Error -> Python.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

namespace rudnn::bindings {

namespace nb = nanobind;

using In = nb::ndarray<nb::ro>;                 // read-only input
using Out = nb::ndarray<>;                      // written output
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

// A Python int holding a cudaStream_t (0 on the CPU).
inline Stream as_stream(std::uintptr_t s) { return reinterpret_cast<Stream>(s); }

inline DType to_dtype(nb::dlpack::dtype t, const char* name) {
  using nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    const auto code = static_cast<dtype_code>(t.code);
    if (code == dtype_code::Float && t.bits == 32) return DType::f32;
    if (code == dtype_code::Float && t.bits == 16) return DType::f16;
    if (code == dtype_code::Bfloat && t.bits == 16) return DType::bf16;
    if (code == dtype_code::Int && t.bits == 32) return DType::i32;
    if (code == dtype_code::Int && t.bits == 64) return DType::i64;
    if (code == dtype_code::UInt && t.bits == 32) return DType::u32;
    if (code == dtype_code::UInt && t.bits == 8) return DType::u8;
    if (code == dtype_code::Bool && t.bits == 8) return DType::boolean;
  }
  static const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string kind = t.code < 7 ? kinds[t.code] : "code" + std::to_string(t.code);
  throw Error(ErrorKind::dtype, std::string(name) + ": unsupported dtype " + kind + std::to_string(t.bits) +
                                    (t.lanes != 1 ? "x" + std::to_string(t.lanes) : std::string()));
}

template <class Array>
Tensor to_tensor(const Array& a, const char* name) {
  Tensor t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), name);
  if (a.device_type() == nb::device::cpu::value) {
    t.device = Device{DeviceType::cpu, 0};
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = Device{DeviceType::cuda, a.device_id()};
  } else {
    throw Error(ErrorKind::device, std::string(name) + ": unsupported device type " + std::to_string(a.device_type()) +
                                       " (expected cpu or cuda)");
  }
  if (a.ndim() > static_cast<size_t>(kMaxRank))
    throw Error(ErrorKind::shape, std::string(name) + ": at most " + std::to_string(kMaxRank) + " axes, got " +
                                      std::to_string(a.ndim()));
  t.rank = static_cast<int>(a.ndim());
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = static_cast<std::int64_t>(a.shape(d));
    t.strides[d] = static_cast<std::int64_t>(a.stride(d));
  }
  return t;
}

// Fills `slot` and returns its address, or nullptr for None.
template <class Array>
const Tensor* opt_tensor(const std::optional<Array>& a, const char* name, std::optional<Tensor>& slot) {
  if (!a) return nullptr;
  slot = to_tensor(*a, name);
  return &*slot;
}

// The workspace of a call: the array given, or, when `alloc` (a Python callable: byte count ->
// DLPack capsule of that many uint8 on the call's device) is given instead, one it allocates
// for bytes() > 0 bytes; `held` keeps that array alive through the call. Asking for the size
// here, on the views already imported, spares the Python layer a second export of every array
// (a separate *_workspace_bytes call takes capsules of its own).
template <class Bytes>
const Tensor* workspace_from(const std::optional<nb::ndarray<>>& given, const nb::object& alloc, Bytes&& bytes,
                             std::optional<nb::ndarray<>>& held, std::optional<Tensor>& slot) {
  if (given) return opt_tensor(given, "workspace", slot);
  if (alloc.is_none()) return nullptr;
  const std::size_t n = bytes();
  if (n == 0) return nullptr;
  held = nb::cast<nb::ndarray<>>(alloc(n));
  slot = to_tensor(*held, "workspace");
  return &*slot;
}

// rudnn::Error -> rudnn.errors.<Kind>Error (classes defined in Python, looked up once).
inline void register_error_translator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      static const char* names[] = {"ShapeError", "DTypeError", "DeviceError",
                                    "ArgumentError", "UnsupportedError", "CudaError"};
      nb::object errors = nb::module_::import_("rudnn.errors");
      nb::object cls = errors.attr(names[static_cast<int>(e.kind())]);
      PyErr_SetString(cls.ptr(), e.what());
    }
  });
}

}  // namespace rudnn::bindings
