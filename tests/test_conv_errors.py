"""Every documented error of the conv family: the exception type and a message naming the argument."""

import numpy as np
import pytest
import torch

import rudnn

X = torch.zeros((1, 4, 6, 6))
W = torch.zeros((8, 4, 3, 3))


def _raises(exc, match, fn, *args, **kw):
    with pytest.raises(exc, match=match):
        fn(*args, **kw)


def test_channel_mismatch():
    _raises(rudnn.ShapeError, r"conv: w: channel mismatch: expected 4 input channels per group .*x has 4 channels",
            rudnn.conv, X, torch.zeros((8, 3, 3, 3)))
    _raises(rudnn.ShapeError, r"w: channel mismatch: expected 2 input channels per group .*groups = 2",
            rudnn.conv, X, W, groups=2)
    _raises(rudnn.ShapeError, r"conv_weight_backward: w_shape: channel mismatch",
            rudnn.conv_weight_backward, torch.zeros((1, 8, 4, 4)), X, (8, 3, 3, 3))


def test_bad_groups():
    _raises(rudnn.ArgumentError, r"conv: groups: expected a divisor of the input channels \(4 in x\), got 3",
            rudnn.conv, X, torch.zeros((6, 1, 3, 3)), groups=3)
    _raises(rudnn.ArgumentError, r"conv: groups: expected a divisor of the output channels \(Cout = 6 in w\), got 4",
            rudnn.conv, X, torch.zeros((6, 1, 3, 3)), groups=4)
    _raises(rudnn.ArgumentError, r"conv: groups: expected an integer >= 1, got 0", rudnn.conv, X, W, groups=0)
    _raises(rudnn.ArgumentError, r"conv: groups: expected an int >= 1, got True", rudnn.conv, X, W, groups=True)


def test_kernel_larger_than_padded_input():
    _raises(rudnn.ShapeError, r"conv: w: the kernel \(extent 7 .*\) is larger than the padded input \(size 6\)",
            rudnn.conv, X, torch.zeros((8, 4, 7, 7)))
    _raises(rudnn.ShapeError, r"extent 9 .* larger than the padded input \(size 8\)",
            rudnn.conv, X, W, padding=1, dilation=4)
    rudnn.conv(X, torch.zeros((8, 4, 7, 7)), padding=1)  # padding makes it fit


def test_negative_padding_stride_dilation():
    _raises(rudnn.ArgumentError, r"conv: padding: negative padding is not supported, got \[-1, -1\]",
            rudnn.conv, X, W, padding=-1)
    _raises(rudnn.ArgumentError, r"conv: stride: expected values >= 1, got \[1, 0\]", rudnn.conv, X, W, stride=(1, 0))
    _raises(rudnn.ArgumentError, r"conv: dilation: expected values >= 1, got \[0, 0\]", rudnn.conv, X, W, dilation=0)
    _raises(rudnn.ArgumentError, r"conv: padding: expected an int or a sequence of 2 ints", rudnn.conv, X, W,
            padding=(1, 1, 1))
    _raises(rudnn.ArgumentError, r"conv: padding: expected an int, a sequence of 2 ints, 'same' or 'valid', "
            r"got 'full'", rudnn.conv, X, W, padding="full")
    _raises(rudnn.ArgumentError, r"conv: padding: padding='same' is not supported for strided convolutions",
            rudnn.conv, X, W, stride=2, padding="same")


def test_layout_mismatch():
    _raises(rudnn.ShapeError, r"conv: layout: layout mismatch: 'NDHWC' is a layout for 3 spatial dims, but the "
            r"arrays have 2", rudnn.conv, X, W, layout="NDHWC")
    # An NHWC weight ([Cout, kH, kW, Cin]) with the default layout: named as such.
    _raises(rudnn.ShapeError, r"w: channel mismatch: .*it looks like the NHWC weight layout \[Cout, kH, kW, "
            r"Cin/groups\] \(layout mismatch", rudnn.conv, X, torch.zeros((8, 3, 3, 4)))
    _raises(rudnn.ShapeError, r"it looks like the NCHW weight layout", rudnn.conv, X.movedim(1, -1).contiguous(), W,
            layout="NHWC")
    _raises(rudnn.ArgumentError, r"conv: layout: expected 'NCHW' \(channels first\) or 'NHWC'", rudnn.conv, X, W,
            layout="CHWN")


def test_ranks():
    _raises(rudnn.ShapeError, r"conv: x: expected 3, 4 or 5 axes", rudnn.conv, torch.zeros((4, 6)), W)
    _raises(rudnn.ShapeError, r"conv: w: expected 4 axes \[Cout, Cin/groups, kH, kW\] like x", rudnn.conv, X,
            torch.zeros((8, 4, 3)))
    _raises(rudnn.ShapeError, r"conv: x: expected sizes >= 1 on every axis but the batch axis", rudnn.conv,
            torch.zeros((1, 4, 0, 6)), W)


def test_dtypes():
    _raises(rudnn.DTypeError, r"conv: w: expected the dtype of x \(float32\), got float16", rudnn.conv, X, W.half())
    _raises(rudnn.DTypeError, r"conv: x: expected float32, float16 or bfloat16, got int32", rudnn.conv, X.int(),
            W.int())
    _raises(rudnn.DTypeError, r"conv: bias: expected the dtype of x", rudnn.conv, X, W,
            torch.zeros(8, dtype=torch.bfloat16))
    _raises(rudnn.ShapeError, r"conv: bias: expected shape \[8\]", rudnn.conv, X, W, torch.zeros(4))


def test_strategies():
    # CUTLASS's kernels run on CUDA devices only: asking for them on the CPU says so.
    _raises(rudnn.UnsupportedError, r"conv: strategy 'implicit_gemm': CUTLASS implicit GEMM runs on CUDA devices "
            r"only \(the tensors are on the CPU\)", rudnn.conv, X, W, strategy="implicit_gemm")
    _raises(NotImplementedError, r"conv_data_backward: strategy 'implicit_gemm': CUTLASS implicit GEMM runs on CUDA",
            rudnn.conv_data_backward, torch.zeros((1, 8, 4, 4)), W, X.shape, strategy="implicit_gemm")
    _raises(rudnn.UnsupportedError, r"conv_weight_backward: strategy 'implicit_gemm': CUTLASS implicit GEMM runs on "
            r"CUDA", rudnn.conv_weight_backward, torch.zeros((1, 8, 4, 4)), X, W.shape, strategy="implicit_gemm")
    _raises(rudnn.ArgumentError, r"conv: strategy: expected one of 'auto', 'direct', 'implicit_gemm', 'autotune', "
            r"got 'fast'", rudnn.conv, X, W, strategy="fast")


def test_backward_shapes():
    _raises(rudnn.ShapeError, r"conv_data_backward: dy: expected shape \[1, 8, 4, 4\] \(the conv output shape for "
            r"x_shape and w\), got \[1, 8, 5, 4\]", rudnn.conv_data_backward, torch.zeros((1, 8, 5, 4)), W, X.shape)
    _raises(rudnn.ShapeError, r"conv_weight_backward: dy: expected shape \[1, 8, 6, 6\]",
            rudnn.conv_weight_backward, torch.zeros((1, 8, 4, 4)), X, W.shape, padding=1)
    _raises(rudnn.ArgumentError, r"conv_data_backward: x_shape: expected a sequence of ints", rudnn.conv_data_backward,
            torch.zeros((1, 8, 4, 4)), W, (1, 4, 6.5, 6))
    _raises(rudnn.ShapeError, r"conv_bias_backward: dy: expected 3, 4 or 5 axes", rudnn.conv_bias_backward,
            torch.zeros((4, 8)))
    _raises(rudnn.DTypeError, r"conv_data_backward: w: expected the dtype of dy", rudnn.conv_data_backward,
            torch.zeros((1, 8, 4, 4)), W.half(), X.shape)


def test_out_and_frameworks_leave_inputs_untouched():
    out = torch.full((1, 8, 5, 5), 7.0)
    _raises(rudnn.ShapeError, r"conv: y: expected shape \[1, 8, 4, 4\] \(the output shape for x and w\), got "
            r"\[1, 8, 5, 5\]", rudnn.conv, X, W, out=out)
    assert torch.equal(out, torch.full((1, 8, 5, 5), 7.0))
    _raises(rudnn.DTypeError, r"conv: y: expected the dtype of x", rudnn.conv, X, W, out=torch.zeros((1, 8, 4, 4),
            dtype=torch.float16))
    _raises(rudnn.FrameworkError, r"conv: w: expected a torch.Tensor", rudnn.conv, X, np.zeros((8, 4, 3, 3), "float32"))


def test_outputs_apart_from_inputs():
    x = torch.zeros((1, 4, 6, 6))
    w = torch.zeros((4, 4, 1, 1))
    _raises(rudnn.ArgumentError, r"conv: y: shares memory with conv: x \(rudnn does not compute in place",
            rudnn.conv, x, w, out=x)
    _raises(rudnn.ShapeError, r"conv: y: expected an output whose elements do not share memory",
            rudnn.conv, x, w, out=torch.zeros((1, 4, 1, 6)).expand(1, 4, 6, 6))
    dy = torch.zeros((1, 4, 6, 6))
    _raises(rudnn.ArgumentError, r"conv_bias_backward: db: shares memory with conv_bias_backward: dy",
            rudnn._C.conv_bias_backward, dy, dy[0, 0, 0, :4], 2, 0, 0)
