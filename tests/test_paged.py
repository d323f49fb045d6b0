"""rudnn.paged (HostPlan, DevicePlan, attention, mla, append, SplitWorkspace) on the CPU against
the float64 reference of tests/reference/paged.py (pages gathered into dense K/V per sequence),
with the FlashAttention error budget: at most twice the error of the same computation in the
input dtype."""

import math

import numpy as np
import pytest
import torch

import rudnn
from rudnn.paged import DevicePlan, HostPlan, SplitWorkspace
from reference import paged as ref
from util import DEVICES, DTYPES, assert_close_to_oracle, rand


def schedule(lengths, queries_per_seq, page_size, *, seed=0, spare_pages=3, shared_prefix=False, mode="tail"):
    """(page_size, pages, tables, lengths, sequence_ids, positions) with pages drawn at random
    from a shuffled pool. queries_per_seq[s] query rows per sequence at its last positions
    (mode "tail": decode is 1 row at the end, prefill the whole sequence) or at random distinct
    positions (mode "random"). shared_prefix: every sequence's first page is page 0's table entry
    of sequence 0 (a common prefix page)."""
    g = np.random.default_rng(seed)
    need = [math.ceil(n / page_size) for n in lengths]
    pages = sum(need) + spare_pages
    pool = list(g.permutation(pages))
    tables = [[int(pool.pop()) for _ in range(k)] for k in need]
    if shared_prefix:
        first = next(t[0] for t in tables if t)
        for t in tables:
            if t:
                t[0] = first
    seq_ids, positions = [], []
    for s, (n, nq) in enumerate(zip(lengths, queries_per_seq)):
        assert nq <= n
        pos = list(range(n - nq, n)) if mode == "tail" else sorted(g.choice(n, nq, replace=False).tolist())
        seq_ids += [s] * nq
        positions += pos
    order = g.permutation(len(seq_ids))  # rows of different sequences interleaved
    seq_ids = [seq_ids[i] for i in order]
    positions = [positions[i] for i in order]
    return page_size, pages, tables, list(lengths), seq_ids, positions


def plan_of(sched, q):
    page_size, pages, tables, lengths, seq_ids, positions = sched
    return DevicePlan.upload(HostPlan(page_size, pages, tables, lengths, seq_ids, positions), q)


def ref_sched(sched):
    page_size, _, tables, lengths, seq_ids, positions = sched
    return page_size, tables, lengths, seq_ids, positions


def check_attention(sched, Hq, Hkv, D, Dv, dtype, causal, seed=0, scale=None, workspace=None, device="cpu"):
    """plan.attention on `device` (inputs made on the CPU and moved there) against the oracle."""
    page_size, pages = sched[0], sched[1]
    Q = len(sched[4])
    q = rand((Q, Hq, D), dtype, seed=seed)
    k = rand((pages, page_size, Hkv, D), dtype, seed=seed + 1)
    v = rand((pages, page_size, Hkv, Dv), dtype, seed=seed + 2)
    plan = plan_of(sched, q.to(device))
    s = D ** -0.5 if scale is None else scale
    out, lse = plan.attention(q.to(device), k.to(device), v.to(device), scale, causal, return_lse=True,
                              workspace=workspace)
    assert out.device.type == device
    out, lse = out.cpu(), lse.cpu()
    assert out.dtype == dtype and tuple(out.shape) == (Q, Hq, Dv)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (Q, Hq)
    o64, l64 = ref.attention(ref_sched(sched), q, k, v, scale=s, causal=causal)
    o_same, l_same = ref.attention(ref_sched(sched), q, k, v, scale=s, causal=causal, dtype=dtype)
    assert_close_to_oracle(out, o_same, o64, "out")
    assert_close_to_oracle(lse, l_same.float(), l64, "lse", dtype=torch.float32)
    return out, lse


CASES = [  # (page_size, lengths, queries per sequence, Hq, Hkv)
    pytest.param(16, [37, 5, 64, 1], [1, 1, 1, 1], 8, 2, id="decode-ps16-gqa4"),
    pytest.param(1, [7, 3, 12], [1, 1, 1], 4, 4, id="decode-ps1-mha"),
    pytest.param(64, [150, 64, 9], [1, 1, 1], 8, 1, id="decode-ps64-mqa8"),
    pytest.param(16, [20, 33], [20, 33], 8, 1, id="prefill-ps16-gqa8"),
    pytest.param(1, [6, 4], [6, 4], 4, 1, id="prefill-ps1-gqa4"),
    pytest.param(64, [70, 3], [70, 3], 2, 2, id="prefill-ps64-mha"),
    pytest.param(16, [40, 17, 3, 70], [1, 17, 3, 1], 8, 2, id="mixed-ps16-gqa4"),
    pytest.param(64, [130, 65, 2], [4, 65, 1], 8, 8, id="mixed-ps64-mha"),
    pytest.param(1, [9, 2, 5], [1, 2, 3], 8, 1, id="mixed-ps1-gqa8"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page_size,lengths,nq,Hq,Hkv", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_attention(page_size, lengths, nq, Hq, Hkv, causal, dtype, device):
    sched = schedule(lengths, nq, page_size, seed=len(lengths))
    check_attention(sched, Hq, Hkv, 32, 32, dtype, causal, device=device)


@pytest.mark.parametrize("D,Dv", [(64, 128), (96, 16), (1, 1), (1, 7), (1024, 1024), (13, 1024)])
@pytest.mark.parametrize("device", DEVICES)
def test_head_dims(D, Dv, device):
    sched = schedule([19, 4], [3, 1], 16, seed=3, mode="random")
    check_attention(sched, 4, 2, D, Dv, torch.float32, True, device=device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_positions_causal(dtype):
    """Query rows at arbitrary positions of their sequence (not only the tail)."""
    sched = schedule([50, 33, 8], [6, 4, 2], 16, seed=5, mode="random")
    check_attention(sched, 8, 2, 40, 24, dtype, True)


def test_empty_sequences_and_no_queries():
    # A sequence of length 0 with no pages and no queries, and one with history but no queries.
    sched = schedule([0, 12, 0, 30], [0, 2, 0, 0], 16, seed=7)
    check_attention(sched, 4, 2, 16, 16, torch.float32, True)
    # No query rows at all: an empty output.
    sched = schedule([5, 9], [0, 0], 4, seed=8)
    out = check_attention(sched, 4, 2, 16, 8, torch.float32, False)[0]
    assert tuple(out.shape) == (0, 4, 8)
    # No sequences at all.
    q = torch.zeros(0, 4, 8)
    plan = DevicePlan.upload(HostPlan(4, 0, [], [], [], []), q)
    out = plan.attention(q, torch.zeros(0, 4, 2, 8), torch.zeros(0, 4, 2, 8))
    assert tuple(out.shape) == (0, 4, 8)


@pytest.mark.parametrize("causal", [True, False])
def test_shared_prefix_page(causal):
    sched = schedule([40, 20, 16, 33], [1, 20, 2, 1], 16, seed=9, shared_prefix=True)
    first = [t[0] for t in sched[2]]
    assert len(set(first)) == 1
    check_attention(sched, 8, 2, 32, 32, torch.bfloat16, causal)


def test_block_table_with_padding():
    """A 2-D vLLM block table: entries past a sequence's pages may hold anything."""
    page_size, pages, tables, lengths, seq_ids, positions = schedule([33, 5, 16], [2, 1, 16], 16, seed=10)
    width = 5
    block = np.full((3, width), 10**9, dtype=np.int64)
    block[1, -1] = -7
    for s, t in enumerate(tables):
        block[s, :len(t)] = t
    q = rand((len(seq_ids), 4, 16), torch.float32, seed=1)
    k = rand((pages, page_size, 2, 16), torch.float32, seed=2)
    v = rand((pages, page_size, 2, 8), torch.float32, seed=3)
    for tab in (block, torch.from_numpy(block), block.astype(np.int32), tables, [np.array(t) for t in tables]):
        plan = DevicePlan.upload(HostPlan(page_size, pages, tab, lengths, seq_ids, positions), q)
        out = plan.attention(q, k, v, 0.3, True)
        o64, _ = ref.attention((page_size, tables, lengths, seq_ids, positions), q, k, v, scale=0.3, causal=True)
        assert_close_to_oracle(out, ref.attention((page_size, tables, lengths, seq_ids, positions), q, k, v,
                                                  scale=0.3, causal=True, dtype=torch.float32)[0], o64)
    # the packed tables hold 0 past each sequence's pages (never an id outside the caches)
    assert plan.tables.shape == (3, 3) and int(plan.tables[1, 1]) == 0


def test_metadata_arrays_and_numpy():
    """Metadata from NumPy / torch arrays of any integer dtype; NumPy q gives NumPy out."""
    page_size, pages, tables, lengths, seq_ids, positions = schedule([21, 8], [2, 1], 4, seed=11)
    q = rand((3, 4, 8), torch.float32, seed=1)
    k = rand((pages, page_size, 1, 8), torch.float32, seed=2)
    v = rand((pages, page_size, 1, 8), torch.float32, seed=3)
    want = plan_of((page_size, pages, tables, lengths, seq_ids, positions), q).attention(q, k, v)
    host = HostPlan(page_size, pages, [np.array(t, dtype=np.uint8) for t in tables],
                    torch.tensor(lengths, dtype=torch.int32), np.array(seq_ids, dtype=np.uint32),
                    np.array(positions, dtype=np.int16))
    plan = DevicePlan.upload(host, q.numpy())
    got = plan.attention(q.numpy(), k.numpy(), v.numpy())
    assert isinstance(got, np.ndarray) and isinstance(plan.tables, np.ndarray)
    assert plan.tables.dtype == np.int32
    np.testing.assert_array_equal(got, want.numpy())


def test_out_argument_and_strided_q():
    page_size, pages, tables, lengths, seq_ids, positions = schedule([21, 8], [2, 1], 4, seed=12)
    base = rand((4, 3, 8), torch.float16, seed=1)  # [Hq, queries, D] memory, q a transposed view
    q = base.transpose(0, 1)
    k = rand((pages, page_size, 2, 8), torch.float16, seed=2)
    v = rand((pages, page_size, 2, 8), torch.float16, seed=3)
    plan = plan_of((page_size, pages, tables, lengths, seq_ids, positions), q)
    out = torch.empty(3, 4, 8, dtype=torch.float16)
    got = plan.attention(q, k, v, out=out)
    assert got is out
    torch.testing.assert_close(out, plan.attention(q.contiguous(), k, v), rtol=0, atol=0)


@pytest.mark.parametrize("splits", [2, 3, 7, 16, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_split_kv_equals_unsplit(splits, dtype, device):
    sched = schedule([300, 5, 64, 1], [1, 5, 2, 1], 16, seed=13)
    Q = len(sched[4])
    ws = SplitWorkspace(torch.zeros(1, device=device), Q, 8, 24, splits)
    assert ws.nbytes == splits * Q * 8 * (24 + 1) * 4
    out, lse = check_attention(sched, 8, 2, 32, 24, dtype, True, workspace=ws, device=device)
    assert rudnn.paged.last_algorithm() == ("cpu" if device == "cpu" else "cuda_decode_split")
    plain, plain_lse = check_attention(sched, 8, 2, 32, 24, dtype, True, device=device)
    # the same math merged by log-sum-exp: equal to rounding
    tol = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.float(), plain.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(lse, plain_lse, rtol=2e-6, atol=2e-6)


def test_split_workspace_reused():
    sched = schedule([100, 30], [1, 1], 16, seed=14)
    q = rand((2, 4, 16), torch.float32, seed=1)
    ws = SplitWorkspace(q, 2, 4, 16, 4)
    plan = plan_of(sched, q)
    k = rand((sched[1], 16, 1, 16), torch.float32, seed=2)
    a = plan.attention(q, k, k, workspace=ws)
    b = plan.attention(q, k, k, workspace=ws)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def mla_case(lengths, nq, page_size, H, R, P, dtype, seed, mode="tail"):
    sched = schedule(lengths, nq, page_size, seed=seed, mode=mode)
    pages = sched[1]
    Q = len(sched[4])
    q = rand((Q, H, R), dtype, seed=seed)
    qp = rand((Q, H, P), dtype, seed=seed + 1)
    latent = rand((pages, page_size, 1, R), dtype, seed=seed + 2)
    kp = rand((pages, page_size, 1, P), dtype, seed=seed + 3)
    return sched, q, qp, latent, kp


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H,R,P,page_size,lengths,nq", [
    pytest.param(16, 512, 64, 64, [130, 7], [1, 1], id="deepseek-decode"),
    pytest.param(4, 64, 16, 16, [40, 9, 18], [3, 9, 1], id="mixed"),
    pytest.param(2, 1024, 256, 1, [5, 3], [2, 3], id="R1024-P256"),
    pytest.param(3, 8, 1, 16, [20], [4], id="P1"),
])
@pytest.mark.parametrize("device", DEVICES)
def test_mla(H, R, P, page_size, lengths, nq, causal, dtype, device):
    sched, q, qp, latent, kp = mla_case(lengths, nq, page_size, H, R, P, dtype, seed=R + P)
    scale = (128 + 64) ** -0.5
    plan = plan_of(sched, q.to(device))
    on = [t.to(device) for t in (q, qp, latent, kp)]
    out, lse = (t.cpu() for t in plan.mla(*on, scale, causal, return_lse=True))
    assert out.dtype == dtype and tuple(out.shape) == tuple(q.shape)
    o64, l64 = ref.mla(ref_sched(sched), q, qp, latent, kp, scale=scale, causal=causal)
    o_same, l_same = ref.mla(ref_sched(sched), q, qp, latent, kp, scale=scale, causal=causal, dtype=dtype)
    assert_close_to_oracle(out, o_same, o64, "out")
    assert_close_to_oracle(lse, l_same.float(), l64, "lse", dtype=torch.float32)


@pytest.mark.parametrize("splits", [2, 5, 32])
@pytest.mark.parametrize("device", DEVICES)
def test_mla_split_kv(splits, device):
    sched, q, qp, latent, kp = mla_case([200, 3], [1, 2], 64, 8, 64, 16, torch.float32, seed=21)
    q, qp, latent, kp = (t.to(device) for t in (q, qp, latent, kp))
    plan = plan_of(sched, q)
    ws = SplitWorkspace(q, q.shape[0], 8, 64, splits)
    a = plan.mla(q, qp, latent, kp, 0.1, True, workspace=ws)
    b = plan.mla(q, qp, latent, kp, 0.1, True)
    torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("device", DEVICES)
def test_append_then_attend(page_size, dtype, device):
    """History written into pages, new rows appended through the plan, then attention equals
    attention over the concatenated dense history."""
    g = np.random.default_rng(page_size)
    hist = [25, 0, 70]
    new = [1, 4, 3]  # decode, a small prefill into an empty sequence, a chunk
    lengths = [h + n for h, n in zip(hist, new)]
    sched = schedule(lengths, new, page_size, seed=page_size)
    page_size, pages, tables, lengths, seq_ids, positions = sched
    Hkv, Hq, D, Dv = 2, 8, 16, 8
    k_cache = torch.zeros(pages, page_size, Hkv, D, dtype=dtype)
    v_cache = torch.zeros(pages, page_size, Hkv, Dv, dtype=dtype)
    dense_k = [rand((n, Hkv, D), dtype, seed=10 + s) for s, n in enumerate(lengths)]
    dense_v = [rand((n, Hkv, Dv), dtype, seed=20 + s) for s, n in enumerate(lengths)]
    for s, h in enumerate(hist):  # the history, written page by page
        for t in range(h):
            k_cache[tables[s][t // page_size], t % page_size] = dense_k[s][t]
            v_cache[tables[s][t // page_size], t % page_size] = dense_v[s][t]
    k_new = torch.stack([dense_k[s][t] for s, t in zip(seq_ids, positions)])
    v_new = torch.stack([dense_v[s][t] for s, t in zip(seq_ids, positions)])
    q = rand((len(seq_ids), Hq, D), dtype, seed=int(g.integers(1000)))
    plan = plan_of(sched, q.to(device))
    on_k, on_v = k_cache.to(device), v_cache.to(device)
    kc, vc = plan.append(k_new.to(device), v_new.to(device), on_k, on_v)
    assert kc is on_k and vc is on_v
    out = plan.attention(q.to(device), on_k, on_v, 0.25, True).cpu()
    k_cache, v_cache = on_k.cpu(), on_v.cpu()
    # the oracle over the dense histories (no pages)
    o64 = torch.zeros(len(seq_ids), Hq, Dv, dtype=torch.float64)
    for r, (s, t) in enumerate(zip(seq_ids, positions)):
        K = dense_k[s][:t + 1].double().repeat_interleave(Hq // Hkv, 1)
        V = dense_v[s][:t + 1].double().repeat_interleave(Hq // Hkv, 1)
        p = torch.softmax(0.25 * torch.einsum("hd,nhd->hn", q[r].double(), K), -1)
        o64[r] = torch.einsum("hn,nhd->hd", p, V)
    same = ref.attention(ref_sched(sched), q, k_cache, v_cache, scale=0.25, causal=True, dtype=dtype)[0]
    assert_close_to_oracle(out, same, o64)


def test_append_mla_caches():
    """MLA appends the latent rows as k and the rotary rows as v (one head)."""
    sched = schedule([3, 6], [1, 2], 4, seed=30)
    pages = sched[1]
    latent = torch.zeros(pages, 4, 1, 32)
    kp = torch.zeros(pages, 4, 1, 8)
    rows_l, rows_p = rand((3, 1, 32), torch.float32, seed=1), rand((3, 1, 8), torch.float32, seed=2)
    plan = plan_of(sched, rows_l)
    plan.append(rows_l, rows_p, latent, kp)
    _, _, tables, _, seq_ids, positions = sched
    for r, (s, t) in enumerate(zip(seq_ids, positions)):
        torch.testing.assert_close(latent[tables[s][t // 4], t % 4], rows_l[r], rtol=0, atol=0)
        torch.testing.assert_close(kp[tables[s][t // 4], t % 4], rows_p[r], rtol=0, atol=0)
    assert int((latent != 0).any(-1).sum()) == 3


def test_reserve_and_upload_into():
    """upload(..., into=plan) rewrites the reserved buffers in place: same memory, new schedule,
    results equal those of a fresh plan."""
    q0 = torch.zeros(1)
    plan = DevicePlan.reserve(q0, max_queries=8, max_seqs=4, max_pages=6)
    ptrs = [b.data_ptr() for b in plan._buffers]
    Hq, Hkv, D = 4, 2, 16
    k = rand((30, 16, Hkv, D), torch.float32, seed=1)
    v = rand((30, 16, Hkv, D), torch.float32, seed=2)
    for seed, lengths, nq in [(1, [40, 7, 90], [1, 1, 1]), (2, [3, 95, 16, 20], [2, 1, 3, 2]), (3, [1], [1])]:
        page_size, pages, tables, lengths, seq_ids, positions = schedule(lengths, nq, 16, seed=seed, spare_pages=0)
        pages = 30
        host = HostPlan(page_size, pages, tables, lengths, seq_ids, positions)
        q = rand((len(seq_ids), Hq, D), torch.float32, seed=seed)
        same = DevicePlan.upload(host, q, into=plan)
        assert same is plan and [b.data_ptr() for b in plan._buffers] == ptrs
        assert plan.tables.data_ptr() == ptrs[0] and tuple(plan.tables.shape) == (len(lengths), 6)
        got = plan.attention(q, k, v, causal=True)
        want = DevicePlan.upload(host, q).attention(q, k, v, causal=True)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_host_plan_info():
    host = HostPlan(16, 10, [[3, 4], [5], []], [17, 16, 0], [0, 1, 0], [16, 15, 3])
    assert (host.num_seqs, host.queries, host.max_pages, host.max_length) == (3, 3, 2, 17)
    assert host.duplicate_rows is None
    dup = HostPlan(4, 4, [[0, 1], [0]], [6, 4], [0, 1], [2, 2])  # shared page 0, both write slot 2
    assert dup.duplicate_rows == (0, 1)
    assert rudnn.paged.DevicePlan.upload(dup, torch.zeros(1)).host is dup
