"""Benchmark family `interpolate`: 2x bilinear and nearest upsampling, 0.5x antialiased bilinear
downsampling and bicubic upsampling, forward and backward, against torch eager, in NCHW and
channels_last (ops ending in `_cl`).

Forward peers are torch.nn.functional.interpolate on the same tensor (torch keeps channels_last
inputs channels_last). Backward peers are torch autograd of the same call: the forward runs once
outside the timed region and only torch.autograd.grad(..., retain_graph=True) is timed; rudnn's
backward is its gather. The float64 references are torch's on float64 copies.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, poison_allocator, torch_dtype

FAMILY = "interpolate"
PEER = "torch eager"
BOUND = "memory"
TARGET = (0.0, 1.5)  # SPEC section 8: >= 1.5x torch forward (and >= 2x backward: read the backward rows)

# op -> interpolate's options
_OPS = {
    "bilinear_up2": dict(scale_factor=2.0, mode="bilinear"),
    "nearest_up2": dict(scale_factor=2.0, mode="nearest"),
    "bicubic_up1.5": dict(scale_factor=1.5, mode="bicubic", align_corners=True),
    "bilinear_aa_down2": dict(scale_factor=0.5, mode="bilinear", antialias=True),
}
OPS = tuple(f"{op}{bwd}{cl}" for op in _OPS for bwd in ("", "_backward") for cl in ("", "_cl"))

_GPU_QUICK = [((16, 64, 128, 128), "bfloat16"), ((8, 256, 64, 64), "float32")]
_GPU_MORE = [((4, 128, 255, 257), "float16")]
_CPU = [((2, 8, 24, 24), "bfloat16"), ((2, 8, 24, 24), "float32")]
_CPU_MORE = [((1, 4, 27, 31), "float16")]


def cases(device: str, quick: bool) -> list:
    if device == "cuda":
        sizes = _GPU_QUICK if quick else _GPU_QUICK + _GPU_MORE
    else:
        sizes = _CPU if quick else _CPU + _CPU_MORE
    # torch's CPU antialias kernels take float32 only: no peer for the others there.
    return [CaseSpec(FAMILY, op, shape, dt) for op in OPS for shape, dt in sizes
            if device == "cuda" or dt == "float32" or "_aa" not in op]


def _split(op):
    channels_last = op.endswith("_cl")
    base = op[:-3] if channels_last else op
    backward = base.endswith("_backward")
    return (base[: -len("_backward")] if backward else base), backward, channels_last


def prepare(spec: CaseSpec, device: str) -> Prepared:
    import torch
    import torch.nn.functional as F

    import rudnn

    name, backward, channels_last = _split(spec.op)
    kw = _OPS[name]
    dt = torch_dtype(spec.dtype)
    x = torch.randn(*spec.shape, device=device).to(dt)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def theirs(t):
        return F.interpolate(t, **kw)

    def ours(t):
        return rudnn.interpolate(t, **kw)

    y_peer = theirs(x)
    s_el = x.element_size()
    moved = (x.numel() + y_peer.numel()) * s_el

    if not backward:
        def check():
            poison_allocator(device, [(y_peer.shape, dt)])
            return [compare("y", ours(x), theirs(x.double()), y_peer, expect_dtype=dt)]

        return Prepared(run=lambda: ours(x), peer=lambda: theirs(x), check=check, bytes=moved)

    dy = torch.randn(*y_peer.shape, device=device).to(dt)
    if channels_last:
        dy = dy.contiguous(memory_format=torch.channels_last)
    xg = x.detach().clone().requires_grad_()
    with torch.enable_grad():
        yg = theirs(xg)

    def peer():
        return torch.autograd.grad(yg, xg, dy, retain_graph=True)[0]

    def run():
        return rudnn.interpolate_backward(dy, x.shape, **kw)

    def check():
        x64 = x.double().requires_grad_()
        with torch.enable_grad():
            dx_ref = torch.autograd.grad(theirs(x64), x64, dy.double())[0]
        poison_allocator(device, [(x.shape, dt)])
        return [compare("dx", run(), dx_ref, peer(), expect_dtype=dt)]

    return Prepared(run=run, peer=peer, check=check, bytes=moved)
