"""Every documented error of the pooling family: type, message, and nothing written."""

import numpy as np
import pytest
import torch

import rudnn
from util import DEVICES


def _x(shape=(1, 2, 6, 6), dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


def _i(shape=(1, 2, 3, 3), dtype=torch.int64, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "call, exc, message",
    [
        # x
        (lambda d: rudnn.max_pool(_x(dtype=torch.int32, device=d), 2), rudnn.DTypeError,
         "max_pool: x: expected float32, float16 or bfloat16, got int32"),
        (lambda d: rudnn.avg_pool(_x((2, 3), device=d), 2), rudnn.ShapeError,
         "avg_pool: x: expected 3 to 5 axes ([N, C, *spatial]), got 2; for a batch-less input give the window as a "
         "tuple"),
        (lambda d: rudnn.max_pool(_x((3, 4, 5, 6, 7), device=d), (2, 2)), rudnn.ShapeError,
         "max_pool: x: expected 3 or 4 axes ([C, H, W] or [N, C, H, W]) for 2 spatial dims, got shape [3, 4, 5, 6, 7]"),
        (lambda d: rudnn.max_pool(_x((5, 6, 2), device=d), (2, 2, 2), layout="NHWC"), rudnn.ShapeError,
         "max_pool: x: expected 4 or 5 axes ([D, H, W, C] or [N, D, H, W, C]) for 3 spatial dims, got shape "
         "[5, 6, 2]"),
        (lambda d: rudnn.max_pool(_x((1, 2, 0, 5), device=d), 2), rudnn.ShapeError,
         "max_pool: x: expected sizes >= 1 on every axis but the batch axis, got shape [1, 2, 0, 5]"),
        (lambda d: rudnn.adaptive_avg_pool(_x((1, 0, 4), device=d), 2), rudnn.ShapeError,
         "adaptive_avg_pool: x: expected sizes >= 1 on every axis but the batch axis, got shape [1, 0, 4]"),
        # window options
        (lambda d: rudnn.max_pool(_x((1, 1, 3, 3), device=d), 5, padding=0), rudnn.ShapeError,
         "max_pool: kernel: the window (extent 5 along spatial axis 0) is larger than the padded input (size 3), so "
         "the output size would be < 1"),
        (lambda d: rudnn.max_pool(_x((1, 1, 5, 9), device=d), 3, dilation=(1, 5)), rudnn.ShapeError,
         "max_pool: kernel: the window (extent 11 along spatial axis 1) is larger than the padded input (size 9)"),
        (lambda d: rudnn.avg_pool(_x((1, 1, 4), device=d), 3, padding=2), rudnn.ArgumentError,
         "avg_pool: padding: expected at most half the kernel ([1] for kernel [3]), got [2]"),
        (lambda d: rudnn.max_pool(_x(device=d), (0, 2)), rudnn.ArgumentError,
         "max_pool: kernel: expected values >= 1, got [0, 2]"),
        (lambda d: rudnn.max_pool(_x(device=d), 2, stride=0), rudnn.ArgumentError,
         "max_pool: stride: expected values >= 1, got [0, 0]"),
        (lambda d: rudnn.avg_pool(_x(device=d), 2, padding=-1), rudnn.ArgumentError,
         "avg_pool: padding: expected values >= 0, got [-1, -1]"),
        (lambda d: rudnn.max_pool(_x(device=d), 2, dilation=(1, 0)), rudnn.ArgumentError,
         "max_pool: dilation: expected values >= 1, got [1, 0]"),
        (lambda d: rudnn.max_pool(_x(device=d), (2, 2), stride=(1, 1, 1)), rudnn.ArgumentError,
         "max_pool: kernel, stride: expected one length (one entry per spatial axis), got kernel of length 2, stride "
         "of length 3"),
        (lambda d: rudnn.max_pool(_x(device=d), 2.5), rudnn.ArgumentError,
         "max_pool: kernel: expected an int or a sequence of 2 ints, got 2.5"),
        (lambda d: rudnn.max_pool(_x(device=d), True), rudnn.ArgumentError,
         "max_pool: kernel: expected an int or a sequence of 2 ints, got True"),
        (lambda d: rudnn.max_pool(_x(device=d), 2, ceil_mode="yes"), rudnn.ArgumentError,
         "max_pool: ceil_mode: expected True or False, got 'yes'"),
        (lambda d: rudnn.max_pool(_x(device=d), 2, return_indices=1), rudnn.ArgumentError,
         "max_pool: return_indices: expected True or False, got 1"),
        (lambda d: rudnn.avg_pool(_x(device=d), 2, count_include_pad=None), rudnn.ArgumentError,
         "avg_pool: count_include_pad: expected True or False, got None"),
        (lambda d: rudnn.max_pool(_x(device=d), 2, layout="NCWH"), rudnn.ArgumentError,
         "max_pool: layout: expected 'NCHW' (channels first) or 'NHWC' (channels last), got 'NCWH'"),
        (lambda d: rudnn.avg_pool(_x(device=d), 2, divisor_override=0), rudnn.ArgumentError,
         "avg_pool: divisor_override: expected a nonzero integer or None, got 0"),
        (lambda d: rudnn.avg_pool(_x(device=d), 2, divisor_override=1.5), rudnn.ArgumentError,
         "avg_pool: divisor_override: expected a nonzero int or None, got 1.5"),
        (lambda d: rudnn.max_pool(_x(device=d), 2**64), rudnn.ArgumentError,
         "max_pool: kernel: 18446744073709551616 is out of the int64 range"),
        (lambda d: rudnn.max_pool(_x((1, 1, 3, 3), device=d), (2**62, 1), dilation=(8, 1)), rudnn.ArgumentError,
         "max_pool: the window size along spatial axis 0 overflows int64"),
        # adaptive output_size
        (lambda d: rudnn.adaptive_avg_pool(_x(device=d), (-1, 3)), rudnn.ArgumentError,
         "adaptive_avg_pool: output_size: expected values >= 0, got [-1, 3]"),
        (lambda d: rudnn.adaptive_max_pool(_x(device=d), (2, 2, 2, 2)), rudnn.ArgumentError,
         "adaptive_max_pool: expected 1, 2 or 3 spatial dims, got 4"),
        (lambda d: rudnn.adaptive_max_pool(_x((2, 6, 6), device=d), (2, 2, 2)), rudnn.ShapeError,
         "adaptive_max_pool: x: expected 4 or 5 axes ([C, D, H, W] or [N, C, D, H, W]) for 3 spatial dims, got shape "
         "[2, 6, 6]"),
        (lambda d: rudnn.adaptive_avg_pool(_x(device=d), "2"), rudnn.ArgumentError,
         "adaptive_avg_pool: output_size: expected an int >= 0, None, or a sequence of them"),
        (lambda d: rudnn.adaptive_avg_pool(_x(device=d), (2**63 - 1, 1)), rudnn.ArgumentError,
         "adaptive_avg_pool: output_size * input size along spatial axis 0 overflows int64"),
        (lambda d: rudnn.adaptive_max_pool(_x(device=d), (2**62, 1)), rudnn.ArgumentError,
         "adaptive_max_pool: output_size * input size along spatial axis 0 overflows int64"),
        (lambda d: rudnn.adaptive_avg_pool(_x(device=d), (2**40, 2**40)), rudnn.ArgumentError,
         "adaptive_avg_pool: the number of output elements overflows int64"),
        # outputs
        (lambda d: rudnn.max_pool(_x(device=d), 2, out=_x((1, 2, 4, 4), device=d)), rudnn.ShapeError,
         "max_pool: y: expected shape [1, 2, 3, 3] (the pooled shape of x), got [1, 2, 4, 4]"),
        (lambda d: rudnn.avg_pool(_x(device=d), 2, out=_x((1, 2, 3, 3), torch.float16, device=d)), rudnn.DTypeError,
         "avg_pool: y: expected float32 (the dtype of x), got float16"),
        (lambda d: rudnn.avg_pool(_x(device=d), 2, out=torch.empty(1, 2, 1, 1, device=d).expand(1, 2, 3, 3)),
         rudnn.ShapeError, "avg_pool: y: expected an output whose elements do not share memory"),
        # backward
        (lambda d: rudnn.max_pool_backward(_x((1, 2, 3, 3), device=d), _x(device=d), _i(dtype=torch.uint8, device=d),
                                           kernel=2), rudnn.DTypeError,
         "max_pool_backward: indices: expected int64 or int32, got uint8"),
        (lambda d: rudnn.max_pool_backward(_x((1, 2, 3, 3), device=d), _x(device=d), _i((1, 2, 3, 2), device=d),
                                           kernel=2), rudnn.ShapeError,
         "max_pool_backward: indices: expected the shape of dy [1, 2, 3, 3], got [1, 2, 3, 2]"),
        (lambda d: rudnn.max_pool_backward(_x((1, 2, 4, 4), device=d), _x(device=d), _i((1, 2, 4, 4), device=d),
                                           kernel=2), rudnn.ShapeError,
         "max_pool_backward: dy: expected shape [1, 2, 3, 3] (the output of max_pool for x), got [1, 2, 4, 4]"),
        (lambda d: rudnn.max_pool_backward(_x((1, 2, 3, 3), torch.float16, device=d), _x(device=d), _i(device=d),
                                           kernel=2), rudnn.DTypeError,
         "max_pool_backward: dy: expected float32 (the dtype of x), got float16"),
        (lambda d: rudnn.avg_pool_backward(_x((1, 2, 3, 3), device=d), (1, 2, 8, 8), kernel=2), rudnn.ShapeError,
         "avg_pool_backward: dy: expected shape [1, 2, 4, 4] (the output of avg_pool for x_shape), got [1, 2, 3, 3]"),
        (lambda d: rudnn.avg_pool_backward(_x((1, 2, 3, 3), torch.int32, device=d), (1, 2, 6, 6), kernel=2),
         rudnn.DTypeError, "avg_pool_backward: dy: expected float32, float16 or bfloat16, got int32"),
        (lambda d: rudnn.avg_pool_backward(_x((1, 2, 3, 3), device=d), "abc", kernel=2), rudnn.ArgumentError,
         "avg_pool_backward: x_shape: expected a sequence of ints, got 'a'"),
        (lambda d: rudnn.adaptive_avg_pool_backward(_x((1, 2, 3, 3), device=d), (1, 2, 0, 3)), rudnn.ShapeError,
         "adaptive_avg_pool_backward: x_shape: expected sizes >= 1 on every axis but the batch axis"),
        (lambda d: rudnn.adaptive_max_pool_backward(_x((2, 2, 3, 3), device=d), _x(device=d), _i((2, 2, 3, 3), device=d)),
         rudnn.ShapeError, "adaptive_max_pool_backward: dy: expected shape [1, 2, 3, 3] (the batch and channels of x, "
                           "any output size), got [2, 2, 3, 3]"),
        (lambda d: rudnn.adaptive_avg_pool_backward(_x((2, 3, 3), device=d), (1, 2, 6, 6)), rudnn.ShapeError,
         "adaptive_avg_pool_backward: dy: expected 4 axes like x_shape [1, 2, 6, 6], got shape [2, 3, 3]"),
        (lambda d: rudnn.max_pool_backward(_x((1, 2, 3, 3), device=d), np.zeros((1, 2, 6, 6), np.float32),
                                           _i(device=d), kernel=2), rudnn.FrameworkError,
         "max_pool_backward: x: expected a torch.Tensor like dy (one framework per call), got numpy.ndarray"),
    ],
)
def test_documented_errors(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert message in str(info.value)


def test_int32_indices_must_hold_every_flat_index():
    big = (1, 1, 65536, 65537)  # 2**32 + 65536 elements per plane; expanded views, no memory
    x = torch.zeros(1).expand(big)
    dy = torch.zeros(1).expand(1, 1, 32768, 32768)
    with pytest.raises(rudnn.DTypeError, match="max_pool_backward: indices: int32 cannot hold the flat indices of "
                                               "an input plane of 4295032832 elements; use int64"):
        rudnn.max_pool_backward(dy, x, torch.zeros(1, dtype=torch.int32).expand(dy.shape), kernel=2)


def test_huge_stride_is_one_window():
    x = _x((1, 1, 3, 3))
    torch.testing.assert_close(rudnn.max_pool(x, 1, stride=(2**62, 1)), x[:, :, :1])
    torch.testing.assert_close(rudnn.max_pool(x, 1, stride=(2**62 + 1, 1), ceil_mode=True), x[:, :, :1])
    torch.testing.assert_close(rudnn.avg_pool(x, 2, stride=2**62 + 3, padding=1, ceil_mode=True),
                               torch.nn.functional.avg_pool2d(x, 2, stride=2**30, padding=1, ceil_mode=True))


@pytest.mark.parametrize("device", DEVICES)
def test_failed_call_writes_nothing(device):
    x = _x(device=device)
    out = torch.full((1, 2, 3, 3), 3.0, device=device)
    with pytest.raises(rudnn.ArgumentError):
        rudnn.avg_pool(x, 2, divisor_override=0, out=out)
    with pytest.raises(rudnn.DTypeError):
        rudnn.max_pool(x.half(), 2, out=out)
    assert torch.all(out == 3.0)


@pytest.mark.cuda
def test_mixed_devices():
    with pytest.raises(rudnn.DeviceError, match="max_pool: out: expected device cuda:0 like x, got cpu"):
        rudnn.max_pool(_x(device="cuda"), 2, out=_x((1, 2, 3, 3)))
    with pytest.raises(rudnn.DeviceError, match="max_pool_backward: indices: expected device cuda:0 like dy, got cpu"):
        rudnn.max_pool_backward(_x((1, 2, 3, 3), device="cuda"), _x(device="cuda"), _i(), kernel=2)
