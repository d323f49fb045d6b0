"""Shared test helpers: devices, dtypes and the FlashAttention-style error budget."""

import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# Below these relative errors a result is as good as float32/f16/bf16 arithmetic allows,
# whatever the same-dtype torch result happened to get.
FLOOR = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_close_to_oracle(ours, torch_same_dtype, oracle64, what="result", dtype=None, scale=None):
    """Our error against the float64 oracle is at most twice that of torch computing
    in the same dtype (plus a floor of a few ulps of `dtype`, default ours.dtype,
    relative to `scale`, default max|oracle|; pass the size of the terms that cancel when
    the result is much smaller than its inputs)."""
    assert ours.shape == oracle64.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(oracle64.shape)}"
    if ours.numel() == 0:
        return
    ours_c = ours.detach().cpu()
    scale = max(scale if scale is not None else oracle64.abs().max().item(), 1e-30)
    err = max_abs(ours_c, oracle64)
    torch_err = max_abs(torch_same_dtype.detach().cpu(), oracle64)
    budget = 2 * torch_err + FLOOR[dtype or ours.dtype] * scale
    assert err <= budget, f"{what}: max error {err:.3g} > budget {budget:.3g} (torch same-dtype error {torch_err:.3g})"


def rand(shape, dtype, device="cpu", seed=0, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype).to(device)
