// Cached properties of CUDA devices (queried once per device per process).
#pragma once

#include <string>

namespace rudnn::core {

struct DeviceProps {
  std::string name;  // "NVIDIA H200", ...
  int sm_count = 0;
  int max_smem_per_block_optin = 0;  // bytes, with cudaFuncAttributeMaxDynamicSharedMemorySize
  int max_threads_per_sm = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

// Throws rudnn::Error(cuda) if the device cannot be queried.
const DeviceProps& device_props(int device);

// The device that owns the calling thread's CUDA context.
int current_device();

// Makes `device` current for the lifetime of the guard, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

}  // namespace rudnn::core
