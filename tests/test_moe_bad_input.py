"""Issue 27, items 4 and 5: MoE metadata that used to give uninitialised rows or NaN tokens.
Host metadata (offsets, expert ids, row_of_slot) is checked and refused with an ArgumentError
that names the bad element; on CUDA, where offsets are not read on the host, rows that no
expert segment covers come out zero."""

import pytest
import torch

import rudnn
import rudnn.torch as rt
from rudnn import moe

E, I, H = 2, 3, 4


def _weights(device="cpu"):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(device) for s in ((E, I, H), (E, I, H), (E, H, I))]


def _x(rows=4, device="cpu"):
    return torch.randn(rows, H, generator=torch.Generator().manual_seed(1)).to(device)


@pytest.mark.parametrize("offsets, message", [
    ([0, 2, 3], "offsets[2]: expected 4 (every row of x belongs to an expert), got 3"),
    ([0, 3, 2], "offsets[2]: expected >= offsets[1] = 3 (offsets do not decrease), got 2"),
    ([1, 2, 4], "offsets[0]: expected 0 (the first row), got 1"),
    ([-1, 2, 4], "offsets[0]: expected 0 (the first row), got -1"),
    ([0, 2, 5], "offsets[2]: expected 4 (every row of x belongs to an expert), got 5"),
])
@pytest.mark.parametrize("grad", [True, False])
def test_host_offsets_that_do_not_partition_the_rows(offsets, message, grad):
    # rudnn.torch runs the training forward where a gradient is needed, the inference one otherwise
    op = "SwiGluExperts.forward_dispatched_training" if grad else "SwiGluExperts.forward_dispatched"
    gate, up, down = _weights()
    x = _x().requires_grad_(grad)
    with pytest.raises(rudnn.ArgumentError) as info:
        rt.moe.swiglu_experts(x, torch.tensor(offsets, dtype=torch.int32), gate, up, down)
    assert str(info.value) == f"{op}: {message}"


def test_training_backward_checks_offsets_too():
    gate, up, down = _weights()
    x = _x()
    good = torch.tensor([0, 2, 4], dtype=torch.int32)
    gate.requires_grad_()
    y = rt.moe.swiglu_experts(x, good, gate, up, down)
    y.sum().backward()  # good offsets: fine
    with pytest.raises(rudnn.ArgumentError, match=r"MoeTrainingCache.backward: offsets\[1\]: expected >= offsets\[0\]"):
        moe._experts_backward(gate.detach(), up, down, torch.ones_like(x), x,
                              torch.tensor([0, -1, 4], dtype=torch.int32), torch.zeros(4, I), torch.zeros(4, I), 0,
                              None)


@pytest.mark.cuda
def test_device_offsets_leave_no_row_unwritten():
    gate, up, down = _weights("cuda")
    x = _x(device="cuda")
    # poison the allocator's memory so that an unwritten row would show
    torch.full((1 << 20,), 1234.5, device="cuda")
    y = rt.moe.swiglu_experts(x, torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda"), gate, up, down)
    assert torch.equal(y[3].cpu(), torch.zeros(H))
    ref = rt.moe.swiglu_experts(x[:3].cpu(), torch.tensor([0, 2, 3], dtype=torch.int32), *(w.cpu() for w in
                                                                                          (gate, up, down)))
    torch.testing.assert_close(y[:3].cpu(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [2, -1, 7])
def test_dispatch_refuses_expert_ids_out_of_range(bad):
    x = torch.randn(3, H)
    ids = torch.tensor([[0, 1], [1, bad], [0, 1]], dtype=torch.int32)
    with pytest.raises(rudnn.ArgumentError) as info:
        rt.moe.dispatch(x, ids, E)
    assert str(info.value) == f"moe.dispatch: expert_indices[1, 1]: expected an expert id in [0, {E}), got {bad}"



@pytest.mark.cuda
@pytest.mark.parametrize("bad", [2, -1, 7])
def test_dispatch_of_device_ids_out_of_range_gives_nan_tokens(bad):
    # Device ids are not read on the host: the slot gets no row, the token is NaN (documented),
    # the other tokens are exact.
    x = torch.randn(3, H, device="cuda")
    ids = torch.tensor([[0, 1], [1, bad], [0, 1]], dtype=torch.int32, device="cuda")
    w = torch.rand(3, 2, device="cuda")
    y, offsets, token_of_row, row_of_slot = rt.moe.dispatch(x, ids, E)
    assert int(offsets[-1]) == 5 and int(row_of_slot[1, 1]) == -1
    assert sorted(token_of_row[:5].tolist()) == [0, 0, 1, 2, 2]
    out = rt.moe.combine(y, row_of_slot, w)
    dx = rt.moe.dispatch_backward(y, row_of_slot)
    assert torch.isnan(out[1]).all() and torch.isnan(dx[1]).all()
    good = [0, 2]
    torch.testing.assert_close(out[good], (w[good, :, None] * x[good, None, :]).sum(1))
    torch.testing.assert_close(dx[good], 2 * x[good])
    _, dweights = rt.moe.combine_backward(y, torch.ones(3, H, device="cuda"), row_of_slot, w)
    assert torch.isnan(dweights[1, 1]) and not torch.isnan(dweights[good]).any()

def test_combine_refuses_rows_outside_y():
    y = torch.randn(6, H)
    w = torch.rand(3, 2)
    rows = torch.tensor([[0, 1], [2, 6], [4, 5]], dtype=torch.int32)
    with pytest.raises(rudnn.ArgumentError) as info:
        rt.moe.combine(y, rows, w)
    assert str(info.value) == "moe.combine: row_of_slot[1, 1]: expected a row of y in [0, 6), got 6"
    # y with too few rows for the slots: the first row it lacks is named
    with pytest.raises(rudnn.ArgumentError, match=r"moe.combine: row_of_slot\[1, 1\]: expected a row of y in \[0, 5\), got 5"):
        rt.moe.combine(y[:5], rows.clamp(max=5), w)
    rows[1, 1] = -1
    with pytest.raises(rudnn.ArgumentError, match=r"moe.combine_backward: row_of_slot\[1, 1\]: .* got -1"):
        moe._combine_backward(y, torch.randn(3, H), rows, w, 0, None)


def test_combine_backward_refuses_a_row_named_twice():
    # Found by the fuzz suite (tests/fuzz/driver.py, family moe_experts): combine_backward writes
    # dy[r] from the one slot naming row r, so two slots on one row gave the gradient of one of
    # them (the CPU backend: the last; 9.5 off torch autograd) instead of their sum. Host rows
    # must be distinct, as every dispatch makes them; nothing is written on refusal.
    y, w, dout = torch.randn(6, H), torch.rand(3, 2), torch.randn(3, H)
    rows = torch.tensor([[0, 1], [2, 3], [4, 1]], dtype=torch.int32)
    plan = moe.RoutingPlan(torch.zeros(3, 2, dtype=torch.int32), w, E, scoring="softmax", renormalize=True, scale=1.0)
    d = moe.DispatchedTokens(plan, y, None, None, rows)
    for strategy in ("plane", "serial"):
        with pytest.raises(rudnn.ArgumentError) as info:
            d.combine_backward(y, dout, strategy)
        assert str(info.value) == ("moe.combine_backward: row_of_slot[2, 1]: row 1 of y is already named by "
                                   "row_of_slot[0, 1] (the rows of a dispatch are distinct)")
    # combine and dispatch_backward are gathers: a repeated row is summed, as torch autograd says
    yy = y.double().requires_grad_()
    ref = (w.double()[:, :, None] * yy[rows.long()]).sum(1)
    torch.testing.assert_close(d.combine(y).double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(d.dispatch_backward(y).double(), yy[rows.long()].sum(1), rtol=1e-6, atol=1e-6)
    # distinct rows: dy and dweights are torch autograd's
    rows[2, 1] = 5
    dy, dweights = d.combine_backward(y, dout, "serial")
    ww = w.double().requires_grad_()
    gy, gw = torch.autograd.grad((ww[:, :, None] * yy[rows.long()]).sum(1), (yy, ww), dout.double())
    torch.testing.assert_close(dy.double(), gy, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dweights.double(), gw, rtol=1e-6, atol=1e-6)


def test_the_torch_and_jax_moe_modules_have_the_same_functions():
    # issue 27 usability: rudnn.torch.moe lacked the backward steps rudnn.jax.moe has
    import rudnn.jax as rj
    assert sorted(rt.moe.__all__) == sorted(rj.moe.__all__)


def test_torch_backward_steps_match_autograd():
    gate, up, down = (w.requires_grad_() for w in _weights())
    x = _x().requires_grad_()
    offsets = torch.tensor([0, 2, 4], dtype=torch.int32)
    y = rt.moe.swiglu_experts(x, offsets, gate, up, down)
    dy = torch.randn_like(y)
    y.backward(dy)
    y2, a, b = rt.moe.swiglu_experts_training(x.detach(), offsets, gate.detach(), up.detach(), down.detach())
    torch.testing.assert_close(y2, y.detach(), rtol=0, atol=0)
    dx, dgate, dup, ddown = rt.moe.swiglu_experts_backward(dy, x.detach(), offsets, gate.detach(), up.detach(),
                                                            down.detach(), a, b)
    for got, want in ((dx, x.grad), (dgate, gate.grad), (dup, up.grad), (ddown, down.grad)):
        torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-5, atol=1e-6)
    rows = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    ys = torch.randn(4, H, requires_grad=True)
    w = torch.rand(2, 2, requires_grad=True)
    out = rt.moe.combine(ys, rows, w)
    dout = torch.randn_like(out)
    out.backward(dout)
    dys, dw = rt.moe.combine_backward(ys.detach(), dout, rows, w.detach())
    torch.testing.assert_close(dys, ys.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dw.to(w.dtype), w.grad, rtol=1e-6, atol=1e-6)
    dxt = rt.moe.dispatch_backward(torch.ones(4, H), rows)
    torch.testing.assert_close(dxt, torch.full((2, H), 2.0))
