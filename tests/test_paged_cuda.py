"""What only the CUDA backend of rudnn.paged has (test_paged.py runs the shared cases on both
devices): the default path's split choice from the history length and SM count (its workspace
allocated by torch), corrupted device tables that must stay inside the caches (bench/gpu_check.sh
runs this file under compute-sanitizer too), a CUDA graph captured over plan.attention replayed
with a new schedule uploaded in place, the torch wrapper on CUDA, the tensor-core prefill
kernel (prefill_cuda.cu) beside the decode kernel in prefill-only and mixed batches, and the
tensor-core MLA decode kernel (mla_decode_cuda.cu) at DeepSeek's shapes. Skipped without a GPU."""

import pytest
import torch

import rudnn
import rudnn.torch.paged  # noqa: F401  (rudnn.torch.paged.attention)
from rudnn.paged import DevicePlan, HostPlan, SplitWorkspace
from reference import paged as ref
from test_paged import mla_case, plan_of, ref_sched, schedule
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
    # bf16 D = 128 with 16+ rows: the prefill kernel is launched too and finds no prefill run
    pytest.param([300] * 64, [1] * 64, "cuda_mixed", id="many-short-rows-no-split"),
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


def grouped(sched):
    """The schedule with its rows ordered by (sequence, position), as servers pack prefill rows:
    the runs of consecutive rows the prefill kernel takes (cuda_common.cuh)."""
    page_size, pages, tables, lengths, seq_ids, positions = sched
    rows = sorted(zip(seq_ids, positions))
    return page_size, pages, tables, lengths, [s for s, _ in rows], [t for _, t in rows]


# Prefill (a whole sequence), chunked prefill (the last 20 positions of 130), decode rows and a
# run too short for the prefill kernel (5 rows) in one call; page sizes 1/16/64, GQA 1/4/8, both
# head dims and dtypes the prefill kernel has, causal by absolute position and not.
PREFILL_CASES = [
    pytest.param(16, 8, 2, 128, torch.bfloat16, True, id="page16-gqa4-d128-bf16-causal"),
    pytest.param(1, 8, 8, 64, torch.float16, True, id="page1-gqa1-d64-f16-causal"),
    pytest.param(64, 8, 1, 64, torch.bfloat16, False, id="page64-gqa8-d64-bf16"),
    pytest.param(16, 4, 1, 128, torch.float16, False, id="page16-gqa4-d128-f16"),
]


@pytest.mark.parametrize("page_size,Hq,Hkv,D,dtype,causal", PREFILL_CASES)
def test_prefill_and_mixed_batches(page_size, Hq, Hkv, D, dtype, causal):
    sched = grouped(schedule([300, 7, 130, 40, 5], [300, 1, 20, 1, 5], page_size, seed=21))
    q, k, v = operands(sched, Hq, Hkv, D, D, dtype, seed=3)
    plan = plan_of(sched, q.cuda())
    out, lse = plan.attention(q.cuda(), k.cuda(), v.cuda(), causal=causal, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mixed"
    o64, l64 = ref.attention(ref_sched(sched), q, k, v, scale=D ** -0.5, causal=causal)
    o_same, l_same = ref.attention(ref_sched(sched), q, k, v, scale=D ** -0.5, causal=causal, dtype=dtype)
    assert_close_to_oracle(out.cpu(), o_same, o64, "out")
    assert_close_to_oracle(lse.cpu(), l_same.float(), l64, "lse", dtype=torch.float32)


def test_prefill_rows_with_splits_equal_unsplit():
    """With a split workspace the prefill kernel writes its rows as split 0 (the other splits'
    lse -inf) and the merge returns them unchanged; the decode rows split."""
    sched = grouped(schedule([200, 3000, 64], [200, 1, 1], 16, seed=22))
    q, k, v = (t.cuda() for t in operands(sched, 8, 2, 64, 64, torch.bfloat16, seed=4))
    plan = plan_of(sched, q)
    ws = SplitWorkspace(q, len(sched[4]), 8, 64, 4)
    split, split_lse = plan.attention(q, k, v, causal=True, workspace=ws, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mixed_split"
    plain, plain_lse = plan.attention(q, k, v, causal=True, return_lse=True)
    # Sequence 0's rows (0-199 once grouped) in whole 64-row windows, 0-191: the prefill kernel's;
    # the last window holds only 8 of them (a run shorter than kPrefillMinRun), which the decode
    # kernel takes and splits, so they are compared with the tolerance below like the decode rows.
    prefill_rows = [r for r, s in enumerate(sched[4]) if s == 0][:192]
    assert torch.equal(split[prefill_rows], plain[prefill_rows])  # the same kernel, merged exactly
    torch.testing.assert_close(split, plain, rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(split_lse, plain_lse, rtol=1e-5, atol=1e-5)


def test_corrupted_device_tables_under_prefill_rows():
    """The prefill kernel's page lookups are bounded as the decode kernel's: a sequence whose
    pages are all out of range gives its prefill rows out 0 and lse -inf, the other rows are
    unchanged (the same kernels on the same data: bitwise)."""
    sched = grouped(schedule([40, 70, 9], [40, 70, 1], 16, seed=23))
    q, k, v = (t.cuda() for t in operands(sched, 4, 2, 64, 64, torch.bfloat16, seed=5))
    plan = plan_of(sched, q)
    good, good_lse = plan.attention(q, k, v, causal=True, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mixed"
    tables, _, seq_ids, _ = plan._buffers
    bad = [-7, sched[1], 2 ** 31 - 1, -(2 ** 31), 5000, -1, 3 * sched[1]]
    tables[0] = torch.tensor([bad[j % len(bad)] for j in range(tables.shape[1])], dtype=torch.int32, device="cuda")
    row_of_seq2 = [r for r, s in enumerate(sched[4]) if s == 2]
    seq_ids[row_of_seq2[0]] = 1000
    out, lse = plan.attention(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    lost = [r for r, s in enumerate(sched[4]) if s in (0, 2)]
    kept = [r for r in range(len(sched[4])) if r not in lost]
    assert torch.equal(out[lost], torch.zeros_like(out[lost]))
    assert torch.isneginf(lse[lost]).all()
    assert torch.equal(out[kept], good[kept]) and torch.equal(lse[kept], good_lse[kept])


# The tensor-core MLA decode kernel (mla_decode_cuda.cu): DeepSeek's shapes (H = 128 over two
# 64-head blocks, R = 512, P = 64, page 64), decode rows and several rows of one sequence, histories
# that are no multiple of its 32-slot tile, an empty one, f16 and bf16, causal and not.
MLA_TC_CASES = [
    pytest.param(torch.bfloat16, True, id="bf16-causal"),
    pytest.param(torch.float16, False, id="f16"),
]


def mla_deepseek(dtype, seed, lengths=(1000, 130, 64, 37, 0), nq=(4, 1, 2, 1, 0), H=128):
    return mla_case(list(lengths), list(nq), 64, H, 512, 64, dtype, seed=seed)


@pytest.mark.parametrize("dtype,causal", MLA_TC_CASES)
def test_mla_tensor_cores_at_deepseek_shapes(dtype, causal):
    sched, q, qp, latent, kp = mla_deepseek(dtype, seed=31)
    scale = (128 + 64) ** -0.5
    plan = plan_of(sched, q.cuda())
    args = (q.cuda(), qp.cuda(), latent.cuda(), kp.cuda(), scale, causal)
    # one split: the kernel alone (plan.mla without a workspace lets the core split long histories
    # when the rows are few for the SMs: 8 rows x 2 head blocks here, a history of 1000)
    out, lse = rudnn.torch.paged.mla(plan, *args, splits=1, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mla"
    auto, auto_lse = plan.mla(*args, return_lse=True)
    assert rudnn.paged.last_algorithm() in ("cuda_mla", "cuda_mla_split")
    torch.testing.assert_close(auto, out, rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(auto_lse, lse, rtol=1e-5, atol=1e-5)
    o64, l64 = ref.mla(ref_sched(sched), q, qp, latent, kp, scale=scale, causal=causal)
    o_same, l_same = ref.mla(ref_sched(sched), q, qp, latent, kp, scale=scale, causal=causal, dtype=dtype)
    assert_close_to_oracle(out.cpu(), o_same, o64, "out")
    assert_close_to_oracle(lse.cpu(), l_same.float(), l64, "lse", dtype=torch.float32)
    # the CPU backend on the same inputs, within the emulator's bound: one rounding of the dtype
    # plus u max|latent| (the kernel rounds P to the dtype before P V, u its unit roundoff)
    cpu_out, cpu_lse = plan_of(sched, q).mla(q, qp, latent, kp, scale, causal, return_lse=True)
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    torch.testing.assert_close(out.cpu().float(), cpu_out.float(), rtol=2 * u,
                               atol=u * latent.abs().max().item() + 2 * u * 1e-2)
    torch.testing.assert_close(lse.cpu(), cpu_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("splits", [3, 32])
def test_mla_tensor_cores_with_splits(splits):
    """Split partials of the MLA kernel through the decode path's merge kernel: equal to the
    unsplit kernel within float32 merging, and the float64 oracle's budget."""
    sched, q, qp, latent, kp = mla_deepseek(torch.bfloat16, seed=32, lengths=(3000, 200, 5), nq=(1, 2, 1))
    q, qp, latent, kp = (t.cuda() for t in (q, qp, latent, kp))
    plan = plan_of(sched, q)
    ws = SplitWorkspace(q, q.shape[0], 128, 512, splits)
    split, split_lse = plan.mla(q, qp, latent, kp, 0.07, True, workspace=ws, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mla_split"
    # unsplit (plan.mla without a workspace would pick its own split count for these 4 rows)
    plain, plain_lse = rudnn.torch.paged.mla(plan, q, qp, latent, kp, 0.07, True, splits=1, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mla"
    torch.testing.assert_close(split, plain, rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(split_lse, plain_lse, rtol=1e-5, atol=1e-5)
    o64, _ = ref.mla(ref_sched(sched), *(t.cpu() for t in (q, qp, latent, kp)), scale=0.07, causal=True)
    o_same, _ = ref.mla(ref_sched(sched), *(t.cpu() for t in (q, qp, latent, kp)), scale=0.07, causal=True,
                        dtype=torch.bfloat16)
    assert_close_to_oracle(split.cpu(), o_same, o64, "out")


def test_mla_other_shapes_keep_the_decode_kernel():
    sched, q, qp, latent, kp = mla_case([70], [1], 16, 16, 256, 64, torch.bfloat16, seed=33)  # R = 256
    q, qp, latent, kp = (t.cuda() for t in (q, qp, latent, kp))
    plan_of(sched, q).mla(q, qp, latent, kp, 0.1, False)
    assert rudnn.paged.last_algorithm() == "cuda_decode"


def test_corrupted_device_tables_under_the_mla_kernel():
    """The MLA kernel's page lookups are bounded: a sequence whose pages are all out of range gets
    out 0 and lse -inf, the other rows are unchanged (bitwise: the same kernel on the same data)."""
    sched, q, qp, latent, kp = mla_deepseek(torch.bfloat16, seed=34, lengths=(300, 70), nq=(1, 2))
    q, qp, latent, kp = (t.cuda() for t in (q, qp, latent, kp))
    plan = plan_of(sched, q)
    good, good_lse = plan.mla(q, qp, latent, kp, 0.1, True, return_lse=True)
    assert rudnn.paged.last_algorithm() == "cuda_mla"
    tables, _, _, _ = plan._buffers
    bad = [-7, sched[1], 2 ** 31 - 1, -(2 ** 31), 5000]
    tables[0] = torch.tensor([bad[j % len(bad)] for j in range(tables.shape[1])], dtype=torch.int32, device="cuda")
    out, lse = plan.mla(q, qp, latent, kp, 0.1, True, return_lse=True)
    torch.cuda.synchronize()
    lost = [r for r, s in enumerate(sched[4]) if s == 0]
    kept = [r for r in range(len(sched[4])) if r not in lost]
    assert torch.equal(out[lost], torch.zeros_like(out[lost])) and torch.isneginf(lse[lost]).all()
    assert torch.equal(out[kept], good[kept]) and torch.equal(lse[kept], good_lse[kept])
