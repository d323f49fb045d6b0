"""Every documented error of interpolate and interpolate_backward: type, message, and nothing written."""

import pytest
import torch

import rudnn
from util import DEVICES


def _x(shape=(1, 2, 6, 6), dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "call, exc, message",
    [
        # x
        (lambda d: rudnn.interpolate(_x(dtype=torch.int32, device=d), size=3), rudnn.DTypeError,
         "interpolate: x: expected float32, float16 or bfloat16, got int32"),
        (lambda d: rudnn.interpolate(_x((2, 6), device=d), size=3), rudnn.ShapeError,
         "interpolate: x: expected 3, 4 or 5 axes ([N, C, L], [N, C, H, W] or [N, C, D, H, W]), got shape [2, 6]"),
        (lambda d: rudnn.interpolate(_x((1, 2, 3, 4, 5, 6), device=d), size=3, layout="NHWC"), rudnn.ShapeError,
         "interpolate: x: expected 3, 4 or 5 axes ([N, L, C], [N, H, W, C] or [N, D, H, W, C]), got shape "
         "[1, 2, 3, 4, 5, 6]"),
        (lambda d: rudnn.interpolate(_x((1, 0, 4), device=d), size=3), rudnn.ShapeError,
         "interpolate: x: expected sizes >= 1 on every axis but the batch axis, got shape [1, 0, 4]"),
        # mode and rank
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="cubic"), rudnn.ArgumentError,
         "interpolate: mode: expected one of 'nearest', 'nearest-exact', 'linear', 'bilinear', 'trilinear', "
         "'bicubic', 'area', got 'cubic'"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="linear"), rudnn.ShapeError,
         "interpolate: mode: 'linear' takes 3-D input [N, C, L], got x of shape [1, 2, 6, 6]"),
        (lambda d: rudnn.interpolate(_x((1, 2, 6), device=d), size=3, mode="bilinear"), rudnn.ShapeError,
         "interpolate: mode: 'bilinear' takes 4-D input [N, C, H, W], got x of shape [1, 2, 6]"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="trilinear"), rudnn.ShapeError,
         "interpolate: mode: 'trilinear' takes 5-D input [N, C, D, H, W], got x of shape [1, 2, 6, 6]"),
        (lambda d: rudnn.interpolate(_x((1, 2, 3, 3, 3), device=d), size=3, mode="bicubic"), rudnn.ShapeError,
         "interpolate: mode: 'bicubic' takes 4-D input [N, C, H, W], got x of shape [1, 2, 3, 3, 3]"),
        # options that go with the mode
        (lambda d: rudnn.interpolate(_x(device=d), size=3, align_corners=False), rudnn.ArgumentError,
         "interpolate: align_corners: only the linear, bilinear, trilinear and bicubic modes take align_corners "
         "(None otherwise), got mode 'nearest'"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="area", align_corners=True), rudnn.ArgumentError,
         "got mode 'area'"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="nearest-exact", antialias=True), rudnn.ArgumentError,
         "interpolate: antialias: only the bilinear and bicubic modes (4-D input) take antialias, got mode "
         "'nearest-exact'"),
        (lambda d: rudnn.interpolate(_x((1, 2, 3, 3, 3), device=d), size=2, mode="trilinear", antialias=True),
         rudnn.ArgumentError, "got mode 'trilinear'"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="bilinear", antialias=1), rudnn.ArgumentError,
         "interpolate: antialias: expected True or False, got 1"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, mode="bilinear", align_corners="yes"), rudnn.ArgumentError,
         "interpolate: align_corners: expected True or False, got 'yes'"),
        # size and scale_factor
        (lambda d: rudnn.interpolate(_x(device=d), size=3, scale_factor=2.0), rudnn.ArgumentError,
         "interpolate: size, scale_factor: expected exactly one of them, got both"),
        (lambda d: rudnn.interpolate(_x(device=d)), rudnn.ArgumentError,
         "interpolate: size, scale_factor: expected exactly one of them, got neither"),
        (lambda d: rudnn.interpolate(_x(device=d), size=(3, 4, 5)), rudnn.ArgumentError,
         "interpolate: size: expected 2 entries (one per spatial axis of x of shape [1, 2, 6, 6]), got 3"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor=(2.0,)), rudnn.ArgumentError,
         "interpolate: scale_factor: expected 2 entries (one per spatial axis of x of shape [1, 2, 6, 6]), got 1"),
        (lambda d: rudnn.interpolate(_x(device=d), size=()), rudnn.ArgumentError,
         "interpolate: size: expected 2 entries (one per spatial axis), got an empty sequence"),
        (lambda d: rudnn.interpolate(_x(device=d), size=(3, 0)), rudnn.ArgumentError,
         "interpolate: size: expected values >= 1, got [3, 0]"),
        (lambda d: rudnn.interpolate(_x(device=d), size=2.5), rudnn.ArgumentError,
         "interpolate: size: expected an int or a sequence of ints, got 2.5"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor=(2.0, -1.5)), rudnn.ArgumentError,
         "interpolate: scale_factor: expected finite values > 0, got [2, -1.5]"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor=0.0), rudnn.ArgumentError,
         "interpolate: scale_factor: expected finite values > 0, got [0, 0]"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor=float("nan")), rudnn.ArgumentError,
         "interpolate: scale_factor: expected finite values > 0, got [nan, nan]"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor="2"), rudnn.ArgumentError,
         "interpolate: scale_factor: expected a number or a sequence of numbers, got '2'"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor=0.1), rudnn.ArgumentError,
         "interpolate: scale_factor: the output size along spatial axis 0 is floor(6 * 0.1) = 0; expected >= 1"),
        (lambda d: rudnn.interpolate(_x(device=d), scale_factor=1e300), rudnn.ArgumentError,
         "interpolate: scale_factor: the output size along spatial axis 0 (input size 6 * 1e+300) overflows int64"),
        (lambda d: rudnn.interpolate(_x(device=d), size=(2**40, 2**40)), rudnn.ArgumentError,
         "interpolate: the number of output elements overflows int64"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, recompute_scale_factor=True), rudnn.ArgumentError,
         "interpolate: recompute_scale_factor: not meaningful with an explicit size (give scale_factor)"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, layout="NCWH"), rudnn.ArgumentError,
         "interpolate: layout: expected 'NCHW' (channels first) or 'NHWC' (channels last), got 'NCWH'"),
        # outputs
        (lambda d: rudnn.interpolate(_x(device=d), size=3, out=torch.empty(1, 2, 3, 4, device=d)), rudnn.ShapeError,
         "interpolate: y: expected shape [1, 2, 3, 3] (x resampled), got [1, 2, 3, 4]"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, out=torch.empty(1, 2, 3, 3, device=d).half()),
         rudnn.DTypeError, "interpolate: y: expected the dtype of x (float32), got float16"),
        (lambda d: rudnn.interpolate(_x(device=d), size=3, out=torch.empty(1, 2, 1, 3, device=d).expand(1, 2, 3, 3)),
         rudnn.ShapeError, "interpolate: y: expected an output whose elements do not share memory"),
        # backward
        (lambda d: rudnn.interpolate_backward(_x((1, 2, 3, 3), device=d), (1, 2, 6, 6), size=4), rudnn.ShapeError,
         "interpolate_backward: dy: expected shape [1, 2, 4, 4] (x_shape resampled), got [1, 2, 3, 3]"),
        (lambda d: rudnn.interpolate_backward(_x((1, 2, 3, 3), dtype=torch.int64, device=d), (1, 2, 6, 6), size=3),
         rudnn.DTypeError, "interpolate_backward: dy: expected float32, float16 or bfloat16, got int64"),
        (lambda d: rudnn.interpolate_backward(_x((1, 2, 3, 3), device=d), (1, 2, 6, 6), size=3, mode="linear"),
         rudnn.ShapeError, "interpolate_backward: mode: 'linear' takes 3-D input [N, C, L], got x_shape of shape"),
        (lambda d: rudnn.interpolate_backward(_x((1, 2, 3, 3), device=d), (1, 2, 6, 6), size=3, scale_factor=0.5),
         rudnn.ArgumentError, "interpolate_backward: size, scale_factor: expected exactly one of them, got both"),
        (lambda d: rudnn.interpolate_backward(_x((1, 2, 3, 3), device=d), (1, 2, 6, "6"), size=3),
         rudnn.ArgumentError, "interpolate_backward: x_shape: expected a sequence of ints, got '6'"),
    ],
)
def test_documented_errors(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert message in str(info.value)


def test_output_size_overflow_along_an_axis():
    with pytest.raises(rudnn.ArgumentError, match="the output size times the input size along spatial axis 0 "
                                                  "overflows int64"):
        rudnn.interpolate(_x((1, 1, 4)), size=2**62, mode="area")


@pytest.mark.parametrize("device", DEVICES)
def test_failed_call_writes_nothing(device):
    x = _x(device=device)
    out = torch.full((1, 2, 3, 3), 3.0, device=device)
    with pytest.raises(rudnn.ArgumentError):
        rudnn.interpolate(x, size=3, mode="nearest", align_corners=True, out=out)
    with pytest.raises(rudnn.ShapeError):
        rudnn.interpolate(x[:, :, :, :5], size=3, mode="linear", out=out)
    assert torch.equal(out, torch.full_like(out, 3.0))


def test_torch_agrees_that_these_are_errors():
    # The checks mirror torch.nn.functional.interpolate's (which raises ValueError or NotImplementedError).
    x = _x()
    for kw in [dict(size=3, scale_factor=2.0), dict(), dict(size=3, align_corners=True),
               dict(size=3, mode="bicubic", recompute_scale_factor=True), dict(size=3, antialias=True),
               dict(size=(3, 4, 5))]:
        with pytest.raises((ValueError, NotImplementedError, RuntimeError)):
            torch.nn.functional.interpolate(x, **kw)
        with pytest.raises(rudnn.Error):
            rudnn.interpolate(x, **kw)
