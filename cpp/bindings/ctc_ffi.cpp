// XLA FFI handlers of the CTC family (rudnn.jax). reduction: 0 none, 1 mean, 2 sum.
//
// Targets (attributes in brackets: blank, reduction, zero_infinity):
//   rudnn_ctc_loss_forward   (log_probs, targets, input_lengths, target_lengths) -> loss
//   rudnn_ctc_loss_backward  (dloss, log_probs, targets, input_lengths, target_lengths) -> dlog_probs
// libruDNN reads the targets and lengths on the host, so the handlers exist on the "cpu" platform
// only; the workspace (whose size depends on those values) is host memory of the handler's own.
// Checks of values run as XLA runs the call (rudnn.jax raises them as rudnn errors when eager).
#include <cstdint>
#include <vector>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/ctc.hpp"

namespace rudnn::jax_ffi {

namespace {

CtcOptions options(std::int64_t blank, std::int32_t reduction, bool zero_infinity) {
  CtcOptions o;
  o.blank = blank;
  o.reduction = reduction == 0 ? CtcReduction::none : reduction == 2 ? CtcReduction::sum : CtcReduction::mean;
  o.zero_infinity = zero_infinity;
  return o;
}

// A host workspace of `bytes` (16-byte aligned), viewed as a u8 tensor in `slot`.
const Tensor* host_workspace(std::size_t bytes, std::vector<std::uint64_t>& storage, Tensor& slot) {
  storage.assign(bytes / 8 + 2, 0);
  const std::int64_t size = std::int64_t(bytes);
  slot = Tensor::contiguous(storage.data(), DType::u8, Device{DeviceType::cpu, 0}, &size, 1);
  return &slot;
}

template <class Args>
void set_inputs(Args& a, const Place& place, const char* op, ffi::AnyBuffer log_probs, ffi::AnyBuffer targets,
                ffi::AnyBuffer input_lengths, ffi::AnyBuffer target_lengths, std::int64_t blank,
                std::int32_t reduction, bool zero_infinity) {
  const std::string prefix = std::string(op) + ": ";
  a.options = options(blank, reduction, zero_infinity);
  a.log_probs = view(log_probs, place, prefix + "log_probs");
  a.targets = view(targets, place, prefix + "targets");
  a.input_lengths = view(input_lengths, place, prefix + "input_lengths");
  a.target_lengths = view(target_lengths, place, prefix + "target_lengths");
}

ffi::Error ctc_forward(const Place& place, ffi::AnyBuffer log_probs, ffi::AnyBuffer targets,
                       ffi::AnyBuffer input_lengths, ffi::AnyBuffer target_lengths, ffi::Result<ffi::AnyBuffer> loss,
                       std::int64_t blank, std::int32_t reduction, bool zero_infinity) {
  return guarded([&] {
    CtcLossArgs a;
    set_inputs(a, place, "ctc_loss", log_probs, targets, input_lengths, target_lengths, blank, reduction,
               zero_infinity);
    a.loss = view(*loss, place, "ctc_loss: loss");
    std::vector<std::uint64_t> storage;
    Tensor workspace;
    a.workspace = host_workspace(ctc_loss_workspace_bytes(a), storage, workspace);
    ctc_loss_forward(a, place.stream);
  });
}

ffi::Error ctc_backward(const Place& place, ffi::AnyBuffer dloss, ffi::AnyBuffer log_probs, ffi::AnyBuffer targets,
                        ffi::AnyBuffer input_lengths, ffi::AnyBuffer target_lengths,
                        ffi::Result<ffi::AnyBuffer> dlog_probs, std::int64_t blank, std::int32_t reduction,
                        bool zero_infinity) {
  return guarded([&] {
    CtcLossBackwardArgs a;
    set_inputs(a, place, "ctc_loss_backward", log_probs, targets, input_lengths, target_lengths, blank, reduction,
               zero_infinity);
    a.dloss = view(dloss, place, "ctc_loss_backward: dloss");
    a.dlog_probs = view(*dlog_probs, place, "ctc_loss_backward: dlog_probs");
    std::vector<std::uint64_t> storage;
    Tensor workspace;
    a.workspace = host_workspace(ctc_loss_backward_workspace_bytes(a), storage, workspace);
    ctc_loss_backward(a, place.stream);
  });
}

template <class B>
auto with_attrs(B&& b) {
  return std::forward<B>(b)
      .template Attr<std::int64_t>("blank")
      .template Attr<std::int32_t>("reduction")
      .template Attr<bool>("zero_infinity");
}

template <class B>
auto bind_inputs(B&& b) {
  return std::forward<B>(b)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>();
}

RUDNN_FFI_HANDLER(ctc_forward_cpu, with_attrs(bind_inputs(cpu_binding()).template Ret<ffi::AnyBuffer>()), on_cpu,
                  ctc_forward)
RUDNN_FFI_HANDLER(ctc_backward_cpu,
                  with_attrs(bind_inputs(cpu_binding().template Arg<ffi::AnyBuffer>()).template Ret<ffi::AnyBuffer>()),
                  on_cpu, ctc_backward)

}  // namespace

void add_ctc_targets(nb::dict& cpu, nb::dict& cuda) {
  (void)cuda;
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_ctc_loss_forward"] = capsule(ctc_forward_cpu);
  cpu["rudnn_ctc_loss_backward"] = capsule(ctc_backward_cpu);
}

}  // namespace rudnn::jax_ffi
