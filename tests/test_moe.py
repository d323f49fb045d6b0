"""rudnn.moe forward: routing, dispatch/combine and SwiGLU experts against the naive
references of tests/reference/moe.py (float64 oracle; error budget: twice that of the same
computation by torch in the input dtype, plus a few ulps)."""

import numpy as np
import pytest
import torch

import rudnn
from rudnn import moe
from reference import moe as ref
from util import DEVICES, DTYPES, FLOOR, assert_close_to_oracle, rand

# ulp-scale tolerance of a value rounded once to the dtype after float32 arithmetic
ROUNDING = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _experts(E, I, H, dtype, device, seed=10):
    s = 1.0 / H ** 0.5
    return (rand((E, I, H), dtype, device, seed=seed, scale=s), rand((E, I, H), dtype, device, seed=seed + 1, scale=s),
            rand((E, H, I), dtype, device, seed=seed + 2, scale=1.0 / I ** 0.5))


def _assert_weights(ours, ref64, dtype):
    torch.testing.assert_close(ours.cpu().double(), ref64, rtol=ROUNDING[dtype], atol=ROUNDING[dtype] * 1e-2,
                               equal_nan=True)


# ---- routing -------------------------------------------------------------------------------

ROUTE_CASES = [  # (T, E, top_k, renormalize)
    (9, 8, 2, True),      # Mixtral-like
    (6, 128, 8, True),    # Qwen3-MoE-like
    (5, 8, 2, False),
    (4, 5, 5, True),      # top_k = E
    (3, 1, 1, True),      # E = 1
    (1, 7, 3, False),     # one token, odd E
    (0, 8, 2, True),      # no tokens
    (2, 1024, 64, True),  # the largest supported case
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, E, k, renorm", ROUTE_CASES)
def test_route(device, dtype, T, E, k, renorm):
    logits = rand((T, E), dtype, device, seed=T * 31 + E, scale=2.0)
    plan = moe.route(logits, k, renormalize=renorm)
    assert isinstance(plan, moe.RoutingPlan)
    assert plan.expert_indices.dtype == torch.uint32 and tuple(plan.expert_indices.shape) == (T, k)
    assert plan.weights.dtype == dtype and plan.weights.device == logits.device
    idx64, w64 = ref.route_softmax(logits.cpu(), k, renorm)
    assert torch.equal(plan.expert_indices.cpu().long(), idx64)
    _assert_weights(plan.weights, w64, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_route_ties_go_to_the_lower_id(device):
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0], [-1.0, 5.0, -1.0, 5.0, -1.0]],
                          device=device)
    plan = moe.route(logits, 3)
    assert plan.expert_indices.cpu().long().tolist() == [[1, 2, 4], [0, 1, 2], [1, 3, 0]]
    torch.testing.assert_close(plan.weights[1].cpu(), torch.full((3,), 1 / 3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_route_non_finite_rows_give_nan(device, dtype):
    inf = float("inf")
    logits = torch.tensor([[0.5, float("nan"), 1.0, 0.0], [0.5, inf, 1.0, 0.0], [-inf, -inf, -inf, -inf],
                           [-inf, 2.0, -inf, 1.0], [1.0, 2.0, 3.0, 4.0]], dtype=dtype, device=device)
    plan = moe.route(logits, 2)
    w = plan.weights.cpu().float()
    assert torch.isnan(w[:3]).all()
    assert plan.expert_indices[:3].cpu().long().tolist() == [[0, 1]] * 3
    assert not torch.isnan(w[3:]).any()  # -inf logits alone are fine: they get weight 0
    assert plan.expert_indices[3].cpu().long().tolist() == [1, 3]
    idx64, w64 = ref.route_softmax(logits.cpu(), 2, True)
    _assert_weights(plan.weights, w64, dtype)


SIGMOID_CASES = [  # (T, E, groups, selected_groups, top_k, group_top_two, renormalize, scale, bias)
    (6, 256, 8, 4, 8, True, True, 2.5, True),  # DeepSeek-V3-like
    (5, 256, 8, 4, 8, False, True, 2.5, True),
    (4, 64, 8, 3, 6, True, False, 1.0, True),
    (5, 16, 1, 1, 4, True, True, 1.0, False),
    (3, 12, 4, 2, 6, True, True, 0.5, True),   # top_k = all experts of the kept groups
    (2, 6, 6, 2, 2, False, True, 1.0, True),   # one expert per group
    (0, 16, 4, 2, 2, True, True, 1.0, True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, E, G, SG, k, top_two, renorm, scale, with_bias", SIGMOID_CASES)
def test_route_sigmoid_grouped(device, dtype, T, E, G, SG, k, top_two, renorm, scale, with_bias):
    logits = rand((T, E), dtype, device, seed=E + T, scale=2.0)
    bias = rand((E,), torch.float32, device, seed=3, scale=0.2) if with_bias else None
    plan = moe.route_sigmoid_grouped(logits, bias, top_k=k, groups=G, selected_groups=SG, group_top_two=top_two,
                                     renormalize=renorm, scale=scale)
    assert plan.expert_indices.dtype == torch.uint32 and plan.weights.dtype == dtype
    idx64, w64 = ref.route_sigmoid_grouped(logits.cpu(), None if bias is None else bias.cpu(), k, G, SG, top_two,
                                           renorm, scale)
    assert torch.equal(plan.expert_indices.cpu().long(), idx64)
    _assert_weights(plan.weights, w64, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_route_sigmoid_grouped_bias_selects_only(device):
    # Expert 0 has the best score, but a bias moves expert 3 ahead; weights stay sigmoid(logits).
    logits = torch.tensor([[3.0, 0.0, 0.0, 1.0]], device=device)
    bias = torch.tensor([0.0, 0.0, 0.0, 0.5], device=device)
    plan = moe.route_sigmoid_grouped(logits, bias, top_k=1, groups=1, selected_groups=1, renormalize=False)
    assert plan.expert_indices.cpu().long().tolist() == [[3]]
    torch.testing.assert_close(plan.weights.cpu(), torch.sigmoid(torch.tensor([[1.0]])))
    nan_row = torch.tensor([[float("nan"), 0.0, 0.0, 1.0]], device=device)
    plan = moe.route_sigmoid_grouped(nan_row, top_k=2, groups=2, selected_groups=1)
    assert torch.isnan(plan.weights.cpu()).all()


# ---- dispatch and combine -------------------------------------------------------------------

def _check_layout(d, indices, E, x):
    offsets, rows = ref.dispatch_layout(indices.cpu().long(), E)
    assert d.offsets.cpu().tolist() == offsets
    T, k = indices.shape
    assert tuple(d.x.shape) == (T * k, x.shape[1])
    for r, (t, j) in enumerate(rows):
        assert int(d.token_of_row[r]) == t and int(d.row_of_slot[t, j]) == r
    assert torch.equal(d.x.cpu(), x.cpu()[[t for t, _ in rows]])


DISPATCH_CASES = [  # (T, E, k, H)
    (9, 8, 2, 24), (6, 128, 8, 16), (1, 4, 2, 7), (5, 3, 3, 5), (4, 1, 1, 9), (0, 4, 2, 8), (33, 16, 4, 3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, E, k, H", DISPATCH_CASES)
def test_dispatch_combine(device, dtype, T, E, k, H):
    x = rand((T, H), dtype, device, seed=1)
    plan = moe.route(rand((T, E), dtype, device, seed=2), k)
    d = plan.dispatch(x)
    _check_layout(d, plan.expert_indices, E, x)
    y = rand((T * k, H), dtype, device, seed=3)
    out = d.combine(y)
    assert out.dtype == dtype and tuple(out.shape) == (T, H)
    w = plan.weights.cpu().double()
    oracle = torch.zeros(T, H, dtype=torch.float64)
    same = torch.zeros(T, H, dtype=dtype)
    for t in range(T):
        for j in range(k):
            r = int(d.row_of_slot[t, j])
            oracle[t] += w[t, j] * y[r].cpu().double()
            same[t] += plan.weights[t, j].cpu() * y[r].cpu()
    assert_close_to_oracle(out, same, oracle, "combine")


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_many_tokens_on_one_expert_and_empty_experts(device):
    T, E, k, H = 40, 6, 2, 5
    logits = torch.full((T, E), -5.0, device=device)
    logits[:, 4] = 5.0  # every token picks expert 4 first
    logits[::3, 1] = 4.0
    logits[1::3, 0] = 4.0
    logits[2::3, 5] = 4.0
    x = rand((T, H), torch.float32, device)
    plan = moe.route(logits, k)
    d = plan.dispatch(x)
    counts = np.diff(d.offsets.cpu().numpy())
    assert counts.tolist() == [13, 14, 0, 0, 40, 13]
    _check_layout(d, plan.expert_indices, E, x)


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_is_deterministic(device):
    plan = moe.route(rand((300, 16), torch.float32, device, seed=5), 4)
    x = rand((300, 8), torch.float32, device, seed=6)
    a, b = plan.dispatch(x), plan.dispatch(x)
    for name in ("x", "offsets", "token_of_row", "row_of_slot"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


# ---- SwiGLU experts -------------------------------------------------------------------------

def _same_dtype_experts(d, gate, up, down):
    """The expert outputs computed by torch in the input dtype (per-expert matmuls)."""
    x = d.x.cpu()
    y = torch.zeros_like(x)
    off = d.offsets.cpu().tolist()
    for e in range(gate.shape[0]):
        xs = x[off[e]:off[e + 1]]
        h = torch.nn.functional.silu(xs @ gate[e].cpu().T) * (xs @ up[e].cpu().T)
        y[off[e]:off[e + 1]] = h @ down[e].cpu().T
    return y


def _oracle_experts(d, gate, up, down):
    x = d.x.cpu()
    y = torch.zeros(x.shape, dtype=torch.float64)
    off = d.offsets.cpu().tolist()
    for e in range(gate.shape[0]):
        for n in range(off[e], off[e + 1]):
            y[n] = ref.expert(x[n], gate[e].cpu(), up[e].cpu(), down[e].cpu())
    return y


EXPERT_CASES = [  # (T, E, k, H, I)
    (9, 8, 2, 32, 48),    # Mixtral-like (small H, I)
    (6, 128, 8, 16, 8),   # Qwen3-MoE-like
    (5, 4, 2, 13, 7),     # H, I not multiples of 8
    (1, 3, 1, 9, 5),      # one token
    (0, 4, 2, 8, 8),      # no tokens
    (7, 2, 2, 8, 24),     # top_k = E
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", ["auto", "scalar"])
@pytest.mark.parametrize("T, E, k, H, I", EXPERT_CASES)
def test_experts_forward_dispatched(device, dtype, strategy, T, E, k, H, I):
    gate, up, down = _experts(E, I, H, dtype, device)
    experts = moe.SwiGluExperts(gate, up, down)
    plan = moe.route(rand((T, E), dtype, device, seed=4), k)
    d = plan.dispatch(rand((T, H), dtype, device, seed=5))
    y = experts.forward_dispatched(d, strategy=strategy)
    assert y.dtype == dtype and tuple(y.shape) == (T * k, H)
    assert_close_to_oracle(y, _same_dtype_experts(d, gate, up, down), _oracle_experts(d, gate, up, down), "y")


TC_CASES = [  # (T, E, k, H, I): H, I multiples of 8 as TMA needs
    (9, 8, 2, 64, 128),   # Mixtral-like
    (6, 128, 8, 32, 16),  # Qwen3-MoE-like: most experts get no rows
    (1, 4, 2, 16, 8),     # one token
    (300, 4, 1, 128, 64), # long segments: several 128-row tiles per expert
]


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["native", "sm80", "cooperative", "pingpong"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T, E, k, H, I", TC_CASES)
def test_experts_tensor_core(monkeypatch, kernel, dtype, T, E, k, H, I):
    device = "cuda"
    cc = torch.cuda.get_device_capability()
    if cc != (9, 0) and cc[0] != 8:
        pytest.skip("the tensor_core strategy needs sm_80-class or sm_90 GPUs in this build")
    monkeypatch.delenv("RUDNN_MOE_SM80_ON_SM90", raising=False)
    monkeypatch.delenv("RUDNN_MOE_GEMM_SCHEDULE", raising=False)
    if kernel != "native" and cc != (9, 0):
        pytest.skip("'native' already is the sm80 kernel here (no Hopper schedules)")
    if kernel == "sm80":
        monkeypatch.setenv("RUDNN_MOE_SM80_ON_SM90", "1")  # the CUTLASS 2.x grouped kernel on Hopper
    elif kernel != "native":  # the forward GEMMs' tiles forced (native: <= 64 rows per expert take pingpong)
        monkeypatch.setenv("RUDNN_MOE_GEMM_SCHEDULE", kernel)
    gate, up, down = _experts(E, I, H, dtype, device)
    experts = moe.SwiGluExperts(gate, up, down)
    plan = moe.route(rand((T, E), dtype, device, seed=4), k)
    d = plan.dispatch(rand((T, H), dtype, device, seed=5))
    y = experts.forward_dispatched(d, strategy="tensor_core")
    assert_close_to_oracle(y, _same_dtype_experts(d, gate, up, down), _oracle_experts(d, gate, up, down), "y")
    y_train, cache = experts.forward_dispatched_training(d, strategy="tensor_core")
    torch.testing.assert_close(y_train, y, rtol=0, atol=0)
    _, cache_scalar = experts.forward_dispatched_training(d, strategy="scalar")
    assert_close_to_oracle(cache.gate_pre, cache_scalar.gate_pre, cache_scalar.gate_pre.double().cpu(), "a",
                           scale=cache_scalar.gate_pre.abs().max().item())


@pytest.mark.cuda
def test_tensor_core_refuses_what_it_cannot_do():
    gate, up, down = _experts(4, 8, 12, torch.bfloat16, "cuda")  # H = 12: not a multiple of 8
    experts = moe.SwiGluExperts(gate, up, down)
    d = moe.route(rand((3, 4), torch.bfloat16, "cuda"), 2).dispatch(rand((3, 12), torch.bfloat16, "cuda"))
    with pytest.raises(rudnn.UnsupportedError, match="SwiGluExperts.forward_dispatched: strategy 'tensor_core' needs"):
        experts.forward_dispatched(d, strategy="tensor_core")
    assert experts.forward_dispatched(d).shape == (6, 12)  # "auto" falls back to "scalar"
    gate, up, down = _experts(4, 8, 16, torch.float32, "cuda")
    d = moe.route(rand((3, 4), torch.float32, "cuda"), 2).dispatch(rand((3, 16), torch.float32, "cuda"))
    with pytest.raises(rudnn.UnsupportedError, match="strategy 'tensor_core' needs"):
        moe.SwiGluExperts(gate, up, down).forward_dispatched(d, strategy="tensor_core")


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["scalar", "tensor_core"])
def test_cuda_rows_no_expert_covers_come_out_zero(strategy):
    """Device offsets are not read on the host, so they may not tile the rows: here rows 0-2 come
    before the first expert's and rows 33-39 after the last's. libruDNN writes those rows zero (y,
    a, b of the forward, dx of the backward) in outputs the Python layer allocates without a fill;
    the caching allocator is first handed NaN-filled blocks of those sizes, so rows left unwritten
    would show. The covered rows and the weight gradients are those of the same calls on the
    covered rows alone."""
    if strategy == "tensor_core" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the tensor_core forward and backward both run on sm_90 in this build")
    E, I, H, N, dtype = 4, 64, 64, 40, torch.bfloat16
    gate, up, down = _experts(E, I, H, dtype, "cuda")
    x, dy = rand((N, H), dtype, "cuda", seed=5), rand((N, H), dtype, "cuda", seed=6)
    offsets = torch.tensor([3, 10, 10, 25, 33], dtype=torch.int32, device="cuda")
    code = moe._choice(moe._EXPERTS_STRATEGIES, strategy, "test", "strategy")

    def poison_then(fn):
        nan_blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape in [(N, H), (N, I), (N, I)]]
        del nan_blocks
        return fn()

    y, a, b = poison_then(lambda: moe._experts_forward("forward", gate, up, down, x, offsets, code, True, None))
    dx, dgate, dup, ddown = poison_then(lambda: moe._experts_backward(gate, up, down, dy, x, offsets, a, b, code, None))
    sub_x, sub_offsets = x[3:33].contiguous(), offsets - 3
    y_sub, a_sub, b_sub = moe._experts_forward("forward", gate, up, down, sub_x, sub_offsets, code, True, None)
    dx_sub, *grads_sub = moe._experts_backward(gate, up, down, dy[3:33].contiguous(), sub_x, sub_offsets, a_sub,
                                              b_sub, code, None)
    for name, got, covered in [("y", y, y_sub), ("a", a, a_sub), ("b", b, b_sub), ("dx", dx, dx_sub)]:
        assert torch.equal(got[:3], torch.zeros_like(got[:3])) and torch.equal(got[33:], torch.zeros_like(got[33:])), \
            f"{name}: a row of no expert is not zero"
        torch.testing.assert_close(got[3:33], covered, msg=f"{name}: covered rows")
    for got, want in zip((dgate, dup, ddown), grads_sub):
        torch.testing.assert_close(got, want)


# ---- gate and up interleaved for the fused forward (fused_gate_up) ---------------------------

def _interleaved(gate, up):
    """gate_up written from its definition: per expert, 64-row blocks of gate and of up alternate."""
    E, I, H = gate.shape
    blocks = (gate.reshape(E, I // 64, 64, H), up.reshape(E, I // 64, 64, H))
    return torch.stack(blocks, dim=2).reshape(E, 2 * I, H)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("E, I, H", [(E, I, H) for E in (1, 3) for I in (64, 192) for H in (8, 40)])
def test_interleave_gate_up(device, dtype, E, I, H):
    gate, up = rand((E, I, H), dtype, device, seed=1), rand((E, I, H), dtype, device, seed=2)
    gate_up = moe.interleave_gate_up(gate, up)
    assert gate_up.dtype == dtype and gate_up.device == gate.device and tuple(gate_up.shape) == (E, 2 * I, H)
    assert torch.equal(gate_up.cpu(), _interleaved(gate.cpu(), up.cpu()))


def test_interleave_gate_up_numpy_and_empty():
    rng = np.random.default_rng(0)
    gate, up = rng.standard_normal((2, 128, 5)).astype(np.float16), rng.standard_normal((2, 128, 5)).astype(np.float16)
    gate_up = moe.interleave_gate_up(gate, up)
    assert isinstance(gate_up, np.ndarray) and gate_up.dtype == np.float16
    assert np.array_equal(gate_up, _interleaved(torch.from_numpy(gate), torch.from_numpy(up)).numpy())
    for shape in ((0, 64, 8), (2, 0, 8), (2, 64, 0)):
        assert moe.interleave_gate_up(torch.zeros(shape), torch.zeros(shape)).shape == (shape[0], 2 * shape[1],
                                                                                      shape[2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_gate_up_on_the_cpu_changes_nothing(dtype):
    # The CPU backend reads gate and up and ignores gate_up: the same bits as without it.
    T, E, k, H, I = 9, 4, 2, 16, 128
    gate, up, down = _experts(E, I, H, dtype, "cpu")
    plain, fused = moe.SwiGluExperts(gate, up, down), moe.SwiGluExperts(gate, up, down, fused_gate_up=True)
    assert plain.gate_up is None
    assert torch.equal(fused.gate_up, _interleaved(gate, up))
    x, logits = rand((T, H), dtype, seed=5), rand((T, E), dtype, seed=4)
    d = moe.route(logits, k).dispatch(x)
    assert torch.equal(fused.forward_dispatched(d), plain.forward_dispatched(d))
    assert torch.equal(fused(x, logits, top_k=k), plain(x, logits, top_k=k))
    (y_fused, cache_fused), (y_plain, cache_plain) = fused.forward_dispatched_training(d), \
        plain.forward_dispatched_training(d)
    assert torch.equal(y_fused, y_plain) and torch.equal(cache_fused.gate_pre, cache_plain.gate_pre)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("misaligned", [False, True])
def test_interleave_gate_up_cuda_matches_the_cpu(dtype, misaligned):
    E, I, H = 3, 192, 40
    gate, up = rand((E, I, H), dtype, "cuda", seed=1), rand((E, I, H), dtype, "cuda", seed=2)
    if misaligned:  # dense views one element past a 16-byte boundary (the 2-D copies take any alignment)
        gate = torch.cat([gate.new_zeros(1), gate.reshape(-1)])[1:].view(E, I, H)
        up = torch.cat([up.new_zeros(1), up.reshape(-1)])[1:].view(E, I, H)
    assert torch.equal(moe.interleave_gate_up(gate, up).cpu(), moe.interleave_gate_up(gate.cpu(), up.cpu()))


VARIANTS_NOT_BUILT = "this libruDNN was built without the MoE GEMM variants"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T, E, k, H, I", [
    (300, 8, 2, 256, 128),  # ~75 rows per expert: partial row tiles, two h tiles
    (300, 4, 1, 40, 192),   # H = 40: a partial, zero-filled K tile; I = 192: a partial N tile unfused
    (1, 4, 2, 16, 64),      # decode: two rows, most experts empty
    (600, 4, 1, 72, 320),   # ~150 rows per expert: two row tiles
])
def test_fused_gate_up_tensor_core_is_bitwise_the_unfused_result(dtype, T, E, k, H, I, monkeypatch):
    # The fused epilogue rounds a and b to the dtype before the SwiGLU, as the unfused path stores them.
    monkeypatch.delenv("RUDNN_MOE_SM80_ON_SM90", raising=False)
    cc = torch.cuda.get_device_capability()
    if cc != (9, 0) and cc[0] != 8:
        pytest.skip("the tensor_core strategy needs sm_80-class or sm_90 GPUs in this build")
    gate, up, down = _experts(E, I, H, dtype, "cuda")
    plain, fused = moe.SwiGluExperts(gate, up, down), moe.SwiGluExperts(gate, up, down, fused_gate_up=True)
    assert torch.equal(fused.gate_up.cpu(), moe.interleave_gate_up(gate.cpu(), up.cpu()))
    logits = rand((T, E), dtype, "cuda", seed=4)
    logits[:, 0] = -1e4  # expert 0 gets no rows: an empty group in both GEMMs
    d = moe.route(logits, k).dispatch(rand((T, H), dtype, "cuda", seed=5))
    assert int(d.offsets[1]) == 0
    y_plain = plain.forward_dispatched(d, strategy="tensor_core")
    assert moe.last_algorithm() == "tensor_core"
    y_fused = fused.forward_dispatched(d, strategy="tensor_core")
    assert moe.last_algorithm() == ("tensor_core_fused" if cc == (9, 0) else "tensor_core")
    assert_close_to_oracle(y_fused, _same_dtype_experts(d, gate, up, down), _oracle_experts(d, gate, up, down), "y")
    assert torch.equal(y_fused, y_plain)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T, E, k, H, I", [
    (300, 8, 2, 256, 128),  # ~75 rows per expert: two 64-row tiles, one 128-row tile
    (5, 16, 4, 40, 192),    # ~1 row per expert, H = 40 (a partial K tile), empty experts
    (200, 2, 1, 72, 64),    # ~100 rows per expert, one partial N tile in the down projection
])
def test_forward_gemm_schedules_agree_bitwise(dtype, T, E, k, H, I, monkeypatch):
    # 64-row ping-pong and 128-row cooperative tiles (alone or in multicast clusters) issue the same
    # m64n128k16 wgmma for each output element over the same K order and round once in the epilogue:
    # the same bits, fused or not. The variants (multicast; pingpong_wide: 128x128 ping-pong tiles for
    # the nt GEMMs, the same wgmma sequence per tile) exist in builds with
    # -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON (bench/gpu_check.sh's); the cases put a single N tile (2I = 128,
    # H = 72) in a 1x2 cluster whose second CTA has no tile, and experts with no rows.
    monkeypatch.delenv("RUDNN_MOE_SM80_ON_SM90", raising=False)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the forward GEMM schedules are Hopper's (sm_90)")
    gate, up, down = _experts(E, I, H, dtype, "cuda")
    d = moe.route(rand((T, E), dtype, "cuda", seed=4), k).dispatch(rand((T, H), dtype, "cuda", seed=5))
    oracle, same = _oracle_experts(d, gate, up, down), _same_dtype_experts(d, gate, up, down)
    for fused in (False, True):
        experts = moe.SwiGluExperts(gate, up, down, fused_gate_up=fused)
        y = {}
        for schedule in ("cooperative", "pingpong", "multicast", "pingpong_wide"):
            monkeypatch.setenv("RUDNN_MOE_GEMM_SCHEDULE", schedule)
            try:
                y[schedule] = experts.forward_dispatched(d, strategy="tensor_core")
            except rudnn.UnsupportedError as e:
                if schedule not in ("multicast", "pingpong_wide") or VARIANTS_NOT_BUILT not in str(e):
                    raise
                continue
            assert_close_to_oracle(y[schedule], same, oracle, f"y ({schedule}, fused={fused})")
        for schedule in y:
            assert torch.equal(y["cooperative"], y[schedule]), f"{schedule}, fused={fused}"


def _layer_check(out, x, logits, gate, up, down, indices, dtype, **route_opts):
    oracle = ref.moe_layer(x.cpu(), logits.cpu(), gate.cpu(), up.cpu(), down.cpu(), indices.cpu().long(),
                           **route_opts)
    same = ref.moe_layer(x.cpu(), logits.cpu(), gate.cpu(), up.cpu(), down.cpu(), indices.cpu().long(),
                         dtype=dtype, **route_opts)
    assert out.dtype == dtype
    assert_close_to_oracle(out, same, oracle, "moe layer")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, E, k, H, I, renorm", [(12, 8, 2, 32, 40, True), (5, 128, 8, 16, 8, True),
                                                   (4, 6, 3, 11, 13, False)])
def test_moe_layer(device, dtype, T, E, k, H, I, renorm):
    gate, up, down = _experts(E, I, H, dtype, device)
    x = rand((T, H), dtype, device, seed=6)
    logits = rand((T, E), dtype, device, seed=7)
    out = moe.SwiGluExperts(gate, up, down)(x, logits, top_k=k, renormalize=renorm)
    idx, _ = ref.route_softmax(logits.cpu(), k, renorm)
    _layer_check(out, x, logits, gate, up, down, idx, dtype, renormalize=renorm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_layer_sigmoid_grouped(device, dtype):
    T, E, H, I = 4, 256, 16, 8  # DeepSeek-V3-like routing with a small expert size
    gate, up, down = _experts(E, I, H, dtype, device)
    x = rand((T, H), dtype, device, seed=8)
    logits = rand((T, E), dtype, device, seed=9)
    bias = rand((E,), torch.float32, device, seed=10, scale=0.1)
    opts = dict(top_k=8, groups=8, selected_groups=4, scale=2.5)
    out = moe.SwiGluExperts(gate, up, down).forward_sigmoid_grouped(x, logits, bias, **opts)
    idx, _ = ref.route_sigmoid_grouped(logits.cpu(), bias.cpu(), 8, 8, 4, True, True, 2.5)
    _layer_check(out, x, logits, gate, up, down, idx, dtype, scoring="sigmoid", scale=2.5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_inputs(dtype):
    rng = np.random.default_rng(0)
    T, E, k, H, I = 6, 8, 2, 12, 10
    x = rng.standard_normal((T, H)).astype(dtype)
    logits = rng.standard_normal((T, E)).astype(dtype)
    gate = (rng.standard_normal((E, I, H)) / 4).astype(dtype)
    up = (rng.standard_normal((E, I, H)) / 4).astype(dtype)
    down = (rng.standard_normal((E, H, I)) / 4).astype(dtype)
    plan = moe.route(logits, k)
    assert isinstance(plan.expert_indices, np.ndarray) and plan.expert_indices.dtype == np.uint32
    d = plan.dispatch(x)
    assert isinstance(d.offsets, np.ndarray) and d.offsets.dtype == np.int32
    out = d.combine(moe.SwiGluExperts(gate, up, down).forward_dispatched(d))
    assert isinstance(out, np.ndarray) and out.dtype == np.dtype(dtype)
    t = lambda a: torch.from_numpy(a)
    _layer_check(t(out), t(x), t(logits), t(gate), t(up), t(down), t(plan.expert_indices.astype(np.int64)),
                 getattr(torch, dtype))


def test_strided_inputs():
    # Row-strided views of logits and x are read in place (last axis contiguous).
    big_logits = rand((5, 16), torch.float32, seed=1)
    big_x = rand((5, 20), torch.float32, seed=2)
    logits, x = big_logits[:, :8], big_x[:, 3:15]
    gate, up, down = _experts(8, 6, 12, torch.float32, "cpu")
    out = moe.SwiGluExperts(gate, up, down)(x, logits, top_k=2)
    ref_out = moe.SwiGluExperts(gate, up, down)(x.contiguous(), logits.contiguous(), top_k=2)
    assert torch.equal(out, ref_out)


def _five_steps(experts, x, logits, k, renormalize=True, strategy="auto"):
    d = moe.route(logits, k, renormalize).dispatch(x)
    return d.combine(experts.forward_dispatched(d, strategy))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype, logits_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                                   (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("T, E, k, H, I, renorm, fused", [(12, 8, 2, 32, 64, True, False),
                                                        (5, 128, 8, 16, 64, False, True),
                                                        (70, 4, 4, 24, 8, True, False), (0, 6, 3, 8, 64, True, True)])
def test_layer_call_is_the_five_steps_bitwise(device, x_dtype, logits_dtype, T, E, k, H, I, renorm, fused):
    """SwiGluExperts(x, logits) is one call into libruDNN (moe_layer_forward): bitwise the result
    of route -> dispatch -> forward_dispatched -> combine, for logits in another dtype than x, gate
    and up interleaved or not, two chunks of slots (T * k = 280 > 256: the plan's four launches
    on a GPU), no tokens."""
    gate, up, down = _experts(E, I, H, x_dtype, device)
    experts = moe.SwiGluExperts(gate, up, down, fused_gate_up=fused)
    x, logits = rand((T, H), x_dtype, device, seed=6), rand((T, E), logits_dtype, device, seed=7)
    out = experts(x, logits, top_k=k, renormalize=renorm)
    assert out.dtype == x_dtype and tuple(out.shape) == (T, H) and out.device == x.device
    assert torch.equal(out, _five_steps(experts, x, logits, k, renorm))
    if T:
        assert out.abs().sum() > 0  # not a vacuous comparison of zeros


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_call_sigmoid_grouped_is_the_five_steps_bitwise(device, dtype):
    """forward_sigmoid_grouped as one call (moe_layer_forward with DeepSeek-V3 routing) against
    route_sigmoid_grouped -> dispatch -> forward_dispatched -> combine, with and without bias."""
    T, E, H, I = 6, 64, 16, 8
    gate, up, down = _experts(E, I, H, dtype, device)
    experts = moe.SwiGluExperts(gate, up, down)
    x, logits = rand((T, H), dtype, device, seed=8), rand((T, E), dtype, device, seed=9)
    for bias in (rand((E,), torch.float32, device, seed=10, scale=0.1), None):
        opts = dict(top_k=6, groups=8, selected_groups=3, group_top_two=bias is not None, scale=2.5)
        out = experts.forward_sigmoid_grouped(x, logits, bias, **opts)
        d = moe.route_sigmoid_grouped(logits, bias, **opts).dispatch(x)
        assert torch.equal(out, d.combine(experts.forward_dispatched(d))) and out.abs().sum() > 0


def test_layer_call_workspace_and_token_errors():
    """What moe_layer_forward checks beyond its steps: x and logits naming the same tokens, and
    the caller's workspace (size, alignment, dtype)."""
    gate, up, down = _experts(4, 8, 16, torch.float32, "cpu")
    experts = moe.SwiGluExperts(gate, up, down)
    x, logits = rand((5, 16), torch.float32), rand((5, 4), torch.float32, seed=3)
    with pytest.raises(rudnn.ShapeError) as info:
        experts(x, logits[:4], top_k=2)
    assert str(info.value) == "SwiGluExperts: logits: expected [T, E] with T = 5 (the tokens of x), got [4, 4]"
    with pytest.raises(rudnn.ArgumentError) as info:
        experts(x, logits, top_k=5)
    assert str(info.value).startswith("SwiGluExperts: top_k: expected 1 <= top_k <= E (4), got 5"), str(info.value)
    with pytest.raises(rudnn.FrameworkError, match="SwiGluExperts: logits: expected a torch.Tensor"):
        experts(x, None, top_k=2)
    out = torch.empty(5, 16)
    call = lambda workspace: rudnn._C.moe_layer_forward(x, logits, 2, True, gate, up, down, None, 0, out, workspace, 0)
    with pytest.raises(rudnn.ArgumentError) as info:
        call(torch.empty(8, dtype=torch.uint8))
    message = str(info.value)
    assert message.startswith("SwiGluExperts: workspace: expected at least ") and message.endswith(" bytes, got 8")
    need = int(message.split("at least ")[1].split(" ")[0])
    buffer = torch.empty(need + 8, dtype=torch.uint8)
    with pytest.raises(rudnn.ArgumentError, match="SwiGluExperts: workspace: expected an address aligned to 8 bytes"):
        call(buffer[1:need + 1])
    with pytest.raises(rudnn.DTypeError, match="SwiGluExperts: workspace: expected uint8, got float32"):
        call(torch.empty(need, dtype=torch.float32))
    call(buffer[:need])  # enough and aligned: the layer, as the Python call gives it
    assert torch.equal(out, experts(x, logits, top_k=2))


def test_last_algorithm_names_the_strategy_that_ran():
    T, E, k, H, I = 12, 4, 2, 8, 6
    gate, up, down = _experts(E, I, H, torch.float32, "cpu")
    experts = moe.SwiGluExperts(gate, up, down)
    experts(rand((T, H), torch.float32), rand((T, E), torch.float32, seed=3), top_k=k)
    assert moe.last_algorithm() == "cpu"


@pytest.mark.cuda
def test_last_algorithm_on_cuda():
    T, E, k, H, I = 64, 4, 2, 64, 128
    gate, up, down = _experts(E, I, H, torch.bfloat16, "cuda")
    experts = moe.SwiGluExperts(gate, up, down)
    x, logits = rand((T, H), torch.bfloat16, "cuda"), rand((T, E), torch.float32, "cuda", seed=3)
    d = moe.route(logits, k).dispatch(x)
    experts.forward_dispatched(d, strategy="scalar")
    assert moe.last_algorithm() == "scalar"
    cc = torch.cuda.get_device_capability()
    if cc != (9, 0) and cc[0] != 8:
        pytest.skip("the tensor_core strategy needs sm_80-class or sm_90 GPUs in this build")
    experts.forward_dispatched(d, strategy="tensor_core")
    assert moe.last_algorithm() == "tensor_core"
