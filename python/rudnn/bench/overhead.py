"""Benchmark family `overhead`: the host cost of one call on a tiny input, one op of every family,
against the same torch op (issue 27: a decode step calls these ops thousands of times a second;
CUDA graphs hide the host cost, without them it is the floor).

Timed by Timer.host (TIMING = "host"): wall time of 200 back-to-back calls with one
synchronization at the end, per call, median of 7 batches. The inputs are small enough that the
device work (a few µs at most) hides under the host work on a GPU, so the ms column is Python,
argument checks, DLPack exports, output allocation and the launch. The check compares each
result with torch's op in float64, as the other families do. Ops without a torch peer (gated
delta, paged attention) are timed by their own families.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, torch_dtype

FAMILY = "overhead"
PEER = "torch eager (host time per call, tiny inputs)"
BOUND = "memory"
TARGET = None
TIMING = "host"

# op -> the shape label of its tiny input (what _inputs builds)
OPS = {"layer_norm": (4, 64), "softmax": (4, 64), "attention": (1, 2, 8, 64), "conv": (1, 8, 8, 8),
       "max_pool": (1, 8, 8, 8), "interpolate": (1, 8, 8, 8), "grid_sample": (1, 8, 8, 8), "ctc_loss": (12, 2, 6),
       "moe_route": (4, 16), "torch.layer_norm": (4, 64), "torch.attention": (1, 2, 8, 64)}


def cases(device: str, quick: bool) -> list:
    dt = "bfloat16" if device == "cuda" else "float32"
    return [CaseSpec(FAMILY, op, shape, dt) for op, shape in OPS.items()]


def _inputs(op, dt, device):
    """(rudnn call, torch call, float64 reference call[, the inputs]) of `op` on tiny inputs;
    "torch.<op>" is <op> called through rudnn.torch."""
    import torch
    import torch.nn.functional as F

    import rudnn
    import rudnn.torch

    if op.startswith("torch."):  # the same op through rudnn.torch's wrapper (its eager fast path)
        plain = _inputs(op[len("torch."):], dt, device)
        wrapped = {"torch.layer_norm": lambda x, w, b: rudnn.torch.layer_norm(x, w, b),
                   "torch.attention": lambda q, k, v: rudnn.torch.attention(q, k, v, causal=True)}[op]
        return (lambda: wrapped(*plain[3]),) + plain[1:3]

    def rnd(*shape):
        return torch.randn(*shape, device=device).to(dt)

    if op == "layer_norm":
        x, w, b = rnd(4, 64), rnd(64), rnd(64)
        return (lambda: rudnn.layer_norm(x, w, b), lambda: F.layer_norm(x, (64,), w, b),
                lambda: F.layer_norm(x.double(), (64,), w.double(), b.double()), (x, w, b))
    if op == "softmax":
        x = rnd(4, 64)
        return lambda: rudnn.softmax(x), lambda: torch.softmax(x, -1), lambda: torch.softmax(x.double(), -1)
    if op == "attention":
        q, k, v = rnd(1, 2, 8, 64), rnd(1, 2, 8, 64), rnd(1, 2, 8, 64)
        sdpa = F.scaled_dot_product_attention
        return (lambda: rudnn.attention(q, k, v, causal=True), lambda: sdpa(q, k, v, is_causal=True),
                lambda: sdpa(q.double(), k.double(), v.double(), is_causal=True), (q, k, v))
    if op == "conv":
        x, w = rnd(1, 8, 8, 8), rnd(8, 8, 3, 3)
        return (lambda: rudnn.conv(x, w, padding=1), lambda: F.conv2d(x, w, padding=1),
                lambda: F.conv2d(x.double(), w.double(), padding=1))
    if op == "max_pool":
        x = rnd(1, 8, 8, 8)
        return lambda: rudnn.max_pool(x, 2), lambda: F.max_pool2d(x, 2), lambda: F.max_pool2d(x.double(), 2)
    if op == "interpolate":
        x = rnd(1, 8, 8, 8)
        up = dict(scale_factor=2, mode="bilinear", align_corners=False)
        return (lambda: rudnn.interpolate(x, **up), lambda: F.interpolate(x, **up),
                lambda: F.interpolate(x.double(), **up))
    if op == "grid_sample":
        x, grid = rnd(1, 8, 8, 8), (torch.rand(1, 8, 8, 2, device=device) * 2 - 1).to(dt)
        gs = dict(mode="bilinear", padding_mode="zeros", align_corners=False)
        return (lambda: rudnn.grid_sample(x, grid, **gs), lambda: F.grid_sample(x, grid, **gs),
                lambda: F.grid_sample(x.double(), grid.double(), **gs))
    if op == "ctc_loss":
        T, N, C, S = 12, 2, 6, 4
        lp = torch.randn(T, N, C, device=device).log_softmax(-1).to(dt)
        targets = torch.randint(1, C, (N, S), device=device)
        il, tl = torch.full((N,), T, device=device), torch.full((N,), S, device=device)
        return (lambda: rudnn.ctc_loss(lp, targets, il, tl), lambda: F.ctc_loss(lp.float(), targets, il, tl),
                lambda: F.ctc_loss(lp.double(), targets, il, tl))
    if op == "moe_route":
        logits = rnd(4, 16)

        def torch_route(lg):
            w, i = torch.topk(torch.softmax(lg.float(), -1), 2, -1)
            return w / w.sum(-1, keepdim=True)

        return (lambda: rudnn.moe.route(logits, 2).weights, lambda: torch_route(logits),
                lambda: torch_route(logits.double()))
    raise KeyError(op)


def prepare(spec: CaseSpec, device: str) -> Prepared:
    dt = torch_dtype(spec.dtype)
    ours, theirs, ref = _inputs(spec.op, dt, device)[:3]

    def check():
        return [compare("y", ours(), ref(), theirs())]

    return Prepared(run=ours, peer=theirs, check=check)
