// Bindings of the norm/softmax family (rudnn._C.norm_*, softmax_*).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "families.hpp"
#include "rudnn/norm.hpp"
#include "tensor_convert.hpp"

namespace rudnn::bindings {

namespace {

NormKind as_kind(int k) { return k == 0 ? NormKind::layer : NormKind::rms; }

NormBackwardArgs backward_args(int kind, const In& dy, const In& x, const OptIn& weight, const OptIn& mean,
                               const In& rstd, const Out& dx, const OptOut& dweight, const OptOut& dbias,
                               std::optional<Tensor> (&keep)[5]) {
  NormBackwardArgs a;
  a.kind = as_kind(kind);
  a.dy = to_tensor(dy, "dy");
  a.x = to_tensor(x, "x");
  a.weight = opt_tensor(weight, "weight", keep[0]);
  a.mean = opt_tensor(mean, "mean", keep[1]);
  a.rstd = to_tensor(rstd, "rstd");
  a.dx = to_tensor(dx, "dx");
  a.dweight = opt_tensor(dweight, "dweight", keep[2]);
  a.dbias = opt_tensor(dbias, "dbias", keep[3]);
  return a;
}

}  // namespace

void register_norm(nb::module_& m) {
  m.def(
      "norm_forward",
      [](int kind, const In& x, const OptIn& weight, const OptIn& bias, const OptIn& residual, float eps,
         const Out& y, const OptOut& residual_out, const OptOut& mean, const OptOut& rstd, std::uintptr_t stream) {
        std::optional<Tensor> keep[6];
        NormForwardArgs a;
        a.kind = as_kind(kind);
        a.x = to_tensor(x, "x");
        a.weight = opt_tensor(weight, "weight", keep[0]);
        a.bias = opt_tensor(bias, "bias", keep[1]);
        a.residual = opt_tensor(residual, "residual", keep[2]);
        a.eps = eps;
        a.y = to_tensor(y, "y");
        a.residual_out = opt_tensor(residual_out, "residual_out", keep[3]);
        a.mean = opt_tensor(mean, "mean", keep[4]);
        a.rstd = opt_tensor(rstd, "rstd", keep[5]);
        nb::gil_scoped_release release;
        norm_forward(a, as_stream(stream));
      },
      nb::arg("kind"), nb::arg("x"), nb::arg("weight").none(), nb::arg("bias").none(), nb::arg("residual").none(),
      nb::arg("eps"), nb::arg("y"), nb::arg("residual_out").none(), nb::arg("mean").none(), nb::arg("rstd").none(),
      nb::arg("stream"));

  m.def(
      "norm_backward",
      [](int kind, const In& dy, const In& x, const OptIn& weight, const OptIn& mean, const In& rstd, const Out& dx,
         const OptOut& dweight, const OptOut& dbias, const OptOut& workspace, std::uintptr_t stream,
         const nb::object& workspace_alloc) {
        std::optional<Tensor> keep[5];
        std::optional<Out> held;
        NormBackwardArgs a = backward_args(kind, dy, x, weight, mean, rstd, dx, dweight, dbias, keep);
        a.workspace = workspace_from(workspace, workspace_alloc, [&] { return norm_backward_workspace_bytes(a); },
                                     held, keep[4]);
        nb::gil_scoped_release release;
        norm_backward(a, as_stream(stream));
      },
      nb::arg("kind"), nb::arg("dy"), nb::arg("x"), nb::arg("weight").none(), nb::arg("mean").none(),
      nb::arg("rstd"), nb::arg("dx"), nb::arg("dweight").none(), nb::arg("dbias").none(),
      nb::arg("workspace").none(), nb::arg("stream"), nb::arg("workspace_alloc").none() = nb::none());

  m.def(
      "softmax_forward",
      [](const In& x, const Out& y, std::uintptr_t stream) {
        const Tensor tx = to_tensor(x, "x"), ty = to_tensor(y, "y");
        nb::gil_scoped_release release;
        softmax_forward(tx, ty, as_stream(stream));
      },
      nb::arg("x"), nb::arg("y"), nb::arg("stream"));

  m.def(
      "softmax_backward",
      [](const In& dy, const In& y, const Out& dx, std::uintptr_t stream) {
        const Tensor tdy = to_tensor(dy, "dy"), ty = to_tensor(y, "y"), tdx = to_tensor(dx, "dx");
        nb::gil_scoped_release release;
        softmax_backward(tdy, ty, tdx, as_stream(stream));
      },
      nb::arg("dy"), nb::arg("y"), nb::arg("dx"), nb::arg("stream"));
}

}  // namespace rudnn::bindings
