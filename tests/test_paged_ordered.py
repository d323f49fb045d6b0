"""OrderedBackwardWorkspace (SPEC section 3) on the CPU: the ordered algorithm against torch
autograd through the float64 reference, bitwise identical over 5 runs and across its options
(query pruning, the history row cache and history compaction change the work and the memory,
never the bits), the zeros of compaction's inactive pages, bytes() against the documented
layout, the 64 MiB budget (an error leaves the previous mode), the two environment switches,
and every error of the workspace."""

import itertools

import numpy as np
import pytest
import torch

import rudnn
from rudnn.paged import DevicePlan, HostPlan, OrderedBackwardWorkspace
from reference import paged as ref
from test_paged import mla_case, plan_of, ref_sched, schedule
from test_paged_backward import autograd_attention
from util import DTYPES, assert_close_to_oracle, rand

OPTIONS = list(itertools.product([True, False], repeat=3))  # (query_pruning, history_row_cache, history_compaction)


def gqa_case(dtype, *, seed=3, lengths=(37, 5, 20, 30), nq=(1, 2, 20, 0), page_size=16, Hq=8, Hkv=2, D=32, Dv=16):
    """A mixed batch with a shared prefix page, a sequence without query rows (its own pages are
    inactive), spare pages nobody reads, and one query row whose dout is zero (pruned)."""
    sched = schedule(list(lengths), list(nq), page_size, seed=seed, shared_prefix=True, spare_pages=3)
    Q, pages = len(sched[4]), sched[1]
    q = rand((Q, Hq, D), dtype, seed=1)
    k = rand((pages, page_size, Hkv, D), dtype, seed=2)
    v = rand((pages, page_size, Hkv, Dv), dtype, seed=3)
    dout = rand((Q, Hq, Dv), dtype, seed=4)
    dout[Q // 2] = 0
    return sched, q, k, v, dout


def active_pages(sched):
    page_size, pages, tables, lengths, seq_ids, _ = sched
    act = sorted({tables[s][j] for s in set(seq_ids) for j in range(-(-lengths[s] // page_size))})
    return act, sorted(set(range(pages)) - set(act))


def expected_bytes(sched, heads, pruning, row_cache, compaction):
    """The layout of paged.hpp, counted from the schedule."""
    page_size, pages, tables, lengths, seq_ids, _ = sched
    Q = len(seq_ids)
    readers = sum(-(-lengths[s] // page_size) for s in seq_ids)
    listed = len(active_pages(sched)[0]) if compaction else pages
    inactive = pages - listed
    words = 3 * listed + 1 + 2 * readers + inactive + Q * heads * 2
    if row_cache:
        words += Q + 1 + sum(lengths[s] for s in seq_ids) * heads * 2
    return 4 * words


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_ordered_attention_matches_autograd_and_is_bitwise_stable(causal, dtype):
    sched, q, k, v, dout = gqa_case(dtype)
    plan = plan_of(sched, q)
    results = {}
    for opts in OPTIONS:
        ws = OrderedBackwardWorkspace(plan, q, *opts)
        runs = [plan.attention_backward(q, k, v, dout, 0.3, causal, workspace=ws) for _ in range(5)]
        assert rudnn._C.paged_last_algorithm() == "cpu_ordered"
        for again in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(again, runs[0])), opts
        results[opts] = runs[0]
    # the options change the work and the memory, never the bits
    first = results[OPTIONS[0]]
    for opts, grads in results.items():
        assert all(torch.equal(a, b) for a, b in zip(grads, first)), opts
    g64 = autograd_attention(sched, q, k, v, dout, 0.3, causal, torch.float64)
    same = autograd_attention(sched, q, k, v, dout, 0.3, causal, dtype)
    for name, ours, s, o in zip(("dq", "dk", "dv"), first, same, g64):
        assert ours.dtype == dtype
        assert_close_to_oracle(ours, s, o, name)
    assert not first[0][q.shape[0] // 2].any()  # the zero dout row: dq exactly zero


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_ordered_mla(causal, dtype):
    sched, q, qp, latent, kp = mla_case([40, 9, 18], [3, 9, 1], 16, 4, 64, 16, dtype, seed=5)
    dout = rand(tuple(q.shape), dtype, seed=9)
    dlse = rand(tuple(q.shape[:2]), torch.float32, seed=10)
    plan = plan_of(sched, q)
    grads = None
    for opts in OPTIONS:
        ws = OrderedBackwardWorkspace(plan, q, *opts)
        runs = [plan.mla_backward(q, qp, latent, kp, dout, 0.15, causal, workspace=ws, dlse=dlse) for _ in range(5)]
        for again in runs:
            assert all(torch.equal(a, b) for a, b in zip(again, runs[0])), opts
        if grads is None:
            grads = runs[0]
        assert all(torch.equal(a, b) for a, b in zip(runs[0], grads)), opts

    def autograd(dt):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, qp, latent, kp)]
        out, lse = ref.mla(ref_sched(sched), *leaves, scale=0.15, causal=causal, dtype=dt)
        (out * dout.to(dt)).sum().add((lse * dlse.to(dt)).sum()).backward()
        return [t.grad for t in leaves]

    g64, same = autograd(torch.float64), autograd(dtype)
    for name, ours, s, o in zip(("dq", "dqp", "dlatent", "dkp"), grads, same, g64):
        assert_close_to_oracle(ours, s, o, name)


def test_ordered_need_subsets_and_dlse():
    sched, q, k, v, dout = gqa_case(torch.float32)
    plan = plan_of(sched, q)
    dlse = rand(tuple(q.shape[:2]), torch.float32, seed=7)
    ws = OrderedBackwardWorkspace(plan, q)
    full = plan.attention_backward(q, k, v, dout, 0.3, True, workspace=ws, dlse=dlse)
    for need in (("dq",), ("dk",), ("dv",), ("dk", "dv"), ("dq", "dv")):
        part = plan.attention_backward(q, k, v, dout, 0.3, True, workspace=ws, dlse=dlse, need=need)
        for name, got, want in zip(("dq", "dk", "dv"), part, full):
            assert (got is None) == (name not in need)
            if got is not None:
                assert torch.equal(got, want), (need, name)
    # dlse reaches a row whose dout is zero: it is no longer pruned
    g64 = autograd_attention(sched, q, k, v, dout, 0.3, True, torch.float64)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, lse = ref.attention(ref_sched(sched), *leaves, scale=0.3, causal=True)
    (out * dout.double()).sum().add((lse * dlse.double()).sum()).backward()
    for ours, want in zip(full, [t.grad for t in leaves]):
        torch.testing.assert_close(ours.double(), want, rtol=1e-4, atol=1e-5)
    assert full[0][q.shape[0] // 2].abs().sum() > 0
    assert not torch.equal(full[0], g64[0].float())


def test_compaction_pages_zeros_and_bytes():
    sched, q, k, v, dout = gqa_case(torch.float32)
    plan = plan_of(sched, q)
    act, inact = active_pages(sched)
    assert inact, "the case must have pages no sequence with queries reaches"
    for opts in OPTIONS:
        ws = OrderedBackwardWorkspace(plan, q, *opts)
        assert (ws.query_pruning, ws.history_row_cache, ws.history_compaction) == opts
        assert ws.bytes() == expected_bytes(sched, q.shape[1], *opts) == ws.buffer.numel()
        a, i = ws.compaction_pages()
        assert a.tolist() == act and i.tolist() == inact
    plain = OrderedBackwardWorkspace(plan, q)
    assert OrderedBackwardWorkspace(plan, q, history_compaction=True).bytes() < plain.bytes()
    assert OrderedBackwardWorkspace(plan, q, history_row_cache=True).bytes() > plain.bytes()
    ws = OrderedBackwardWorkspace(plan, q, history_compaction=True)
    _, dk, dv = plan.attention_backward(q, k, v, dout, 0.3, False, workspace=ws)
    assert not dk[inact].any() and not dv[inact].any()
    assert dk[act].abs().sum() > 0 and dv[act].abs().sum() > 0


def test_budget_error_leaves_the_previous_mode():
    # one long sequence read by 100 query rows: its row cache needs 100 x 100000 x 8 heads x 8 bytes
    host = HostPlan(16, 6250, [list(range(6250))], [100000], [0] * 100, list(range(99900, 100000)))
    q = torch.zeros(100, 8, 4)
    plan = DevicePlan.upload(host, q)
    ws = OrderedBackwardWorkspace(plan, q, history_compaction=True)
    before, buffer = ws.bytes(), ws.buffer
    with pytest.raises(rudnn.ArgumentError, match=r"OrderedBackwardWorkspace: needs \d+ bytes \(index \d+, row "
                       r"statistics 6400, history row cache 640000000\), above the 64 MiB budget of an ordered "
                       r"workspace \(turn history_row_cache off\)"):
        ws.configure(history_row_cache=True)
    assert (ws.query_pruning, ws.history_row_cache, ws.history_compaction) == (True, False, True)
    assert ws.bytes() == before and ws.buffer is buffer
    with pytest.raises(rudnn.ArgumentError, match="above the 64 MiB budget"):
        OrderedBackwardWorkspace(plan, q, history_row_cache=True)
    # the workspace still works, in its previous mode
    small = HostPlan(4, 3, [[0, 1]], [6], [0, 0], [4, 5])
    q2 = rand((2, 2, 4), torch.float32, seed=1)
    plan2 = DevicePlan.upload(small, q2)
    ws2 = OrderedBackwardWorkspace(plan2, q2)
    ws2.configure(history_row_cache=True)
    assert ws2.history_row_cache and ws2.bytes() == expected_bytes(
        (4, 3, [[0, 1]], [6], [0, 0], [4, 5]), 2, True, True, False)


def test_environment_switches(monkeypatch):
    sched, q, k, v, dout = gqa_case(torch.float32)
    plan = plan_of(sched, q)
    for var, attr in (("RUDNN_PAGED_ORDERED_CACHE_ROWS", "history_row_cache"),
                      ("RUDNN_PAGED_ORDERED_COMPACT_HISTORY", "history_compaction")):
        monkeypatch.delenv(var, raising=False)
        assert getattr(OrderedBackwardWorkspace(plan, q), attr) is False
        monkeypatch.setenv(var, "0")
        assert getattr(OrderedBackwardWorkspace(plan, q), attr) is False
        monkeypatch.setenv(var, "1")
        assert getattr(OrderedBackwardWorkspace(plan, q), attr) is True
        assert getattr(OrderedBackwardWorkspace(plan, q, **{attr: False}), attr) is False  # an argument wins
        ws = OrderedBackwardWorkspace(plan, q)
        made = ws.bytes()
        monkeypatch.setenv(var, "0")  # read when the workspace is made, not later
        assert getattr(ws, attr) is True and ws.bytes() == made
        for bad in ("2", "yes", "true", " 1"):
            monkeypatch.setenv(var, bad)
            with pytest.raises(rudnn.ArgumentError, match=f"OrderedBackwardWorkspace: {var}={bad}: expected unset, "
                               r"0 \(off\) or 1 \(on\)"):
                OrderedBackwardWorkspace(plan, q, **{attr: True})
        monkeypatch.delenv(var)


def test_ordered_workspace_errors():
    sched, q, k, v, dout = gqa_case(torch.float32)
    plan = plan_of(sched, q)
    ws = OrderedBackwardWorkspace(plan, q)
    op = "paged_attention_backward"
    with pytest.raises(rudnn.ArgumentError, match="OrderedBackwardWorkspace: plan: expected a rudnn.paged.DevicePlan, "
                                                  "got HostPlan"):
        OrderedBackwardWorkspace(plan.host, q)
    empty = DevicePlan.reserve(q, 4, 4, 4)
    with pytest.raises(rudnn.ArgumentError, match="OrderedBackwardWorkspace: plan: this plan was reserved but holds "
                                                  "no schedule yet"):
        OrderedBackwardWorkspace(empty, q)
    with pytest.raises(rudnn.ArgumentError, match="OrderedBackwardWorkspace: query_pruning: expected True or False, "
                                                  "got 1"):
        OrderedBackwardWorkspace(plan, q, query_pruning=1)
    with pytest.raises(rudnn.ArgumentError, match="OrderedBackwardWorkspace: history_row_cache: expected True or "
                                                  "False, got 'yes'"):
        ws.configure(history_row_cache="yes")
    with pytest.raises(rudnn.ShapeError, match=r"OrderedBackwardWorkspace: q: expected rank 3 \[queries, heads, "
                                               rf"dim\], got shape \({q.shape[0]}, 8\)"):
        OrderedBackwardWorkspace(plan, q[:, :, 0])
    with pytest.raises(rudnn.DeviceError, match="OrderedBackwardWorkspace: q: expected the framework and device of "
                                                "the plan \\(torch cpu\\), got numpy cpu"):
        OrderedBackwardWorkspace(plan, q.numpy())
    # a workspace of another head count (made for q of 4 heads, used with 8)
    ws4 = OrderedBackwardWorkspace(plan, q[:, :4])
    with pytest.raises(rudnn.ShapeError, match=rf"{op}: workspace: made for {q.shape[0]} queries x 4 heads over "
                       rf"{sched[1]} pages of page_size 16, the call has {q.shape[0]} queries x 8 heads"):
        plan.attention_backward(q, k, v, dout, 0.3, True, workspace=ws4)
    # the plan rewritten in place with another schedule: the workspace's index is stale
    reserved = DevicePlan.reserve(q, 64, 8, 8)
    DevicePlan.upload(plan.host, q, into=reserved)
    stale = OrderedBackwardWorkspace(reserved, q)
    DevicePlan.upload(HostPlan(*sched[:2], sched[2], sched[3], sched[4], [0] * len(sched[4])), q, into=reserved)
    with pytest.raises(rudnn.ArgumentError, match=f"{op}: workspace: made for another schedule"):
        reserved.attention_backward(q, k, v, dout, 0.3, True, workspace=stale)
    other = plan_of(sched, q)
    with pytest.raises(rudnn.ArgumentError, match=f"{op}: workspace: made for another schedule"):
        other.attention_backward(q, k, v, dout, 0.3, True, workspace=ws)
    # numpy arrays with a torch workspace
    with pytest.raises(rudnn.DeviceError, match=f"{op}: workspace: expected a workspace of q's framework and device "
                                                r"\(numpy cpu\), got torch cpu"):
        np_plan = plan_of(sched, q.numpy())
        np_plan.attention_backward(q.numpy(), k.numpy(), v.numpy(), dout.numpy(), 0.3, True, workspace=ws)
    with pytest.raises(rudnn.ArgumentError, match="paged_mla_backward: workspace: expected a "
                                                  "rudnn.paged.OrderedBackwardWorkspace or None, got str"):
        plan.mla_backward(q, q[..., :4], k[:, :, :1], k[:, :, :1, :4], dout, 0.3, workspace="ordered")
    # a scribbled index is caught on the host before any read
    bad = OrderedBackwardWorkspace(plan, q)
    bad.buffer[:4] = torch.tensor([255, 255, 255, 127], dtype=torch.uint8)  # listed_ids[0] = 2^31 - 1
    with pytest.raises(rudnn.ArgumentError, match=f"{op}: workspace: its index is corrupted \\(page id 2147483647\\); "
                                                  "make the workspace again"):
        plan.attention_backward(q, k, v, dout, 0.3, True, workspace=bad)
    # a torch workspace with JAX arrays, a JAX workspace with torch arrays
    jax = pytest.importorskip("jax")
    jq = jax.numpy.asarray(q.numpy())
    jplan = DevicePlan.upload(plan.host, jq)
    jargs = [jax.numpy.asarray(t.numpy()) for t in (q, k, v, dout)]
    with pytest.raises(rudnn.DeviceError, match=f"{op}: workspace: expected a workspace made for a JAX q, got a torch "
                                                "one"):
        jplan.attention_backward(*jargs, 0.3, True, workspace=ws)
    jws = OrderedBackwardWorkspace(jplan, jq)
    with pytest.raises(rudnn.DeviceError, match=f"{op}: workspace: expected a workspace of q's framework and device "
                                                r"\(torch cpu\), got jax cpu"):
        plan.attention_backward(q, k, v, dout, 0.3, True, workspace=jws)
    with pytest.raises(rudnn.ArgumentError, match=f"{op}: workspace: made for another schedule"):
        DevicePlan.upload(HostPlan(*sched), jq).attention_backward(*jargs, 0.3, True, workspace=jws)
    with pytest.raises(rudnn.ArgumentError, match="paged_mla_backward: workspace: expected a "
                                                  "rudnn.paged.OrderedBackwardWorkspace or None, got int"):
        jplan.mla_backward(jargs[0], jargs[0][..., :4], jargs[1][:, :, :1], jargs[1][:, :, :1, :4], jargs[3], 0.3,
                           workspace=3)


def test_ordered_jax_matches_torch_bitwise():
    jax = pytest.importorskip("jax")
    import rudnn.jax.paged as jpaged

    sched, q, k, v, dout = gqa_case(torch.bfloat16)
    tplan = plan_of(sched, q)
    dlse = rand(tuple(q.shape[:2]), torch.float32, seed=7)
    j = lambda t: jax.numpy.asarray(t.float().numpy()).astype(jax.numpy.bfloat16)  # noqa: E731
    jq, jk, jv, jd = j(q), j(k), j(v), j(dout)
    jplan = DevicePlan.upload(tplan.host, jq)
    for opts in [(True, False, False), (False, True, True)]:
        want = tplan.attention_backward(q, k, v, dout, 0.3, True, dlse=dlse,
                                        workspace=OrderedBackwardWorkspace(tplan, q, *opts))
        jws = OrderedBackwardWorkspace(jplan, jq, *opts)
        assert jws.bytes() == expected_bytes(sched, q.shape[1], *opts)
        runs = [jpaged.attention_backward(jplan, jq, jk, jv, jd, 0.3, True, workspace=jws,
                                          dlse=jax.numpy.asarray(dlse.numpy())) for _ in range(5)]
        for got in runs:
            for a, b in zip(got, want):
                assert np.array_equal(np.asarray(a.astype(jax.numpy.float32)), b.float().numpy()), opts
    # MLA through the plan method
    msched, mq, mqp, mlat, mkp = mla_case([20, 9], [3, 1], 16, 2, 32, 8, torch.float32, seed=5)
    md = rand(tuple(mq.shape), torch.float32, seed=9)
    mplan = plan_of(msched, mq)
    want = mplan.mla_backward(mq, mqp, mlat, mkp, md, 0.2, True, workspace=OrderedBackwardWorkspace(mplan, mq))
    jm = [jax.numpy.asarray(t.numpy()) for t in (mq, mqp, mlat, mkp, md)]
    jmplan = DevicePlan.upload(mplan.host, jm[0])
    got = jmplan.mla_backward(*jm, 0.2, True, workspace=OrderedBackwardWorkspace(jmplan, jm[0]))
    for a, b in zip(got, want):
        assert np.array_equal(np.asarray(a), b.numpy())


def test_ordered_numpy():
    sched, q, k, v, dout = gqa_case(torch.float32)
    plan_t, plan_n = plan_of(sched, q), plan_of(sched, q.numpy())
    ws_t, ws_n = OrderedBackwardWorkspace(plan_t, q), OrderedBackwardWorkspace(plan_n, q.numpy())
    assert isinstance(ws_n.buffer, np.ndarray)
    t = plan_t.attention_backward(q, k, v, dout, 0.3, True, workspace=ws_t)
    n = plan_n.attention_backward(q.numpy(), k.numpy(), v.numpy(), dout.numpy(), 0.3, True, workspace=ws_n)
    for a, b in zip(t, n):
        assert np.array_equal(a.numpy(), b)
