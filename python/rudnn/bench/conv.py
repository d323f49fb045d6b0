"""Benchmark family `conv`: forward, data gradient and weight gradient of rudnn.conv against torch
(cuDNN on CUDA) on channels_last tensors, which rudnn reads in place (NHWC without copies).

A case's shape is (N, C, *spatial, Cout, kernel, stride): x is (N, C, *spatial) in channels_last
memory, w (Cout, C, kernel, ...) likewise, padding kernel // 2. The rows are ResNet-50 layers
(batch 64, bf16) and 3-D VAE layers (N = 1, C = 128..512, 16×64×64 down to 4×16×16). The peer's backward rows time
torch.autograd.grad of the forward (run once outside the timed region) with respect to x or w
alone. The float64 references are torch's convolution of float64 copies. The plain ops run rudnn's
strategy="auto" (CUTLASS implicit GEMM where it applies, the direct kernels otherwise: the row's
algorithm column says which ran); the ``*_ig`` ops (CUDA only) force strategy="implicit_gemm".
No row of this family has run on a GPU yet: the implicit-GEMM kernels compile for sm_80 and
sm_90a but are unmeasured.
"""

from __future__ import annotations

import math

from . import CaseSpec, Prepared, compare, poison_allocator, torch_dtype

FAMILY = "conv"
PEER = "torch (cuDNN), channels_last"
BOUND = "compute"
TARGET = (0.0, 1.0)  # SPEC section 8: >= 1.0x cuDNN
OPS = ("conv", "conv_data_backward", "conv_weight_backward")
IG_OPS = tuple(f"{op}_ig" for op in OPS)  # strategy="implicit_gemm" (CUDA only)

_GPU_QUICK = [((64, 64, 56, 56, 64, 3, 1), "bfloat16"), ((64, 256, 56, 56, 64, 1, 1), "bfloat16")]
_GPU_MORE = [((64, 128, 56, 56, 128, 3, 2), "bfloat16"), ((64, 512, 7, 7, 512, 3, 1), "bfloat16"),
             ((64, 256, 56, 56, 512, 1, 2), "bfloat16"),
             ((1, 128, 16, 64, 64, 128, 3, 1), "bfloat16"), ((1, 256, 8, 32, 32, 256, 3, 1), "bfloat16"),
             ((1, 512, 4, 16, 16, 512, 3, 1), "bfloat16")]
_CPU = [((2, 16, 14, 14, 16, 3, 1), "float32"), ((2, 16, 14, 14, 16, 3, 1), "bfloat16")]
_CPU_MORE = [((1, 8, 6, 10, 10, 8, 3, 2), "float32")]


def cases(device: str, quick: bool) -> list:
    if device == "cuda":
        sizes = _GPU_QUICK if quick else _GPU_QUICK + _GPU_MORE
    else:
        sizes = _CPU if quick else _CPU + _CPU_MORE
    ops = OPS + IG_OPS if device == "cuda" else OPS
    return [CaseSpec(FAMILY, op, shape, dt) for op in ops for shape, dt in sizes]


def _channels_last(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def prepare(spec: CaseSpec, device: str) -> Prepared:
    import torch
    import torch.nn.functional as F

    import rudnn

    *x_shape, cout, k, stride = spec.shape
    dims = len(x_shape) - 2
    conv_nd = getattr(F, f"conv{dims}d")
    dt = torch_dtype(spec.dtype)
    x = _channels_last(torch.randn(*x_shape, device=device).to(dt))
    w = _channels_last((torch.randn(cout, x_shape[1], *([k] * dims), device=device) / math.sqrt(x_shape[1] * k ** dims))
                       .to(dt))
    kw = dict(stride=stride, padding=k // 2)
    theirs = lambda a, b: conv_nd(a, b, None, **kw)  # noqa: E731
    op = spec.op.removesuffix("_ig")
    ours_kw = dict(kw, strategy="implicit_gemm" if spec.op.endswith("_ig") else "auto")
    y_peer = theirs(x, w)
    flops = 2 * y_peer.numel() * x_shape[1] * k ** dims
    algorithm = rudnn.conv_last_algorithm

    if op == "conv":
        def check():
            poison_allocator(device, [(y_peer.shape, dt)])
            y = rudnn.conv(x, w, None, **ours_kw)
            return [compare("y", y, theirs(x.double(), w.double()), y_peer, expect_dtype=dt)]

        return Prepared(run=lambda: rudnn.conv(x, w, None, **ours_kw), peer=lambda: theirs(x, w), check=check,
                        flops=flops, algorithm=algorithm)

    dy = _channels_last(torch.randn(*y_peer.shape, device=device).to(dt))
    data = op == "conv_data_backward"
    xg, wg = x.detach().clone().requires_grad_(data), w.detach().clone().requires_grad_(not data)
    with torch.enable_grad():
        yg = theirs(xg, wg)

    def peer():
        return torch.autograd.grad(yg, xg if data else wg, dy, retain_graph=True)[0]

    def ours():
        if data:
            return rudnn.conv_data_backward(dy, w, x.shape, **ours_kw)
        return rudnn.conv_weight_backward(dy, x, w.shape, **ours_kw)

    def check():
        x64, w64 = x.double().requires_grad_(data), w.double().requires_grad_(not data)
        with torch.enable_grad():
            ref = torch.autograd.grad(theirs(x64, w64), x64 if data else w64, dy.double())[0]
        poison_allocator(device, [((x if data else w).shape, dt)])
        return [compare("dx" if data else "dw", ours(), ref, peer(), expect_dtype=dt)]

    return Prepared(run=ours, peer=peer, check=check, flops=flops, algorithm=algorithm)
