// Shared pieces of the XLA FFI handlers (rudnn.jax): XLA buffers -> rudnn::Tensor views,
// the optional-operand walkers, rudnn::Error -> ffi::Error, the per-platform bindings,
// and the (shape, dtype name) specs used for trace-time validation.
//
// Each op family keeps its handlers in cpp/bindings/<family>_ffi.cpp and adds them to the
// target tables in jax_ffi.cpp. Handlers never throw across the C boundary: a rudnn::Error
// becomes an ffi::Error whose message starts with the Python exception name.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "rudnn/error.hpp"
#include "rudnn/tensor.hpp"

// jaxlib's headers are not warning-clean (switches over enums without a return after them).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wreturn-type"
#endif
#include "xla/ffi/api/ffi.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace rudnn::jax_ffi {

namespace nb = nanobind;
namespace ffi = xla::ffi;


using rudnn::Device;
using rudnn::DeviceType;
using rudnn::DType;
using rudnn::ErrorKind;
using rudnn::Tensor;

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message) { throw rudnn::Error(kind, message); }

// Where a handler runs. CPU handlers have no stream and no scratch memory (the
// CPU backend needs none); CUDA handlers get XLA's stream, the device ordinal and
// XLA's scratch allocator for workspaces.
struct Place {
  Device device{};
  rudnn::Stream stream = nullptr;
  ffi::ScratchAllocator* scratch = nullptr;
};

inline Place cpu_place() { return Place{Device{DeviceType::cpu, 0}, nullptr, nullptr}; }

inline DType from_xla(ffi::DataType type, const std::string& name) {
  switch (type) {
    case ffi::DataType::F32: return DType::f32;
    case ffi::DataType::F16: return DType::f16;
    case ffi::DataType::BF16: return DType::bf16;
    case ffi::DataType::S32: return DType::i32;
    case ffi::DataType::S64: return DType::i64;
    case ffi::DataType::U32: return DType::u32;
    case ffi::DataType::U8: return DType::u8;
    case ffi::DataType::PRED: return DType::boolean;
    default: break;
  }
  fail(ErrorKind::dtype, name + ": unsupported XLA element type (code " + std::to_string(int(type)) + ")");
}

// XLA buffers are dense and row-major.
inline Tensor view(const ffi::AnyBuffer& buffer, const Place& place, const std::string& name) {
  const auto dims = buffer.dimensions();
  if (dims.size() > std::size_t(rudnn::kMaxRank))
    fail(ErrorKind::shape, name + ": rank " + std::to_string(dims.size()) + " exceeds the maximum of " +
                               std::to_string(rudnn::kMaxRank));
  return Tensor::contiguous(buffer.untyped_data(), from_xla(buffer.element_type(), name), place.device, dims.begin(),
                            int(dims.size()));
}

// The optional operands travel as "remaining" arguments/results; the has_* attributes
// say which are present. These walk them in order and check that the count matches.
class Inputs {
 public:
  Inputs(const ffi::RemainingArgs& args, const Place& place, const char* op) : args_(args), place_(place), op_(op) {}
  Tensor next(const char* name) {
    ffi::ErrorOr<ffi::AnyBuffer> buffer = args_.get<ffi::AnyBuffer>(next_++);
    if (buffer.has_error())
      fail(ErrorKind::value, op_ + ": internal: custom call is missing input '" + name + "': " +
                                 buffer.error().message());
    return view(*buffer, place_, op_ + ": " + name);
  }
  void finish() const {
    if (next_ != args_.size())
      fail(ErrorKind::value, op_ + ": internal: custom call has " + std::to_string(args_.size()) +
                                 " optional inputs, the attributes describe " + std::to_string(next_));
  }

 private:
  const ffi::RemainingArgs& args_;
  const Place& place_;
  std::string op_;
  std::size_t next_ = 0;
};

class Outputs {
 public:
  Outputs(const ffi::RemainingRets& rets, const Place& place, const char* op) : rets_(rets), place_(place), op_(op) {}
  Tensor next(const char* name) {
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> buffer = rets_.get<ffi::AnyBuffer>(next_++);
    if (buffer.has_error())
      fail(ErrorKind::value, op_ + ": internal: custom call is missing output '" + name + "': " +
                                 buffer.error().message());
    return view(**buffer, place_, op_ + ": " + name);
  }
  void finish() const {
    if (next_ != rets_.size())
      fail(ErrorKind::value, op_ + ": internal: custom call has " + std::to_string(rets_.size()) +
                                 " optional outputs, the attributes describe " + std::to_string(next_));
  }

 private:
  const ffi::RemainingRets& rets_;
  const Place& place_;
  std::string op_;
  std::size_t next_ = 0;
};

inline const char* python_error_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::shape: return "ShapeError";
    case ErrorKind::dtype: return "DTypeError";
    case ErrorKind::device: return "DeviceError";
    case ErrorKind::value: return "ArgumentError";
    case ErrorKind::unsupported: return "UnsupportedError";
    case ErrorKind::cuda: return "CudaError";
  }
  return "Error";
}

inline ffi::ErrorCode xla_error_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::unsupported: return ffi::ErrorCode::kUnimplemented;
    case ErrorKind::cuda: return ffi::ErrorCode::kInternal;
    default: return ffi::ErrorCode::kInvalidArgument;
  }
}

// A u8 workspace of `bytes` from XLA's scratch allocator, or nullptr when none is needed.
// XLA_FFI_DeviceMemory_Allocate refuses alignments above 16 (the GPU check of 2026-11-30 failed
// every JAX op with a workspace while this asked for 256), so ask for 16 and 256 bytes more, and
// start the workspace at the next 256-byte boundary: the workspace layouts (CUTLASS's
// device-built grouped-GEMM arguments among them) assume that alignment.
inline const Tensor* scratch_workspace(const Place& place, std::size_t bytes, Tensor& slot, const std::string& op) {
  constexpr std::size_t kXlaMaxAlignment = 16, kWorkspaceAlignment = 256;
  if (bytes == 0) return nullptr;
  if (place.scratch == nullptr)
    fail(ErrorKind::unsupported, op + ": internal: a workspace is needed but XLA gave no scratch allocator");
  std::optional<void*> memory = place.scratch->Allocate(bytes + kWorkspaceAlignment, kXlaMaxAlignment);
  if (!memory.has_value() || *memory == nullptr)
    fail(ErrorKind::cuda, op + ": XLA could not allocate " + std::to_string(bytes + kWorkspaceAlignment) +
                              " bytes of scratch memory for the workspace");
  const std::uintptr_t raw = reinterpret_cast<std::uintptr_t>(*memory);
  const std::uintptr_t aligned = (raw + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  const std::int64_t size = std::int64_t(bytes);
  slot = Tensor::contiguous(reinterpret_cast<void*>(aligned), DType::u8, place.device, &size, 1);
  return &slot;
}

// Runs `body`, turning every C++ exception into an ffi::Error (nothing may unwind into XLA).
template <class Body>
ffi::Error guarded(Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const rudnn::Error& e) {
    return ffi::Error(xla_error_code(e.kind()), std::string("rudnn.") + python_error_name(e.kind()) + ": " + e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("rudnn: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("rudnn: unknown C++ exception");
  }
}

inline auto cpu_binding() { return ffi::Ffi::Bind(); }
inline auto cuda_binding() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>().Ctx<ffi::ScratchAllocator>();
}

// A binding followed by `args` buffer operands, then `rets` buffer results (at least one in all).
// Every step returns the builder call's own result: a Binding cannot be moved from outside.
template <int args, int rets, class B>
auto buffers(B&& b) {
  static_assert(args >= 0 && rets >= 0 && args + rets > 0);
  if constexpr (args > 0) {
    if constexpr (args + rets == 1)
      return std::forward<B>(b).template Arg<ffi::AnyBuffer>();
    else
      return buffers<args - 1, rets>(std::forward<B>(b).template Arg<ffi::AnyBuffer>());
  } else if constexpr (rets == 1) {
    return std::forward<B>(b).template Ret<ffi::AnyBuffer>();
  } else {
    return buffers<0, rets - 1>(std::forward<B>(b).template Ret<ffi::AnyBuffer>());
  }
}

// Adapters from a platform's context parameters to a Place.
template <class Impl>
inline auto on_cpu(Impl impl) {
  return [impl](auto... operands) { return impl(cpu_place(), std::move(operands)...); };
}

template <class Impl>
inline auto on_cuda(Impl impl) {
  return [impl](void* stream, std::int32_t ordinal, ffi::ScratchAllocator scratch, auto... operands) {
    const Place place{Device{DeviceType::cuda, ordinal}, stream, &scratch};
    return impl(place, std::move(operands)...);
  };
}

// Defines handler `name`; each builds its binding once, on first call (as XLA_FFI_DEFINE_HANDLER does).
#define RUDNN_FFI_HANDLER(name, binding, adapter, impl)          \
  XLA_FFI_Error* name(XLA_FFI_CallFrame* call_frame) {           \
    static auto* handler = binding.To(adapter(impl)).release();  \
    return handler->Call(call_frame);                            \
  }

// Trace-time validation runs the same C++ checks on data-less views, so that a JAX
// user gets rudnn.ShapeError & co. when tracing instead of an XlaRuntimeError when
// the compiled program runs.

// (shape, dtype name) of an abstract JAX array.
using Spec = std::tuple<std::vector<std::int64_t>, std::string>;

// Validation never reads data, but the views get non-null addresses anyway, each its own 2^44-byte
// stretch of the address space (never dereferenced), since XLA gives every operand and result
// its own buffer: the check that outputs overlap no input (core/aliasing.hpp) then passes, as
// it does at run time.
inline void* placeholder_data() {
  static thread_local std::uintptr_t next = 0;
  next = next % 4095 + 1;
  return reinterpret_cast<void*>(next << 44);
}

// A data-less view shaped like t at an address of its own: an output allocated like an input.
inline Tensor abstract_like(const Tensor& t) {
  Tensor r = t;
  r.data = placeholder_data();
  return r;
}

inline DType dtype_from_name(const std::string& dtype, const std::string& name) {
  if (dtype == "float32") return DType::f32;
  if (dtype == "float16") return DType::f16;
  if (dtype == "bfloat16") return DType::bf16;
  if (dtype == "int32") return DType::i32;
  if (dtype == "int64") return DType::i64;
  if (dtype == "uint32") return DType::u32;
  if (dtype == "uint8") return DType::u8;
  if (dtype == "bool") return DType::boolean;
  fail(ErrorKind::dtype, name + ": expected float32, float16 or bfloat16, got " + dtype);
}

inline Tensor abstract(const Spec& spec, const std::string& name) {
  const auto& [shape, dtype] = spec;
  if (shape.size() > std::size_t(rudnn::kMaxRank))
    fail(ErrorKind::shape, name + ": rank " + std::to_string(shape.size()) + " exceeds the maximum of " +
                               std::to_string(rudnn::kMaxRank));
  return Tensor::contiguous(placeholder_data(), dtype_from_name(dtype, name), Device{DeviceType::cpu, 0},
                            shape.data(), int(shape.size()));
}

}  // namespace rudnn::jax_ffi
