"""Benchmark family `pooling`: max, average and adaptive average pooling, forward and backward,
against torch eager, in NCHW and channels_last (ops ending in `_cl`).

Forward peers are torch.nn.functional.max_pool2d / avg_pool2d / adaptive_avg_pool2d on the same
tensor (torch keeps channels_last inputs channels_last). Backward peers are torch autograd of
the same op: the forward runs once outside the timed region and only
torch.autograd.grad(..., retain_graph=True) is timed; rudnn's backward is its gather
(max: from the forward's indices). The float64 references are torch's ops on float64 copies.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, poison_allocator, torch_dtype

FAMILY = "pooling"
PEER = "torch eager"
BOUND = "memory"
TARGET = (0.0, 1.5)  # SPEC section 8: >= 1.5x torch forward (and >= 2x backward: read the backward rows)

# (op, kernel, stride, padding): ResNet's stem max pool, a 2x2 average pool, global average pool.
_OPS = {
    "max_pool": (3, 2, 1), "avg_pool": (2, 2, 0), "adaptive_avg_pool": None,
}
OPS = tuple(f"{op}{bwd}{cl}" for op in _OPS for bwd in ("", "_backward") for cl in ("", "_cl"))

_GPU_QUICK = [((64, 64, 112, 112), "bfloat16"), ((32, 256, 56, 56), "bfloat16"), ((32, 64, 112, 112), "float32")]
_GPU_MORE = [((128, 2048, 7, 7), "bfloat16"), ((16, 96, 147, 149), "float16")]
_CPU = [((2, 16, 28, 28), "bfloat16"), ((2, 16, 28, 28), "float32")]
_CPU_MORE = [((1, 8, 27, 31), "float16")]


def cases(device: str, quick: bool) -> list:
    if device == "cuda":
        sizes = _GPU_QUICK if quick else _GPU_QUICK + _GPU_MORE
    else:
        sizes = _CPU if quick else _CPU + _CPU_MORE
    return [CaseSpec(FAMILY, op, shape, dt) for op in OPS for shape, dt in sizes]


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
    dt = torch_dtype(spec.dtype)
    x = torch.randn(*spec.shape, device=device).to(dt)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    n, c, h, w = spec.shape
    if name == "adaptive_avg_pool":
        size = (1, 1) if h <= 7 else (7, 7)
        theirs = lambda t: F.adaptive_avg_pool2d(t, size)  # noqa: E731
        ours = lambda t: rudnn.adaptive_avg_pool(t, size)  # noqa: E731
        ours_bwd = lambda dy, _: rudnn.adaptive_avg_pool_backward(dy, x.shape)  # noqa: E731
    else:
        k, s, p = _OPS[name]
        if name == "max_pool":
            theirs = lambda t: F.max_pool2d(t, k, s, p)  # noqa: E731
            ours = lambda t: rudnn.max_pool(t, k, s, p)  # noqa: E731
            _, indices = rudnn.max_pool(x, k, s, p, return_indices=True)
            ours_bwd = lambda dy, _: rudnn.max_pool_backward(dy, x, indices, kernel=k, stride=s, padding=p)  # noqa
        else:
            theirs = lambda t: F.avg_pool2d(t, k, s, p)  # noqa: E731
            ours = lambda t: rudnn.avg_pool(t, k, s, p)  # noqa: E731
            ours_bwd = lambda dy, _: rudnn.avg_pool_backward(dy, x.shape, kernel=k, stride=s, padding=p)  # noqa
    y_peer = theirs(x)
    s_el = x.element_size()

    if not backward:
        def check():
            poison_allocator(device, [(y_peer.shape, dt)])
            y = ours(x)
            return [compare("y", y, theirs(x.double()), y_peer, expect_dtype=dt)]

        return Prepared(run=lambda: ours(x), peer=lambda: theirs(x), check=check,
                        bytes=(x.numel() + y_peer.numel()) * s_el)

    dy = torch.randn(*y_peer.shape, device=device).to(dt)
    if channels_last:
        dy = dy.contiguous(memory_format=torch.channels_last)
    xg = x.detach().clone().requires_grad_()
    with torch.enable_grad():
        yg = theirs(xg)

    def peer():
        return torch.autograd.grad(yg, xg, dy, retain_graph=True)[0]

    def check():
        x64 = x.double().requires_grad_()
        with torch.enable_grad():
            dx_ref = torch.autograd.grad(theirs(x64), x64, dy.double())[0]
        poison_allocator(device, [(x.shape, dt)])
        return [compare("dx", ours_bwd(dy, x), dx_ref, peer(), expect_dtype=dt)]

    index_bytes = y_peer.numel() * 8 if name == "max_pool" else 0
    return Prepared(run=lambda: ours_bwd(dy, x), peer=peer, check=check,
                    bytes=(x.numel() + y_peer.numel()) * s_el + index_bytes)
