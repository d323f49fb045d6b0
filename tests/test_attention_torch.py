"""rudnn.torch.attention: custom op with fake implementation, autograd against torch
autograd of the float64 reference, opcheck, torch.compile."""

import pytest
import torch
from torch.library import opcheck

import rudnn
import rudnn.torch as rt
from reference import attention as ref
from util import DEVICES, DTYPES, assert_close_to_oracle, rand


def _qkv(device, dtype=torch.float32, B=2, Hq=4, Hkv=2, Sq=7, Sk=9, D=16):
    q = rand((B, Sq, Hq, D), dtype, device, seed=1).transpose(1, 2)  # [B, S, H, D] memory
    k = rand((B, Sk, Hkv, D), dtype, device, seed=2).transpose(1, 2)
    v = rand((B, Sk, Hkv, D), dtype, device, seed=3).transpose(1, 2)
    return q, k, v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_autograd(device, dtype):
    q, k, v = _qkv(device, dtype)
    bias = rand((4, 1, 9), torch.float32, device, seed=4)
    opts = dict(causal=True, softcap=4.0, window=(5, None), bias=bias)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = rt.attention(*leaves, **opts)
    g = rand(out.shape, dtype, device, seed=5)
    out.backward(g)

    def oracle(dt):
        ls = [t.detach().cpu().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = ref.attention(*ls, dtype=dt, **dict(opts, bias=bias.cpu()))
        o.backward(g.cpu().to(dt))
        return o, [t.grad for t in ls]

    (o64, g64), (osame, gsame) = oracle(torch.float64), oracle(dtype)
    assert_close_to_oracle(out, osame, o64, "out")
    for ours, same, exact, name in zip([t.grad for t in leaves], gsame, g64, ("dq", "dk", "dv")):
        assert ours.dtype == dtype and ours.shape == exact.shape
        assert_close_to_oracle(ours, same, exact, name)


# GQA ratios 8 (decode: one query row) and 1, and rows that see no key (causal, Sq > Sk): out 0,
# lse -inf, and zero gradients for those rows.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("Hq, Hkv, Sq, Sk, opts", [(8, 1, 1, 13, dict(softcap=3.0)), (4, 4, 9, 4, dict(causal=True))],
                         ids=["decode_gqa8", "mha_empty_rows"])
def test_autograd_gqa_decode_and_empty_rows(device, Hq, Hkv, Sq, Sk, opts):
    q, k, v = (t.detach().clone().requires_grad_() for t in _qkv(device, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk))
    out, lse = rt.attention(q, k, v, return_lse=True, **opts)
    g = rand(out.shape, torch.float32, device, seed=6)
    out.backward(g)
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    o64, l64 = ref.attention(*leaves, **opts)
    o64.backward(g.cpu().double())
    torch.testing.assert_close(out.detach().cpu().double(), o64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), l64, rtol=1e-5, atol=1e-5)
    for ours, exact in zip((q.grad, k.grad, v.grad), leaves):
        torch.testing.assert_close(ours.cpu().double(), exact.grad, rtol=1e-5, atol=1e-5)
    empty = Sq - Sk if opts.get("causal") else 0  # query i sees keys j <= i + Sk - Sq
    assert (out[:, :, :empty] == 0).all() and (lse[:, :, :empty] == float("-inf")).all()
    assert (q.grad[:, :, :empty] == 0).all() and torch.isfinite(q.grad).all()


def _packed_leaves(device, Hkv):
    """q [8, 4, 16] and k, v [8, Hkv, 16] (packed rows) that require grad."""
    return tuple(rand((8, h, 16), torch.float32, device, seed=s).requires_grad_()
                 for h, s in ((4, 1), (Hkv, 2), (Hkv, 3)))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_varlen(device):
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32, device=device)
    q, k, v = _packed_leaves(device, Hkv=1)
    out, lse = rt.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, return_lse=True)
    assert lse.shape == (4, 8)
    out.sum().backward()
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    o, _ = ref.attention_varlen(*leaves, cu.cpu(), cu.cpu(), causal=True)
    o.sum().backward()
    for ours, exact in zip((q.grad, k.grad, v.grad), leaves):
        torch.testing.assert_close(ours.cpu().double(), exact.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, k, v = (t.contiguous().requires_grad_() for t in _qkv(device))
    mask = torch.rand(7, 9, device=device) > 0.3
    ops = torch.ops.rudnn
    opcheck(ops.attention_forward.default, (q, k, v, None, None, None, False, -1, -1, None, None, None, "auto"))
    opcheck(ops.attention_forward.default, (q, k, v, mask, None, 0.5, True, 3, 0, 2.0, None, None, "auto"))
    out, lse = rudnn.attention(q.detach(), k.detach(), v.detach(), return_lse=True)
    opcheck(ops.attention_backward.default, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse,
                                             None, None, None, False, -1, -1, None, None, None, "auto", True))
    opcheck(ops.attention_backward.default, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse,
                                             None, None, None, False, -1, -1, None, None, None, "auto", True,
                                             torch.randn_like(lse)))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 5, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 2, 11, 64, dtype=torch.bfloat16)
        v = torch.empty(2, 2, 11, 32, dtype=torch.bfloat16)
        out, lse = torch.ops.rudnn.attention_forward(q, k, v, None, None, None, True, -1, -1, None, None, None, "auto")
        assert out.shape == (2, 8, 5, 32) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 8, 5) and lse.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile(device):
    if device == "cuda":
        pytest.importorskip("triton")  # inductor's GPU code generator

    def block(q, k, v):
        return rt.attention(q * 2.0, k, v, causal=True).sum(-1)

    q, k, v = _qkv(device, D=64)
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v))
    qs = q.detach().clone().requires_grad_()
    compiled(qs, k, v).sum().backward()
    qe = q.detach().clone().requires_grad_()
    block(qe, k, v).sum().backward()
    torch.testing.assert_close(qs.grad, qe.grad)


def test_out_runs_eagerly():
    q, k, v = _qkv("cpu")
    out = torch.empty(2, 4, 7, 16)
    assert rt.attention(q, k, v, out=out) is out
    torch.testing.assert_close(out, rudnn.attention(q, k, v))


def test_errors_are_rudnn_errors():
    """The wrapper's errors are rudnn's (type and message), in eager mode and through autograd."""
    q, k, v = _qkv("cpu", Hq=6, Hkv=4)
    with pytest.raises(rudnn.ShapeError, match="attention: the number of query heads Hq = 6 must be a multiple of "
                                               "the number of key/value heads Hkv = 4"):
        rt.attention(q.requires_grad_(), k, v)
    q, k, v = _qkv("cpu")
    with pytest.raises(rudnn.ArgumentError, match="attention: strategy: expected one of 'auto', 'flash', 'fallback', "
                                                  "'autotune', got 'fast'"):
        rt.attention(q, k, v, strategy="fast")
    with pytest.raises(rudnn.ArgumentError, match=r"attention: softcap: expected a finite value > 0 \(or None\), "
                                                  r"got -1.0"):
        rt.attention(q, k, v, softcap=-1.0)
    with pytest.raises(rudnn.DTypeError, match="attention: v: expected the dtype of q"):
        rt.attention(q, k, v.half())
    with pytest.raises(rudnn.DTypeError, match=r"attention: v: float64 arrays are not taken by rudnn \(its data arrays "
                                               r"are float32, float16, bfloat16; .*\), got float64"):
        rt.attention(q, k, v.double())


def test_bias_that_requires_grad_is_refused():
    """No gradient flows to mask or bias: one that requires grad is an error, not a silently
    untrained parameter; detached (or under no_grad) it is used as given."""
    q, k, v = _qkv("cpu")
    bias = torch.zeros(4, 1, 9, requires_grad=True)
    with pytest.raises(rudnn.UnsupportedError, match=r"rudnn.torch.attention: bias: gradients with respect to bias "
                                                     r"are not computed; pass bias.detach\(\)"):
        rt.attention(q.requires_grad_(), k, v, bias=bias)
    mask = torch.zeros(7, 9, requires_grad=True)
    with pytest.raises(rudnn.UnsupportedError, match="rudnn.torch.attention: mask: gradients with respect to mask"):
        rt.attention(q, k, v, mask=mask)
    torch.testing.assert_close(rt.attention(q, k, v, bias=bias.detach()), rudnn.attention(q.detach(), k, v))
    with torch.no_grad():
        torch.testing.assert_close(rt.attention(q, k, v, bias=bias), rudnn.attention(q.detach(), k, v))


# Empty sizes: the gradient of out.sum() over an empty out arrives as an expanded tensor (every
# stride 0), which an empty array may have. Sk = 0 gives out 0, lse -inf and zero gradients.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B, Hq, Hkv, Sq, Sk", [(0, 4, 2, 5, 7), (2, 4, 2, 0, 7), (2, 0, 2, 5, 7), (2, 4, 2, 5, 0),
                                                (0, 0, 1, 0, 0)], ids=["B0", "Sq0", "Hq0", "Sk0", "all0"])
def test_autograd_empty_sizes(device, B, Hq, Hkv, Sq, Sk):
    q = torch.randn(B, Hq, Sq, 16, device=device, requires_grad=True)
    k = torch.randn(B, Hkv, Sk, 16, device=device, requires_grad=True)
    v = torch.randn(B, Hkv, Sk, 8, device=device, requires_grad=True)
    out, lse = rt.attention(q, k, v, return_lse=True)
    assert out.shape == (B, Hq, Sq, 8) and lse.shape == (B, Hq, Sq)
    assert (out == 0).all() if Sk == 0 else True
    assert (lse == float("-inf")).all() if Sk == 0 else True
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and (t.grad == 0).all()


# With return_lse=True the gradient flows through lse too (as when partial attentions are merged
# by their lse, in ring or split-KV attention): d lse_i / d s_ij = softmax_ij.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use", ["out_and_lse", "lse_only"])
@pytest.mark.parametrize("Hq, Hkv, Sq, Sk, opts", [(4, 2, 7, 9, dict(softcap=3.0, window=(4, None))),
                                                   (4, 4, 9, 4, dict(causal=True))], ids=["gqa", "empty_rows"])
def test_autograd_through_lse(device, use, Hq, Hkv, Sq, Sk, opts):
    q, k, v = (t.detach().clone().requires_grad_() for t in _qkv(device, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk))
    mask = (torch.rand(Sq, Sk, generator=torch.Generator().manual_seed(0)) > 0.2).to(device)
    out, lse = rt.attention(q, k, v, mask=mask, return_lse=True, **opts)
    assert lse.requires_grad
    g, h = rand(out.shape, torch.float32, device, seed=6), rand(lse.shape, torch.float32, device, seed=7)

    def loss(o, l):
        finite = torch.where(torch.isfinite(l), l, torch.zeros_like(l))
        return (finite * h.to(l.device)).sum() + ((o * g.to(o.device)).sum() if use == "out_and_lse" else 0)

    loss(out, lse).backward()
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    loss(*ref.attention(*leaves, mask=mask.cpu(), **opts)).backward()
    for ours, exact, name in zip((q.grad, k.grad, v.grad), leaves, ("dq", "dk", "dv")):
        expected = exact.grad if exact.grad is not None else torch.zeros_like(exact)  # lse does not depend on v
        assert ours.shape == exact.shape, name
        torch.testing.assert_close(ours.cpu().double(), expected, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_through_lse_varlen_and_compiled(device):
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32, device=device)
    q, k, v = _packed_leaves(device, Hkv=2)
    h = rand((4, 8), torch.float32, device, seed=4)

    def loss(a, b, c):
        o, l = rt.attention(a, b, c, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, return_lse=True)
        return o.sum() + (l * h).sum()

    torch.compile(loss, fullgraph=True)(q, k, v).backward()
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    o, l = ref.attention_varlen(*leaves, cu.cpu(), cu.cpu(), causal=True)
    (o.sum() + (l * h.cpu().double()).sum()).backward()
    for ours, exact in zip((q.grad, k.grad, v.grad), leaves):
        torch.testing.assert_close(ours.cpu().double(), exact.grad, rtol=1e-5, atol=1e-5)


def test_compiled_call_with_wrong_ranks_raises_rudnns_error():
    """The fake implementation does not index shapes it was not given: the call's own validation
    reports the problem."""
    q, k, v = _qkv("cpu")
    compiled = torch.compile(lambda a, b, c: rt.attention(a, b, c), fullgraph=True)
    with pytest.raises(rudnn.ShapeError, match=r"attention: q: expected rank 4 \[B, H, S, D\], got shape \[7, 16\]"):
        compiled(q[0, 0], k[0, 0], v[0, 0])
