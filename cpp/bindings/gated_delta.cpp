// Bindings of the gated delta rule family (rudnn._C.gated_delta_*).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "families.hpp"
#include "rudnn/gated_delta.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

GatedDeltaAlgo as_algo(int a) { return a == 0 ? GatedDeltaAlgo::chunked : GatedDeltaAlgo::recurrent; }
GatedDeltaKernel as_kernel(int k) {
  return k == 1 ? GatedDeltaKernel::chunked : k == 2 ? GatedDeltaKernel::recurrent : GatedDeltaKernel::automatic;
}

GatedDeltaBackwardArgs backward_args(int algo, const In& q, const In& k, const In& v, const In& beta, const In& g,
                                     const OptIn& initial, const OptIn& cu_seqlens, float scale, int chunk_size,
                                     const In& dout, const OptIn& dfinal, const Out& dq, const Out& dk,
                                     const Out& dv, const Out& dbeta, const Out& dg, const OptOut& dinitial,
                                     std::optional<Tensor> (&keep)[5]) {
  GatedDeltaBackwardArgs a;
  a.algo = as_algo(algo);
  a.q = to_tensor(q, "q");
  a.k = to_tensor(k, "k");
  a.v = to_tensor(v, "v");
  a.beta = to_tensor(beta, "beta");
  a.log_decay = to_tensor(g, "log_decay");
  a.initial_state = opt_tensor(initial, "initial_state", keep[0]);
  a.cu_seqlens = opt_tensor(cu_seqlens, "cu_seqlens", keep[1]);
  a.scale = scale;
  a.chunk_size = chunk_size;
  a.dout = to_tensor(dout, "dout");
  a.dfinal_state = opt_tensor(dfinal, "dfinal_state", keep[2]);
  a.dq = to_tensor(dq, "dq");
  a.dk = to_tensor(dk, "dk");
  a.dv = to_tensor(dv, "dv");
  a.dbeta = to_tensor(dbeta, "dbeta");
  a.dlog_decay = to_tensor(dg, "dlog_decay");
  a.dinitial_state = opt_tensor(dinitial, "dinitial_state", keep[3]);
  return a;
}

}  // namespace

GatedDeltaForwardArgs forward_args(int algo, const In& q, const In& k, const In& v, const In& beta, const In& g,
                                   const OptIn& initial, const OptIn& cu_seqlens, float scale, int chunk_size,
                                   const Out& out, const Out& final_state, int kernel,
                                   std::optional<Tensor> (&keep)[3]) {
  GatedDeltaForwardArgs a;
  a.algo = as_algo(algo);
  a.kernel = as_kernel(kernel);
  a.q = to_tensor(q, "q");
  a.k = to_tensor(k, "k");
  a.v = to_tensor(v, "v");
  a.beta = to_tensor(beta, "beta");
  a.log_decay = to_tensor(g, "log_decay");
  a.initial_state = opt_tensor(initial, "initial_state", keep[0]);
  a.cu_seqlens = opt_tensor(cu_seqlens, "cu_seqlens", keep[1]);
  a.scale = scale;
  a.chunk_size = chunk_size;
  a.out = to_tensor(out, "out");
  a.final_state = to_tensor(final_state, "final_state");
  return a;
}

void register_gated_delta(nb::module_& m) {
  m.def("gated_delta_last_algorithm", [] { return std::string(gated_delta_last_algorithm()); },
        "What the last gated delta forward or backward on this thread ran.");

  m.def(
      "gated_delta_forward",
      [](int algo, const In& q, const In& k, const In& v, const In& beta, const In& g, const OptIn& initial,
         const OptIn& cu_seqlens, float scale, int chunk_size, const Out& out, const Out& final_state, int kernel,
         const OptOut& workspace, std::uintptr_t stream, const nb::object& workspace_alloc) {
        std::optional<Tensor> keep[3];
        std::optional<Out> held;
        GatedDeltaForwardArgs a = forward_args(algo, q, k, v, beta, g, initial, cu_seqlens, scale, chunk_size, out,
                                               final_state, kernel, keep);
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return gated_delta_forward_workspace_bytes(a); },
                                     held, keep[2]);
        nb::gil_scoped_release release;
        gated_delta_forward(a, as_stream(stream));
      },
      nb::arg("algo"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("beta"), nb::arg("log_decay"),
      nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("scale"), nb::arg("chunk_size"),
      nb::arg("out"), nb::arg("final_state"), nb::arg("kernel"), nb::arg("workspace").none(), nb::arg("stream"),
      nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "gated_delta_backward",
      [](int algo, const In& q, const In& k, const In& v, const In& beta, const In& g, const OptIn& initial,
         const OptIn& cu_seqlens, float scale, int chunk_size, const In& dout, const OptIn& dfinal, const Out& dq,
         const Out& dk, const Out& dv, const Out& dbeta, const Out& dg, const OptOut& dinitial,
         const OptOut& workspace, std::uintptr_t stream, const nb::object& workspace_alloc, int kernel) {
        std::optional<Tensor> keep[5];
        std::optional<Out> held;
        GatedDeltaBackwardArgs a = backward_args(algo, q, k, v, beta, g, initial, cu_seqlens, scale, chunk_size, dout,
                                                 dfinal, dq, dk, dv, dbeta, dg, dinitial, keep);
        a.kernel = as_kernel(kernel);
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return gated_delta_backward_workspace_bytes(a); },
                                     held, keep[4]);
        nb::gil_scoped_release release;
        gated_delta_backward(a, as_stream(stream));
      },
      nb::arg("algo"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("beta"), nb::arg("log_decay"),
      nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("scale"), nb::arg("chunk_size"),
      nb::arg("dout"), nb::arg("dfinal_state").none(), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
      nb::arg("dbeta"), nb::arg("dlog_decay"), nb::arg("dinitial_state").none(), nb::arg("workspace").none(),
      nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none(), nb::arg("kernel") = 0);
}

}  // namespace rudnn::bindings
