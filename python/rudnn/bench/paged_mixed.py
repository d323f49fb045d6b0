"""Benchmark family `paged_mixed`: one plan.attention call over a paged KV cache serving prefill
rows (many new query rows per sequence, causal by absolute position, after a history) and decode
rows (one row per sequence) together, as a serving step does; TFLOP/s against the bf16 matmul
rate of the same run.

Peer: rudnn's dense flash attention (varlen, causal bottom-right aligned, which is the same
visibility for query rows that are their sequences' last positions) over the same rows with the
pages gathered into dense K/V beforehand (the gather is not timed: the peer is the dense kernel
the paged one should match, issue 21). GQA 32/8, D = Dv = 128, pages of 16 slots shuffled over
the cache, bf16. FLOPs: 4·D per query head and visible key (QKᵀ and PV). The float64 reference
is computed on the first prefill and the first decode sequence's rows.
Shape label: prefill sequences × new rows × history × decode sequences × decode length × Hq ×
Hkv × D × page.
"""

from __future__ import annotations

import math

from . import CaseSpec, Prepared, compare, torch_dtype

FAMILY = "paged_mixed"
PEER = "rudnn dense flash attention (varlen) on gathered K/V"
BOUND = "compute"
TARGET = (0.0, 1.0)  # the paged prefill should match the dense flash kernel on the same rows

HQ, HKV, D, PAGE = 32, 8, 128, 16
# (prefill sequences, new rows each, history before them, decode sequences, decode length)
_GPU = [(4, 512, 1536, 60, 4096), (8, 2048, 0, 0, 1), (2, 1024, 7168, 128, 8192)]
_CPU = [(2, 24, 40, 3, 50), (1, 33, 0, 0, 1)]


def cases(device: str, quick: bool) -> list:
    sizes = (_GPU[:1] if quick else _GPU) if device == "cuda" else _CPU
    heads = (HQ, HKV, D, PAGE) if device == "cuda" else (8, 2, 32, 16)
    return [CaseSpec(FAMILY, "attention_mixed", s + heads, "bfloat16") for s in sizes]


def prepare(spec: CaseSpec, device: str) -> Prepared:
    import torch

    import rudnn

    n_pre, new, hist, n_dec, dec_len, hq, hkv, d, page = spec.shape
    dt = torch_dtype(spec.dtype)
    lengths = [hist + new] * n_pre + [dec_len] * n_dec
    rows_of = [new] * n_pre + [1] * n_dec
    per = [math.ceil(n / page) for n in lengths]
    pages = sum(per)
    g = torch.Generator().manual_seed(sum(lengths) * 7919 + pages)
    order = torch.randperm(pages, generator=g).tolist()
    width = max(per)
    tables, at = [], 0
    for p in per:  # unused entries name page 0 (valid, never read)
        tables.append(order[at:at + p] + [0] * (width - p))
        at += p
    seq_ids = [s for s, r in enumerate(rows_of) for _ in range(r)]
    positions = [lengths[s] - rows_of[s] + i for s, r in enumerate(rows_of) for i in range(r)]
    host = rudnn.paged.HostPlan(page, pages, tables, lengths, seq_ids, positions)
    Q = len(seq_ids)
    q = torch.randn(Q, hq, d, device=device).to(dt)
    k = torch.randn(pages, page, hkv, d, device=device).to(dt)
    v = torch.randn(pages, page, hkv, d, device=device).to(dt)
    plan = rudnn.paged.DevicePlan.upload(host, q)
    scale = d ** -0.5
    dev_tables = torch.tensor(tables, dtype=torch.long, device=device)

    def dense(cache, s):  # [lengths[s], Hkv, D]: sequence s's positions in order
        return cache[dev_tables[s, :per[s]]].reshape(-1, hkv, d)[:lengths[s]]

    kd = torch.cat([dense(k, s) for s in range(len(lengths))])
    vd = torch.cat([dense(v, s) for s in range(len(lengths))])
    cu_q = torch.tensor([0] + list(_cumsum(rows_of)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(_cumsum(lengths)), dtype=torch.int32, device=device)

    def run():
        return plan.attention(q, k, v, scale, True)

    def peer():
        return rudnn.attention(q, kd, vd, scale=scale, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)

    def check():
        out, p = run(), peer()
        sample = [0] + ([n_pre] if n_dec else [])  # the first sequence of each kind
        errs = []
        for s in sample:
            r0, r1 = int(cu_q[s]), int(cu_q[s + 1])
            ref = _causal_reference(q[r0:r1], dense(k, s), dense(v, s), scale, lengths[s])
            errs.append(compare(f"out (sequence {s})", out[r0:r1], ref, p[r0:r1], expect_dtype=dt))
        return errs

    flops = sum(4 * d * hq * (pos + 1) for pos in positions)
    return Prepared(run=run, peer=peer, check=check, flops=flops, algorithm=rudnn.paged.last_algorithm)


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def _causal_reference(q, k, v, scale, length):
    """float64 [rows, Hq, D] for query rows that are the last len(q) positions of `length`."""
    import torch

    rows, hq = q.shape[0], q.shape[1]
    rep = hq // k.shape[1]
    kk, vv = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = torch.einsum("rhd,nhd->rhn", q.double(), kk) * scale
    pos = torch.arange(length - rows, length, device=q.device)[:, None, None]
    s = s.masked_fill(torch.arange(length, device=q.device)[None, None, :] > pos, float("-inf"))
    return torch.einsum("rhn,nhd->rhd", s.softmax(-1), vv)
