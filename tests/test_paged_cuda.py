"""What only the CUDA backend of rudnn.paged has (test_paged.py runs the shared cases on both
devices): the default path's split choice from the history length and SM count (its workspace
allocated by torch), corrupted device tables that must stay inside the caches (bench/gpu_check.sh
runs this file under compute-sanitizer too), a CUDA graph captured over plan.attention replayed
with a new schedule uploaded in place, the torch wrapper on CUDA. Skipped without a GPU."""

import pytest
import torch

import rudnn
import rudnn.torch.paged  # noqa: F401  (rudnn.torch.paged.attention)
from rudnn.paged import DevicePlan, HostPlan, SplitWorkspace
from reference import paged as ref
from test_paged import plan_of, ref_sched, schedule
from util import assert_close_to_oracle, rand

pytestmark = pytest.mark.cuda


def operands(sched, Hq, Hkv, D, Dv, dtype, seed=0):
    page_size, pages = sched[0], sched[1]
    Q = len(sched[4])
    q = rand((Q, Hq, D), dtype, seed=seed)
    k = rand((pages, page_size, Hkv, D), dtype, seed=seed + 1)
    v = rand((pages, page_size, Hkv, Dv), dtype, seed=seed + 2)
    return q, k, v


@pytest.mark.parametrize("lengths,nq,expected", [
    pytest.param([8192], [1], "cuda_decode_split", id="one-long-row-splits"),
    pytest.param([3000, 700], [1, 1], "cuda_decode_split", id="two-rows-split"),
    pytest.param([300] * 64, [1] * 64, "cuda_decode", id="many-short-rows-no-split"),
])
def test_default_path_picks_splits(lengths, nq, expected):
    sched = schedule(lengths, nq, 16, seed=5)
    q, k, v = operands(sched, 32, 8, 128, 128, torch.bfloat16)
    plan = plan_of(sched, q.cuda())
    out, lse = plan.attention(q.cuda(), k.cuda(), v.cuda(), causal=True, return_lse=True)
    assert rudnn.paged.last_algorithm() == expected
    o64, l64 = ref.attention(ref_sched(sched), q, k, v, scale=128 ** -0.5, causal=True)
    o_same, l_same = ref.attention(ref_sched(sched), q, k, v, scale=128 ** -0.5, causal=True, dtype=torch.bfloat16)
    assert_close_to_oracle(out.cpu(), o_same, o64, "out")
    assert_close_to_oracle(lse.cpu(), l_same.float(), l64, "lse", dtype=torch.float32)


def test_explicit_workspace_still_decides():
    sched = schedule([5000], [1], 16, seed=6)
    q, k, v = (t.cuda() for t in operands(sched, 8, 2, 64, 64, torch.float32))
    plan = plan_of(sched, q)
    ws = SplitWorkspace(q, 1, 8, 64, 3)
    a = plan.attention(q, k, v, workspace=ws)
    assert rudnn.paged.last_algorithm() == "cuda_decode_split"
    b = rudnn.torch.paged.attention(plan, q, k, v)  # the torch op: splits=1 unless asked
    assert rudnn.paged.last_algorithm() == "cuda_decode"
    torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


def test_corrupted_device_tables_stay_inside_the_caches():
    """Device metadata is not checked on the host (that would synchronize): page ids out of
    range are skipped, a sequence id out of range gives a row without keys (out 0, lse -inf)."""
    sched = schedule([40, 40, 9], [1, 1, 1], 16, seed=7)
    q, k, v = (t.cuda() for t in operands(sched, 4, 2, 32, 32, torch.float32))
    plan = plan_of(sched, q)
    good, good_lse = plan.attention(q, k, v, return_lse=True)
    tables, _, seq_ids, _ = plan._buffers
    row_of_seq0 = [r for r, s in enumerate(sched[4]) if s == 0]
    row_of_seq2 = [r for r, s in enumerate(sched[4]) if s == 2]
    tables[0] = torch.tensor([-7, sched[1], 2 ** 31 - 1], dtype=torch.int32, device="cuda")
    seq_ids[row_of_seq2[0]] = 1000
    out, lse = plan.attention(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    lost = row_of_seq0 + row_of_seq2
    kept = [r for r in range(len(sched[4])) if r not in lost]
    assert torch.equal(out[lost], torch.zeros_like(out[lost]))
    assert torch.isneginf(lse[lost]).all()
    torch.testing.assert_close(out[kept], good[kept], rtol=0, atol=0)
    torch.testing.assert_close(lse[kept], good_lse[kept], rtol=0, atol=0)


def test_cuda_graph_replays_a_schedule_uploaded_in_place():
    Hq, Hkv, D = 8, 2, 64
    k = rand((40, 16, Hkv, D), torch.bfloat16, seed=1).cuda()
    v = rand((40, 16, Hkv, D), torch.bfloat16, seed=2).cuda()
    q = rand((4, Hq, D), torch.bfloat16, seed=3).cuda()
    plan = DevicePlan.reserve(q, max_queries=4, max_seqs=4, max_pages=10)
    hosts = []
    for seed, lengths in [(1, [40, 7, 90, 3]), (2, [150, 1, 16, 33])]:
        page_size, _, tables, lengths, seq_ids, positions = schedule(lengths, [1] * 4, 16, seed=seed, spare_pages=0)
        hosts.append(HostPlan(page_size, 40, tables, lengths, seq_ids, positions))
    DevicePlan.upload(hosts[0], q, into=plan)
    ws = SplitWorkspace(q, 4, Hq, D, 4)  # a workspace serves one stream: the eager calls'
    plan.attention(q, k, v, causal=True, workspace=ws)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_ws = SplitWorkspace(q, 4, Hq, D, 4)  # the capture stream's, from the graph's pool
        out = plan.attention(q, k, v, causal=True, workspace=graph_ws)
    for host in hosts:
        DevicePlan.upload(host, q, into=plan)
        graph.replay()
        eager = DevicePlan.upload(host, q).attention(q, k, v, causal=True, workspace=ws)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager, rtol=0, atol=0)


def test_append_on_cuda_equals_the_cpu():
    sched = schedule([17, 33, 1], [1, 2, 1], 16, seed=8)
    pages = sched[1]
    k_new, v_new = rand((4, 2, 64), torch.bfloat16, seed=1), rand((4, 2, 24), torch.bfloat16, seed=2)
    caches = [rand((pages, 16, 2, 64), torch.bfloat16, seed=3), rand((pages, 16, 2, 24), torch.bfloat16, seed=4)]
    on_gpu = [c.cuda() for c in caches]
    plan_of(sched, k_new).append(k_new, v_new, *caches)
    plan_of(sched, k_new.cuda()).append(k_new.cuda(), v_new.cuda(), *on_gpu)
    assert rudnn.paged.last_algorithm() == "cuda_append"
    for cpu, gpu in zip(caches, on_gpu):
        assert torch.equal(cpu, gpu.cpu())
