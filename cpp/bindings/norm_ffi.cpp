// XLA FFI handlers of the norm/softmax family and their trace-time validation.
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
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "norm/problem.hpp"
#include "rudnn/norm.hpp"

namespace rudnn::jax_ffi {

namespace {

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

    a.workspace = scratch_workspace(place, rudnn::norm_backward_workspace_bytes(a), workspace, op);
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

}  // namespace

void add_norm_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_norm_forward"] = capsule(norm_forward_cpu);
  cpu["rudnn_norm_backward"] = capsule(norm_backward_cpu);
  cpu["rudnn_softmax_forward"] = capsule(softmax_forward_cpu);
  cpu["rudnn_softmax_backward"] = capsule(softmax_backward_cpu);
  cuda["rudnn_norm_forward"] = capsule(norm_forward_cuda);
  cuda["rudnn_norm_backward"] = capsule(norm_backward_cuda);
  cuda["rudnn_softmax_forward"] = capsule(softmax_forward_cuda);
  cuda["rudnn_softmax_backward"] = capsule(softmax_backward_cuda);
}

namespace {

// A float32 tensor of shape x.shape[:-1] (the statistics outputs).
Tensor stats_like(const Tensor& x) {
  const int rank = x.rank > 0 ? x.rank - 1 : 0;
  return Tensor::contiguous(placeholder_data(), DType::f32, x.device, x.shape, rank);
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
  a.y = abstract_like(a.x);
  a.eps = float(eps);
  Tensor weight, bias, residual, residual_out, mean, rstd;
  if (weight_spec) a.weight = &(weight = abstract(*weight_spec, op + ": weight"));
  if (bias_spec) a.bias = &(bias = abstract(*bias_spec, op + ": bias"));
  if (residual_spec) {
    a.residual = &(residual = abstract(*residual_spec, op + ": residual"));
    a.residual_out = &(residual_out = abstract_like(a.x));
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
  a.dx = abstract_like(a.x);
  a.rstd = abstract(rstd_spec, op + ": rstd");
  Tensor weight, mean, dweight_t, dbias_t;
  if (weight_spec) a.weight = &(weight = abstract(*weight_spec, op + ": weight"));
  if (mean_spec) a.mean = &(mean = abstract(*mean_spec, op + ": mean"));
  if (a.x.rank >= 1) {
    const std::int64_t hidden = a.x.shape[a.x.rank - 1];
    if (dweight) a.dweight = &(dweight_t = Tensor::contiguous(placeholder_data(), DType::f32, a.x.device, &hidden, 1));
    if (dbias) a.dbias = &(dbias_t = Tensor::contiguous(placeholder_data(), DType::f32, a.x.device, &hidden, 1));
  }
  rudnn::norm::validate_backward(a);
}

void validate_softmax_forward(const Spec& x_spec) {
  const Tensor x = abstract(x_spec, "softmax: x");
  rudnn::norm::validate_softmax_forward(x, abstract_like(x));
}

void validate_softmax_backward(const Spec& dy_spec, const Spec& y_spec) {
  const Tensor dy = abstract(dy_spec, "softmax_backward: dy");
  const Tensor y = abstract(y_spec, "softmax_backward: y");
  rudnn::norm::validate_softmax_backward(dy, y, abstract_like(y));
}

}  // namespace

void add_norm_validation(nb::module_& m) {
  m.def("jax_validate_norm_forward", &validate_norm_forward, nb::arg("kind"), nb::arg("x"), nb::arg("weight").none(),
        nb::arg("bias").none(), nb::arg("residual").none(), nb::arg("eps"), nb::arg("stats") = false,
        "Runs the checks of layer_norm (kind='layer') / rms_norm (kind='rms') on (shape, dtype name) specs.");
  m.def("jax_validate_norm_backward", &validate_norm_backward, nb::arg("kind"), nb::arg("dy"), nb::arg("x"),
        nb::arg("weight").none(), nb::arg("mean").none(), nb::arg("rstd"), nb::arg("dweight") = false,
        nb::arg("dbias") = false, "Runs the checks of layer_norm_backward / rms_norm_backward on specs.");
  m.def("jax_validate_softmax_forward", &validate_softmax_forward, nb::arg("x"));
  m.def("jax_validate_softmax_backward", &validate_softmax_backward, nb::arg("dy"), nb::arg("y"));
}

}  // namespace rudnn::jax_ffi
