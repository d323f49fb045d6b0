"""The chunked backward of the gated delta rule (issue 26 item 2), as an algorithm: a float64
torch implementation of exactly the stages the CUDA kernels follow (cpp/src/gated_delta/
chunked_backward.cu, whose comment block derives the formulas), checked against torch autograd
through the token-by-token float64 recurrence of tests/reference/gated_delta.py. This proves the
math before (and independently of) any kernel: several chunk sizes, a partial last chunk, a
nonzero initial state and d(final_state), grouped value heads, varlen, and log decays down to
-inf (the chunked form raises them to -80, problem.hpp: chunked_log_decay).

Stages, per (sequence, value head), chunks of C tokens (the last one padded with zeros):
  prep     per chunk: G = cumsum(g), T = (I + L)^-1, W, U' = T diag(beta) V, P
  forward  over chunks in order: S0 of every chunk (checkpoints), U = U' - W S0
  reverse  over chunks backwards: dS_C (the gradient of the chunk's end state) of every chunk,
           dU = P^T dO + diag(e^(G_last - G)) K dS_C, dS0 = e^(G_last) dS_C + scale (diag(e^G) Q)^T dO - W^T dU
  local    per chunk, from S0, dS_C, U, dU alone: dq, dk (summed over the value heads of a q/k
           head in order), dv, dbeta, dlog_decay."""

import math

import numpy as np

import pytest
import torch

from reference import gated_delta as ref
from test_gated_delta import make_inputs, oracle_grads

FLOOR = -80.0  # problem.hpp: kChunkedLogDecayFloor


def _chunk_tensors(x, b, h, c0, c1, C, width=None):
    """Rows c0..c1-1 of x[b, h] zero padded to C rows (float64)."""
    rows = x[b, h, c0:c1].double()
    pad = C - (c1 - c0)
    shape = (pad,) + tuple(rows.shape[1:])
    return torch.cat([rows, torch.zeros(shape, dtype=torch.float64)])


def chunked_backward(q, k, v, beta, g, scale, state, dout, dfinal, C, cu=None, planted_bug=False):
    """Float64 chunked backward; returns (dq, dk, dv, dbeta, dlog_decay, dinitial_state)."""
    B, Hk, T, K = q.shape
    Hv, V = v.shape[1], v.shape[3]
    group = Hv // Hk
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    N = len(seqs)
    f64 = torch.float64
    dq = torch.zeros(B, Hk, T, K, dtype=f64)
    dk = torch.zeros(B, Hk, T, K, dtype=f64)
    dv = torch.zeros(B, Hv, T, V, dtype=f64)
    dbeta = torch.zeros(B, Hv, T, dtype=f64)
    dg = torch.zeros(B, Hv, T, dtype=f64)
    dinit = torch.zeros(N, Hv, K, V, dtype=f64)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool))
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
    for n, (b, bos, eos) in enumerate(seqs):
        starts = list(range(bos, eos, C))
        for h in range(Hv):
            hk = h // group
            # prep (per chunk, independent of the state)
            prep = []
            for c0 in starts:
                c1 = min(c0 + C, eos)
                Kc, Qc = _chunk_tensors(k, b, hk, c0, c1, C), _chunk_tensors(q, b, hk, c0, c1, C)
                Vc, dOc = _chunk_tensors(v, b, h, c0, c1, C), _chunk_tensors(dout, b, h, c0, c1, C)
                bc = _chunk_tensors(beta, b, h, c0, c1, C)
                gc = _chunk_tensors(g.clamp(min=FLOOR), b, h, c0, c1, C)  # -inf -> -80; NaN stays
                G = torch.cumsum(gc, 0)
                gamma = torch.exp(G)
                w = torch.exp(G[-1] - G)
                Gam = torch.exp((G[:, None] - G[None, :]).masked_fill(~lower, 0.0)) * lower
                L = (bc[:, None] * Gam * (Kc @ Kc.T)) * strict
                Tm = torch.linalg.inv(torch.eye(C, dtype=f64) + L)
                W = Tm @ ((bc * gamma)[:, None] * Kc)
                Up = Tm @ (bc[:, None] * Vc)
                P = scale * Gam * (Qc @ Kc.T)
                prep.append(dict(c0=c0, c1=c1, K=Kc, Q=Qc, V=Vc, dO=dOc, b=bc, G=G, gamma=gamma, w=w, Gam=Gam, L=L,
                                 T=Tm, W=W, Up=Up, P=P))
            # forward over chunks: checkpoints S0 and U
            S = state[n, h].double() if state is not None else torch.zeros(K, V, dtype=f64)
            for c in prep:
                c["S0"] = S
                c["U"] = c["Up"] - c["W"] @ S
                S = torch.exp(c["G"][-1]) * S + c["K"].T @ (c["w"][:, None] * c["U"])
            # reverse over chunks: dS_C and dU, then dinitial
            dS = dfinal[n, h].double() if dfinal is not None else torch.zeros(K, V, dtype=f64)
            for c in reversed(prep):
                c["dSC"] = dS
                c["dU"] = c["P"].T @ c["dO"] + (c["w"][:, None] * c["K"]) @ dS
                dS = (torch.exp(c["G"][-1]) * dS + scale * (c["gamma"][:, None] * c["Q"]).T @ c["dO"]
                      - (0.0 if planted_bug else c["W"].T @ c["dU"]))
            dinit[n, h] = dS
            # local gradients, per chunk
            for c in prep:
                Kc, Qc, Vc, dO, bc, G, gamma, w, Gam, L, Tm, P, S0, dSC, U, dU = (
                    c[x] for x in ("K", "Q", "V", "dO", "b", "G", "gamma", "w", "Gam", "L", "T", "P", "S0", "dSC",
                                   "U", "dU"))
                dX = Tm.T @ dU
                KS, QS, KdS = Kc @ S0, Qc @ S0, Kc @ dSC
                r = Vc - gamma[:, None] * KS
                dP = (dO @ U.T) * lower
                dA = scale * Gam * dP
                dL = -(dX @ U.T) * strict
                D = bc[:, None] * Gam * dL
                dq_c = scale * gamma[:, None] * (dO @ S0.T) + dA @ Kc
                dk_c = (dA.T @ Qc + w[:, None] * (U @ dSC.T) - (bc * gamma)[:, None] * (dX @ S0.T) + D @ Kc
                        + D.T @ Kc)
                dbeta_c = (dX * r).sum(1) + (dL * Gam * (Kc @ Kc.T)).sum(1)
                dw = (KdS * U).sum(1) * w
                dG = (scale * gamma * (dO * QS).sum(1) + (dP * P).sum(1) - (dP * P).sum(0)
                      - bc * gamma * (dX * KS).sum(1) + (dL * L).sum(1) - (dL * L).sum(0) - dw)
                dG[-1] += torch.exp(G[-1]) * (dSC * S0).sum() + dw.sum()
                dg_c = torch.flip(torch.cumsum(torch.flip(dG, [0]), 0), [0])
                # the kernel's form of the same sum: the pairs (i, j >= t) that cancel left out
                E = dP * P + dL * L
                r = scale * gamma * (dO * QS).sum(1) - bc * gamma * (dX * KS).sum(1)
                after = torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0])
                before = torch.cumsum(dw, 0) - dw
                cross = torch.stack([E[t:, :t].sum() for t in range(C)])
                dg_kernel = after + before + cross + torch.exp(G[-1]) * (dSC * S0).sum()
                assert torch.allclose(dg_kernel, dg_c, rtol=1e-9, atol=1e-9 * max(1.0, float(dg_c.abs().max())))
                dg_c = dg_kernel
                c0, c1 = c["c0"], c["c1"]
                m = c1 - c0
                dq[b, hk, c0:c1] += dq_c[:m]
                dk[b, hk, c0:c1] += dk_c[:m]
                dv[b, h, c0:c1] = (bc[:, None] * dX)[:m]
                dbeta[b, h, c0:c1] = dbeta_c[:m]
                dg[b, h, c0:c1] = dg_c[:m]
    return dq, dk, dv, dbeta, dg, (dinit if state is not None else None)


NAMES = ["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"]


def _check(case, C, decay=0.0, cu=None, extreme=False, seed=0, initial=True):
    q, k, v, beta, g, state = make_inputs(*case, torch.float64, seed=seed, decay=decay, cu_seqlens=cu,
                                          initial=initial)
    if extreme:  # very negative log decays, a reset, and one below the chunked floor
        g = g.clone()
        g[..., 1] = -30.0
        g[..., min(5, g.shape[-1] - 1)] = -1e4
        g[..., -1] = -200.0
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    dfinal = torch.randn((len(cu) - 1 if cu else case[0],) + (case[2], case[4], case[5]), generator=gen,
                         dtype=torch.float64)
    ours = chunked_backward(q, k, v, beta, g, 0.37, state, dout, dfinal, C, cu)
    oracle = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.37, cu, torch.float64)
    for name, mine, want in zip(NAMES, ours, oracle):
        if want is None:
            assert mine is None
            continue
        assert torch.isfinite(mine).all(), name
        scale = max(1.0, float(want.abs().max()))
        err = float((mine - want).abs().max())
        assert err <= 1e-9 * scale, f"{name}: max error {err:.3e} (scale {scale:.3e}), C = {C}, case {case}"


# (B, Hk, Hv, T, K, V)
@pytest.mark.parametrize("C", [1, 4, 16, 64])
@pytest.mark.parametrize("case", [(2, 1, 1, 37, 8, 6), (1, 2, 4, 70, 16, 12), (1, 1, 2, 64, 12, 10)])
def test_chunked_backward_algorithm_matches_autograd(case, C):
    _check(case, C, decay=0.0, seed=3)


@pytest.mark.parametrize("decay", [8.0, -6.0])
def test_chunked_backward_algorithm_decays(decay):
    _check((1, 1, 2, 45, 8, 8), 16, decay=decay, seed=4)


@pytest.mark.parametrize("C", [8, 64])
def test_chunked_backward_algorithm_very_negative_log_decays(C):
    _check((1, 1, 2, 40, 8, 8), C, extreme=True, seed=5)


def test_chunked_backward_algorithm_varlen_without_initial_state():
    cu = [0, 5, 5, 6, 40, 57]
    _check((1, 1, 2, 57, 8, 8), 16, cu=cu, seed=6, initial=False)
    _check((1, 2, 2, 57, 8, 8), 4, cu=cu, seed=7)


def test_planted_error_in_the_algorithm_is_caught():
    """The comparison above is not vacuous: dropping the W^T dU term of the reverse state pass
    (dS0 misses the path through U = U' - W S0) is far outside its 1e-9 budget."""
    case = (1, 1, 1, 20, 8, 8)
    q, k, v, beta, g, state = make_inputs(*case, torch.float64, seed=8)
    gen = torch.Generator().manual_seed(9)
    dout = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    oracle = oracle_grads(q, k, v, beta, g, state, dout, None, 0.37, None, torch.float64)
    good = chunked_backward(q, k, v, beta, g, 0.37, state, dout, None, 8)
    assert float((good[0] - oracle[0]).abs().max()) < 1e-9
    bad = chunked_backward(q, k, v, beta, g, 0.37, state, dout, None, 8, planted_bug=True)
    assert max(float((x - y).abs().max()) for x, y in zip(bad[:5], oracle[:5])) > 1e-3


# ---- The library's backward entry: strategy= and the CUDA chunked kernels (chunked_backward.cu) ----

import rudnn  # noqa: E402
from util import DTYPES, assert_close_to_oracle  # noqa: E402


def test_backward_strategy_is_checked_and_the_cpu_computes_the_same_function():
    q, k, v, beta, g, state = make_inputs(1, 1, 2, 20, 8, 8, torch.float32, seed=12)
    dout = torch.randn(v.shape, generator=torch.Generator().manual_seed(13))
    with pytest.raises(ValueError, match="strategy"):
        rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, scale=0.3, strategy="fast")
    runs = [rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, scale=0.3, strategy=s)
            for s in ("auto", "chunked", "recurrent")]
    assert rudnn.gated_delta_last_algorithm() == "cpu"
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


# (B, Hk, Hv, T, K, V, chunk_size, cu_seqlens, layout): several chunks with a partial last one,
# grouped value heads, V over several 32-column slices, varlen, the [B, T, H, X] layout.
CUDA_CASES = [(1, 1, 1, 300, 64, 64, 64, None, "bhtk"), (2, 2, 4, 261, 32, 72, 64, None, "bhtk"),
              (1, 1, 2, 200, 16, 24, 16, None, "bthk"), (1, 2, 4, 333, 128, 128, 64, [0, 100, 100, 101, 333], "bhtk"),
              (1, 1, 2, 150, 48, 40, 32, [0, 7, 150], "bthk")]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "x".join(map(str, c[:7])) + ("_varlen" if c[7] else "")
                         + "_" + c[8])
def test_cuda_chunked_backward_against_autograd_and_cpu(case, dtype):
    B, Hk, Hv, T, K, V, C, cu, layout = case
    q, k, v, beta, g, state = make_inputs(B, Hk, Hv, T, K, V, dtype, "cuda", decay=1.0, layout=layout, seed=T,
                                          cu_seqlens=cu)
    gen = torch.Generator().manual_seed(T + 1)
    dout = torch.randn(v.shape, generator=gen).to(dtype).to("cuda")
    dfinal = torch.randn(state.shape, generator=gen).to("cuda")
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
    run = lambda strategy: rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, dfinal, scale=K ** -0.5,
                                                                 chunk_size=C, cu_seqlens=cu_t, strategy=strategy)
    ours = run("chunked")
    assert rudnn.gated_delta_last_algorithm() == "chunked_backward"
    again = run("chunked")
    for a, b in zip(ours, again):  # fixed-order sums: bitwise reproducible
        assert torch.equal(a, b)
    g64 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, K ** -0.5, cu, torch.float64)
    g32 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, K ** -0.5, cu, torch.float32)
    # (No CPU-backend check here: its token-serial float32 recurrence is not this test's subject,
    # and at T = 333 its dlog_decay error, 1.2x the budget below in 16-bit cases, would fail a
    # correct GPU run; the emulation tests compare the kernels with it.)
    for name, mine, o64, o32, x in zip(NAMES, ours, g64, g32, (q, k, v, beta, g, state)):
        assert mine.dtype == x.dtype and mine.shape == x.shape, name
        assert_close_to_oracle(mine, o32.to(x.dtype), o64, f"{name} {case}")


@pytest.mark.cuda
def test_cuda_backward_auto_picks_by_length_and_strategy_forces_either():
    def run(T, strategy="auto", K=64):
        q, k, v, beta, g, state = make_inputs(1, 1, 2, T, K, 32, torch.bfloat16, "cuda", seed=T)
        dout = torch.randn(v.shape, device="cuda").to(torch.bfloat16)
        rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, scale=0.2, strategy=strategy)
        return rudnn.gated_delta_last_algorithm()

    assert run(64) == "recurrent_backward"
    assert run(300) == "chunked_backward"
    assert run(300, "recurrent") == "recurrent_backward"
    assert run(64, "chunked") == "chunked_backward"
    assert run(300, K=192) == "recurrent_backward"  # K > 128: the chunked backward does not apply
    with pytest.raises(NotImplementedError, match="chunked backward"):
        run(300, "chunked", K=192)


def test_backward_strategy_in_the_torch_and_jax_entries():
    """rudnn.torch takes the same strategy= (a custom-op argument); JAX arrays take "auto" only."""
    import rudnn.torch as rt

    q, k, v, beta, g, state = make_inputs(1, 1, 2, 12, 8, 8, torch.float32, seed=14)
    dout = torch.randn(v.shape, generator=torch.Generator().manual_seed(15))
    want = rudnn.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, scale=0.3)
    for strategy in ("auto", "chunked", "recurrent"):
        got = rt.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, scale=0.3, strategy=strategy)
        for a, b in zip(want, got):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="strategy"):
        rt.chunk_gated_delta_rule_backward(dout, q, k, v, beta, g, state, scale=0.3, strategy="fast")
    jax = pytest.importorskip("jax")
    cpu = jax.devices("cpu")[0]  # committed there: the CPU backend's function, as `want`
    args = [jax.device_put(t.numpy(), cpu) for t in (dout, q, k, v, beta, g, state)]
    got = rudnn.chunk_gated_delta_rule_backward(*args, scale=0.3)
    for a, b in zip(want, got):
        assert np.allclose(np.asarray(b), a.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(NotImplementedError, match="only 'auto'"):
        rudnn.chunk_gated_delta_rule_backward(*args, scale=0.3, strategy="chunked")
