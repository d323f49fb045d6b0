"""rudnn.torch gated delta ops: autograd against torch autograd through the float64 reference,
opcheck (schema, fake tensors, autograd registration), torch.compile."""

import pytest
import torch
from torch.library import opcheck

import rudnn
import rudnn.torch as rt
from test_gated_delta import make_inputs, oracle_grads
from util import DEVICES, DTYPES, assert_close_to_oracle

NAMES = ["q", "k", "v", "beta", "log_decay", "initial_state"]


def _call(entry, args, scale, cu_seqlens=None):
    if entry == "chunk":
        return rt.chunk_gated_delta_rule(*args, scale=scale, chunk_size=16, cu_seqlens=cu_seqlens)
    return rt.gated_delta_rule(*args, scale=scale, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ["chunk", "recurrent"])
@pytest.mark.parametrize("with_state", [True, False])
def test_autograd(device, dtype, entry, with_state):
    inputs = make_inputs(1, 2, 4, 21, 8, 12, dtype, device, seed=41, initial=with_state)
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    out, final = _call(entry, leaves, 0.35)
    gen = torch.Generator().manual_seed(4)
    dout = torch.randn(out.shape, generator=gen).to(dtype).to(device)
    dfinal = torch.randn(final.shape, generator=gen).to(device)
    ((out * dout).sum() + (final * dfinal).sum()).backward()
    g64 = oracle_grads(*inputs, dout, dfinal, 0.35, None, torch.float64)
    g32 = oracle_grads(*inputs, dout, dfinal, 0.35, None, torch.float32)
    for name, leaf, o64, o32 in zip(NAMES, leaves, g64, g32):
        if leaf is None:
            continue
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype, name
        assert_close_to_oracle(leaf.grad, o32.to(leaf.dtype), o64, name)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_final_state_only_varlen(device):
    """A loss on final_state alone (dout is None inside autograd), varlen packing."""
    cu = torch.tensor([0, 4, 4, 13], dtype=torch.int32)
    inputs = make_inputs(1, 1, 2, 13, 8, 8, torch.float32, device, seed=43, cu_seqlens=cu)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    _, final = _call("chunk", leaves, 0.5, cu.to(device))
    dfinal = torch.randn(final.shape, generator=torch.Generator().manual_seed(5)).to(device)
    (final * dfinal).sum().backward()
    dout = torch.zeros(inputs[2].shape)
    g64 = oracle_grads(*inputs, dout, dfinal, 0.5, cu.tolist(), torch.float64)
    g32 = oracle_grads(*inputs, dout, dfinal, 0.5, cu.tolist(), torch.float32)
    for name, leaf, o64, o32 in zip(NAMES, leaves, g64, g32):
        assert_close_to_oracle(leaf.grad, o32, o64, name)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k, v, beta, g, state = make_inputs(1, 1, 2, 9, 8, 4, torch.float32, device, seed=47)
    for t in (q, k, v, beta, g, state):
        t.requires_grad_()
    ops = torch.ops.rudnn
    opcheck(ops.gated_delta_forward.default, (q, k, v, beta, g, state, None, 0.5, 16, 0))
    opcheck(ops.gated_delta_forward.default, (q, k, v, beta, g, None, None, 0.5, 64, 1))
    cu = torch.tensor([0, 3, 9], dtype=torch.int64, device=device)
    opcheck(ops.gated_delta_forward.default, (q, k, v, beta, g, None, cu, 0.5, 16, 0))
    dout = torch.randn(v.shape, device=device)
    plain = [t.detach() for t in (q, k, v, beta, g, state)]
    opcheck(ops.gated_delta_backward.default, (dout, *plain, torch.randn(state.shape, device=device), None, 0.5, 16, 0))
    opcheck(ops.gated_delta_backward.default, (dout, *plain[:5], None, None, None, 0.5, 64, 1))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 2, 10, 16, dtype=torch.bfloat16)
        v = torch.empty(1, 4, 10, 32, dtype=torch.bfloat16)
        beta, g = torch.empty(1, 4, 10, dtype=torch.bfloat16), torch.empty(1, 4, 10)
        cu = torch.empty(4, dtype=torch.int32)
        out, final = torch.ops.rudnn.gated_delta_forward(q, q, v, beta, g, None, cu, 0.25, 64, 0)
        assert out.shape == (1, 4, 10, 32) and out.dtype == torch.bfloat16
        assert final.shape == (3, 4, 16, 32) and final.dtype == torch.float32


def test_torch_compile_cpu():
    def layer(q, k, v, beta, g, state):
        out, final = rt.chunk_gated_delta_rule(q, k, v, beta, g, state, scale=0.5, chunk_size=16)
        return out * 2.0, final

    compiled = torch.compile(layer, fullgraph=True)
    args = make_inputs(1, 1, 2, 12, 8, 8, torch.float32, seed=53)
    got, want = compiled(*args), layer(*args)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_stream_runs_eagerly():
    args = make_inputs(1, 1, 1, 5, 8, 8, torch.float32, seed=59)
    out, final = rt.gated_delta_rule(*args, scale=0.5, stream=0)
    ref_out, ref_final = rudnn.gated_delta_rule(*args, scale=0.5)
    assert torch.equal(out, ref_out) and torch.equal(final, ref_final)
