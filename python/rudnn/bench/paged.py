"""Benchmark family `paged`: decode over a paged KV cache (rudnn.paged's plan.attention and
plan.mla), in GB/s against the device-copy ceiling of the same run.

attention_decode: one query row per sequence at its last position, Hq = 32 query heads over
Hkv = 8 KV heads, D = Dv = 128, pages of 16 slots shuffled over the cache, bf16; batch
{1, 16, 64, 256} x KV length {1k, 8k, 64k} (256 x 64k is left out: its caches and the peer's
gathered copy do not fit together). The peer is torch: gather the pages into dense K/V, then
scaled_dot_product_attention (the gather is part of the peer's time: that is what a framework
without a paged kernel pays). attention_decode_flashinfer: the same cases against FlashInfer's
BatchDecodeWithPagedKVCacheWrapper when its wheel imports and runs here; otherwise the peer's
column carries its failure ("absent"), never a made-up number.
mla_decode: DeepSeek's shapes (H = 128, R = 512, P = 64, pages of 64), bf16, against torch
gather + SDPA over [latent | kp].

Bytes: the least any kernel must move: every row's history read once (K and V per KV head;
MLA: the latent and kp once), q read and out written once. The float64 reference gathers the
pages on the device, a few rows at a time.
"""

from __future__ import annotations

import math

from . import CaseSpec, Prepared, compare, torch_dtype

FAMILY = "paged"
PEER = "torch gather + SDPA (FlashInfer for the *_flashinfer op)"
BOUND = "memory"
TARGET = (0.85, 1.0)  # SPEC: decode >= 85% of copy bandwidth and >= FlashInfer

HQ, HKV, D, PAGE = 32, 8, 128, 16
MLA_H, MLA_R, MLA_P, MLA_PAGE = 128, 512, 64, 64

_GPU_QUICK = {"attention_decode": [(1, 8192), (64, 8192)], "attention_decode_flashinfer": [(64, 8192)],
              "mla_decode": [(64, 4096)]}
_GPU_MORE = {"attention_decode": [(b, n) for b in (1, 16, 64, 256) for n in (1024, 8192, 65536)
                                  if (b, n) not in ((1, 8192), (64, 8192), (256, 65536))],
             "attention_decode_flashinfer": [(b, n) for b in (1, 16, 64, 256) for n in (1024, 8192, 65536)
                                             if (b, n) not in ((64, 8192), (256, 65536))],
             "mla_decode": [(1, 4096), (1, 32768), (64, 32768)]}
_CPU = {"attention_decode": [(2, 64)], "attention_decode_flashinfer": [], "mla_decode": [(2, 40)]}


def cases(device: str, quick: bool) -> list:
    table = dict(_GPU_QUICK) if device == "cuda" else dict(_CPU)
    if device == "cuda" and not quick:
        table = {op: table[op] + _GPU_MORE[op] for op in table}
    out = []
    for op, sizes in table.items():
        for b, n in sizes:
            if op == "mla_decode":
                heads = (MLA_H, MLA_R, MLA_P, MLA_PAGE) if device == "cuda" else (8, 32, 8, 16)
            else:
                heads = (HQ, HKV, D, PAGE) if device == "cuda" else (8, 2, 32, 16)
            out.append(CaseSpec(FAMILY, op, (b, n) + heads, "bfloat16"))
    return out


def prepare(spec: CaseSpec, device: str) -> Prepared:
    return _mla(spec, device) if spec.op == "mla_decode" else _attention(spec, device)


# ---------------------------------------------------------------------------------------------


class _Schedule:
    """B sequences of n positions each, one decode row per sequence at position n - 1, their
    pages a random permutation of the cache's."""

    def __init__(self, B, n, page, device, torch):
        import rudnn

        per = math.ceil(n / page)
        self.pages = B * per
        g = torch.Generator().manual_seed(B * 7919 + n)
        self.tables = torch.randperm(self.pages, generator=g).reshape(B, per).to(torch.int32)
        self.host = rudnn.paged.HostPlan(page, self.pages, self.tables, [n] * B, list(range(B)), [n - 1] * B)
        self.B, self.n, self.page = B, n, page
        self.dev_tables = self.tables.to(device=device, dtype=torch.long)

    def gather(self, cache, rows):
        """[len(rows), n, H, X]: the pages of sequences `rows` in position order (a copy)."""
        t = self.dev_tables[rows]  # [r, pages]
        g = cache[t]  # [r, pages, page, H, X]
        return g.reshape(len(rows), -1, *cache.shape[2:])[:, :self.n]


def _reference(q, keys, values, scale, rows_at_once=4):
    """float64 out [B, H, Dv] from gathered keys / values (callables of a row list)."""
    import torch

    B, H = q.shape[0], q.shape[1]
    outs = []
    for r0 in range(0, B, rows_at_once):
        rows = list(range(r0, min(B, r0 + rows_at_once)))
        k, v = keys(rows).double(), values(rows).double()  # [r, n, Hk, X]
        rep = H // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        s = torch.einsum("rhd,rnhd->rhn", q[rows].double(), k) * scale
        outs.append(torch.einsum("rhn,rnhd->rhd", s.softmax(-1), v))
    return torch.cat(outs)


def _attention(spec, device):
    import torch
    import torch.nn.functional as F

    import rudnn

    B, n, hq, hkv, d, page = spec.shape
    dt = torch_dtype(spec.dtype)
    sch = _Schedule(B, n, page, device, torch)
    q = torch.randn(B, hq, d, device=device).to(dt)
    k = torch.randn(sch.pages, page, hkv, d, device=device).to(dt)
    v = torch.randn(sch.pages, page, hkv, d, device=device).to(dt)
    plan = rudnn.paged.DevicePlan.upload(sch.host, q)
    scale = d ** -0.5
    run = lambda: plan.attention(q, k, v, scale)
    all_rows = list(range(B))

    def torch_peer():
        kk = sch.gather(k, all_rows).transpose(1, 2)  # [B, Hkv, n, D]
        vv = sch.gather(v, all_rows).transpose(1, 2)
        return F.scaled_dot_product_attention(q[:, :, None], kk, vv, scale=scale, enable_gqa=True)[:, :, 0]

    peer = torch_peer if spec.op == "attention_decode" else _flashinfer_peer(sch, q, k, v, scale, device)

    def check():
        out = run()
        ref = _reference(q, lambda r: sch.gather(k, r), lambda r: sch.gather(v, r), scale)
        p = _try(peer)
        return [compare("out", out, ref, p, expect_dtype=dt)]

    nbytes = B * n * hkv * 2 * d * q.element_size() + 2 * q.numel() * q.element_size()
    return Prepared(run=run, peer=peer, check=check, bytes=nbytes, algorithm=rudnn.paged.last_algorithm)


def _flashinfer_peer(sch, q, k, v, scale, device):
    """FlashInfer's paged decode (NHD layout: [pages, page, Hkv, D] is rudnn's), built on first use."""
    cell = []

    def peer():
        if not cell:
            import torch

            try:
                import flashinfer
            except Exception as e:  # the wheel is optional: report it absent
                raise RuntimeError(f"absent (flashinfer does not import: {type(e).__name__})") from None
            ws = torch.empty(128 << 20, dtype=torch.uint8, device=device)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
            per = sch.tables.shape[1]
            indptr = torch.arange(0, sch.B * per + 1, per, dtype=torch.int32, device=device)
            indices = sch.tables.reshape(-1).to(device=device, dtype=torch.int32)
            last = torch.full((sch.B,), (sch.n - 1) % sch.page + 1, dtype=torch.int32, device=device)
            w.plan(indptr, indices, last, q.shape[1], k.shape[2], q.shape[2], sch.page, sm_scale=scale,
                   q_data_type=q.dtype, kv_data_type=k.dtype)
            cell.append(lambda: w.run(q, (k, v)))
        return cell[0]()

    return peer


def _mla(spec, device):
    import torch
    import torch.nn.functional as F

    import rudnn

    B, n, H, R, P, page = spec.shape
    dt = torch_dtype(spec.dtype)
    sch = _Schedule(B, n, page, device, torch)
    q = torch.randn(B, H, R, device=device).to(dt)
    qp = torch.randn(B, H, P, device=device).to(dt)
    latent = torch.randn(sch.pages, page, 1, R, device=device).to(dt)
    kp = torch.randn(sch.pages, page, 1, P, device=device).to(dt)
    plan = rudnn.paged.DevicePlan.upload(sch.host, q)
    scale = (128 + 64) ** -0.5  # DeepSeek's QK head dim before absorption
    run = lambda: plan.mla(q, qp, latent, kp, scale)
    all_rows = list(range(B))
    q_cat = torch.cat([q, qp], -1)

    def peer():
        lat = sch.gather(latent, all_rows).transpose(1, 2)  # [B, 1, n, R]
        key = torch.cat([lat, sch.gather(kp, all_rows).transpose(1, 2)], -1)
        return F.scaled_dot_product_attention(q_cat[:, :, None], key.expand(-1, H, -1, -1),
                                              lat.expand(-1, H, -1, -1), scale=scale)[:, :, 0]

    def check():
        out = run()
        keys = lambda r: torch.cat([sch.gather(latent, r), sch.gather(kp, r)], -1)
        ref = _reference(q_cat, keys, lambda r: sch.gather(latent, r), scale)
        return [compare("out", out, ref, _try(peer), expect_dtype=dt)]

    nbytes = B * n * (R + P) * q.element_size() + (q.numel() * 2 + qp.numel()) * q.element_size()
    return Prepared(run=run, peer=peer, check=check, bytes=nbytes, algorithm=rudnn.paged.last_algorithm)


def _try(fn):
    try:
        return fn()
    except Exception:  # the peer is optional for the check
        return None
