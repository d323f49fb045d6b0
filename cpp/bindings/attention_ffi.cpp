// XLA FFI handlers of attention and their trace-time validation.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets):
//   rudnn_attention_forward   (q, k, v, [mask], [bias], [cu_q, cu_k]) -> (out, lse)
//   rudnn_attention_backward  (dout, q, k, v, out, lse, [mask], [bias], [cu_q, cu_k], [dlse]) -> (dq, dk, dv)
//   [has_mask, has_bias, varlen, has_scale, causal: bool, scale, softcap: f32,
//    window_left, window_right: i64, strategy: i32; backward also deterministic, has_dlse: bool]
// CUDA workspaces come from XLA's scratch allocator.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "attention/problem.hpp"
#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/attention.hpp"

namespace rudnn::jax_ffi {

namespace {

struct OptionAttrs {
  bool has_mask, has_bias, varlen, has_scale, causal;
  float scale, softcap;
  std::int64_t window_left, window_right;
  std::int32_t strategy;
};

// Reads the optional operands of the options in their fixed order into `slots` and returns the
// options (the caller reads any operand after them, then calls in.finish()).
rudnn::AttentionOptions read_options(const OptionAttrs& o, Inputs& in, Tensor (&slots)[4]) {
  rudnn::AttentionOptions opt;
  if (o.has_mask) opt.mask = &(slots[0] = in.next("mask"));
  if (o.has_bias) opt.bias = &(slots[1] = in.next("bias"));
  if (o.varlen) {
    opt.cu_seqlens_q = &(slots[2] = in.next("cu_seqlens_q"));
    opt.cu_seqlens_k = &(slots[3] = in.next("cu_seqlens_k"));
  }
  if (o.has_scale) opt.scale = o.scale;
  opt.causal = o.causal;
  opt.window_left = o.window_left;
  opt.window_right = o.window_right;
  opt.softcap = o.softcap;
  if (o.strategy < 0 || o.strategy > 3)
    fail(ErrorKind::value, "attention: internal: strategy attribute out of range: " + std::to_string(o.strategy));
  opt.strategy = static_cast<rudnn::AttentionStrategy>(o.strategy);
  return opt;
}

ffi::Error attention_forward(const Place& place, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                             ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                             bool has_mask, bool has_bias, bool varlen, bool has_scale, bool causal, float scale,
                             float softcap, std::int64_t window_left, std::int64_t window_right,
                             std::int32_t strategy) {
  return guarded([&] {
    const char* op = "attention";
    rudnn::AttentionForwardArgs a;
    a.q = view(q, place, "attention: q");
    a.k = view(k, place, "attention: k");
    a.v = view(v, place, "attention: v");
    Tensor slots[4], lse_t, ws;
    Inputs in(args, place, op);
    a.options = read_options({has_mask, has_bias, varlen, has_scale, causal, scale, softcap, window_left, window_right,
                              strategy},
                             in, slots);
    in.finish();
    a.out = view(*out, place, "attention: out");
    lse_t = view(*lse, place, "attention: lse");
    a.lse = &lse_t;
    const Tensor* w = scratch_workspace(place, rudnn::attention_forward_workspace_bytes(a), ws, op);
    rudnn::attention_forward(a, w, place.stream);
  });
}

ffi::Error attention_backward(const Place& place, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                              ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::RemainingArgs args,
                              ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                              ffi::Result<ffi::AnyBuffer> dv, bool has_mask, bool has_bias, bool varlen,
                              bool has_scale, bool causal, float scale, float softcap, std::int64_t window_left,
                              std::int64_t window_right, std::int32_t strategy, bool deterministic, bool has_dlse) {
  return guarded([&] {
    const char* op = "attention_backward";
    rudnn::AttentionBackwardArgs a;
    a.dout = view(dout, place, "attention_backward: dout");
    a.q = view(q, place, "attention_backward: q");
    a.k = view(k, place, "attention_backward: k");
    a.v = view(v, place, "attention_backward: v");
    a.out = view(out, place, "attention_backward: out");
    a.lse = view(lse, place, "attention_backward: lse");
    Tensor slots[4], dlse, ws;
    Inputs in(args, place, op);
    a.options = read_options({has_mask, has_bias, varlen, has_scale, causal, scale, softcap, window_left, window_right,
                              strategy},
                             in, slots);
    if (has_dlse) a.dlse = &(dlse = in.next("dlse"));
    in.finish();
    a.deterministic = deterministic;
    a.dq = view(*dq, place, "attention_backward: dq");
    a.dk = view(*dk, place, "attention_backward: dk");
    a.dv = view(*dv, place, "attention_backward: dv");
    const Tensor* w = scratch_workspace(place, rudnn::attention_backward_workspace_bytes(a), ws, op);
    rudnn::attention_backward(a, w, place.stream);
  });
}

template <class B>
auto with_option_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<bool>("has_mask")
      .template Attr<bool>("has_bias")
      .template Attr<bool>("varlen")
      .template Attr<bool>("has_scale")
      .template Attr<bool>("causal")
      .template Attr<float>("scale")
      .template Attr<float>("softcap")
      .template Attr<std::int64_t>("window_left")
      .template Attr<std::int64_t>("window_right")
      .template Attr<std::int32_t>("strategy");
}

template <class B>
auto bind_forward(B&& b) {
  return with_option_attrs(std::forward<B>(b)
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .RemainingArgs()
                               .template Ret<ffi::AnyBuffer>()
                               .template Ret<ffi::AnyBuffer>());
}

template <class B>
auto bind_backward(B&& b) {
  return with_option_attrs(std::forward<B>(b)
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .template Arg<ffi::AnyBuffer>()
                               .RemainingArgs()
                               .template Ret<ffi::AnyBuffer>()
                               .template Ret<ffi::AnyBuffer>()
                               .template Ret<ffi::AnyBuffer>())
      .template Attr<bool>("deterministic")
      .template Attr<bool>("has_dlse");
}

RUDNN_FFI_HANDLER(attention_forward_cpu, bind_forward(cpu_binding()), on_cpu, attention_forward)
RUDNN_FFI_HANDLER(attention_backward_cpu, bind_backward(cpu_binding()), on_cpu, attention_backward)
RUDNN_FFI_HANDLER(attention_forward_cuda, bind_forward(cuda_binding()), on_cuda, attention_forward)
RUDNN_FFI_HANDLER(attention_backward_cuda, bind_backward(cuda_binding()), on_cuda, attention_backward)

// Abstract views for trace-time validation. They claim a CUDA device so that the checks
// never read the (absent) values of cu_seqlens; every operand claims the same device.
Tensor abstract_view(const Spec& spec, const std::string& name) {
  Tensor t = abstract(spec, name);
  t.device = Device{DeviceType::cuda, 0};
  return t;
}

rudnn::AttentionOptions abstract_options(const std::optional<Spec>& mask, const std::optional<Spec>& bias,
                                         const std::optional<Spec>& cu_q, const std::optional<Spec>& cu_k,
                                         std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr,
                                         double softcap, const std::string& op, Tensor (&slots)[4]) {
  rudnn::AttentionOptions o;
  if (mask) o.mask = &(slots[0] = abstract_view(*mask, op + ": mask"));
  if (bias) o.bias = &(slots[1] = abstract_view(*bias, op + ": bias"));
  if (cu_q) o.cu_seqlens_q = &(slots[2] = abstract_view(*cu_q, op + ": cu_seqlens_q"));
  if (cu_k) o.cu_seqlens_k = &(slots[3] = abstract_view(*cu_k, op + ": cu_seqlens_k"));
  o.scale = scale;
  o.causal = causal;
  o.window_left = wl;
  o.window_right = wr;
  o.softcap = softcap;
  return o;
}

// Returns (out shape, lse shape) after running the forward checks on specs.
std::tuple<std::vector<std::int64_t>, std::vector<std::int64_t>> validate_forward(
    const Spec& q, const Spec& k, const Spec& v, const std::optional<Spec>& mask, const std::optional<Spec>& bias,
    const std::optional<Spec>& cu_q, const std::optional<Spec>& cu_k, std::optional<double> scale, bool causal,
    std::int64_t wl, std::int64_t wr, double softcap) {
  rudnn::AttentionForwardArgs a;
  const std::string op = "attention";
  Tensor slots[4];
  a.q = abstract_view(q, op + ": q");
  a.k = abstract_view(k, op + ": k");
  a.v = abstract_view(v, op + ": v");
  a.options = abstract_options(mask, bias, cu_q, cu_k, scale, causal, wl, wr, softcap, op, slots);
  // Out and lse are allocated by XLA from the shapes returned here: check q/k/v first with an
  // out of the shape the validation expects (derived once the inputs passed).
  const bool varlen = cu_q.has_value() || cu_k.has_value();
  std::vector<std::int64_t> out_shape, lse_shape;
  if (!varlen && a.q.rank == 4 && a.v.rank == 4) {
    out_shape = {a.q.shape[0], a.q.shape[1], a.q.shape[2], a.v.shape[3]};
    lse_shape = {a.q.shape[0], a.q.shape[1], a.q.shape[2]};
  } else if (varlen && a.q.rank == 3 && a.v.rank == 3) {
    out_shape = {a.q.shape[0], a.q.shape[1], a.v.shape[2]};
    lse_shape = {a.q.shape[1], a.q.shape[0]};
  } else {
    out_shape = {0};
    lse_shape = {0};
  }
  a.out = Tensor::contiguous(placeholder_data(), a.q.dtype, a.q.device, out_shape.data(), int(out_shape.size()));
  Tensor lse = Tensor::contiguous(placeholder_data(), DType::f32, a.q.device, lse_shape.data(), int(lse_shape.size()));
  a.lse = &lse;
  rudnn::attention::validate_forward(a);
  return {out_shape, lse_shape};
}

void validate_backward(const Spec& dout, const Spec& q, const Spec& k, const Spec& v, const Spec& out,
                       const Spec& lse, const std::optional<Spec>& mask, const std::optional<Spec>& bias,
                       const std::optional<Spec>& cu_q, const std::optional<Spec>& cu_k, std::optional<double> scale,
                       bool causal, std::int64_t wl, std::int64_t wr, double softcap,
                       const std::optional<Spec>& dlse) {
  rudnn::AttentionBackwardArgs a;
  const std::string op = "attention_backward";
  Tensor slots[4], dlse_t;
  if (dlse) a.dlse = &(dlse_t = abstract_view(*dlse, op + ": dlse"));
  a.dout = abstract_view(dout, op + ": dout");
  a.q = abstract_view(q, op + ": q");
  a.k = abstract_view(k, op + ": k");
  a.v = abstract_view(v, op + ": v");
  a.out = abstract_view(out, op + ": out");
  a.lse = abstract_view(lse, op + ": lse");
  a.options = abstract_options(mask, bias, cu_q, cu_k, scale, causal, wl, wr, softcap, op, slots);
  a.dq = abstract_like(a.q);
  a.dk = abstract_like(a.k);
  a.dv = abstract_like(a.v);
  rudnn::attention::validate_backward(a);
}

}  // namespace

void add_attention_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_attention_forward"] = capsule(attention_forward_cpu);
  cpu["rudnn_attention_backward"] = capsule(attention_backward_cpu);
  cuda["rudnn_attention_forward"] = capsule(attention_forward_cuda);
  cuda["rudnn_attention_backward"] = capsule(attention_backward_cuda);
}

void add_attention_validation(nb::module_& m) {
  m.def("jax_validate_attention_forward", &validate_forward, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("mask").none(), nb::arg("bias").none(), nb::arg("cu_seqlens_q").none(),
        nb::arg("cu_seqlens_k").none(), nb::arg("scale").none(), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("softcap"),
        "Runs the checks of attention on (shape, dtype name) specs; returns (out shape, lse shape).");
  m.def("jax_validate_attention_backward", &validate_backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("mask").none(), nb::arg("bias").none(),
        nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("scale").none(), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"), nb::arg("dlse").none());
}

}  // namespace rudnn::jax_ffi
