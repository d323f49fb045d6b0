// The single exception type of libruDNN. The kind decides which Python
// exception the bindings raise (ShapeError, DTypeError, ...).
#pragma once

#include <stdexcept>
#include <string>

namespace rudnn {

enum class ErrorKind {
  shape,        // wrong rank or sizes                       -> rudnn.ShapeError(ValueError)
  dtype,        // wrong element type                        -> rudnn.DTypeError(TypeError)
  device,       // wrong or mixed devices                    -> rudnn.DeviceError(ValueError)
  value,        // a bad scalar argument (eps <= 0, ...)     -> rudnn.ArgumentError(ValueError)
  unsupported,  // valid request this build/device cannot do -> rudnn.UnsupportedError(NotImplementedError)
  cuda,         // a CUDA runtime failure                    -> rudnn.CudaError(RuntimeError)
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace rudnn
