"""The CUDA paged backward (cpp/src/paged/backward_cuda.cu) against the CPU backend, which
test_paged_backward.py and test_paged_ordered.py check against torch autograd: the default
atomic history reduction (to the FlashAttention budget: twice the error of autograd through the
reference in the input dtype), the ordered mode (OrderedBackwardWorkspace: bitwise identical
over 5 runs and across its options), need= subsets, dlse, GQA, MLA, a shared prefix page,
compaction's zeros. Skipped without a CUDA GPU."""

import itertools

import pytest
import torch

import rudnn
from rudnn.paged import OrderedBackwardWorkspace
from test_paged import mla_case, plan_of
from test_paged_backward import autograd_attention
from test_paged_ordered import active_pages, gqa_case
from util import DTYPES, assert_close_to_oracle, rand

pytestmark = pytest.mark.cuda

OPTIONS = list(itertools.product([True, False], repeat=3))


def to_cuda(*ts):
    return [t.cuda() for t in ts]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [dict(page_size=16, Hq=8, Hkv=2, D=32, Dv=16),
                                   dict(page_size=1, Hq=4, Hkv=4, D=64, Dv=64),
                                   dict(page_size=16, Hq=8, Hkv=1, D=128, Dv=96)], ids=["gqa4", "mha-ps1", "mqa"])
def test_cuda_attention_backward(shape, causal, dtype):
    sched, q, k, v, dout = gqa_case(dtype, **shape)
    qc, kc, vc, dc = to_cuda(q, k, v, dout)
    plan = plan_of(sched, qc)
    grads = plan.attention_backward(qc, kc, vc, dc, 0.3, causal)
    assert rudnn._C.paged_last_algorithm() == "cuda_atomic"
    g64 = autograd_attention(sched, q, k, v, dout, 0.3, causal, torch.float64)
    same = autograd_attention(sched, q, k, v, dout, 0.3, causal, dtype)
    for name, ours, s, o in zip(("dq", "dk", "dv"), grads, same, g64):
        assert ours.dtype == dtype and ours.is_cuda
        assert_close_to_oracle(ours.cpu(), s, o, name)
    ordered = None
    for opts in OPTIONS:
        ws = OrderedBackwardWorkspace(plan, qc, *opts)
        runs = [plan.attention_backward(qc, kc, vc, dc, 0.3, causal, workspace=ws) for _ in range(5)]
        assert rudnn._C.paged_last_algorithm() == "cuda_ordered"
        for again in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(again, runs[0])), opts
        ordered = ordered or runs[0]
        assert all(torch.equal(a, b) for a, b in zip(runs[0], ordered)), opts
    for name, ours, s, o in zip(("dq", "dk", "dv"), ordered, same, g64):
        assert_close_to_oracle(ours.cpu(), s, o, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_mla_backward(causal, dtype):
    sched, q, qp, latent, kp = mla_case([40, 9, 18], [3, 9, 1], 16, 4, 64, 16, dtype, seed=5)
    dout = rand(tuple(q.shape), dtype, seed=9)
    dlse = rand(tuple(q.shape[:2]), torch.float32, seed=10)
    cpu_plan = plan_of(sched, q)
    want = cpu_plan.mla_backward(q, qp, latent, kp, dout, 0.15, causal, dlse=dlse)
    args = to_cuda(q, qp, latent, kp, dout)
    plan = plan_of(sched, args[0])
    got = plan.mla_backward(*args, 0.15, causal, dlse=dlse.cuda())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for name, a, b in zip(("dq", "dqp", "dlatent", "dkp"), got, want):
        torch.testing.assert_close(a.cpu().float(), b.float(), **tol, msg=name)
    ws = OrderedBackwardWorkspace(plan, args[0], history_row_cache=True)
    runs = [plan.mla_backward(*args, 0.15, causal, dlse=dlse.cuda(), workspace=ws) for _ in range(5)]
    for again in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(again, runs[0]))
    for name, a, b in zip(("dq", "dqp", "dlatent", "dkp"), runs[0], want):
        torch.testing.assert_close(a.cpu().float(), b.float(), **tol, msg=name)


@pytest.mark.parametrize("ordered", [False, True])
def test_cuda_need_subsets_and_compaction_zeros(ordered):
    sched, q, k, v, dout = gqa_case(torch.bfloat16)
    qc, kc, vc, dc = to_cuda(q, k, v, dout)
    plan = plan_of(sched, qc)
    ws = OrderedBackwardWorkspace(plan, qc, history_compaction=True) if ordered else None
    full = plan.attention_backward(qc, kc, vc, dc, 0.3, True, workspace=ws)
    for need in (("dq",), ("dk",), ("dv",), ("dk", "dv")):
        part = plan.attention_backward(qc, kc, vc, dc, 0.3, True, workspace=ws, need=need)
        for name, got, f in zip(("dq", "dk", "dv"), part, full):
            assert (got is None) == (name not in need)
            if got is not None and ordered:
                assert torch.equal(got, f), (need, name)
    _, inactive = active_pages(sched)
    assert not full[1][inactive].any() and not full[2][inactive].any()
