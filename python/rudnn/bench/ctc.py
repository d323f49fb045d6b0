"""Benchmark family `ctc`: ctc_loss forward and backward against torch eager.

Shapes are (T, N, C, S): time steps, batch, classes (blank 0 included), target length; every
sequence has the full input length and a random target of length S (labels 1..C-1), padded.
torch's CTC kernels take float32 and float64 only, so for f16/bf16 the peer runs on a float32
copy of log_probs (the copy is not timed). The backward peer is torch autograd of the mean loss:
the forward runs once outside the timed region and only torch.autograd.grad(...,
retain_graph=True) is timed. The float64 references are torch's on float64 copies.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, poison_allocator, torch_dtype

FAMILY = "ctc"
PEER = "torch eager"
BOUND = "memory"
TARGET = (0.0, 1.5)  # SPEC section 8: >= 1.5x torch forward (and >= 2x backward: read the backward rows)

OPS = ("ctc_loss", "ctc_loss_backward")

# Speech-like (wav2vec2 CTC heads: ~50 frames/s, ~32 characters) and a large vocabulary.
_GPU_QUICK = [((400, 32, 32, 100), "float32"), ((400, 32, 32, 100), "bfloat16")]
_GPU_MORE = [((1000, 16, 1024, 200), "float16"), ((200, 64, 5000, 50), "bfloat16")]
_CPU = [((50, 4, 20, 10), "float32")]
_CPU_MORE = [((80, 4, 300, 20), "bfloat16")]


def cases(device: str, quick: bool) -> list:
    if device == "cuda":
        sizes = _GPU_QUICK if quick else _GPU_QUICK + _GPU_MORE
    else:
        sizes = _CPU if quick else _CPU + _CPU_MORE
    return [CaseSpec(FAMILY, op, shape, dt) for op in OPS for shape, dt in sizes]


def prepare(spec: CaseSpec, device: str) -> Prepared:
    import torch
    import torch.nn.functional as F

    import rudnn

    T, N, C, S = spec.shape
    dt = torch_dtype(spec.dtype)
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(T, N, C, generator=g).log_softmax(-1).to(dt).to(device)
    targets = torch.randint(1, C, (N, S), generator=g)
    il, tl = torch.full((N,), T, dtype=torch.int64), torch.full((N,), S, dtype=torch.int64)
    peer_in = log_probs.float()

    def theirs(t):
        return F.ctc_loss(t, targets.to(t.device), il, tl)

    loss_peer = theirs(peer_in)
    if spec.op == "ctc_loss":
        def check():
            poison_allocator(device, [((), dt)])
            loss = rudnn.ctc_loss(log_probs, targets, il, tl)
            return [compare("loss", loss, theirs(log_probs.double()), loss_peer, expect_dtype=dt)]

        return Prepared(run=lambda: rudnn.ctc_loss(log_probs, targets, il, tl), peer=lambda: theirs(peer_in),
                        check=check, bytes=log_probs.numel() * log_probs.element_size())

    dloss = torch.ones((), device=device)
    xg = peer_in.detach().clone().requires_grad_()
    with torch.enable_grad():
        loss_g = theirs(xg)

    def peer():
        return torch.autograd.grad(loss_g, xg, dloss, retain_graph=True)[0]

    def ours():
        return rudnn.ctc_loss_backward(dloss.to(dt), log_probs, targets, il, tl)

    def check():
        x64 = log_probs.double().requires_grad_()
        with torch.enable_grad():
            ref = torch.autograd.grad(theirs(x64), x64, dloss.double())[0]
        poison_allocator(device, [(log_probs.shape, dt)])
        return [compare("dlog_probs", ours(), ref, peer(), expect_dtype=dt)]

    return Prepared(run=ours, peer=peer, check=check, bytes=2 * log_probs.numel() * log_probs.element_size())
