// XLA FFI handlers of the CTC family (rudnn.jax). reduction: 0 none, 1 mean, 2 sum.
//
// Targets (the same names on the "cpu" and "CUDA" platforms; attributes in brackets: blank,
// reduction, zero_infinity):
//   rudnn_ctc_loss_forward   (log_probs, targets, input_lengths, target_lengths) -> loss
//   rudnn_ctc_loss_backward  (dloss, log_probs, targets, input_lengths, target_lengths) -> dlog_probs
// libruDNN reads the targets and lengths on the host (their values size the problem and the
// workspace). The cpu handlers view XLA's buffers as they are and take a host workspace of their
// own; the CUDA handlers copy the three integer operands into host memory of their own (on XLA's
// stream, then wait for it: a synchronization per call, as torch's ctc_loss makes for CUDA lengths)
// and take the workspace from XLA's scratch allocator. Checks of values run as XLA runs the call
// (rudnn.jax raises them as rudnn errors when eager).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "jax_ffi.hpp"
#include "jax_ffi_common.hpp"
#include "rudnn/ctc.hpp"
#if RUDNN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#endif

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

// The workspace of a call: host memory of the handler's own on the cpu platform (`storage`),
// XLA's scratch memory on CUDA.
const Tensor* workspace(const Place& place, std::size_t bytes, std::vector<std::uint64_t>& storage, Tensor& slot,
                        const char* op) {
  if (place.device.is_cuda()) return scratch_workspace(place, bytes, slot, op);
  return host_workspace(bytes, storage, slot);
}

// Host memory of the handler's own for the integer operands of a CUDA call (8-byte words, so
// int64 values are aligned); it outlives the libruDNN call that reads it.
struct HostInts {
  std::vector<std::uint64_t> targets, input_lengths, target_lengths;
};

#if RUDNN_WITH_CUDA
// Makes a device current while it lives, and the caller's device again after.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    RUDNN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) RUDNN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CurrentDevice() {
    int now = 0;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
};

// One integer operand of a CUDA call: its view (of `bytes` bytes of device memory) and the host
// memory of its copy.
struct HostCopy {
  Tensor& view;
  std::size_t bytes;
  std::vector<std::uint64_t>& host;
};

// Copies the operands into their host memory in the order of XLA's stream (which produced them),
// waits for the stream, and points the views at the copies.
void copy_to_host(const Place& place, std::initializer_list<HostCopy> copies) {
  CurrentDevice current(place.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(place.stream);
  for (const HostCopy& c : copies) {
    c.host.assign((c.bytes + 7) / 8, 0);
    if (c.bytes > 0)
      RUDNN_CUDA_CHECK(cudaMemcpyAsync(c.host.data(), c.view.data, c.bytes, cudaMemcpyDeviceToHost, stream));
  }
  RUDNN_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (const HostCopy& c : copies) {
    c.view.data = c.host.data();
    c.view.device = Device{DeviceType::cpu, 0};
  }
}
#endif

template <class Args>
void set_inputs(Args& a, const Place& place, const char* op, ffi::AnyBuffer log_probs, ffi::AnyBuffer targets,
                ffi::AnyBuffer input_lengths, ffi::AnyBuffer target_lengths, std::int64_t blank,
                std::int32_t reduction, bool zero_infinity, HostInts& host) {
  const std::string prefix = std::string(op) + ": ";
  a.options = options(blank, reduction, zero_infinity);
  a.log_probs = view(log_probs, place, prefix + "log_probs");
  a.targets = view(targets, place, prefix + "targets");
  a.input_lengths = view(input_lengths, place, prefix + "input_lengths");
  a.target_lengths = view(target_lengths, place, prefix + "target_lengths");
  if (!place.device.is_cuda()) return;
#if RUDNN_WITH_CUDA
  copy_to_host(place, {{a.targets, targets.size_bytes(), host.targets},
                       {a.input_lengths, input_lengths.size_bytes(), host.input_lengths},
                       {a.target_lengths, target_lengths.size_bytes(), host.target_lengths}});
#else
  (void)host;
  fail(ErrorKind::unsupported, std::string(op) + ": this libruDNN was built without CUDA (RUDNN_WITH_CUDA=OFF)");
#endif
}

ffi::Error ctc_forward(const Place& place, ffi::AnyBuffer log_probs, ffi::AnyBuffer targets,
                       ffi::AnyBuffer input_lengths, ffi::AnyBuffer target_lengths, ffi::Result<ffi::AnyBuffer> loss,
                       std::int64_t blank, std::int32_t reduction, bool zero_infinity) {
  return guarded([&] {
    CtcLossArgs a;
    HostInts host;
    set_inputs(a, place, "ctc_loss", log_probs, targets, input_lengths, target_lengths, blank, reduction,
               zero_infinity, host);
    a.loss = view(*loss, place, "ctc_loss: loss");
    std::vector<std::uint64_t> storage;
    Tensor slot;
    a.workspace = workspace(place, ctc_loss_workspace_bytes(a), storage, slot, "ctc_loss");
    ctc_loss_forward(a, place.stream);
  });
}

ffi::Error ctc_backward(const Place& place, ffi::AnyBuffer dloss, ffi::AnyBuffer log_probs, ffi::AnyBuffer targets,
                        ffi::AnyBuffer input_lengths, ffi::AnyBuffer target_lengths,
                        ffi::Result<ffi::AnyBuffer> dlog_probs, std::int64_t blank, std::int32_t reduction,
                        bool zero_infinity) {
  return guarded([&] {
    CtcLossBackwardArgs a;
    HostInts host;
    set_inputs(a, place, "ctc_loss_backward", log_probs, targets, input_lengths, target_lengths, blank, reduction,
               zero_infinity, host);
    a.dloss = view(dloss, place, "ctc_loss_backward: dloss");
    a.dlog_probs = view(*dlog_probs, place, "ctc_loss_backward: dlog_probs");
    std::vector<std::uint64_t> storage;
    Tensor slot;
    a.workspace = workspace(place, ctc_loss_backward_workspace_bytes(a), storage, slot, "ctc_loss_backward");
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
RUDNN_FFI_HANDLER(ctc_forward_cuda, with_attrs(bind_inputs(cuda_binding()).template Ret<ffi::AnyBuffer>()), on_cuda,
                  ctc_forward)
RUDNN_FFI_HANDLER(ctc_backward_cuda,
                  with_attrs(bind_inputs(cuda_binding().template Arg<ffi::AnyBuffer>()).template Ret<ffi::AnyBuffer>()),
                  on_cuda, ctc_backward)

}  // namespace

// Registered in every build: without the CUDA backend the CUDA handlers report UnsupportedError.
void add_ctc_targets(nb::dict& cpu, nb::dict& cuda) {
  auto capsule = [](XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) { return nb::capsule(reinterpret_cast<void*>(fn)); };
  cpu["rudnn_ctc_loss_forward"] = capsule(ctc_forward_cpu);
  cpu["rudnn_ctc_loss_backward"] = capsule(ctc_backward_cpu);
  cuda["rudnn_ctc_loss_forward"] = capsule(ctc_forward_cuda);
  cuda["rudnn_ctc_loss_backward"] = capsule(ctc_backward_cuda);
}

}  // namespace rudnn::jax_ffi
