"""rudnn.torch.paged: custom ops over the plan's metadata tensors (CPU): equal to the eager
plan methods, opcheck, torch.compile (a plan rewritten in place is seen without recompiling),
and the documented lack of a backward."""

import pytest
import torch
from torch.library import opcheck

import rudnn
import rudnn.torch as rt
from rudnn.paged import DevicePlan, HostPlan
from reference import paged as ref
from test_paged import mla_case, plan_of, ref_sched, schedule
from util import DTYPES, assert_close_to_oracle, rand


def case(dtype=torch.float32, seed=0):
    sched = schedule([37, 5, 20], [1, 2, 20], 16, seed=seed)
    Q = len(sched[4])
    q = rand((Q, 8, 32), dtype, seed=seed)
    k = rand((sched[1], 16, 2, 32), dtype, seed=seed + 1)
    v = rand((sched[1], 16, 2, 16), dtype, seed=seed + 2)
    return sched, plan_of(sched, q), q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_matches_eager_and_reference(dtype):
    sched, plan, q, k, v = case(dtype)
    out, lse = rt.paged.attention(plan, q, k, v, 0.2, True, return_lse=True)
    e_out, e_lse = plan.attention(q, k, v, 0.2, True, return_lse=True)
    torch.testing.assert_close(out, e_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, e_lse, rtol=0, atol=0)
    o64, _ = ref.attention(ref_sched(sched), q, k, v, scale=0.2, causal=True)
    assert_close_to_oracle(out, ref.attention(ref_sched(sched), q, k, v, scale=0.2, causal=True, dtype=dtype)[0], o64)
    split = rt.paged.attention(plan, q, k, v, 0.2, True, splits=4)
    tol = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(split.float(), out.float(), rtol=tol, atol=tol)


def test_mla_matches_eager():
    sched, q, qp, latent, kp = mla_case([70, 3], [1, 3], 64, 8, 64, 16, torch.bfloat16, seed=4)
    plan = plan_of(sched, q)
    out = rt.paged.mla(plan, q, qp, latent, kp, 0.1, True)
    torch.testing.assert_close(out, plan.mla(q, qp, latent, kp, 0.1, True), rtol=0, atol=0)


def test_append_in_place():
    sched, plan, q, k, v = case()
    kn, vn = rand((q.shape[0], 2, 32), torch.float32, seed=7), rand((q.shape[0], 2, 16), torch.float32, seed=8)
    k2, v2 = k.clone(), v.clone()
    kc, vc = rt.paged.append(plan, kn, vn, k, v)
    assert kc is k and vc is v
    plan.append(kn, vn, k2, v2)
    assert torch.equal(k, k2) and torch.equal(v, v2)


def test_opcheck():
    sched, plan, q, k, v = case()
    meta = (plan.tables, plan.lengths, plan.sequence_ids, plan.positions, plan.page_size)
    ops = torch.ops.rudnn
    opcheck(ops.paged_attention.default, (*meta, q, k, v, 0.3, True, 1))
    opcheck(ops.paged_attention.default, (*meta, q, k, v, 0.3, False, 3))
    sched, q, qp, latent, kp = mla_case([20, 3], [1, 3], 16, 4, 32, 8, torch.float32, seed=2)
    plan = plan_of(sched, q)
    meta = (plan.tables, plan.lengths, plan.sequence_ids, plan.positions, plan.page_size)
    opcheck(ops.paged_mla.default, (*meta, q, qp, latent, kp, 0.1, True, 1))
    opcheck(ops.paged_append.default, (*meta, qp[:, :1].contiguous(), qp[:, :1].contiguous(), kp.clone(), kp.clone()))


def test_compile_sees_a_plan_rewritten_in_place():
    torch._dynamo.reset()
    q0 = torch.zeros(1)
    plan = DevicePlan.reserve(q0, max_queries=4, max_seqs=4, max_pages=8)
    k = rand((40, 16, 2, 32), torch.float32, seed=1)
    v = rand((40, 16, 2, 32), torch.float32, seed=2)

    @torch.compile(fullgraph=True)
    def step(q, k_new, v_new):
        rt.paged.append(plan, k_new, v_new, k, v)
        return rt.paged.attention(plan, q, k, v, 0.25, True)

    for seed, lengths in [(1, [30, 7, 100, 64]), (2, [5, 120, 3, 17])]:
        sched = schedule(lengths, [1, 1, 1, 1], 16, seed=seed, spare_pages=40 - sum(-(-n // 16) for n in lengths))
        page_size, pages, tables, lengths, seq_ids, positions = sched
        DevicePlan.upload(HostPlan(page_size, pages, tables, lengths, seq_ids, positions), q0, into=plan)
        q = rand((4, 8, 32), torch.float32, seed=seed)
        kn, vn = rand((4, 2, 32), torch.float32, seed=seed + 5), rand((4, 2, 32), torch.float32, seed=seed + 6)
        got = step(q, kn, vn)
        want = plan.attention(q, k, v, 0.25, True)  # the caches already hold the appended rows
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        o64, _ = ref.attention(ref_sched(sched), q, k, v, scale=0.25, causal=True)
        assert_close_to_oracle(got, ref.attention(ref_sched(sched), q, k, v, scale=0.25, causal=True,
                                                  dtype=torch.float32)[0], o64)


def test_no_backward_yet():
    sched, plan, q, k, v = case()
    out = rt.paged.attention(plan, q.requires_grad_(), k, v)
    with pytest.raises(rudnn.UnsupportedError, match="rudnn.torch.paged.attention: the paged backward is not built"):
        out.sum().backward()


def test_wrapper_errors():
    sched, plan, q, k, v = case()
    with pytest.raises(rudnn.ArgumentError, match="rudnn.torch.paged.attention: plan: expected a rudnn.paged.DevicePlan, "
                                                  "got HostPlan"):
        rt.paged.attention(plan.host, q, k, v)
    np_plan = DevicePlan.upload(plan.host, q.numpy())
    with pytest.raises(rudnn.ArgumentError, match="expected a plan of torch tensors"):
        rt.paged.attention(np_plan, q, k, v)
    with pytest.raises(rudnn.ArgumentError, match="rudnn.torch.paged.attention: splits: expected an int"):
        rt.paged.attention(plan, q, k, v, splits=2.0)
    with pytest.raises(rudnn.ArgumentError, match="SplitWorkspace: splits: expected an integer in 2..32, got 40"):
        rt.paged.attention(plan, q, k, v, splits=40)
