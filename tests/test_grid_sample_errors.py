"""Every documented error of grid_sample and grid_sample_backward: type, message, and nothing written."""

import pytest
import torch

import rudnn
from util import DEVICES


SUFFIX = " (rudnn does not compute in place: give an output that overlaps no argument)"


def _x(shape=(1, 2, 6, 6), dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype)


def _g(shape=(1, 3, 4, 2), dtype=torch.float32, device="cpu"):
    return (torch.rand(shape, device=device) * 2 - 1).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "call, exc, message",
    [
        # x
        (lambda d: rudnn.grid_sample(_x(dtype=torch.int32, device=d), _g(device=d)), rudnn.DTypeError,
         "grid_sample: x: expected float32, float16 or bfloat16, got int32"),
        (lambda d: rudnn.grid_sample(_x((2, 6, 6), device=d), _g((3, 4, 2), device=d)), rudnn.ShapeError,
         "grid_sample: x: expected 4 or 5 axes ([N, C, H, W] or [N, C, D, H, W]), got shape [2, 6, 6]"),
        (lambda d: rudnn.grid_sample(_x((1, 2, 3, 4, 5, 6), device=d), _g(device=d), layout="NHWC"),
         rudnn.ShapeError,
         "grid_sample: x: expected 4 or 5 axes ([N, H, W, C] or [N, D, H, W, C]), got shape [1, 2, 3, 4, 5, 6]"),
        (lambda d: rudnn.grid_sample(_x((1, 2, 0, 6), device=d), _g(device=d)), rudnn.ShapeError,
         "grid_sample: x: expected non-empty spatial axes, got shape [1, 2, 0, 6] (layout [N, C, H, W])"),
        # grid against x
        (lambda d: rudnn.grid_sample(_x(device=d), _g(dtype=torch.float16, device=d)), rudnn.DTypeError,
         "grid_sample: grid: expected the dtype of x (float32), got float16"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g((3, 4, 2), device=d)), rudnn.ShapeError,
         "grid_sample: grid: expected shape [N, H_out, W_out, 2] with N = 1 (x of shape [1, 2, 6, 6]), got [3, 4, 2]"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g((2, 3, 4, 2), device=d)), rudnn.ShapeError,
         "grid_sample: grid: expected shape [N, H_out, W_out, 2] with N = 1 (x of shape [1, 2, 6, 6]), "
         "got [2, 3, 4, 2]"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g((1, 3, 4, 3), device=d)), rudnn.ShapeError,
         "grid_sample: grid: expected shape [N, H_out, W_out, 2] with N = 1 (x of shape [1, 2, 6, 6]), "
         "got [1, 3, 4, 3]"),
        (lambda d: rudnn.grid_sample(_x((1, 2, 3, 4, 5), device=d), _g(device=d)), rudnn.ShapeError,
         "grid_sample: grid: expected shape [N, D_out, H_out, W_out, 3] with N = 1 (x of shape [1, 2, 3, 4, 5]), "
         "got [1, 3, 4, 2]"),
        # mode, padding and the other options
        (lambda d: rudnn.grid_sample(_x((1, 2, 3, 4, 5), device=d), _g((1, 2, 3, 4, 3), device=d), mode="bicubic"),
         rudnn.ShapeError, "grid_sample: mode: 'bicubic' takes 4-D input [N, C, H, W], got x of shape [1, 2, 3, 4, 5]"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g(device=d), mode="linear"), rudnn.ArgumentError,
         "grid_sample: mode: expected one of 'bilinear', 'nearest', 'bicubic', got 'linear'"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g(device=d), padding_mode="circular"), rudnn.ArgumentError,
         "grid_sample: padding_mode: expected one of 'zeros', 'border', 'reflection', got 'circular'"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g(device=d), align_corners=1), rudnn.ArgumentError,
         "grid_sample: align_corners: expected True or False, got 1"),
        (lambda d: rudnn.grid_sample(_x(device=d), _g(device=d), layout="NCDHW"), rudnn.ArgumentError,
         "grid_sample: layout: expected 'NCHW' (channels first) or 'NHWC' (channels last), got 'NCDHW'"),
        # frameworks
        (lambda d: rudnn.grid_sample(_x(device=d), _g().numpy()), rudnn.FrameworkError,
         "grid_sample: grid: expected a torch.Tensor like x (one framework per call), got numpy.ndarray"),
        # backward
        (lambda d: rudnn.grid_sample_backward(_x((1, 2, 3, 3), device=d), _x(device=d), _g(device=d)),
         rudnn.ShapeError,
         "grid_sample_backward: dy: expected shape [1, 2, 3, 4] (y's shape: x sampled at the grid), got [1, 2, 3, 3]"),
        (lambda d: rudnn.grid_sample_backward(_x((1, 2, 3, 4), torch.float16, d), _x(device=d), _g(device=d)),
         rudnn.DTypeError, "grid_sample_backward: dy: expected the dtype of x (float32), got float16"),
        (lambda d: rudnn.grid_sample_backward(_x((1, 2, 3, 4), device=d), _x(device=d), _g((1, 3, 4, 1), device=d)),
         rudnn.ShapeError,
         "grid_sample_backward: grid: expected shape [N, H_out, W_out, 2] with N = 1 (x of shape [1, 2, 6, 6]), "
         "got [1, 3, 4, 1]"),
        (lambda d: rudnn.grid_sample_backward(_x((1, 2, 3, 4), device=d), _x(device=d), _g(device=d),
                                              output_mask=(True,)),
         rudnn.ArgumentError,
         "grid_sample_backward: output_mask: expected (want_dx, want_dgrid), two bools, got (True,)"),
        (lambda d: rudnn.grid_sample_backward(_x((1, 2, 3, 4), device=d), _x(device=d), _g(device=d),
                                              deterministic=None),
         rudnn.ArgumentError, "grid_sample_backward: deterministic: expected True or False, got None"),
        (lambda d: rudnn.grid_sample_backward(_x((1, 2, 3, 4), device=d), _x(device=d), _g(device=d),
                                              mode="cubic"),
         rudnn.ArgumentError, "grid_sample_backward: mode: expected one of 'bilinear', 'nearest', 'bicubic', "
                              "got 'cubic'"),
    ],
)
def test_error(device, call, exc, message):
    with pytest.raises(exc) as info:
        call(device)
    assert str(info.value) == message


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "out, exc, message",
    [
        (lambda d: torch.full((1, 2, 3, 3), 7.0, device=d), rudnn.ShapeError,
         "grid_sample: y: expected shape [1, 2, 3, 4] (x sampled at the grid), got [1, 2, 3, 3]"),
        (lambda d: torch.full((1, 2, 3, 4), 7.0, device=d).half(), rudnn.DTypeError,
         "grid_sample: y: expected the dtype of x (float32), got float16"),
        (lambda d: torch.full((1, 2, 3, 1), 7.0, device=d).expand(1, 2, 3, 4), rudnn.ShapeError,
         "grid_sample: y: expected an output whose elements do not share memory (no stride 0 on an axis of size "
         "> 1), got shape [1, 2, 3, 4] with strides [6, 3, 1, 0]"),
    ],
)
def test_bad_out_is_not_written(device, out, exc, message):
    o = out(device)
    before = o.clone()
    with pytest.raises(exc) as info:
        rudnn.grid_sample(_x(device=device), _g(device=device), out=o)
    assert str(info.value) == message
    assert torch.equal(o, before)


@pytest.mark.cuda
def test_mixed_devices():
    with pytest.raises(rudnn.DeviceError) as info:
        rudnn.grid_sample(_x(device="cuda"), _g())
    assert str(info.value) == "grid_sample: grid: expected device cuda:0 like x, got cpu"


def test_errors_are_builtin_types():
    with pytest.raises(ValueError):
        rudnn.grid_sample(_x(), _g((1, 3, 4, 3)))
    with pytest.raises(TypeError):
        rudnn.grid_sample(_x(), _g(dtype=torch.float16))


@pytest.mark.cuda
def test_cuda_workspace_checks():
    # The float32 workspace of CUDA's dx (rudnn allocates it; C++ callers pass their own).
    x, grid = _x(device="cuda"), _g(device="cuda")
    dy, dx = torch.randn(1, 2, 3, 4, device="cuda"), torch.empty(1, 2, 6, 6, device="cuda")
    need = rudnn._C.grid_sample_backward_workspace_bytes(dy, x, grid, True, 0, 0, False, 0)
    assert need == 2 * 36 * 4
    assert rudnn._C.grid_sample_backward_workspace_bytes(dy, x, grid, False, 0, 0, False, 0) == 0
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn._C.grid_sample_backward(dy, x, grid, dx, None, torch.empty(need - 1, dtype=torch.uint8, device="cuda"),
                                      0, 0, False, 0, False, 0)
    assert str(info.value) == f"grid_sample_backward: workspace: expected at least {need} bytes, got {need - 1}"
    ws = torch.empty(need + 1, dtype=torch.uint8, device="cuda")[1:]
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn._C.grid_sample_backward(dy, x, grid, dx, None, ws, 0, 0, False, 0, False, 0)
    assert str(info.value) == "grid_sample_backward: workspace: expected an address aligned to 4 bytes (it holds " \
                              "float32 sums)"


@pytest.mark.parametrize("device", DEVICES)
def test_outputs_apart_from_inputs(device):
    # The family-wide aliasing rule (core/aliasing.hpp): no output overlaps an input.
    x, grid = _x(device=device), _g(device=device)
    big = torch.zeros(1, 2, 6, 6, device=device)
    before = big.clone()
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn.grid_sample(big, grid, out=big[:, :, :3, :4])
    assert str(info.value) == "grid_sample: y: shares memory with grid_sample: x" + SUFFIX
    assert torch.equal(big, before)
    grid_big = torch.zeros(1, 3, 4, 2, device=device)
    with pytest.raises(rudnn.ArgumentError) as info:
        rudnn.grid_sample(x, grid_big, out=grid_big.view(1, 2, 3, 4))
    assert str(info.value) == "grid_sample: y: shares memory with grid_sample: grid" + SUFFIX
    dy = torch.randn(1, 2, 3, 4, device=device)
    with pytest.raises(rudnn.ArgumentError) as info:  # the C++ API: dgrid written over x
        rudnn._C.grid_sample_backward(dy, big, grid, None, big.view(-1)[:24].view(1, 3, 4, 2), None, 0, 0, False, 0,
                                      False, 0)
    assert str(info.value) == "grid_sample_backward: dgrid: shares memory with grid_sample_backward: x" + SUFFIX
