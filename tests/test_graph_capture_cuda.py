"""Decode-size calls captured in a CUDA graph (issue 25: decode must not be host-bound, so the whole
step must be capturable): each op is captured once over fixed input tensors, the inputs are then
overwritten in place with new values and the graph replayed; the replay must give the same bits as an
eager call on the new values, and differ from the captured call's result (so the replay really read
the new inputs). A call that synchronizes the host, allocates outside torch's graph pool or launches
on another stream fails the capture itself. test_source_rules.py checks the first two on the source;
this file checks them on the GPU. Skipped without a GPU."""

import pytest
import torch

import rudnn
from rudnn import moe
from util import rand

pytestmark = pytest.mark.cuda


def replay_matches_eager(fn, inputs, new_values):
    """Capture fn(*inputs); refill inputs with new_values; replay; compare with fn on them eagerly."""
    first = fn(*inputs)  # warm up outside the capture (workspace sizes, lazy module loads)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*inputs)
    captured = captured if isinstance(captured, tuple) else (captured,)
    first = first if isinstance(first, tuple) else (first,)
    for tensor, value in zip(inputs, new_values):
        tensor.copy_(value)
    graph.replay()
    eager = fn(*inputs)
    eager = eager if isinstance(eager, tuple) else (eager,)
    torch.cuda.synchronize()
    assert len(captured) == len(eager)
    for replayed, expected in zip(captured, eager):
        torch.testing.assert_close(replayed, expected, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(captured, first)), "the replay did not read the new inputs"


def pair(shape, dtype, seed):
    """Two different values of one input: the captured one (on the GPU) and the replayed one."""
    return rand(shape, dtype, "cuda", seed=seed), rand(shape, dtype, "cuda", seed=seed + 100)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_norms_and_softmax_capture(dtype):
    (x, x2), (r, r2) = pair((7, 4096), dtype, 1), pair((7, 4096), dtype, 2)
    w = rand((4096,), dtype, "cuda", seed=3)
    b = rand((4096,), dtype, "cuda", seed=4)
    replay_matches_eager(lambda x, r: rudnn.rms_norm(x, w, residual=r), [x, r], [x2, r2])
    replay_matches_eager(lambda x, r: rudnn.layer_norm(x, w, b, residual=r), [x, r], [x2, r2])
    replay_matches_eager(lambda x: rudnn.softmax(x), [x], [x2])


@pytest.mark.parametrize("Hq,Hkv", [(8, 8), (32, 8)])
def test_attention_decode_capture(Hq, Hkv):
    (q, q2) = pair((2, Hq, 1, 128), torch.bfloat16, 5)
    (k, k2), (v, v2) = pair((2, Hkv, 777, 128), torch.bfloat16, 6), pair((2, Hkv, 777, 128), torch.bfloat16, 7)
    replay_matches_eager(lambda q, k, v: rudnn.attention(q, k, v, causal=True, return_lse=True),
                         [q, k, v], [q2, k2, v2])


@pytest.mark.parametrize("fused_gate_up", [False, True])
@pytest.mark.parametrize("T", [1, 4, 64])
def test_moe_layer_decode_capture(T, fused_gate_up):
    E, k, H, I = 16, 4, 256, 128
    gate, up = rand((E, I, H), torch.bfloat16, "cuda", seed=8), rand((E, I, H), torch.bfloat16, "cuda", seed=9)
    down = rand((E, H, I), torch.bfloat16, "cuda", seed=10)
    experts = moe.SwiGluExperts(gate * 0.1, up * 0.1, down * 0.1, fused_gate_up=fused_gate_up)
    (x, x2), (logits, logits2) = pair((T, H), torch.bfloat16, 11), pair((T, E), torch.float32, 12)
    replay_matches_eager(lambda x, logits: experts(x, logits, top_k=k), [x, logits], [x2, logits2])


def _kernels_launched(fn):
    """Names of the GPU activities (kernels, memsets, copies) of one call, by torch's profiler."""
    fn()  # warm up: lazy loads and workspace sizes outside the count
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("fused_gate_up", [False, True])
def test_moe_layer_decode_launches(fused_gate_up):
    """A decode step's MoE layer is a short list of launches that does not grow with the tokens:
    routing 1, the dispatch plan 1 (T * k <= 256 slots: the single-chunk kernel), gather 1, the
    experts' uncovered-rows check 1, per grouped GEMM its group-array kernel and the GEMM (2 x 2),
    the SwiGLU kernel where gate and up are not fused, combine 1: 9 fused and 10 unfused expected
    on Hopper; the bound allows CUTLASS one launch of its own per GEMM."""
    E, k, H, I = 16, 4, 256, 128
    gate, up = rand((E, I, H), torch.bfloat16, "cuda", seed=8), rand((E, I, H), torch.bfloat16, "cuda", seed=9)
    down = rand((E, H, I), torch.bfloat16, "cuda", seed=10)
    experts = moe.SwiGluExperts(gate * 0.1, up * 0.1, down * 0.1, fused_gate_up=fused_gate_up)
    counts = {}
    for T in (1, 64):
        x, logits = rand((T, H), torch.bfloat16, "cuda", seed=11), rand((T, E), torch.float32, "cuda", seed=12)
        names = _kernels_launched(lambda: experts(x, logits, top_k=k))
        counts[T] = len(names)
        assert len(names) <= 12, f"T = {T}: {len(names)} launches: {names}"
    assert counts[1] == counts[64], counts


def test_gated_delta_decode_capture():
    B, H, K, V = 2, 4, 128, 128
    (q, q2), (kk, kk2) = pair((B, H, 1, K), torch.bfloat16, 13), pair((B, H, 1, K), torch.bfloat16, 14)
    (v, v2) = pair((B, H, 1, V), torch.bfloat16, 15)
    beta = torch.full((B, H, 1), 0.5, dtype=torch.bfloat16, device="cuda")
    log_decay = torch.full((B, H, 1), -0.1, dtype=torch.float32, device="cuda")
    (state, state2) = pair((B, H, K, V), torch.float32, 16)
    replay_matches_eager(lambda q, k, v, s: rudnn.gated_delta_rule(q, k, v, beta, log_decay, s, scale=K ** -0.5),
                         [q, kk, v, state], [q2, kk2, v2, state2])
