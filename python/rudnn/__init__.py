"""rudnn: fast neural-network operators for PyTorch, CuPy, JAX and NumPy arrays."""

from .errors import (ArgumentError, CudaError, DeviceError, DTypeError, Error, FrameworkError, ShapeError,
                     UnsupportedError)
from . import _C
from . import moe
from . import paged
from .attention import attention, attention_backward, attention_last_algorithm
from .conv import conv, conv_bias_backward, conv_data_backward, conv_last_algorithm, conv_weight_backward
from .ctc import ctc_loss, ctc_loss_backward
from .grid_sample import grid_sample, grid_sample_backward
from .interpolate import interpolate, interpolate_backward
from .gated_delta import (chunk_gated_delta_rule, chunk_gated_delta_rule_backward, gated_delta_last_algorithm,
                          gated_delta_rule, gated_delta_rule_backward)
from .norm import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward, softmax, softmax_backward
from .pooling import (adaptive_avg_pool, adaptive_avg_pool_backward, adaptive_max_pool, adaptive_max_pool_backward,
                      avg_pool, avg_pool_backward, max_pool, max_pool_backward)

__version__ = "0.1.0"

has_cuda = bool(_C.has_cuda)  # the CUDA backend was compiled in (a GPU may still be absent)


def cmake_prefix() -> str:
    """Prefix for C++ consumers: cmake -DCMAKE_PREFIX_PATH=$(python -c 'import rudnn; print(rudnn.cmake_prefix())')."""
    import os

    return os.path.dirname(os.path.abspath(__file__))


__all__ = [
    "Error", "ShapeError", "DTypeError", "DeviceError", "ArgumentError", "FrameworkError", "UnsupportedError",
    "CudaError",
    "layer_norm", "rms_norm", "softmax", "layer_norm_backward", "rms_norm_backward", "softmax_backward",
    "attention", "attention_backward", "attention_last_algorithm",
    "moe", "paged",
    "chunk_gated_delta_rule", "gated_delta_rule", "chunk_gated_delta_rule_backward", "gated_delta_rule_backward",
    "gated_delta_last_algorithm",
    "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "max_pool_backward", "avg_pool_backward",
    "adaptive_avg_pool_backward", "adaptive_max_pool_backward",
    "ctc_loss", "ctc_loss_backward",
    "interpolate", "interpolate_backward",
    "conv", "conv_data_backward", "conv_weight_backward", "conv_bias_backward", "conv_last_algorithm",
    "grid_sample", "grid_sample_backward",
    "has_cuda", "cmake_prefix",
]
