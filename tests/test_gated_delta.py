"""chunk_gated_delta_rule / gated_delta_rule and their backward against the naive float64
token-by-token recurrence of tests/reference/gated_delta.py (backward: torch autograd through
it). Error budget: twice the error of the same recurrence computed by torch in float32 (rounded
to the output dtype), plus a few ulps."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rudnn
from reference import gated_delta as ref
from util import DEVICES, DTYPES, assert_close_to_oracle

ENTRIES = ["chunk", "recurrent"]

# (B, Hk, Hv, T, K, V)
CASES = [
    (1, 1, 1, 1, 8, 8),        # T = 1 (decode)
    (2, 2, 2, 37, 16, 24),     # T not a multiple of any chunk, K != V
    (1, 2, 4, 70, 32, 16),     # grouped value heads, T > 64
    (3, 1, 3, 16, 8, 32),      # grouped, T equal to a chunk
]
# log_decay = logsigmoid(N(0, 1) + offset): about -3e-4 (almost no decay), -0.8, -6 (strong decay).
DECAYS = [8.0, 0.0, -6.0]


def make_inputs(B, Hk, Hv, T, K, V, dtype, device="cpu", decay=0.0, layout="bhtk", seed=0, initial=True,
                cu_seqlens=None):
    g = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)

    def place(x):  # x is [B, H, T, ...]; "bthk" stores it as [B, T, H, ...] and returns the strided view
        if layout == "bthk":
            return x.transpose(1, 2).contiguous().to(device).transpose(1, 2)
        return x.contiguous().to(device)

    q = place(F.normalize(randn(B, Hk, T, K), dim=-1).to(dtype))
    k = place(F.normalize(randn(B, Hk, T, K), dim=-1).to(dtype))
    v = place(randn(B, Hv, T, V).to(dtype))
    beta = place(torch.sigmoid(randn(B, Hv, T)).to(dtype))
    log_decay = place(F.logsigmoid(randn(B, Hv, T) + decay).float())
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    state = (randn(N, Hv, K, V) * 0.5).float().to(device) if initial else None
    return q, k, v, beta, log_decay, state


def run(entry, q, k, v, beta, g, state, scale, chunk_size=64, cu_seqlens=None):
    if entry == "chunk":
        return rudnn.chunk_gated_delta_rule(q, k, v, beta, g, state, scale=scale, chunk_size=chunk_size,
                                            cu_seqlens=cu_seqlens)
    return rudnn.gated_delta_rule(q, k, v, beta, g, state, scale=scale, cu_seqlens=cu_seqlens)


def check_forward(out, final, q, k, v, beta, g, state, scale, cu_seqlens=None, tensor_cores=False):
    """Budget: torch running the recurrence with a float32 state (rounded to the output dtype).
    With tensor_cores (the CUDA chunked kernel, whose matrix products take f16/bf16 operands),
    torch running the recurrence in the input dtype, as tests/util.py's rule says."""
    cu = None if cu_seqlens is None else cu_seqlens.tolist()
    o64, s64 = ref.gated_delta_rule(q, k, v, beta, g, scale, state, cu, torch.float64)
    peer_dtype = q.dtype if tensor_cores and q.dtype != torch.float32 else torch.float32
    o_peer, s_peer = ref.gated_delta_rule(q, k, v, beta, g, scale, state, cu, peer_dtype)
    assert out.dtype == q.dtype and final.dtype == torch.float32 and out.device == q.device
    assert_close_to_oracle(out, o_peer.to(q.dtype), o64, "out")
    assert_close_to_oracle(final, s_peer.float(), s64, "final_state")


# ---- forward ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", CASES)
def test_forward(device, dtype, entry, case):
    q, k, v, beta, g, state = make_inputs(*case, dtype, device, seed=sum(case))
    before = state.clone()
    scale = case[4] ** -0.5
    out, final = run(entry, q, k, v, beta, g, state, scale)
    assert out.shape == (case[0], case[2], case[3], case[5]) and final.shape == state.shape
    check_forward(out, final, q, k, v, beta, g, state, scale, tensor_cores=entry == "chunk" and device == "cuda")
    assert torch.equal(state, before), "initial_state was written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("chunk_size", [1, 7, 16, 32, 64, 100])
def test_forward_decay_scales_and_chunks(device, decay, chunk_size):
    """T = 75 is no multiple of any chunk size (the last chunk is padded); 100 > T."""
    case = (1, 2, 4, 75, 16, 16)
    q, k, v, beta, g, state = make_inputs(*case, torch.bfloat16, device, decay=decay, seed=3)
    out, final = run("chunk", q, k, v, beta, g, state, 0.25, chunk_size)
    check_forward(out, final, q, k, v, beta, g, state, 0.25, tensor_cores=device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_with_minus_inf_log_decays_resets_the_state(device, entry, dtype):
    """log_decay = -inf (a reset: decay 0) gives the recurrence's result on both paths (issue 27
    item 8: the chunked path returned NaN from that step on, e^(-inf - -inf))."""
    case = (1, 2, 2, 75, 16, 8)
    q, k, v, beta, g, state = make_inputs(*case, dtype, device, seed=9)
    g = g.clone()
    g[:, 0, [0, 5, 6, 63, 64, 74]] = float("-inf")  # a chunk's first and last tokens, and runs of them
    g[:, 1, 30] = -1e30  # finite but past the chunked floor
    out, final = run(entry, q, k, v, beta, g, state, 0.25, 16 if entry == "chunk" else 64)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    check_forward(out, final, q, k, v, beta, g, state, 0.25, tensor_cores=entry == "chunk" and device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("decay", DECAYS)
def test_forward_f32_decays_without_initial_state(device, entry, decay):
    case = (2, 1, 2, 40, 16, 8)
    q, k, v, beta, g, _ = make_inputs(*case, torch.float32, device, decay=decay, seed=5, initial=False)
    out, final = run(entry, q, k, v, beta, g, None, 0.5, 16)
    check_forward(out, final, q, k, v, beta, g, None, 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fla_layout_bthk(device, entry, dtype):
    """[B, T, H, K] memory through strides: same result as the dense [B, H, T, K] layout."""
    case = (2, 2, 4, 70, 16, 8)
    args = make_inputs(*case, dtype, device, layout="bthk", seed=7)
    assert args[0].stride(-2) == 2 * 16 and args[3].stride(-1) == 4  # really the FLA layout
    out, final = run(entry, *args, 0.25, 64)
    check_forward(out, final, *args, 0.25, tensor_cores=entry == "chunk" and device == "cuda")
    dense = [a.contiguous() for a in args]
    out_dense, final_dense = run(entry, *dense, 0.25, 64)
    torch.testing.assert_close(out, out_dense, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)
    torch.testing.assert_close(final, final_dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_varlen(device, entry, dtype, index_dtype):
    """Packed sequences with one state each, including a length-0 and a length-1 sequence."""
    lengths = [5, 0, 1, 70, 17]
    cu = torch.tensor([0] + np.cumsum(lengths).tolist(), dtype=index_dtype)
    T = int(cu[-1])
    q, k, v, beta, g, state = make_inputs(1, 2, 4, T, 16, 8, dtype, device, seed=11, cu_seqlens=cu)
    out, final = run(entry, q, k, v, beta, g, state, 0.25, 64, cu.to(device))
    assert final.shape == (len(lengths), 4, 16, 8)
    check_forward(out, final, q, k, v, beta, g, state, 0.25, cu, tensor_cores=entry == "chunk" and device == "cuda")
    # The length-0 sequence passes its state through unchanged.
    torch.testing.assert_close(final[1], state[1], rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", ["auto", "chunked", "recurrent"])
def test_strategies(device, dtype, strategy):
    """Every kernel of chunk_gated_delta_rule computes the same function. On CUDA the chunked
    (tensor-core) kernel takes float16/bfloat16 only."""
    case = (1, 2, 4, 70, 32, 16)
    q, k, v, beta, g, state = make_inputs(*case, dtype, device, seed=37)
    call = lambda: rudnn.chunk_gated_delta_rule(q, k, v, beta, g, state, scale=0.3, strategy=strategy)
    if device == "cuda" and strategy == "chunked" and dtype == torch.float32:
        with pytest.raises(rudnn.UnsupportedError, match="the CUDA chunked kernel needs chunk_size 64, K <= 128"):
            call()
        return
    out, final = call()
    check_forward(out, final, q, k, v, beta, g, state, 0.3, tensor_cores=device == "cuda" and strategy != "recurrent")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("split", [1, 16, 29])
def test_continuation(device, entry, split):
    """final_state of a prefix passed as the next initial_state equals one long call."""
    q, k, v, beta, g, state = make_inputs(2, 1, 2, 45, 16, 16, torch.float32, device, seed=13)
    out, final = run(entry, q, k, v, beta, g, state, 0.25, 16)
    head = [t[:, :, :split] for t in (q, k, v, beta, g)]
    tail = [t[:, :, split:] for t in (q, k, v, beta, g)]
    out1, s1 = run(entry, *head, state, 0.25, 16)
    out2, s2 = run(entry, *tail, s1, 0.25, 16)
    torch.testing.assert_close(torch.cat([out1, out2], 2), out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s2, final, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps_match_prefill(device):
    """Decoding token by token (T = 1, batch 4) reproduces the chunked prefill."""
    q, k, v, beta, g, state = make_inputs(4, 2, 4, 6, 32, 32, torch.float32, device, seed=17)
    out, final = run("chunk", q, k, v, beta, g, state, 0.2, 64)
    s = state
    for t in range(6):
        o, s = rudnn.gated_delta_rule(*[x[:, :, t:t + 1] for x in (q, k, v, beta, g)], s, scale=0.2)
        torch.testing.assert_close(o[:, :, 0], out[:, :, t], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, final, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    """T = 0 returns the initial state; B = 0 returns empty arrays."""
    q, k, v, beta, g, state = make_inputs(2, 1, 1, 0, 8, 4, torch.float32, device)
    out, final = rudnn.chunk_gated_delta_rule(q, k, v, beta, g, state, scale=1.0)
    assert out.shape == (2, 1, 0, 4) and torch.equal(final, state)
    out, final = rudnn.gated_delta_rule(q, k, v, beta, g, None, scale=1.0)
    assert torch.equal(final, torch.zeros_like(state))
    q, k, v, beta, g, _ = make_inputs(0, 1, 1, 3, 8, 4, torch.float32, device)
    out, final = rudnn.gated_delta_rule(q, k, v, beta, g, scale=1.0)
    assert out.shape == (0, 1, 3, 4) and final.shape == (0, 1, 8, 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_out_argument(device, entry):
    """out= receives the output, also as a strided [B, T, H, V] view."""
    q, k, v, beta, g, state = make_inputs(1, 1, 2, 9, 8, 8, torch.float32, device, seed=19)
    want, _ = run(entry, q, k, v, beta, g, state, 0.3)
    out = torch.full((1, 9, 2, 8), float("nan"), device=device).transpose(1, 2)
    kw = {"chunk_size": 64} if entry == "chunk" else {}
    fn = rudnn.chunk_gated_delta_rule if entry == "chunk" else rudnn.gated_delta_rule
    got, _ = fn(q, k, v, beta, g, state, scale=0.3, out=out, **kw)
    assert got is out and torch.equal(out, want)


def test_numpy():
    q, k, v, beta, g, state = make_inputs(1, 1, 2, 9, 8, 8, torch.float32, seed=19)
    out, final = rudnn.chunk_gated_delta_rule(*(t.numpy() for t in (q, k, v, beta, g, state)), scale=0.3,
                                              chunk_size=4)
    assert isinstance(out, np.ndarray) and isinstance(final, np.ndarray) and out.dtype == np.float32
    check_forward(torch.from_numpy(out), torch.from_numpy(final), q, k, v, beta, g, state, 0.3)


# ---- backward --------------------------------------------------------------------------------

def oracle_grads(q, k, v, beta, g, state, dout, dfinal, scale, cu_seqlens, dtype):
    """Gradients by torch autograd through the reference recurrence computed in `dtype`."""
    leaves = [t.detach().cpu().to(dtype).requires_grad_() for t in (q, k, v, beta, g)]
    s = state.detach().cpu().to(dtype).requires_grad_() if state is not None else None
    out, final = ref.gated_delta_rule(*leaves, scale, s, cu_seqlens, dtype)
    loss = (out * dout.cpu().to(dtype)).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal.cpu().to(dtype)).sum()
    grads = torch.autograd.grad(loss, leaves + ([s] if s is not None else []), allow_unused=True)
    grads = [torch.zeros_like(x) if gr is None else gr for gr, x in zip(grads, leaves + [s])]
    return grads + ([None] if s is None else [])


def check_backward(entry, q, k, v, beta, g, state, dout, dfinal, scale, chunk_size=16, cu_seqlens=None):
    backward = rudnn.chunk_gated_delta_rule_backward if entry == "chunk" else rudnn.gated_delta_rule_backward
    kw = {"chunk_size": chunk_size} if entry == "chunk" else {}
    ours = backward(dout, q, k, v, beta, g, state, dfinal, scale=scale, cu_seqlens=cu_seqlens, **kw)
    cu = None if cu_seqlens is None else cu_seqlens.tolist()
    g64 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, scale, cu, torch.float64)
    g32 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, scale, cu, torch.float32)
    names = ["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"]
    inputs = [q, k, v, beta, g, state]
    for name, mine, o64, o32, x in zip(names, ours, g64, g32, inputs):
        if x is None:
            assert mine is None, f"{name} should be None without initial_state"
            continue
        assert mine.dtype == x.dtype and mine.shape == x.shape, name
        assert_close_to_oracle(mine, o32.to(x.dtype), o64, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", [(1, 1, 1, 1, 8, 8), (2, 1, 2, 23, 8, 12), (1, 2, 4, 40, 16, 8)])
def test_backward(device, dtype, entry, case):
    q, k, v, beta, g, state = make_inputs(*case, dtype, device, seed=23 + sum(case))
    gen = torch.Generator().manual_seed(1)
    dout = torch.randn(v.shape, generator=gen).to(dtype).to(device)
    dfinal = torch.randn(state.shape, generator=gen).to(device)
    check_backward(entry, q, k, v, beta, g, state, dout, dfinal, case[4] ** -0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decay", DECAYS)
def test_backward_decays_no_state_bthk(device, decay):
    q, k, v, beta, g, _ = make_inputs(1, 1, 2, 30, 8, 8, torch.float32, device, decay=decay, layout="bthk",
                                      seed=29, initial=False)
    dout = torch.randn(v.shape, generator=torch.Generator().manual_seed(2)).to(device)
    check_backward("chunk", q, k, v, beta, g, None, dout, None, 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_backward_varlen(device, entry):
    lengths = [3, 0, 1, 20, 70]
    cu = torch.tensor([0] + np.cumsum(lengths).tolist(), dtype=torch.int32)
    q, k, v, beta, g, state = make_inputs(1, 1, 2, int(cu[-1]), 8, 8, torch.float32, device, seed=31,
                                          cu_seqlens=cu)
    gen = torch.Generator().manual_seed(3)
    dout = torch.randn(v.shape, generator=gen).to(device)
    dfinal = torch.randn(state.shape, generator=gen).to(device)
    check_backward(entry, q, k, v, beta, g, state, dout, dfinal, 0.5, cu_seqlens=cu.to(device))


def test_last_algorithm_names_the_backend_that_ran():
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    beta, g = torch.rand(1, 2, 9), -torch.rand(1, 2, 9)
    rudnn.chunk_gated_delta_rule(q, k, v, beta, g, scale=0.3)
    assert rudnn.gated_delta_last_algorithm() == "cpu"


@pytest.mark.cuda
def test_last_algorithm_on_cuda():
    def run(dtype):
        q, k, v = (torch.randn(1, 2, 130, 64, device="cuda").to(dtype) for _ in range(3))
        beta, g = torch.rand(1, 2, 130, device="cuda").to(dtype), -torch.rand(1, 2, 130, device="cuda")
        rudnn.chunk_gated_delta_rule(q, k, v, beta, g, scale=0.3)
        return rudnn.gated_delta_last_algorithm()

    assert run(torch.bfloat16) == "chunked"  # the tensor-core chunked kernels take 16-bit inputs
    assert run(torch.float32) == "recurrent"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["bhtk", "bthk"])
def test_chunked_forward_state_kernel_on_wgmma(monkeypatch, dtype, layout):
    """RUDNN_GATED_DELTA_WGMMA=1 puts the chunked forward's state kernel on wgmma on a compute
    capability 9.0 device (elsewhere it changes nothing): within the tensor-core budget of the
    float64 recurrence, as the mma.sync path is, over several chunks with a partial last one, K = V
    = 128 (both 64-key blocks of K^T) and grouped value heads; varlen through the same kernel."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    q, k, v, beta, g, state = make_inputs(2, 2, 4, 300, 128, 128, dtype, device="cuda", decay=1.0, seed=11,
                                          layout=layout)
    monkeypatch.setenv("RUDNN_GATED_DELTA_WGMMA", "1")
    out, final = rudnn.chunk_gated_delta_rule(q, k, v, beta, g, state, scale=0.3)
    assert rudnn.gated_delta_last_algorithm() == ("chunked_wgmma" if hopper else "chunked")
    check_forward(out.cpu(), final.cpu(), q.cpu(), k.cpu(), v.cpu(), beta.cpu(), g.cpu(), state.cpu(), 0.3,
                  tensor_cores=True)
    cu = torch.tensor([0, 70, 71, 300, 600], device="cuda", dtype=torch.int32)
    flat = [x.transpose(1, 2).reshape(1, 600, *x.shape[1:2], *x.shape[3:]).transpose(1, 2) for x in (q, k, v)]
    fb, fg = (x.transpose(1, 2).reshape(1, 600, x.shape[1]).transpose(1, 2) for x in (beta, g))
    states = torch.cat([state, state])
    out, final = rudnn.chunk_gated_delta_rule(*flat, fb, fg, states, scale=0.3, cu_seqlens=cu)
    assert rudnn.gated_delta_last_algorithm() == ("chunked_wgmma" if hopper else "chunked")
    check_forward(out.cpu(), final.cpu(), *(x.cpu() for x in flat), fb.cpu(), fg.cpu(), states.cpu(), 0.3, cu.cpu(),
                  tensor_cores=True)


@pytest.mark.cuda
def test_chunked_backward_with_one_stage_gives_the_same_bits(monkeypatch):
    """RUDNN_GATED_DELTA_BWD_STAGES=1 holds the chunked backward's state passes to one stage of
    staged tiles (where the device holds two: H100/H200 for 16-bit inputs): the same products in
    the same order, so the same bits; the bench times both."""
    q, k, v, beta, g, state = make_inputs(1, 2, 4, 300, 128, 64, torch.bfloat16, device="cuda", decay=1.0, seed=3)
    dout = torch.randn(v.shape, device="cuda").to(v.dtype)
    dfinal = torch.randn(state.shape, device="cuda")
    run = lambda: rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, dfinal, scale=0.3,
                                                        chunk_size=64, strategy="chunked")
    monkeypatch.delenv("RUDNN_GATED_DELTA_BWD_STAGES", raising=False)
    two = run()
    assert rudnn.gated_delta_last_algorithm() == "chunked_backward"
    monkeypatch.setenv("RUDNN_GATED_DELTA_BWD_STAGES", "1")
    one = run()
    for name, a, b in zip(["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"], two, one):
        assert torch.equal(a, b), name
