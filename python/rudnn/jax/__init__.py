"""rudnn for JAX: every op as an XLA FFI custom call (cpu and CUDA platforms), differentiable
with jax.custom_vjp, usable under jax.jit, jax.grad and jax.vmap. Same names, arguments and
results as rudnn.<op>; rudnn.<op> called with JAX arrays comes here."""

from . import moe
from .attention import attention, attention_backward
from .conv import conv, conv_bias_backward, conv_data_backward, conv_weight_backward
from .ctc import ctc_loss, ctc_loss_backward
from .gated_delta import (chunk_gated_delta_rule, chunk_gated_delta_rule_backward, gated_delta_rule,
                          gated_delta_rule_backward)
from .grid_sample import grid_sample, grid_sample_backward
from .interpolate import interpolate, interpolate_backward
from .norm import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward, softmax, softmax_backward
from .pooling import (adaptive_avg_pool, adaptive_avg_pool_backward, adaptive_max_pool, adaptive_max_pool_backward,
                      avg_pool, avg_pool_backward, max_pool, max_pool_backward)

__all__ = [
    "layer_norm", "rms_norm", "softmax", "layer_norm_backward", "rms_norm_backward", "softmax_backward",
    "attention", "attention_backward",
    "moe",
    "chunk_gated_delta_rule", "gated_delta_rule", "chunk_gated_delta_rule_backward", "gated_delta_rule_backward",
    "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "max_pool_backward", "avg_pool_backward",
    "adaptive_avg_pool_backward", "adaptive_max_pool_backward",
    "ctc_loss", "ctc_loss_backward",
    "interpolate", "interpolate_backward",
    "conv", "conv_data_backward", "conv_weight_backward", "conv_bias_backward",
    "grid_sample", "grid_sample_backward",
]
