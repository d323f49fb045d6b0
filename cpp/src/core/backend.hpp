// How every family's dispatch.cpp runs a validated call: on the CPU backend, or on the
// CUDA backend with the tensors' device made current (and a clear error when this
// libruDNN was built without CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.hpp"
#if RUDNN_WITH_CUDA
#include "core/device.hpp"
#endif

namespace rudnn::core {

template <class Cpu, class Cuda>
void on_device(const Device& device, const char* op, Cpu&& cpu, Cuda&& cuda) {
  if (!device.is_cuda()) return cpu();
#if RUDNN_WITH_CUDA
  (void)op;
  DeviceGuard guard(device.index);
  cuda();
#else
  (void)cuda;
  fail(ErrorKind::unsupported, std::string(op) + ": this libruDNN was built without CUDA (RUDNN_WITH_CUDA=OFF)");
#endif
}

// A caller-allocated workspace: uint8 on the device of `ref`, at least `need` bytes (it may be
// null when nothing is needed), its base aligned to `alignment` bytes when it is needed, for what
// the op keeps in it (`holds`, named in the error).
inline void expect_workspace(const Tensor* workspace, const Tensor& ref, const std::string& ref_name,
                             std::size_t need, const std::string& op, std::size_t alignment = 1,
                             const char* holds = "") {
  if (workspace) {
    expect_same_device(*workspace, ref, op + ": workspace", ref_name);
    expect_dtype(*workspace, DType::u8, op + ": workspace");
  }
  const std::size_t have = workspace ? std::size_t(workspace->numel()) : 0;
  if (have < need)
    fail(ErrorKind::value, op + ": workspace: expected at least " + std::to_string(need) + " bytes, got " +
                               std::to_string(have));
  if (need > 0 && reinterpret_cast<std::uintptr_t>(workspace->data) % alignment != 0)
    fail(ErrorKind::value, op + ": workspace: expected an address aligned to " + std::to_string(alignment) +
                               " bytes (it holds " + holds + ")");
}

}  // namespace rudnn::core
