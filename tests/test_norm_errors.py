"""Every documented error of the norm family: type, message, and nothing written."""

import numpy as np
import pytest
import torch

import rudnn
from util import DEVICES


def _x(shape=(4, 8), dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda d: rudnn.layer_norm(_x(dtype=torch.int32, device=d)), rudnn.DTypeError,
         "layer_norm: x: expected float32, float16 or bfloat16, got int32"),
        (lambda d: rudnn.rms_norm(torch.tensor(1.0, device=d)), rudnn.ShapeError,
         "rms_norm: x: expected at least one axis"),
        (lambda d: rudnn.softmax(_x((3, 0), device=d)), rudnn.ShapeError, "softmax: x: the last axis must have size >= 1"),
        (lambda d: rudnn.layer_norm(_x(device=d), torch.ones(7, device=d)), rudnn.ShapeError,
         "layer_norm: weight: expected shape [8] (the last axis of x), got [7]"),
        (lambda d: rudnn.layer_norm(_x(device=d), torch.ones(8, dtype=torch.float16, device=d)), rudnn.DTypeError,
         "layer_norm: weight: expected float32 or the dtype of x (float32), got float16"),
        (lambda d: rudnn.layer_norm(_x(dtype=torch.float16, device=d), torch.ones(8, device=d),
                                    torch.ones(8, dtype=torch.float16, device=d)), rudnn.DTypeError,
         "layer_norm: weight and bias must have the same dtype"),
        (lambda d: rudnn.rms_norm(_x(device=d), residual=_x((4, 9), device=d)), rudnn.ShapeError,
         "rms_norm: residual: expected the shape of x [4, 8], got [4, 9]"),
        (lambda d: rudnn.rms_norm(_x(device=d), residual=_x(dtype=torch.float16, device=d)), rudnn.DTypeError,
         "rms_norm: residual: expected the dtype of x (float32), got float16"),
        (lambda d: rudnn.layer_norm(_x(device=d), eps=0.0), rudnn.ArgumentError,
         "layer_norm: eps: expected a finite value > 0"),
        (lambda d: rudnn.rms_norm(_x(device=d), eps=float("nan")), rudnn.ArgumentError,
         "rms_norm: eps: expected a finite value > 0"),
        (lambda d: rudnn.layer_norm(_x((8, 4), device=d).t()), rudnn.ShapeError,
         "layer_norm: x: the last axis must be contiguous (stride 1), got stride 4"),
        (lambda d: rudnn.softmax(_x(device=d), out=_x((4, 8), torch.float16, device=d)), rudnn.DTypeError,
         "softmax: out: expected the dtype of x (float32), got float16"),
        (lambda d: rudnn.softmax(_x(device=d), out=_x((4, 7), device=d)), rudnn.ShapeError,
         "softmax: out: expected the shape of x [4, 8], got [4, 7]"),
        (lambda d: rudnn.layer_norm(_x(device=d), np.ones(8, np.float32)), rudnn.FrameworkError,
         "layer_norm: weight: expected a torch.Tensor like x (one framework per call), got numpy.ndarray"),
        (lambda d: rudnn.softmax([[1.0, 2.0]]), rudnn.FrameworkError,
         "softmax: x: expected a torch.Tensor, cupy.ndarray, numpy.ndarray or jax.Array, got builtins.list"),
        (lambda d: rudnn.layer_norm_backward(_x(device=d), _x(device=d), None, torch.zeros(4, device=d),
                                             torch.zeros(5, device=d)), rudnn.ShapeError,
         "layer_norm_backward: rstd: expected shape [4] (x.shape[:-1]), got [5]"),
        (lambda d: rudnn.layer_norm_backward(_x(device=d), _x(device=d), None, torch.zeros(4, device=d),
                                             torch.zeros(4, dtype=torch.float64, device=d)), rudnn.DTypeError,
         "layer_norm_backward: rstd: float64 arrays are not taken by rudnn (its data arrays are float32, float16, "
         "bfloat16; its index arrays int32, int64, uint32, uint8 or bool), got float64"),
        (lambda d: rudnn.rms_norm_backward(_x((4, 9), device=d), _x(device=d), None, torch.zeros(4, device=d)),
         rudnn.ShapeError, "rms_norm_backward: dy: expected the shape of x [4, 8], got [4, 9]"),
        (lambda d: rudnn.softmax_backward(_x(device=d), _x(dtype=torch.bfloat16, device=d)), rudnn.DTypeError,
         "softmax_backward: dy: expected the dtype of y (bfloat16), got float32"),
    ],
)
def test_documented_errors(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert message in str(info.value)


def test_exception_classes_are_builtins():
    assert issubclass(rudnn.ShapeError, ValueError) and issubclass(rudnn.DTypeError, TypeError)
    assert issubclass(rudnn.DeviceError, ValueError) and issubclass(rudnn.UnsupportedError, NotImplementedError)
    assert issubclass(rudnn.CudaError, RuntimeError) and issubclass(rudnn.ArgumentError, ValueError)
    assert all(issubclass(c, rudnn.Error) for c in (rudnn.ShapeError, rudnn.FrameworkError, rudnn.CudaError))


@pytest.mark.parametrize("device", DEVICES)
def test_failed_call_writes_nothing(device):
    x = _x(device=device)
    out = torch.full((4, 8), 3.0, device=device)
    with pytest.raises(rudnn.ShapeError):
        rudnn.layer_norm(x, torch.ones(5, device=device), out=out)
    assert torch.all(out == 3.0)


def test_numpy_bfloat16_is_unsupported():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.ones((2, 4), dtype=ml_dtypes.bfloat16)
    with pytest.raises(rudnn.UnsupportedError, match="NumPy arrays cannot carry bfloat16"):
        rudnn.softmax(x)


@pytest.mark.cuda
def test_mixed_devices():
    with pytest.raises(rudnn.DeviceError, match="layer_norm: weight: expected device cuda:0 like x, got cpu"):
        rudnn.layer_norm(_x(device="cuda"), torch.ones(8))
    with pytest.raises(rudnn.DeviceError, match="softmax: out: expected device cpu like x, got cuda:0"):
        rudnn.softmax(_x(), out=_x(device="cuda"))
