"""Benchmark family `attention`: dense attention forward and backward against torch SDPA.

Each case runs twice, once against SDPA's cuDNN backend (ops `attention`, `attention_backward`)
and once against its flash backend (ops `*_vs_flash`), so both peers sit side by side in one
table. Shapes follow FlashAttention's benchmark: B·S = 16k tokens, Hq = 2048 / D heads,
S from 512 to 16k, D in {64, 128, 256}, causal and not, plus a GQA case with 64 query and 8
key/value heads. Backward peers are torch autograd of SDPA: the forward runs once outside the
timed region and only torch.autograd.grad(..., retain_graph=True) is timed. FLOPs are counted
as FlashAttention does (4·B·H·S²·D forward, halved when causal; backward 2.5× forward).

The float64 reference is computed from the math on a slice (batch 0, the first heads, a few
query rows for long sequences) so that it fits in memory; the same slice of rudnn's and the
peer's outputs is compared with it.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, poison_allocator, torch_dtype

FAMILY = "attention"
PEER = "torch SDPA (cuDNN or flash backend, per op name)"
BOUND = "compute"
TARGET = None  # SPEC section 8: >= 1.0x the best torch backend (compare the two ops' ratios)

TOKENS = 16384
# (Hq, Hkv, S, D, causal); B = TOKENS // S.
_GPU_QUICK = [(16, 16, 2048, 128, 0), (16, 16, 2048, 128, 1), (16, 16, 8192, 128, 1), (32, 32, 2048, 64, 1),
              (8, 8, 2048, 256, 1), (64, 8, 4096, 128, 1)]
_GPU_MORE = [(16, 16, s, 128, c) for s in (512, 1024, 4096, 16384) for c in (0, 1)] + \
            [(32, 32, s, 64, c) for s in (512, 8192) for c in (0, 1)] + \
            [(8, 8, s, 256, c) for s in (512, 8192) for c in (0, 1)]
# The flash backward covers the forward's head dims (D = 256 on devices with 144 KiB of shared
# memory per block: A100, Hopper).
_GPU_BACKWARD = [(32, 32, 512, 64, 0), (32, 32, 2048, 64, 1), (32, 32, 8192, 64, 1), (64, 8, 2048, 64, 1),
                 (16, 16, 2048, 128, 1), (16, 16, 8192, 128, 0), (8, 8, 2048, 256, 1)]
_CPU = [(4, 2, 128, 64, 1)]
_CPU_TOKENS = 256

OPS = ("attention", "attention_vs_flash", "attention_backward", "attention_backward_vs_flash")
_REF_ROWS = 256  # query rows of the float64 reference slice (first and last half)
_REF_HEADS = 2


def cases(device: str, quick: bool) -> list:
    if device != "cuda":
        return [CaseSpec(FAMILY, op, (_CPU_TOKENS // s, hq, hkv, s, d, c), "bfloat16")
                for op in ("attention", "attention_backward") for hq, hkv, s, d, c in _CPU]
    fwd = _GPU_QUICK if quick else _GPU_QUICK + _GPU_MORE
    specs = []
    for op in OPS:
        shapes = _GPU_BACKWARD if "backward" in op else fwd
        specs += [CaseSpec(FAMILY, op, (TOKENS // s, hq, hkv, s, d, c), "bfloat16") for hq, hkv, s, d, c in shapes]
    return specs


def _peer_backend(op: str, device: str):
    if device != "cuda":
        return None
    from torch.nn.attention import SDPBackend

    return SDPBackend.FLASH_ATTENTION if op.endswith("_vs_flash") else SDPBackend.CUDNN_ATTENTION


def _sdpa(q, k, v, causal, backend):
    import torch.nn.functional as F

    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=q.shape[1] != k.shape[1])
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=q.shape[1] != k.shape[1])


def _reference(q, k, v, causal, rows):
    """float64 out (and the probabilities' inputs) of batch 0, the first heads, query rows `rows`."""
    import torch

    h = min(q.shape[1], _REF_HEADS)
    group = q.shape[1] // k.shape[1]
    q64 = q[0, :h, rows].double()
    k64 = k[0].double().repeat_interleave(group, 0)[:h]
    v64 = v[0].double().repeat_interleave(group, 0)[:h]
    s = q64 @ k64.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        Sq, Sk = q.shape[2], k.shape[2]
        keep = torch.arange(Sk, device=q.device)[None, :] <= (rows[:, None] + Sk - Sq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v64, h


def prepare(spec: CaseSpec, device: str) -> Prepared:
    import torch

    import rudnn

    B, Hq, Hkv, S, D, causal = spec.shape
    dt = torch_dtype(spec.dtype)
    backend = _peer_backend(spec.op, device)
    g = torch.Generator(device=device)
    q = torch.randn(B, Hq, S, D, device=device, generator=g).to(dt)
    k = torch.randn(B, Hkv, S, D, device=device, generator=g).to(dt)
    v = torch.randn(B, Hkv, S, D, device=device, generator=g).to(dt)
    flops = 4 * B * Hq * S * S * D // (2 if causal else 1)
    rows = torch.arange(S, device=device)
    if S > _REF_ROWS:
        rows = torch.cat([rows[: _REF_ROWS // 2], rows[-_REF_ROWS // 2:]])

    if "backward" not in spec.op:
        def run():
            return rudnn.attention(q, k, v, causal=bool(causal))

        def check():
            ref, h = _reference(q, k, v, causal, rows)
            poison_allocator(device, [((B, Hq, S, D), dt)])
            ours = run()
            peer = _sdpa(q, k, v, causal, backend)
            return [compare("out", ours[0, :h, rows], ref, peer[0, :h, rows], expect_dtype=dt)]

        return Prepared(run=run, peer=lambda: _sdpa(q, k, v, causal, backend), check=check, flops=flops,
                        algorithm=rudnn.attention_last_algorithm)

    out, lse = rudnn.attention(q, k, v, causal=bool(causal), return_lse=True)
    dout = torch.randn(B, Hq, S, D, device=device, generator=g).to(dt)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        og = _sdpa(qg, kg, vg, causal, backend)

    def peer():
        return torch.autograd.grad(og, (qg, kg, vg), dout, retain_graph=True)

    def run():
        return rudnn.attention_backward(dout, q, k, v, out, lse, causal=bool(causal))

    group = Hq // Hkv

    def check():
        # float64 gradients of batch 0, key/value head 0 and its query heads (all rows: dk/dv need
        # every query of the group).
        leaves = [t[:1, :n].detach().double().requires_grad_() for t, n in ((q, group), (k, 1), (v, 1))]
        with torch.enable_grad():
            kk, vv = leaves[1].repeat_interleave(group, 1), leaves[2].repeat_interleave(group, 1)
            s = leaves[0] @ kk.transpose(-1, -2) * D ** -0.5
            if causal:
                s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=device).tril(), float("-inf"))
            o = torch.softmax(s, -1) @ vv
            grads = torch.autograd.grad(o, leaves, dout[:1, :group].double())
        poison_allocator(device, [(q.shape, dt), (k.shape, dt), (v.shape, dt)])
        ours = run()
        theirs = peer()
        heads = (group, 1, 1)
        return [compare(name, a[:1, :n], ref, p[:1, :n], expect_dtype=dt)
                for name, a, ref, p, n in zip(("dq", "dk", "dv"), ours, grads, theirs, heads)]

    return Prepared(run=run, peer=peer, check=check, flops=int(2.5 * flops), algorithm=rudnn.attention_last_algorithm)
