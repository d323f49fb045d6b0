"""plan.attention_backward / plan.mla_backward on the CPU against torch autograd through the
float64 reference (tests/reference/paged.py), with the FlashAttention budget (twice the error
of autograd through the reference in the input dtype); need=; shared pages summing every
sequence's contribution; bitwise run-to-run reproducibility."""

import pytest
import torch

import rudnn
from reference import paged as ref
from test_paged import mla_case, plan_of, ref_sched, schedule
from util import DTYPES, assert_close_to_oracle, rand


def autograd_attention(sched, q, k, v, dout, scale, causal, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = ref.attention(ref_sched(sched), *leaves, scale=scale, causal=causal, dtype=dtype)
    out.backward(dout.to(dtype))
    return [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("page_size,lengths,nq,Hq,Hkv,D,Dv", [
    pytest.param(16, [37, 5, 20], [1, 2, 20], 8, 2, 32, 16, id="mixed-gqa4-ps16"),
    pytest.param(1, [6, 3], [6, 1], 4, 4, 8, 8, id="mha-ps1"),
    pytest.param(64, [70, 9], [3, 9], 8, 1, 16, 24, id="mqa-ps64"),
])
def test_attention_backward(page_size, lengths, nq, Hq, Hkv, D, Dv, causal, dtype):
    sched = schedule(lengths, nq, page_size, seed=sum(lengths), shared_prefix=True)
    Q, pages = len(sched[4]), sched[1]
    q = rand((Q, Hq, D), dtype, seed=1)
    k = rand((pages, page_size, Hkv, D), dtype, seed=2)
    v = rand((pages, page_size, Hkv, Dv), dtype, seed=3)
    dout = rand((Q, Hq, Dv), dtype, seed=4)
    plan = plan_of(sched, q)
    dq, dk, dv = plan.attention_backward(q, k, v, dout, 0.3, causal)
    g64 = autograd_attention(sched, q, k, v, dout, 0.3, causal, torch.float64)
    same = autograd_attention(sched, q, k, v, dout, 0.3, causal, dtype)
    for name, ours, s, o in zip(("dq", "dk", "dv"), (dq, dk, dv), same, g64):
        assert ours.dtype == dtype
        assert_close_to_oracle(ours, s, o, name)
    # need= computes only what is named
    only = plan.attention_backward(q, k, v, dout, 0.3, causal, need=("dk",))
    assert only[0] is None and only[2] is None
    assert torch.equal(only[1], dk)
    # a fixed summation order: bitwise equal run to run
    again = plan.attention_backward(q, k, v, dout, 0.3, causal)
    assert all(torch.equal(a, b) for a, b in zip(again, (dq, dk, dv)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_mla_backward(causal, dtype):
    sched, q, qp, latent, kp = mla_case([40, 9, 18], [3, 9, 1], 16, 4, 64, 16, dtype, seed=5)
    dout = rand(tuple(q.shape), dtype, seed=9)
    plan = plan_of(sched, q)
    grads = plan.mla_backward(q, qp, latent, kp, dout, 0.15, causal)

    def autograd(dt):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, qp, latent, kp)]
        out, _ = ref.mla(ref_sched(sched), *leaves, scale=0.15, causal=causal, dtype=dt)
        out.backward(dout.to(dt))
        return [t.grad for t in leaves]

    g64, same = autograd(torch.float64), autograd(dtype)
    for name, ours, s, o in zip(("dq", "dqp", "dlatent", "dkp"), grads, same, g64):
        assert_close_to_oracle(ours, s, o, name)
    none = plan.mla_backward(q, qp, latent, kp, dout, 0.15, causal, need=())
    assert none == (None, None, None, None)


def test_untouched_slots_get_zero_gradients():
    sched = schedule([5], [1], 4, seed=1, spare_pages=4)
    q, k = rand((1, 2, 8), torch.float32, seed=1), rand((sched[1], 4, 1, 8), torch.float32, seed=2)
    plan = plan_of(sched, q)
    _, dk, dv = plan.attention_backward(q, k, k.clone(), torch.ones(1, 2, 8), causal=True)
    used = {(sched[2][0][t // 4], t % 4) for t in range(5)}
    for p in range(sched[1]):
        for s in range(4):
            if (p, s) not in used:
                assert not dk[p, s].any() and not dv[p, s].any()


def test_backward_errors():
    sched = schedule([5], [1], 4, seed=1)
    q, k = rand((1, 2, 8), torch.float32, seed=1), rand((sched[1], 4, 1, 8), torch.float32, seed=2)
    plan = plan_of(sched, q)
    with pytest.raises(rudnn.ArgumentError, match="paged_attention_backward: need: unknown gradient 'dx'"):
        plan.attention_backward(q, k, k, torch.ones(1, 2, 8), need=("dq", "dx"))
    with pytest.raises(rudnn.ArgumentError, match="paged_attention_backward: need: expected a tuple of gradient names"):
        plan.attention_backward(q, k, k, torch.ones(1, 2, 8), need="dq")
    with pytest.raises(rudnn.ShapeError, match=r"paged_attention_backward: dout: expected shape \[1, 2, 8\]"):
        plan.attention_backward(q, k, k, torch.ones(1, 2, 4))
    with pytest.raises(rudnn.DTypeError, match=r"paged_attention_backward: dout: expected the dtype of q \(float32\)"):
        plan.attention_backward(q, k, k, torch.ones(1, 2, 8, dtype=torch.float16))
    with pytest.raises(rudnn.ArgumentError, match="paged_attention_backward: workspace: expected a "
                                                  "rudnn.paged.OrderedBackwardWorkspace or None, got object"):
        plan.attention_backward(q, k, k, torch.ones(1, 2, 8), workspace=object())
    # a dout expanded over rows and heads is fine (an input); its last axis must be dense
    plan.attention_backward(q, k, k, torch.ones(1, 1, 8).expand(1, 2, 8))
    with pytest.raises(rudnn.ShapeError, match="paged_attention_backward: dout: the last axis must be contiguous"):
        plan.attention_backward(q, k, k, torch.ones(1, 1, 1).expand(1, 2, 8))
