"""Benchmark family `gated_delta`: chunked prefill (forward, and forward + backward) and decode
(T = 1) of the gated delta rule, against flash-linear-attention's Triton kernels in the same run.

Shapes follow Qwen3.5 linear attention: H = 16 q/k heads, 32 value heads, K = V = 128, inputs in
the FLA memory layout [B, T, H, K] (rudnn reads them through strided [B, H, T, K] views, no copy).
FLA's kernels take one head count for q, k and v, so the peer gets q and k repeated to the 32
value heads (outside the timed region). The float64 reference is written here from the chunked
form of the recurrence (exact algebra, float64, chunks of 64), independently of both libraries.
Peer: fla.ops.gated_delta_rule (the fla-core wheel, carried to the GPU by bench/fetch_wheels.sh);
when it cannot be imported the rows carry the peer's error and rudnn's time alone. FLA's Triton
compile and autotune happen in the check and the timer's warm-up calls, outside the timed region.

Shapes (issue 26): prefill T in {2k, 8k, 32k} with B in {1, 8}, forward and forward + backward.
FLOPs are the chunk form's (chunks of C = 64: the K Kᵀ, Q Kᵀ, W = T βK, U' = T βV and P U products,
the three state products W S, Q S and Kᵀ U, the blocked triangular inverse), which is what both
chunked implementations compute: about 1.9× the recurrence's 6·K·V per token and head. Rows whose
inputs fit in L2 (B = 1, T = 2048: ~40 MB against the H200's 60 MB) flush L2 before every timed
call of both sides.
"""

from __future__ import annotations

from . import CaseSpec, Prepared, compare, same_precision_floor, torch_dtype, with_env

FAMILY = "gated_delta"
PEER = "flash-linear-attention (Triton)"
BOUND = "compute"
TARGET = (0.0, 2.0)  # SPEC section 8: >= 2x FLA on prefill (H = 16/32, K = V = 128, T = 8k)

HK, HV, D = 16, 32, 128

# (B, T) per op.
_GPU_QUICK = {"chunk_gated_delta_rule": [(1, 8192), (1, 2048)], "chunk_gated_delta_rule_fwd_bwd": [(1, 2048)],
              "gated_delta_rule": [(64, 1)]}
_GPU_MORE = {"chunk_gated_delta_rule": [(1, 32768), (8, 2048), (8, 8192), (8, 32768), (1, 65536)],
             "chunk_gated_delta_rule_fwd_bwd": [(1, 8192), (1, 32768), (8, 2048), (8, 8192)],
             "gated_delta_rule": []}
_L2_BYTES = 60 << 20  # H200
# "<op>[1stage]": forward + backward with RUDNN_GATED_DELTA_BWD_STAGES=1, the chunked backward's state
# passes on one stage of cp.async tiles where they would run two (bench/NOTES.md, "the state passes'
# tiles by cp.async"): both in one run say what the second stage is worth.
_ONE_STAGE = "[1stage]"
_ONE_STAGE_SIZES = {True: [(1, 2048)], False: [(1, 2048), (1, 8192), (8, 8192)]}  # by quick: beside the default rows
# "<op>[wgmma]": the forward with RUDNN_GATED_DELTA_WGMMA=1, the chunked state kernel's products on
# wgmma (Hopper; opt-in until measured, bench/NOTES.md "the state kernel on wgmma"), beside the
# default mma.sync rows of the same sizes. Elsewhere the variable changes nothing.
_WGMMA = "[wgmma]"
_WGMMA_SIZES = {True: [(1, 8192)], False: [(1, 2048), (1, 8192), (1, 32768), (8, 8192)]}
_VARIANTS = {_ONE_STAGE: "RUDNN_GATED_DELTA_BWD_STAGES", _WGMMA: "RUDNN_GATED_DELTA_WGMMA"}
_CPU = {"chunk_gated_delta_rule": [(1, 64)], "chunk_gated_delta_rule_fwd_bwd": [(1, 32)], "gated_delta_rule": [(4, 1)]}


def cases(device: str, quick: bool) -> list:
    table = dict(_GPU_QUICK) if device == "cuda" else dict(_CPU)
    if device == "cuda" and not quick:
        table = {op: table[op] + _GPU_MORE[op] for op in table}
    heads = (HK, HV, D, D) if device == "cuda" else (2, 4, 32, 32)
    if device == "cuda":
        table["chunk_gated_delta_rule_fwd_bwd" + _ONE_STAGE] = _ONE_STAGE_SIZES[quick]
        table["chunk_gated_delta_rule" + _WGMMA] = _WGMMA_SIZES[quick]
    return [CaseSpec(FAMILY, op, (b, t) + heads, "bfloat16") for op, sizes in table.items() for b, t in sizes]


def prepare(spec: CaseSpec, device: str) -> Prepared:
    for suffix, variable in _VARIANTS.items():
        if spec.op.endswith(suffix):
            import dataclasses

            prepared = prepare(dataclasses.replace(spec, op=spec.op[:-len(suffix)]), device)
            prepared.run = with_env(prepared.run, variable, "1")
            prepared.check = with_env(prepared.check, variable, "1")
            return prepared
    return _PREPARE[spec.op](spec, device)


# ---------------------------------------------------------------------------------------------


def chunk_flops(B, T, H, K, V, C=64):
    """FLOPs of the chunked form over B sequences of T tokens and H (value) heads."""
    chunks = -(-T // C)
    per_chunk = 2 * C * C * (3 * K + 2 * V) + 2 * 3 * C * K * V + 2 * C ** 3 // 3
    return B * H * chunks * per_chunk


def reference64(q, k, v, beta, g, scale, initial, precision=None):
    """out, final_state in float64 (or `precision`: the same computation in float32 is the
    same-precision check's yardstick) from the chunked closed form. q, k [B, Hk, T, K]; v [B, Hv, T, V];
    beta, g [B, Hv, T]; initial [B, Hv, K, V]. Within a chunk with cumulative decays G:
    U = (I + L)^-1 (diag(beta) V - diag(beta e^G) K S0), L_ij = beta_i e^(G_i - G_j) k_i.k_j (i > j),
    O = diag(e^G) Q S0 + (e^(G_i - G_j) [i >= j] * Q K^T) U,  S = e^G_last S0 + K^T diag(e^(G_last - G)) U."""
    import torch

    precision = precision or torch.float64
    B, Hk, T, K = q.shape
    Hv = v.shape[1]
    rep = lambda x: x.to(precision).repeat_interleave(Hv // Hk, dim=1)
    q, k = rep(q) * scale, rep(k)
    v, beta, g = v.to(precision), beta.to(precision), g.to(precision)
    S = initial.to(precision).clone()
    out = torch.empty_like(v)
    C = 64
    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        qc, kc, vc, bc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], beta[:, :, c0:c1]
        G = g[:, :, c0:c1].cumsum(-1)
        n = c1 - c0
        diff = G[..., :, None] - G[..., None, :]
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.where(lower, diff, torch.full_like(diff, -torch.inf)).exp()  # e^(G_i - G_j), i >= j
        strict = decay * (~torch.eye(n, dtype=torch.bool, device=q.device))
        L = bc[..., None] * strict * (kc @ kc.transpose(-1, -2))
        I = torch.eye(n, dtype=precision, device=q.device)
        rhs = bc[..., None] * vc - (bc * G.exp())[..., None] * (kc @ S)
        U = torch.linalg.solve_triangular(I + L, rhs, upper=False, unitriangular=True)
        out[:, :, c0:c1] = G.exp()[..., None] * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ U
        S = G[..., -1:, None].exp() * S + kc.transpose(-1, -2) @ ((G[..., -1:] - G).exp()[..., None] * U)
    return out, S


class _Inputs:
    def __init__(self, spec, device):
        import torch
        import torch.nn.functional as F

        B, T, hk, hv, K, V = spec.shape
        dt = torch_dtype(spec.dtype)
        self.torch, self.dt, self.shape = torch, dt, spec.shape
        # FLA layout [B, T, H, D] in memory; q, k L2-normalized as Qwen does before the kernel.
        self.q_bthd = F.normalize(torch.randn(B, T, hk, K, device=device), dim=-1).to(dt)
        self.k_bthd = F.normalize(torch.randn(B, T, hk, K, device=device), dim=-1).to(dt)
        self.v_bthd = torch.randn(B, T, hv, V, device=device).to(dt)
        self.beta_bth = torch.rand(B, T, hv, device=device).sigmoid().to(dt)
        self.g_bth = F.logsigmoid(torch.randn(B, T, hv, device=device) + 2.0)
        self.state = 0.1 * torch.randn(B, hv, K, V, device=device)
        self.scale = K ** -0.5
        # rudnn's view of the same memory: [B, H, T, D] with strides.
        self.args = (self.q_bthd.transpose(1, 2), self.k_bthd.transpose(1, 2), self.v_bthd.transpose(1, 2),
                     self.beta_bth.transpose(1, 2), self.g_bth.transpose(1, 2))
        self.flops = chunk_flops(B, T, hv, K, V)
        s = self.q_bthd.element_size()
        self.bytes = (2 * B * T * hk * K + 2 * B * T * hv * V) * s + B * T * hv * (s + 4) + 2 * B * hv * K * V * 4

    def fla_args(self):
        """FLA inputs: q, k repeated to the value heads (FLA has one head count)."""
        rep = self.shape[3] // self.shape[2]
        return (self.q_bthd.repeat_interleave(rep, 2), self.k_bthd.repeat_interleave(rep, 2), self.v_bthd,
                self.g_bth, self.beta_bth)

    def reference(self):
        return reference64(*self.args[:3], self.args[3], self.args[4], self.scale, self.state)


def _fla():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def _prefill(spec, device):
    import rudnn

    a = _Inputs(spec, device)
    run = lambda: rudnn.chunk_gated_delta_rule(*a.args, a.state, scale=a.scale)

    def peer_fn():
        fla_chunk = _fla()[0]
        q, k, v, g, beta = a.fla_args()
        return lambda: fla_chunk(q, k, v, g, beta, scale=a.scale, initial_state=a.state, output_final_state=True)

    peer = _lazy(peer_fn)

    def check():
        out, final = run()
        out_ref, final_ref = a.reference()
        p = _try(peer)
        p_out = p[0].transpose(1, 2) if p else None
        return [compare("out", out, out_ref, p_out, expect_dtype=a.dt),
                compare("final_state", final, final_ref, p[1] if p else None, expect_dtype=a.torch.float32,
                        floor=1e-5)]

    return Prepared(run=run, peer=peer, check=check, bytes=a.bytes, flops=a.flops, flush_l2=a.bytes < _L2_BYTES,
                    algorithm=_algorithm)


def _decode(spec, device):
    import rudnn

    a = _Inputs(spec, device)
    run = lambda: rudnn.gated_delta_rule(*a.args, a.state, scale=a.scale)

    def peer_fn():
        fla_rec = _fla()[1]
        q, k, v, g, beta = a.fla_args()
        return lambda: fla_rec(q, k, v, g, beta, scale=a.scale, initial_state=a.state, output_final_state=True)

    peer = _lazy(peer_fn)

    def check():
        out, final = run()
        out_ref, final_ref = a.reference()
        return [compare("out", out, out_ref, None, expect_dtype=a.dt),
                compare("final_state", final, final_ref, None, expect_dtype=a.torch.float32, floor=1e-5)]

    B, T, _, hv, K, V = a.shape
    # decode is the recurrence: three K x V products per token and head (S^T k, k u^T, S^T q)
    return Prepared(run=run, peer=peer, check=check, bytes=a.bytes, flops=6 * B * T * hv * K * V, algorithm=_algorithm)


def _fwd_bwd(spec, device):
    import rudnn

    a = _Inputs(spec, device)
    torch = a.torch
    dout = torch.randn(a.args[2].shape, device=device).to(a.dt)
    dfinal = torch.randn(a.state.shape, device=device)

    def run():
        rudnn.chunk_gated_delta_rule(*a.args, a.state, scale=a.scale)
        return rudnn.chunk_gated_delta_rule_backward(dout, *a.args, a.state, dfinal, scale=a.scale)

    def peer_fn():
        fla_chunk = _fla()[0]
        leaves = [t.detach().clone().requires_grad_() for t in a.fla_args()]
        state = a.state.clone().requires_grad_()
        d_o = dout.transpose(1, 2)

        def go():
            o, s = fla_chunk(*leaves, scale=a.scale, initial_state=state, output_final_state=True)
            return torch.autograd.grad((o, s), leaves + [state], (d_o, dfinal))

        return go

    peer = _lazy(peer_fn)

    def reference_grads(precision):
        leaves = [t.detach().to(precision).requires_grad_() for t in a.args] + \
                 [a.state.to(precision).requires_grad_()]
        with torch.enable_grad():
            out, final = reference64(*leaves[:5], a.scale, leaves[5], precision)
            return torch.autograd.grad((out, final), leaves, (dout.to(precision), dfinal.to(precision)))

    def check():
        grads = run()
        ref, same = reference_grads(torch.float64), reference_grads(torch.float32)
        names = ["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"]
        dtypes = [a.dt] * 4 + [torch.float32] * 2
        # The test suite's budget (tests/test_gated_delta.py): the floor plus twice the error of the
        # same computation in float32, the precision the kernels accumulate in.
        return [compare(n, g, r, None, expect_dtype=d, floor=same_precision_floor(g, s, r))
                for n, g, r, s, d in zip(names, grads, ref, same, dtypes)]

    return Prepared(run=run, peer=peer, check=check, bytes=3 * a.bytes, flops=3 * a.flops,
                    flush_l2=a.bytes < _L2_BYTES, algorithm=_algorithm)


def _algorithm():
    import rudnn

    return rudnn.gated_delta_last_algorithm()


def _lazy(make):
    """The peer callable, built on first use (so an import failure is the peer's, not the case's)."""
    cell = []

    def peer():
        if not cell:
            cell.append(make())
        return cell[0]()

    return peer


def _try(fn):
    try:
        return fn()
    except Exception:  # the peer is optional for the check
        return None


_PREPARE = {"chunk_gated_delta_rule": _prefill, "chunk_gated_delta_rule_fwd_bwd": _fwd_bwd,
            "gated_delta_rule": _decode}
