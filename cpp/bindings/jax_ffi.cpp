// XLA FFI handlers for the norm/softmax family (rudnn.jax) and the trace-time
// validation bindings that go with them.
//
// JAX arrays are immutable and owned by XLA, so every rudnn op on JAX arrays is
// an XLA custom call: XLA allocates the outputs (dense, row-major), hands us its
// stream on CUDA, and we run the same libruDNN entry points as every other
// framework. Handlers never throw across the C boundary: a rudnn::Error becomes an
// ffi::Error whose message starts with the Python exception name.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets):
//   rudnn_norm_forward   (x, [weight], [bias], [residual]) -> (y, [h], [mean], [rstd])
//                        [kind: i32 0=layer 1=rms, eps: f32, has_weight, has_bias,
//                         has_residual, has_mean, has_rstd: bool]
//   rudnn_norm_backward  (dy, x, [weight], [mean], rstd) -> (dx, [dweight], [dbias])
//                        [kind: i32, has_weight, has_dweight, has_dbias: bool]
//                        mean is present iff kind is layer. CUDA scratch comes from XLA.
//   rudnn_softmax_forward   (x) -> y
//   rudnn_softmax_backward  (dy, y) -> dx
#include "jax_ffi.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "norm/problem.hpp"
#include "rudnn/error.hpp"
#include "rudnn/norm.hpp"
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

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace {

using rudnn::Device;
using rudnn::DeviceType;
using rudnn::DType;
using rudnn::ErrorKind;
using rudnn::Tensor;

[[noreturn]] void fail(ErrorKind kind, const std::string& message) { throw rudnn::Error(kind, message); }

// ---------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------

// Where a handler runs. CPU handlers have no stream and no scratch memory (the
// CPU backend needs none); CUDA handlers get XLA's stream, the device ordinal and
// XLA's scratch allocator for workspaces.
struct Place {
  Device device{};
  rudnn::Stream stream = nullptr;
  ffi::ScratchAllocator* scratch = nullptr;
};

Place cpu_place() { return Place{Device{DeviceType::cpu, 0}, nullptr, nullptr}; }

DType from_xla(ffi::DataType type, const std::string& name) {
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
Tensor view(const ffi::AnyBuffer& buffer, const Place& place, const std::string& name) {
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

const char* python_error_name(ErrorKind kind) {
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

ffi::ErrorCode xla_error_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::unsupported: return ffi::ErrorCode::kUnimplemented;
    case ErrorKind::cuda: return ffi::ErrorCode::kInternal;
    default: return ffi::ErrorCode::kInvalidArgument;
  }
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

rudnn::NormKind norm_kind(std::int32_t kind) {
  if (kind != 0 && kind != 1) fail(ErrorKind::value, "norm: internal: kind attribute must be 0 or 1, got " + std::to_string(kind));
  return kind == 0 ? rudnn::NormKind::layer : rudnn::NormKind::rms;
}

ffi::Error norm_forward(const Place& place, ffi::AnyBuffer x, ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> y,
                        ffi::RemainingRets rets, std::int32_t kind, float eps, bool has_weight, bool has_bias,
                        bool has_residual, bool has_mean, bool has_rstd) {
  return guarded([&] {
    const char* op = kind == 1 ? "rms_norm" : "layer_norm";
    rudnn::NormForwardArgs a;
    a.kind = norm_kind(kind);
    a.x = view(x, place, std::string(op) + ": x");
    a.eps = eps;
    a.y = view(*y, place, std::string(op) + ": y");
    Tensor weight, bias, residual, residual_out, mean, rstd;
    Inputs in(args, place, op);
    if (has_weight) a.weight = &(weight = in.next("weight"));
    if (has_bias) a.bias = &(bias = in.next("bias"));
    if (has_residual) a.residual = &(residual = in.next("residual"));
    in.finish();
    Outputs out(rets, place, op);
    if (has_residual) a.residual_out = &(residual_out = out.next("residual_out"));
    if (has_mean) a.mean = &(mean = out.next("mean"));
    if (has_rstd) a.rstd = &(rstd = out.next("rstd"));
    out.finish();
    rudnn::norm_forward(a, place.stream);
  });
}

ffi::Error norm_backward(const Place& place, ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::RemainingArgs args,
                         ffi::Result<ffi::AnyBuffer> dx, ffi::RemainingRets rets, std::int32_t kind, bool has_weight,
                         bool has_dweight, bool has_dbias) {
  return guarded([&] {
    const char* op = kind == 1 ? "rms_norm_backward" : "layer_norm_backward";
    rudnn::NormBackwardArgs a;
    a.kind = norm_kind(kind);
    a.dy = view(dy, place, std::string(op) + ": dy");
    a.x = view(x, place, std::string(op) + ": x");
    a.dx = view(*dx, place, std::string(op) + ": dx");
    Tensor weight, mean, dweight, dbias, workspace;
    Inputs in(args, place, op);
    if (has_weight) a.weight = &(weight = in.next("weight"));
    if (a.kind == rudnn::NormKind::layer) a.mean = &(mean = in.next("mean"));
    a.rstd = in.next("rstd");
    in.finish();
    Outputs out(rets, place, op);
    if (has_dweight) a.dweight = &(dweight = out.next("dweight"));
    if (has_dbias) a.dbias = &(dbias = out.next("dbias"));
    out.finish();

    const std::size_t bytes = rudnn::norm_backward_workspace_bytes(a);
    if (bytes > 0) {
      if (place.scratch == nullptr)
        fail(ErrorKind::unsupported, std::string(op) + ": internal: a workspace is needed but XLA gave no scratch allocator");
      std::optional<void*> memory = place.scratch->Allocate(bytes, 256);
      if (!memory.has_value() || *memory == nullptr)
        fail(ErrorKind::cuda, std::string(op) + ": XLA could not allocate " + std::to_string(bytes) +
                                  " bytes of scratch memory for the workspace");
      const std::int64_t size = std::int64_t(bytes);
      workspace = Tensor::contiguous(*memory, DType::u8, place.device, &size, 1);
      a.workspace = &workspace;
    }
    rudnn::norm_backward(a, place.stream);
  });
}

ffi::Error softmax_forward(const Place& place, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  return guarded([&] {
    rudnn::softmax_forward(view(x, place, "softmax: x"), view(*y, place, "softmax: y"), place.stream);
  });
}

ffi::Error softmax_backward(const Place& place, ffi::AnyBuffer dy, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> dx) {
  return guarded([&] {
    rudnn::softmax_backward(view(dy, place, "softmax_backward: dy"), view(y, place, "softmax_backward: y"),
                            view(*dx, place, "softmax_backward: dx"), place.stream);
  });
}

// Bindings: the platform context first (nothing on the CPU; stream, device ordinal
// and scratch allocator on CUDA), then the operands and attributes of each op.
template <class B>
auto bind_norm_forward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .RemainingRets()
      .template Attr<std::int32_t>("kind")
      .template Attr<float>("eps")
      .template Attr<bool>("has_weight")
      .template Attr<bool>("has_bias")
      .template Attr<bool>("has_residual")
      .template Attr<bool>("has_mean")
      .template Attr<bool>("has_rstd");
}

template <class B>
auto bind_norm_backward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .RemainingRets()
      .template Attr<std::int32_t>("kind")
      .template Attr<bool>("has_weight")
      .template Attr<bool>("has_dweight")
      .template Attr<bool>("has_dbias");
}

template <class B>
auto bind_softmax_forward(B&& b) {
  return std::forward<B>(b).template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>();
}

template <class B>
auto bind_softmax_backward(B&& b) {
  return std::forward<B>(b).template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>();
}

auto cpu_binding() { return ffi::Ffi::Bind(); }
auto cuda_binding() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>().Ctx<ffi::ScratchAllocator>();
}

// Adapters from a platform's context parameters to a Place.
template <class Impl>
auto on_cpu(Impl impl) {
  return [impl](auto... operands) { return impl(cpu_place(), std::move(operands)...); };
}

template <class Impl>
auto on_cuda(Impl impl) {
  return [impl](void* stream, std::int32_t ordinal, ffi::ScratchAllocator scratch, auto... operands) {
    const Place place{Device{DeviceType::cuda, ordinal}, stream, &scratch};
    return impl(place, std::move(operands)...);
  };
}

// Each handler builds its binding once, on first call (as XLA_FFI_DEFINE_HANDLER does).
#define RUDNN_FFI_HANDLER(name, binding, adapter, impl)          \
  XLA_FFI_Error* name(XLA_FFI_CallFrame* call_frame) {           \
    static auto* handler = binding.To(adapter(impl)).release();  \
    return handler->Call(call_frame);                            \
  }

RUDNN_FFI_HANDLER(norm_forward_cpu, bind_norm_forward(cpu_binding()), on_cpu, norm_forward)
RUDNN_FFI_HANDLER(norm_backward_cpu, bind_norm_backward(cpu_binding()), on_cpu, norm_backward)
RUDNN_FFI_HANDLER(softmax_forward_cpu, bind_softmax_forward(cpu_binding()), on_cpu, softmax_forward)
RUDNN_FFI_HANDLER(softmax_backward_cpu, bind_softmax_backward(cpu_binding()), on_cpu, softmax_backward)
// Registered in every build: without the CUDA backend libruDNN itself reports
// UnsupportedError, which beats XLA's "no custom call target" at compile time.
RUDNN_FFI_HANDLER(norm_forward_cuda, bind_norm_forward(cuda_binding()), on_cuda, norm_forward)
RUDNN_FFI_HANDLER(norm_backward_cuda, bind_norm_backward(cuda_binding()), on_cuda, norm_backward)
RUDNN_FFI_HANDLER(softmax_forward_cuda, bind_softmax_forward(cuda_binding()), on_cuda, softmax_forward)
RUDNN_FFI_HANDLER(softmax_backward_cuda, bind_softmax_backward(cuda_binding()), on_cuda, softmax_backward)

#undef RUDNN_FFI_HANDLER

nb::dict ffi_targets() {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  nb::dict cpu, cuda, all;
  cpu["rudnn_norm_forward"] = capsule(norm_forward_cpu);
  cpu["rudnn_norm_backward"] = capsule(norm_backward_cpu);
  cpu["rudnn_softmax_forward"] = capsule(softmax_forward_cpu);
  cpu["rudnn_softmax_backward"] = capsule(softmax_backward_cpu);
  cuda["rudnn_norm_forward"] = capsule(norm_forward_cuda);
  cuda["rudnn_norm_backward"] = capsule(norm_backward_cuda);
  cuda["rudnn_softmax_forward"] = capsule(softmax_forward_cuda);
  cuda["rudnn_softmax_backward"] = capsule(softmax_backward_cuda);
  all["cpu"] = cpu;
  all["CUDA"] = cuda;
  return all;
}

// ---------------------------------------------------------------------------
// Trace-time validation: the same C++ checks on data-less views, so that a JAX
// user gets rudnn.ShapeError & co. when tracing instead of an XlaRuntimeError
// when the compiled program runs.
// ---------------------------------------------------------------------------

// (shape, dtype name) of an abstract JAX array.
using Spec = std::tuple<std::vector<std::int64_t>, std::string>;

// Validation never reads data, but the views get a non-null address anyway.
alignas(16) unsigned char placeholder_storage[16];

DType dtype_from_name(const std::string& dtype, const std::string& name) {
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

Tensor abstract(const Spec& spec, const std::string& name) {
  const auto& [shape, dtype] = spec;
  if (shape.size() > std::size_t(rudnn::kMaxRank))
    fail(ErrorKind::shape, name + ": rank " + std::to_string(shape.size()) + " exceeds the maximum of " +
                               std::to_string(rudnn::kMaxRank));
  return Tensor::contiguous(placeholder_storage, dtype_from_name(dtype, name), Device{DeviceType::cpu, 0},
                            shape.data(), int(shape.size()));
}

// A float32 tensor of shape x.shape[:-1] (the statistics outputs).
Tensor stats_like(const Tensor& x) {
  const int rank = x.rank > 0 ? x.rank - 1 : 0;
  return Tensor::contiguous(placeholder_storage, DType::f32, x.device, x.shape, rank);
}

rudnn::NormKind kind_from_name(const std::string& kind) {
  if (kind == "layer") return rudnn::NormKind::layer;
  if (kind == "rms") return rudnn::NormKind::rms;
  fail(ErrorKind::value, "norm: internal: kind must be 'layer' or 'rms', got '" + kind + "'");
}

void validate_norm_forward(const std::string& kind, const Spec& x_spec, const std::optional<Spec>& weight_spec,
                           const std::optional<Spec>& bias_spec, const std::optional<Spec>& residual_spec, double eps,
                           bool stats) {
  rudnn::NormForwardArgs a;
  a.kind = kind_from_name(kind);
  const std::string op = a.kind == rudnn::NormKind::layer ? "layer_norm" : "rms_norm";
  a.x = abstract(x_spec, op + ": x");
  a.y = a.x;
  a.eps = float(eps);
  Tensor weight, bias, residual, mean, rstd;
  if (weight_spec) a.weight = &(weight = abstract(*weight_spec, op + ": weight"));
  if (bias_spec) a.bias = &(bias = abstract(*bias_spec, op + ": bias"));
  if (residual_spec) {
    a.residual = &(residual = abstract(*residual_spec, op + ": residual"));
    a.residual_out = &a.x;
  }
  if (stats && a.x.rank >= 1) {
    rstd = stats_like(a.x);
    a.rstd = &rstd;
    if (a.kind == rudnn::NormKind::layer) {
      mean = stats_like(a.x);
      a.mean = &mean;
    }
  }
  rudnn::norm::validate_forward(a);
}

void validate_norm_backward(const std::string& kind, const Spec& dy_spec, const Spec& x_spec,
                            const std::optional<Spec>& weight_spec, const std::optional<Spec>& mean_spec,
                            const Spec& rstd_spec, bool dweight, bool dbias) {
  rudnn::NormBackwardArgs a;
  a.kind = kind_from_name(kind);
  const std::string op = a.kind == rudnn::NormKind::layer ? "layer_norm_backward" : "rms_norm_backward";
  a.dy = abstract(dy_spec, op + ": dy");
  a.x = abstract(x_spec, op + ": x");
  a.dx = a.x;
  a.rstd = abstract(rstd_spec, op + ": rstd");
  Tensor weight, mean, dweight_t, dbias_t;
  if (weight_spec) a.weight = &(weight = abstract(*weight_spec, op + ": weight"));
  if (mean_spec) a.mean = &(mean = abstract(*mean_spec, op + ": mean"));
  if (a.x.rank >= 1) {
    const std::int64_t hidden = a.x.shape[a.x.rank - 1];
    if (dweight) a.dweight = &(dweight_t = Tensor::contiguous(placeholder_storage, DType::f32, a.x.device, &hidden, 1));
    if (dbias) a.dbias = &(dbias_t = Tensor::contiguous(placeholder_storage, DType::f32, a.x.device, &hidden, 1));
  }
  rudnn::norm::validate_backward(a);
}

void validate_softmax_forward(const Spec& x_spec) {
  const Tensor x = abstract(x_spec, "softmax: x");
  rudnn::norm::validate_softmax_forward(x, x);
}

void validate_softmax_backward(const Spec& dy_spec, const Spec& y_spec) {
  const Tensor dy = abstract(dy_spec, "softmax_backward: dy");
  const Tensor y = abstract(y_spec, "softmax_backward: y");
  rudnn::norm::validate_softmax_backward(dy, y, y);
}

}  // namespace

void register_jax_ffi(nb::module_& m) {
  m.def("jax_ffi_targets", &ffi_targets,
        "XLA FFI handlers of rudnn.jax as {platform: {target name: PyCapsule}}, for "
        "jax.ffi.register_ffi_target.");
  m.def("jax_validate_norm_forward", &validate_norm_forward, nb::arg("kind"), nb::arg("x"), nb::arg("weight").none(),
        nb::arg("bias").none(), nb::arg("residual").none(), nb::arg("eps"), nb::arg("stats") = false,
        "Runs the checks of layer_norm (kind='layer') / rms_norm (kind='rms') on (shape, dtype name) specs.");
  m.def("jax_validate_norm_backward", &validate_norm_backward, nb::arg("kind"), nb::arg("dy"), nb::arg("x"),
        nb::arg("weight").none(), nb::arg("mean").none(), nb::arg("rstd"), nb::arg("dweight") = false,
        nb::arg("dbias") = false, "Runs the checks of layer_norm_backward / rms_norm_backward on specs.");
  m.def("jax_validate_softmax_forward", &validate_softmax_forward, nb::arg("x"));
  m.def("jax_validate_softmax_backward", &validate_softmax_backward, nb::arg("dy"), nb::arg("y"));
}
