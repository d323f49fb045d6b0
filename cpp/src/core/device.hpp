// Cached properties of CUDA devices (queried once per device per process).
#pragma once

#include <functional>
#include <string>

#include "rudnn/tensor.hpp"

namespace rudnn::core {

struct DeviceProps {
  std::string name;  // "NVIDIA H200", ...
  int sm_count = 0;
  int max_smem_per_block_optin = 0;  // bytes, with cudaFuncAttributeMaxDynamicSharedMemorySize
  int max_smem_per_sm = 0;          // bytes, all resident blocks together (each also holds 1 KB the runtime reserves)
  int max_threads_per_sm = 0;
  int cc_major = 0;
  int cc_minor = 0;
};

// Throws rudnn::Error(cuda) if the device cannot be queried.
const DeviceProps& device_props(int device);

// The device that owns the calling thread's CUDA context.
int current_device();

// "<name> cc<major>.<minor> sms<count>": a device as the on-disk autotune cache keys it (ordinals
// differ between machines; the same model with another SM count may pick differently).
std::string device_tune_key(int device);

// Milliseconds per run of `reps` runs of `run` on `stream`, after one untimed warm-up run (module
// load, first-launch attributes). Synchronizes on its stop event once: autotune only.
float time_on_stream(const std::function<void()>& run, Stream stream, int reps);

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
