// Bindings of the attention family (rudnn._C.attention_*).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "families.hpp"
#include "rudnn/attention.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

// The optional tensors of AttentionOptions live in `keep` (mask, bias, cu_q, cu_k).
AttentionOptions options(const OptIn& mask, const OptIn& bias, std::optional<double> scale, bool causal,
                         std::int64_t window_left, std::int64_t window_right, double softcap, const OptIn& cu_q,
                         const OptIn& cu_k, int strategy, std::optional<Tensor> (&keep)[4]) {
  AttentionOptions o;
  o.mask = opt_tensor(mask, "mask", keep[0]);
  o.bias = opt_tensor(bias, "bias", keep[1]);
  o.scale = scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.cu_seqlens_q = opt_tensor(cu_q, "cu_seqlens_q", keep[2]);
  o.cu_seqlens_k = opt_tensor(cu_k, "cu_seqlens_k", keep[3]);
  o.strategy = static_cast<AttentionStrategy>(strategy);
  return o;
}

#define RUDNN_ATTENTION_OPTION_ARGS                                                                         \
  nb::arg("mask").none(), nb::arg("bias").none(), nb::arg("scale").none(), nb::arg("causal"),               \
      nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"), nb::arg("cu_seqlens_q").none(), \
      nb::arg("cu_seqlens_k").none(), nb::arg("strategy")

}  // namespace

void register_attention(nb::module_& m) {
  auto forward_args = [](const In& q, const In& k, const In& v, const OptIn& mask, const OptIn& bias,
                         std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
                         const OptIn& cu_q, const OptIn& cu_k, int strategy, const Out& out, const OptOut& lse,
                         std::optional<Tensor> (&keep)[4], std::optional<Tensor>& keep_lse) {
    AttentionForwardArgs a;
    a.q = to_tensor(q, "q");
    a.k = to_tensor(k, "k");
    a.v = to_tensor(v, "v");
    a.options = options(mask, bias, scale, causal, wl, wr, softcap, cu_q, cu_k, strategy, keep);
    a.out = to_tensor(out, "out");
    a.lse = opt_tensor(lse, "lse", keep_lse);
    return a;
  };

  m.def(
      "attention_forward",
      [forward_args](const In& q, const In& k, const In& v, const OptIn& mask, const OptIn& bias,
                     std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
                     const OptIn& cu_q, const OptIn& cu_k, int strategy, const Out& out, const OptOut& lse,
                     const OptOut& workspace, std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep[4], keep_lse, ws;
        std::optional<Out> held;
        const AttentionForwardArgs a = forward_args(q, k, v, mask, bias, scale, causal, wl, wr, softcap, cu_q, cu_k,
                                                    strategy, out, lse, keep, keep_lse);
        const Tensor* w = workspace_from(workspace, workspace_alloc, [&] { return attention_forward_workspace_bytes(a); },
                                         held, ws);
        nb::gil_scoped_release release;
        attention_forward(a, w, as_stream(stream));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), RUDNN_ATTENTION_OPTION_ARGS, nb::arg("out"), nb::arg("lse").none(),
      nb::arg("workspace").none(), nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());

  auto backward_args = [](const In& dout, const In& q, const In& k, const In& v, const In& out, const In& lse,
                          const OptIn& mask, const OptIn& bias, std::optional<double> scale, bool causal,
                          std::int64_t wl, std::int64_t wr, double softcap, const OptIn& cu_q, const OptIn& cu_k,
                          int strategy, bool deterministic, const OptIn& dlse, const Out& dq, const Out& dk,
                          const Out& dv, std::optional<Tensor> (&keep)[4], std::optional<Tensor>& keep_dlse) {
    AttentionBackwardArgs a;
    a.dout = to_tensor(dout, "dout");
    a.q = to_tensor(q, "q");
    a.k = to_tensor(k, "k");
    a.v = to_tensor(v, "v");
    a.out = to_tensor(out, "out");
    a.lse = to_tensor(lse, "lse");
    a.options = options(mask, bias, scale, causal, wl, wr, softcap, cu_q, cu_k, strategy, keep);
    a.deterministic = deterministic;
    a.dlse = opt_tensor(dlse, "dlse", keep_dlse);
    a.dq = to_tensor(dq, "dq");
    a.dk = to_tensor(dk, "dk");
    a.dv = to_tensor(dv, "dv");
    return a;
  };

  m.def(
      "attention_backward",
      [backward_args](const In& dout, const In& q, const In& k, const In& v, const In& out, const In& lse,
                      const OptIn& mask, const OptIn& bias, std::optional<double> scale, bool causal, std::int64_t wl,
                      std::int64_t wr, double softcap, const OptIn& cu_q, const OptIn& cu_k, int strategy,
                      bool deterministic, const OptIn& dlse, const Out& dq, const Out& dk, const Out& dv,
                      const OptOut& workspace, std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep[4], keep_dlse, ws;
        std::optional<Out> held;
        const AttentionBackwardArgs a = backward_args(dout, q, k, v, out, lse, mask, bias, scale, causal, wl, wr,
                                                      softcap, cu_q, cu_k, strategy, deterministic, dlse, dq, dk, dv,
                                                      keep, keep_dlse);
        const Tensor* w = workspace_from(workspace, workspace_alloc,
                                         [&] { return attention_backward_workspace_bytes(a); }, held, ws);
        nb::gil_scoped_release release;
        attention_backward(a, w, as_stream(stream));
      },
      nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
      RUDNN_ATTENTION_OPTION_ARGS, nb::arg("deterministic"), nb::arg("dlse").none(), nb::arg("dq"), nb::arg("dk"),
      nb::arg("dv"), nb::arg("workspace").none(), nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());

  // For the tests: the workspace_alloc path of the calls above, which on the CPU never needs a
  // workspace (returns the byte count and device type of what `alloc` handed back for n bytes).
  m.def("_workspace_alloc_check", [](const nb::object& alloc, std::size_t n) {
    std::optional<Out> held;
    std::optional<Tensor> slot;
    const Tensor* w = workspace_from(std::nullopt, alloc, [n] { return n; }, held, slot);
    return w ? nb::make_tuple(std::size_t(w->numel()) * dtype_size(w->dtype), int(w->device.type)) : nb::make_tuple();
  }, nb::arg("alloc").none(), nb::arg("n"));

  m.def("attention_last_algorithm", [] { return std::string(attention_last_algorithm()); },
        "The kernel the last attention call on this thread ran (cpu, fallback, flash_sm80, ...).");
}

}  // namespace rudnn::bindings
