"""Naive paged attention / MLA reference written from the definitions (SPEC section 3): each
sequence's pages are gathered into dense K/V in KV-position order, then every query row does a
plain softmax over the KV positions it sees, in any torch dtype (float64 for the oracle, the
input dtype for the "same-dtype torch" computation whose error sets the test budget). It reads
the schedule from plain Python lists, never from rudnn's plans."""

import torch


def gather(cache, table, length, page_size):
    """[length, H, D]: KV positions 0..length-1 of one sequence, page by page."""
    if length == 0:
        return cache.new_zeros((0,) + tuple(cache.shape[2:]))
    pages = [cache[int(table[t // page_size]), t % page_size] for t in range(length)]
    return torch.stack(pages)


def attention(sched, q, k_cache, v_cache, *, scale, causal, dtype=torch.float64, qp=None, kp=None):
    """out [queries, Hq, Dv] and lse [queries, Hq] in `dtype`. sched = (page_size, tables,
    lengths, sequence_ids, positions) as lists. With qp/kp (MLA) the scores add qp . kp."""
    page_size, tables, lengths, seq_ids, positions = sched
    Q, Hq, _ = q.shape
    Hkv, Dv = k_cache.shape[2], v_cache.shape[3]
    out = torch.zeros(Q, Hq, Dv, dtype=dtype)
    lse = torch.full((Q, Hq), float("-inf"), dtype=dtype)
    for r in range(Q):
        s = int(seq_ids[r])
        n = int(lengths[s])
        if causal:
            n = min(n, int(positions[r]) + 1)
        if n == 0:
            continue
        K = gather(k_cache, tables[s], n, page_size).to(dtype).repeat_interleave(Hq // Hkv, dim=1)  # [n, Hq, D]
        V = gather(v_cache, tables[s], n, page_size).to(dtype).repeat_interleave(Hq // Hkv, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[r].to(dtype), K)
        if qp is not None:
            KP = gather(kp, tables[s], n, page_size).to(dtype).expand(n, Hq, -1)
            scores = scores + torch.einsum("hd,nhd->hn", qp[r].to(dtype), KP)
        scores = scores * scale
        lse[r] = torch.logsumexp(scores, dim=-1)
        out[r] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), V)
    return out, lse


def mla(sched, q, qp, latent, kp, *, scale, causal, dtype=torch.float64):
    """MLA: the latent cache is both key and value."""
    return attention(sched, q, latent, latent, scale=scale, causal=causal, dtype=dtype, qp=qp, kp=kp)
