"""Naive attention reference written from the definitions (SPEC section 2), computing in
any torch dtype: float64 for the oracle, the input dtype for the "same-dtype torch"
computation whose error sets the test budget. Differentiable with torch autograd."""

import torch


def visibility(Sq, Sk, causal=False, window=None):
    """[Sq, Sk] bool: key j visible to query i, aligned to the bottom-right corner."""
    i = torch.arange(Sq)[:, None] + (Sk - Sq)
    j = torch.arange(Sk)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            keep &= j >= i - left
        if right is not None and right >= 0:
            keep &= j <= i + right
    return keep


def logits(q, k, *, scale=None, causal=False, window=None, softcap=None, mask=None, bias=None, dtype=torch.float64):
    """[B, Hq, Sq, Sk] scores in `dtype`, -inf where a key is hidden."""
    q, k = q.to(dtype), k.to(dtype)
    Hq, Sq, D = q.shape[-3:]
    Hkv, Sk = k.shape[-3], k.shape[-2]
    k = k.repeat_interleave(Hq // Hkv, dim=-3)
    scale = D ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.to(dtype)
    keep = visibility(Sq, Sk, causal, window)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            s = s + mask.to(dtype)
    return s.masked_fill(~keep, float("-inf"))


def attention(q, k, v, dtype=torch.float64, **options):
    """(out, lse) with out in `dtype`; rows that see no key give out 0 and lse -inf."""
    Hq, Hkv = q.shape[-3], k.shape[-3]
    if k.shape[-2] == 0:  # no keys at all: every row is empty
        out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=dtype) + 0 * (q.to(dtype).sum() + k.to(dtype).sum() + v.to(dtype).sum())
        return out, torch.full(q.shape[:-1], float("-inf"), dtype=dtype)
    s = logits(q, k, dtype=dtype, **options)
    v = v.to(dtype).repeat_interleave(Hq // Hkv, dim=-3)
    m = s.amax(-1, keepdim=True).detach()
    empty = m == float("-inf")
    p = torch.exp(s - m.masked_fill(empty, 0.0))
    total = p.sum(-1, keepdim=True)
    out = (p / total.masked_fill(empty, 1.0)) @ v
    lse = (m + torch.log(total)).squeeze(-1)
    return out, lse.masked_fill(empty.squeeze(-1), float("-inf"))


def attention_varlen(q, k, v, cu_q, cu_k, dtype=torch.float64, **options):
    """Packed q [Tq, Hq, D], k/v [Tk, Hkv, *]: each sequence is a dense batch of one.
    Returns out [Tq, Hq, Dv] and lse [Hq, Tq]."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, l = attention(q[qs].transpose(0, 1)[None], k[ks].transpose(0, 1)[None], v[ks].transpose(0, 1)[None],
                         dtype=dtype, **options)
        outs.append(o[0].transpose(0, 1))
        lses.append(l[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)
