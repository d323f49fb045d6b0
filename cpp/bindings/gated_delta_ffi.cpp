// XLA FFI handlers of the gated delta rule family and their trace-time validation.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets):
//   rudnn_gated_delta_forward   (q, k, v, beta, log_decay, [initial_state], [cu_seqlens])
//                               -> (out, final_state)
//                               [algo: i32 0=chunked 1=recurrent, scale: f32, chunk_size: i32,
//                                kernel: i32 0=auto 1=chunked 2=recurrent, has_initial, has_cu: bool]
//   rudnn_gated_delta_backward  (dout, q, k, v, beta, log_decay, [initial_state], [dfinal_state],
//                                [cu_seqlens]) -> (dq, dk, dv, dbeta, dlog_decay, [dinitial_state])
//                               [algo, scale, chunk_size, has_initial, has_dfinal, has_cu,
//                                has_dinitial]. CUDA scratch comes from XLA.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "gated_delta/problem.hpp"
#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/gated_delta.hpp"

namespace rudnn::jax_ffi {

namespace {

rudnn::GatedDeltaAlgo algo_of(std::int32_t algo) {
  if (algo != 0 && algo != 1)
    fail(ErrorKind::value, "gated_delta: internal: algo attribute must be 0 or 1, got " + std::to_string(algo));
  return algo == 0 ? rudnn::GatedDeltaAlgo::chunked : rudnn::GatedDeltaAlgo::recurrent;
}

rudnn::GatedDeltaKernel kernel_of(std::int32_t kernel) {
  if (kernel < 0 || kernel > 2)
    fail(ErrorKind::value, "gated_delta: internal: kernel attribute must be 0, 1 or 2, got " + std::to_string(kernel));
  return kernel == 1 ? rudnn::GatedDeltaKernel::chunked
                     : kernel == 2 ? rudnn::GatedDeltaKernel::recurrent : rudnn::GatedDeltaKernel::automatic;
}

const char* op_name(std::int32_t algo, bool backward) {
  if (algo == 0) return backward ? "chunk_gated_delta_rule_backward" : "chunk_gated_delta_rule";
  return backward ? "gated_delta_rule_backward" : "gated_delta_rule";
}

ffi::Error gated_delta_forward(const Place& place, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                               ffi::AnyBuffer beta, ffi::AnyBuffer g, ffi::RemainingArgs args,
                               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> final_state,
                               std::int32_t algo, float scale, std::int32_t chunk_size, std::int32_t kernel,
                               bool has_initial, bool has_cu) {
  return guarded([&] {
    const std::string op = op_name(algo, false);
    rudnn::GatedDeltaForwardArgs a;
    a.algo = algo_of(algo);
    a.kernel = kernel_of(kernel);
    a.q = view(q, place, op + ": q");
    a.k = view(k, place, op + ": k");
    a.v = view(v, place, op + ": v");
    a.beta = view(beta, place, op + ": beta");
    a.log_decay = view(g, place, op + ": log_decay");
    a.scale = scale;
    a.chunk_size = chunk_size;
    a.out = view(*out, place, op + ": out");
    a.final_state = view(*final_state, place, op + ": final_state");
    Tensor initial, cu, workspace;
    Inputs in(args, place, op.c_str());
    if (has_initial) a.initial_state = &(initial = in.next("initial_state"));
    if (has_cu) a.cu_seqlens = &(cu = in.next("cu_seqlens"));
    in.finish();
    a.workspace = scratch_workspace(place, rudnn::gated_delta_forward_workspace_bytes(a), workspace, op);
    rudnn::gated_delta_forward(a, place.stream);
  });
}

ffi::Error gated_delta_backward(const Place& place, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                ffi::AnyBuffer v, ffi::AnyBuffer beta, ffi::AnyBuffer g, ffi::RemainingArgs args,
                                ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dbeta,
                                ffi::Result<ffi::AnyBuffer> dg, ffi::RemainingRets rets, std::int32_t algo, float scale,
                                std::int32_t chunk_size, bool has_initial, bool has_dfinal, bool has_cu,
                                bool has_dinitial) {
  return guarded([&] {
    const std::string op = op_name(algo, true);
    rudnn::GatedDeltaBackwardArgs a;
    a.algo = algo_of(algo);
    a.dout = view(dout, place, op + ": dout");
    a.q = view(q, place, op + ": q");
    a.k = view(k, place, op + ": k");
    a.v = view(v, place, op + ": v");
    a.beta = view(beta, place, op + ": beta");
    a.log_decay = view(g, place, op + ": log_decay");
    a.scale = scale;
    a.chunk_size = chunk_size;
    a.dq = view(*dq, place, op + ": dq");
    a.dk = view(*dk, place, op + ": dk");
    a.dv = view(*dv, place, op + ": dv");
    a.dbeta = view(*dbeta, place, op + ": dbeta");
    a.dlog_decay = view(*dg, place, op + ": dlog_decay");
    Tensor initial, dfinal, cu, dinitial, workspace;
    Inputs in(args, place, op.c_str());
    if (has_initial) a.initial_state = &(initial = in.next("initial_state"));
    if (has_dfinal) a.dfinal_state = &(dfinal = in.next("dfinal_state"));
    if (has_cu) a.cu_seqlens = &(cu = in.next("cu_seqlens"));
    in.finish();
    Outputs res(rets, place, op.c_str());
    if (has_dinitial) a.dinitial_state = &(dinitial = res.next("dinitial_state"));
    res.finish();

    a.workspace = scratch_workspace(place, rudnn::gated_delta_backward_workspace_bytes(a), workspace, op);
    rudnn::gated_delta_backward(a, place.stream);
  });
}

template <class B>
auto bind_forward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<std::int32_t>("algo")
      .template Attr<float>("scale")
      .template Attr<std::int32_t>("chunk_size")
      .template Attr<std::int32_t>("kernel")
      .template Attr<bool>("has_initial")
      .template Attr<bool>("has_cu");
}

template <class B>
auto bind_backward(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .RemainingArgs()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .RemainingRets()
      .template Attr<std::int32_t>("algo")
      .template Attr<float>("scale")
      .template Attr<std::int32_t>("chunk_size")
      .template Attr<bool>("has_initial")
      .template Attr<bool>("has_dfinal")
      .template Attr<bool>("has_cu")
      .template Attr<bool>("has_dinitial");
}

RUDNN_FFI_HANDLER(gated_delta_forward_cpu, bind_forward(cpu_binding()), on_cpu, gated_delta_forward)
RUDNN_FFI_HANDLER(gated_delta_backward_cpu, bind_backward(cpu_binding()), on_cpu, gated_delta_backward)
RUDNN_FFI_HANDLER(gated_delta_forward_cuda, bind_forward(cuda_binding()), on_cuda, gated_delta_forward)
RUDNN_FFI_HANDLER(gated_delta_backward_cuda, bind_backward(cuda_binding()), on_cuda, gated_delta_backward)

// Trace-time checks on (shape, dtype) specs; cu_seqlens' values are not known yet.
struct AbstractInputs {
  Tensor q, k, v, beta, g, initial, cu;
  bool has_initial = false, has_cu = false;
};

AbstractInputs abstract_inputs(const std::string& op, const Spec& q, const Spec& k, const Spec& v, const Spec& beta,
                               const Spec& g, const std::optional<Spec>& initial, const std::optional<Spec>& cu) {
  AbstractInputs in;
  in.q = abstract(q, op + ": q");
  in.k = abstract(k, op + ": k");
  in.v = abstract(v, op + ": v");
  in.beta = abstract(beta, op + ": beta");
  in.g = abstract(g, op + ": log_decay");
  if (initial) in.initial = abstract(*initial, op + ": initial_state"), in.has_initial = true;
  if (cu) in.cu = abstract(*cu, op + ": cu_seqlens"), in.has_cu = true;
  return in;
}

void validate_forward(std::int32_t algo, const Spec& q, const Spec& k, const Spec& v, const Spec& beta, const Spec& g,
                      const std::optional<Spec>& initial, const std::optional<Spec>& cu, double scale,
                      std::int32_t chunk_size, std::int32_t kernel, const Spec& out, const Spec& final_state) {
  const std::string op = op_name(algo, false);
  AbstractInputs in = abstract_inputs(op, q, k, v, beta, g, initial, cu);
  rudnn::GatedDeltaForwardArgs a;
  a.algo = algo_of(algo);
  a.q = in.q, a.k = in.k, a.v = in.v, a.beta = in.beta, a.log_decay = in.g;
  if (in.has_initial) a.initial_state = &in.initial;
  if (in.has_cu) a.cu_seqlens = &in.cu;
  a.scale = float(scale);
  a.chunk_size = chunk_size;
  a.kernel = kernel_of(kernel);
  a.out = abstract(out, op + ": out");
  a.final_state = abstract(final_state, op + ": final_state");
  rudnn::gated_delta::validate_forward(a, /*read_offsets=*/false);
}

void validate_backward(std::int32_t algo, const Spec& dout, const Spec& q, const Spec& k, const Spec& v,
                       const Spec& beta, const Spec& g, const std::optional<Spec>& initial,
                       const std::optional<Spec>& dfinal, const std::optional<Spec>& cu, double scale,
                       std::int32_t chunk_size) {
  const std::string op = op_name(algo, true);
  AbstractInputs in = abstract_inputs(op, q, k, v, beta, g, initial, cu);
  rudnn::GatedDeltaBackwardArgs a;
  a.algo = algo_of(algo);
  a.q = in.q, a.k = in.k, a.v = in.v, a.beta = in.beta, a.log_decay = in.g;
  if (in.has_initial) a.initial_state = &in.initial;
  if (in.has_cu) a.cu_seqlens = &in.cu;
  a.scale = float(scale);
  a.chunk_size = chunk_size;
  a.dout = abstract(dout, op + ": dout");
  Tensor dfinal_t;
  if (dfinal) a.dfinal_state = &(dfinal_t = abstract(*dfinal, op + ": dfinal_state"));
  // The gradient outputs are allocated like their inputs.
  a.dq = abstract_like(in.q), a.dk = abstract_like(in.k), a.dv = abstract_like(in.v);
  a.dbeta = abstract_like(in.beta), a.dlog_decay = abstract_like(in.g);
  Tensor dinitial_t;
  if (in.has_initial) a.dinitial_state = &(dinitial_t = abstract_like(in.initial));
  rudnn::gated_delta::validate_backward(a, /*read_offsets=*/false);
}

}  // namespace

void add_gated_delta_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_gated_delta_forward"] = capsule(gated_delta_forward_cpu);
  cpu["rudnn_gated_delta_backward"] = capsule(gated_delta_backward_cpu);
  cuda["rudnn_gated_delta_forward"] = capsule(gated_delta_forward_cuda);
  cuda["rudnn_gated_delta_backward"] = capsule(gated_delta_backward_cuda);
}

void add_gated_delta_validation(nb::module_& m) {
  m.def("jax_validate_gated_delta_forward", &validate_forward, nb::arg("algo"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("beta"), nb::arg("log_decay"), nb::arg("initial_state").none(),
        nb::arg("cu_seqlens").none(), nb::arg("scale"), nb::arg("chunk_size"), nb::arg("kernel"), nb::arg("out"),
        nb::arg("final_state"), "Runs the checks of (chunk_)gated_delta_rule on (shape, dtype name) specs.");
  m.def("jax_validate_gated_delta_backward", &validate_backward, nb::arg("algo"), nb::arg("dout"), nb::arg("q"),
        nb::arg("k"), nb::arg("v"), nb::arg("beta"), nb::arg("log_decay"), nb::arg("initial_state").none(),
        nb::arg("dfinal_state").none(), nb::arg("cu_seqlens").none(), nb::arg("scale"), nb::arg("chunk_size"),
        "Runs the checks of (chunk_)gated_delta_rule_backward on (shape, dtype name) specs.");
}

}  // namespace rudnn::jax_ffi
