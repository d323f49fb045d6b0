#include "core/device.hpp"

#include <array>
#include <mutex>

#include "core/cuda_check.hpp"

namespace rudnn::core {

namespace {
constexpr int kMaxDevices = 64;
std::mutex props_mutex;
std::array<DeviceProps, kMaxDevices> props_cache;
std::array<bool, kMaxDevices> props_known{};
}  // namespace

const DeviceProps& device_props(int device) {
  if (device < 0 || device >= kMaxDevices)
    throw Error(ErrorKind::device, "CUDA device index " + std::to_string(device) + " is out of range");
  std::lock_guard<std::mutex> lock(props_mutex);
  if (!props_known[device]) {
    DeviceProps p;
    cudaDeviceProp full{};
    RUDNN_CUDA_CHECK(cudaGetDeviceProperties(&full, device));
    p.name = full.name;
    RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, device));
    RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&p.max_smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&p.max_smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&p.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&p.cc_major, cudaDevAttrComputeCapabilityMajor, device));
    RUDNN_CUDA_CHECK(cudaDeviceGetAttribute(&p.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
    props_cache[device] = p;
    props_known[device] = true;
  }
  return props_cache[device];
}

int current_device() {
  int d = 0;
  RUDNN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

std::string device_tune_key(int device) {
  const DeviceProps& p = device_props(device);
  return p.name + " cc" + std::to_string(p.cc_major) + "." + std::to_string(p.cc_minor) + " sms" +
         std::to_string(p.sm_count);
}

float time_on_stream(const std::function<void()>& run, Stream stream, int reps) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaEvent_t start = nullptr, stop = nullptr;
  float ms = 0.0f;
  try {
    RUDNN_CUDA_CHECK(cudaEventCreate(&start));
    RUDNN_CUDA_CHECK(cudaEventCreate(&stop));
    run();
    RUDNN_CUDA_CHECK(cudaEventRecord(start, s));
    for (int i = 0; i < reps; ++i) run();
    RUDNN_CUDA_CHECK(cudaEventRecord(stop, s));
    RUDNN_CUDA_CHECK(cudaEventSynchronize(stop));
    RUDNN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  } catch (...) {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    throw;
  }
  RUDNN_CUDA_CHECK(cudaEventDestroy(start));
  RUDNN_CUDA_CHECK(cudaEventDestroy(stop));
  return ms / float(reps);
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()) {
  if (device != previous_) RUDNN_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int now = 0;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

}  // namespace rudnn::core
