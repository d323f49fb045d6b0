"""Which products of the chunked gated-delta backward (cpp/src/gated_delta/chunked_backward.cu)
may run on tensor cores without leaving the emulator tests' budgets: a CPU study, no GPU, no
kernel. The stages are those of tests/test_gated_delta_chunked_backward.py (float64), with every
product's result rounded to float32 (float32 accumulation) and, for the chosen groups of
products, its operands rounded first to bf16, f16 or tf32 (one MMA), or split as x = hi + lo
(hi, lo in that format) and multiplied as hi·hi + hi·lo + lo·hi (three MMAs, "x3": CUTLASS's
3xTF32 idea). Inputs are bf16 (the bf16 rows of tests/test_gated_delta_emulation.py's CB_CASES,
seed 7) and each gradient is compared, in its output dtype, with the budget of
assert_close_to_oracle: twice the error of torch autograd through the float32 recurrence plus
FLOOR[dtype] x max|oracle|. Printed: the worst error / budget over the cases, per gradient
(> 1 fails the test).

Product groups:
  prep     K K^T, Q K^T, W = T (beta gamma K), U' = T (beta V)
  fwd      W S0, K^T (w U)                         (the forward state pass)
  rev      P^T dO, K dS_C, (gamma Q)^T dO, W^T dU  (the reverse state pass)
  loc_tdu  dX = T^T dU
  loc_s    K S0, Q S0, K dS_C                      (row terms of dbeta, dlog_decay)
  loc_cc   dO U^T, dX U^T                          (dP and dL)
  loc_ck   dO S0^T, U dS_C^T, dX S0^T              (dq, dk only)
  loc_kk   dA K, dA^T Q, D K, D^T K                (dq, dk only)

    python bench/gated_delta_bwd_precision.py        (~2 minutes on one core)
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_gated_delta import make_inputs, oracle_grads  # noqa: E402
from util import FLOOR, max_abs  # noqa: E402

F64 = torch.float64


def _tf32(x):
    """Round to tf32 (10-bit mantissa, nearest with ties away from zero, as cvt.rna.tf32.f32)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~0x1FFF).view(torch.float32).double()


ROUND = {"f32": lambda x: x.float().double(), "bf16": lambda x: x.to(torch.bfloat16).double(),
         "f16": lambda x: x.half().double(), "tf32": _tf32}


def _product(kind, a, b):
    """a @ b as a kind of MMA would compute it, result rounded to float32."""
    if kind.endswith("x3"):
        r = ROUND[kind[:-2]]
        ah, bh = r(a), r(b)
        al, bl = r(a - ah), r(b - bh)
        return ROUND["f32"](ah @ bh + ah @ bl + al @ bh)
    r = ROUND[kind]
    return ROUND["f32"](r(a) @ r(b))


def chunked_backward(q, k, v, beta, g, scale, state, dout, dfinal, C, cu, kinds):
    """The chunked backward's stages with the products of group s computed as kinds.get(s, "f32")."""
    B, Hk, T, K = q.shape
    Hv, V = v.shape[1], v.shape[3]
    group = Hv // Hk
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    dq, dk = torch.zeros(B, Hk, T, K, dtype=F64), torch.zeros(B, Hk, T, K, dtype=F64)
    dv, dbeta, dg = torch.zeros(B, Hv, T, V, dtype=F64), torch.zeros(B, Hv, T, dtype=F64), torch.zeros(B, Hv, T, dtype=F64)
    dinit = torch.zeros(len(seqs), Hv, K, V, dtype=F64)
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool))
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
    f32 = ROUND["f32"]
    mm = lambda group_name, a, b: _product(kinds.get(group_name, "f32"), a, b)  # noqa: E731

    def rows(x, b, h, c0, c1):
        r = x[b, h, c0:c1].double()
        return torch.cat([r, torch.zeros((C - (c1 - c0),) + tuple(r.shape[1:]), dtype=F64)])

    for n, (b, bos, eos) in enumerate(seqs):
        for h in range(Hv):
            hk = h // group
            chunks = []
            for c0 in range(bos, eos, C):
                c1 = min(c0 + C, eos)
                Kc, Qc, Vc, dO = rows(k, b, hk, c0, c1), rows(q, b, hk, c0, c1), rows(v, b, h, c0, c1), rows(dout, b, h, c0, c1)
                bc = rows(beta, b, h, c0, c1)
                G = torch.cumsum(rows(g.clamp(min=-80.0), b, h, c0, c1), 0)  # float64, as the kernels keep it
                gamma, w = f32(torch.exp(G)), f32(torch.exp(G[-1] - G))
                Gam = f32(torch.exp((G[:, None] - G[None, :]).masked_fill(~lower, 0.0)) * lower)
                L = f32(bc[:, None] * Gam * mm("prep", Kc, Kc.T)) * strict
                Tm = f32(torch.linalg.inv(torch.eye(C, dtype=F64) + L))
                chunks.append(dict(c0=c0, c1=c1, K=Kc, Q=Qc, V=Vc, dO=dO, b=bc, G=G, gamma=gamma, w=w, Gam=Gam, L=L,
                                   T=Tm, W=mm("prep", Tm, f32((bc * gamma)[:, None] * Kc)),
                                   Up=mm("prep", Tm, bc[:, None] * Vc), P=f32(scale * Gam * mm("prep", Qc, Kc.T))))
            S = state[n, h].double() if state is not None else torch.zeros(K, V, dtype=F64)
            for c in chunks:
                c["S0"], c["U"] = S, f32(c["Up"] - mm("fwd", c["W"], S))
                S = f32(torch.exp(c["G"][-1]) * S + mm("fwd", c["K"].T, c["w"][:, None] * c["U"]))
            dS = dfinal[n, h].double()
            for c in reversed(chunks):
                c["dSC"] = dS
                c["dU"] = f32(mm("rev", c["P"].T, c["dO"]) + c["w"][:, None] * mm("rev", c["K"], dS))
                dS = f32(torch.exp(c["G"][-1]) * dS + scale * mm("rev", (c["gamma"][:, None] * c["Q"]).T, c["dO"])
                         - mm("rev", c["W"].T, c["dU"]))
            dinit[n, h] = dS
            for c in chunks:
                Kc, Qc, Vc, dO, bc, G, gamma, w, Gam, L, P, S0, dSC, U, dU = (
                    c[x] for x in ("K", "Q", "V", "dO", "b", "G", "gamma", "w", "Gam", "L", "P", "S0", "dSC", "U", "dU"))
                dX = mm("loc_tdu", c["T"].T, dU)
                KS, QS, KdS = mm("loc_s", Kc, S0), mm("loc_s", Qc, S0), mm("loc_s", Kc, dSC)
                dP = mm("loc_cc", dO, U.T) * lower
                dL = -mm("loc_cc", dX, U.T) * strict
                dA, D = f32(scale * Gam * dP), f32(bc[:, None] * Gam * dL)
                dq_c = scale * gamma[:, None] * mm("loc_ck", dO, S0.T) + mm("loc_kk", dA, Kc)
                dk_c = (mm("loc_kk", dA.T, Qc) + w[:, None] * mm("loc_ck", U, dSC.T)
                        - (bc * gamma)[:, None] * mm("loc_ck", dX, S0.T) + mm("loc_kk", D, Kc) + mm("loc_kk", D.T, Kc))
                dbeta_c = (dX * (Vc - gamma[:, None] * KS)).sum(1) + (dL * Gam * (Kc @ Kc.T)).sum(1)
                dw = (KdS * U).sum(1) * w
                E = dP * P + dL * L
                r = scale * gamma * (dO * QS).sum(1) - bc * gamma * (dX * KS).sum(1)
                after = torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0])
                cross = torch.stack([E[t:, :t].sum() for t in range(C)])
                dg_c = after + torch.cumsum(dw, 0) - dw + cross + torch.exp(G[-1]) * (dSC * S0).sum()
                c0, m = c["c0"], c["c1"] - c["c0"]
                dq[b, hk, c0:c0 + m] += dq_c[:m]
                dk[b, hk, c0:c0 + m] += dk_c[:m]
                dv[b, h, c0:c0 + m] = (bc[:, None] * dX)[:m]
                dbeta[b, h, c0:c0 + m] = dbeta_c[:m]
                dg[b, h, c0:c0 + m] = dg_c[:m]
    return dq, dk, dv, dbeta, dg, dinit


# (B, Hk, Hv, T, K, V, C, cu_seqlens): CB_CASES of tests/test_gated_delta_emulation.py in the
# [B, H, T, X] layout (the layout changes no value)
CASES = [(1, 1, 1, 16, 8, 8, 16, None), (2, 1, 2, 37, 12, 40, 16, None), (1, 2, 4, 70, 16, 12, 8, None),
         (1, 1, 2, 93, 16, 8, 64, None), (1, 2, 4, 57, 8, 8, 8, [0, 5, 5, 6, 40, 57]),
         (1, 1, 2, 70, 128, 40, 64, None)]
NAMES = ["dq", "dk", "dv", "dbeta", "dlog_decay", "dinitial_state"]


def worst_ratios(kinds, dtype=torch.bfloat16):
    worst = dict.fromkeys(NAMES, 0.0)
    for B, Hk, Hv, T, K, V, C, cu in CASES:
        q, k, v, beta, g, state = make_inputs(B, Hk, Hv, T, K, V, dtype, seed=7, cu_seqlens=cu)
        gen = torch.Generator().manual_seed(8)
        dout = torch.randn(v.shape, generator=gen).to(dtype)
        dfinal = torch.randn((B if cu is None else len(cu) - 1, Hv, K, V), generator=gen)
        ours = chunked_backward(q, k, v, beta, g, 0.3, state, dout, dfinal, C, cu, kinds)
        o64 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.3, cu, F64)
        o32 = oracle_grads(q, k, v, beta, g, state, dout, dfinal, 0.3, cu, torch.float32)
        for name, mine, want, peer, x in zip(NAMES, ours, o64, o32, (q, k, v, beta, g, state)):
            budget = 2 * max_abs(peer.to(x.dtype), want) + FLOOR[x.dtype] * max(want.abs().max().item(), 1e-30)
            worst[name] = max(worst[name], max_abs(mine.to(x.dtype), want) / budget)
    return worst


def main():
    local = ["loc_tdu", "loc_s", "loc_cc", "loc_ck", "loc_kk"]
    rest = ["loc_tdu", "loc_s", "loc_cc", "fwd", "rev", "prep"]
    plans = {"all float32": {}}
    for kind in ["bf16", "f16", "tf32"]:
        plans[f"local all {kind}"] = dict.fromkeys(local, kind)
        for group in local + ["fwd", "rev", "prep"]:
            plans[f"{group} {kind}"] = {group: kind}
    plans["dq/dk groups bf16"] = {"loc_ck": "bf16", "loc_kk": "bf16"}
    for split in ["tf32x3", "bf16x3"]:
        plans[f"dq/dk bf16, rest {split}"] = {"loc_ck": "bf16", "loc_kk": "bf16", **dict.fromkeys(rest, split)}
    for name, kinds in plans.items():
        w = worst_ratios(kinds)
        print(f"{name:26s} " + " ".join(f"{k}={v:7.2f}" for k, v in w.items()) + ("  FAIL" if max(w.values()) > 1 else ""),
              flush=True)


if __name__ == "__main__":
    main()
