// Every CUDA runtime call and every kernel launch goes through these checks.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "rudnn/error.hpp"

namespace rudnn::core {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  throw Error(ErrorKind::cuda, std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                                   "): " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace rudnn::core

#define RUDNN_CUDA_CHECK(expr)                                                            \
  do {                                                                                    \
    cudaError_t rudnn_status_ = (expr);                                                   \
    if (rudnn_status_ != cudaSuccess)                                                     \
      ::rudnn::core::throw_cuda_error(rudnn_status_, #expr, __FILE__, __LINE__);          \
  } while (0)

// After a <<<...>>> launch: reports bad launch configurations and earlier async faults.
#define RUDNN_CUDA_CHECK_LAUNCH(kernel_name) RUDNN_CUDA_CHECK(cudaGetLastError())
