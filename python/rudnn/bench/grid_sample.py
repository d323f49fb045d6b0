"""Benchmark family `grid_sample`: bilinear (zeros padding), bilinear with border padding and
align_corners, nearest and bicubic sampling of a random grid (a mild warp of the identity),
forward and backward (dx and dgrid; the default atomic dx and, ops ending in `_det`, the
deterministic one), against torch eager, in NCHW and channels_last (ops ending in `_cl`).

Forward peers are torch.nn.functional.grid_sample on the same tensors. Backward peers are torch
autograd of the same call with respect to x and grid: the forward runs once outside the timed
region and only torch.autograd.grad(..., retain_graph=True) is timed. The float64 references are
torch's on float64 copies.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, poison_allocator, torch_dtype

FAMILY = "grid_sample"
PEER = "torch eager"
BOUND = "memory"
TARGET = (0.0, 1.5)  # SPEC section 8: >= 1.5x torch forward (and >= 2x backward: read the backward rows)

# op -> grid_sample's options
_OPS = {
    "bilinear": dict(mode="bilinear", padding_mode="zeros", align_corners=False),
    "bilinear_border_align": dict(mode="bilinear", padding_mode="border", align_corners=True),
    "nearest": dict(mode="nearest", padding_mode="zeros", align_corners=False),
    "bicubic_reflection": dict(mode="bicubic", padding_mode="reflection", align_corners=False),
}
OPS = tuple(f"{op}{bwd}{cl}" for op in _OPS for bwd in ("", "_backward", "_backward_det") for cl in ("", "_cl"))

# (x shape, output spatial size)
_GPU_QUICK = [((8, 64, 128, 128), (128, 128), "bfloat16"), ((4, 128, 64, 64), (96, 96), "float32")]
_GPU_MORE = [((2, 32, 255, 257), (200, 300), "float16")]
_CPU = [((2, 8, 24, 24), (20, 28), "bfloat16"), ((2, 8, 24, 24), (20, 28), "float32")]
_CPU_MORE = [((1, 4, 27, 31), (13, 17), "float16")]


def cases(device: str, quick: bool) -> list:
    if device == "cuda":
        sizes = _GPU_QUICK if quick else _GPU_QUICK + _GPU_MORE
    else:
        sizes = _CPU if quick else _CPU + _CPU_MORE
    # quick runs: the deterministic backward of plain bilinear only
    ops = [op for op in OPS if not quick or "_det" not in op or op.startswith("bilinear_backward_det")]
    # CaseSpec.shape: the x shape followed by the output's spatial size
    return [CaseSpec(FAMILY, op, tuple(shape) + tuple(out), dt) for op in ops for shape, out, dt in sizes]


def _split(op):
    channels_last = op.endswith("_cl")
    base = op[:-3] if channels_last else op
    deterministic = base.endswith("_det")
    base = base[:-4] if deterministic else base
    backward = base.endswith("_backward")
    return (base[: -len("_backward")] if backward else base), backward, deterministic, channels_last


def prepare(spec: CaseSpec, device: str) -> Prepared:
    import torch
    import torch.nn.functional as F

    import rudnn

    name, backward, deterministic, channels_last = _split(spec.op)
    kw = _OPS[name]
    dt = torch_dtype(spec.dtype)
    x_shape, (h_out, w_out) = spec.shape[:4], spec.shape[4:]
    x = torch.randn(*x_shape, device=device).to(dt)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h_out, device=device), torch.linspace(-1, 1, w_out, device=device),
                            indexing="ij")
    ident = torch.stack([xs, ys], -1).expand(x_shape[0], h_out, w_out, 2)
    grid = (ident * 1.05 + 0.04 * torch.randn(x_shape[0], h_out, w_out, 2, device=device)).to(dt).contiguous()

    def theirs(t, g):
        return F.grid_sample(t, g, **kw)

    y_peer = theirs(x, grid)
    s_el = x.element_size()
    moved = (x.numel() + grid.numel() + y_peer.numel()) * s_el

    if not backward:
        def check():
            poison_allocator(device, [(y_peer.shape, dt)])
            return [compare("y", rudnn.grid_sample(x, grid, **kw), theirs(x.double(), grid.double()), y_peer,
                            expect_dtype=dt)]

        return Prepared(run=lambda: rudnn.grid_sample(x, grid, **kw), peer=lambda: theirs(x, grid), check=check,
                        bytes=moved)

    dy = torch.randn(*y_peer.shape, device=device).to(dt)
    if channels_last:
        dy = dy.contiguous(memory_format=torch.channels_last)
    xg, gg = x.detach().clone().requires_grad_(), grid.detach().clone().requires_grad_()
    with torch.enable_grad():
        yg = theirs(xg, gg)

    def peer():
        return torch.autograd.grad(yg, (xg, gg), dy, retain_graph=True)

    def run():
        return rudnn.grid_sample_backward(dy, x, grid, **kw, deterministic=deterministic)

    def check():
        x64, g64 = x.double().requires_grad_(), grid.double().requires_grad_()
        with torch.enable_grad():
            dx_ref, dg_ref = torch.autograd.grad(theirs(x64, g64), (x64, g64), dy.double())
        poison_allocator(device, [(x.shape, dt), (grid.shape, dt)])
        dx, dgrid = run()
        pdx, pdg = peer()
        return [compare("dx", dx, dx_ref, pdx, expect_dtype=dt), compare("dgrid", dgrid, dg_ref, pdg, expect_dtype=dt)]

    return Prepared(run=run, peer=peer, check=check, bytes=moved + x.numel() * s_el + grid.numel() * s_el)
