"""Naive reference of the gated delta rule, written from the recurrence (SPEC section 5):
token by token, per value head, in the dtype asked for (float64 for the oracle). Differentiable
with torch autograd, which gives the backward oracle."""

import torch


def gated_delta_rule(q, k, v, beta, log_decay, scale, initial_state=None, cu_seqlens=None, dtype=torch.float64):
    """q, k [B, Hk, T, K]; v [B, Hv, T, V]; beta, log_decay [B, Hv, T]; states [N, Hv, K, V].
    Returns (out [B, Hv, T, V], final_state [N, Hv, K, V]) in `dtype`, on the CPU."""
    q, k, v, beta, g = (t.detach().cpu().to(dtype) if not t.requires_grad else t.cpu().to(dtype)
                        for t in (q, k, v, beta, log_decay))
    B, Hk, T, K = q.shape
    Hv, V = v.shape[1], v.shape[3]
    group = Hv // Hk
    if cu_seqlens is None:
        sequences = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(c) for c in cu_seqlens]
        sequences = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    outputs = {}
    finals = []
    for n, (b, bos, eos) in enumerate(sequences):
        heads = []
        for h in range(Hv):
            hk = h // group
            if initial_state is None:
                S = torch.zeros(K, V, dtype=dtype)
            else:
                S = initial_state[n, h].cpu().to(dtype)
            for t in range(bos, eos):
                S = torch.exp(g[b, h, t]) * S                              # S_t = exp(g_t) S_{t-1}
                u = beta[b, h, t] * (v[b, h, t] - S.T @ k[b, hk, t])        # beta_t (v_t - S_t^T k_t)
                S = S + torch.outer(k[b, hk, t], u)                         # S_t += k_t (x) u
                outputs[(b, h, t)] = S.T @ (scale * q[b, hk, t])            # o_t = S_t^T (scale q_t)
            heads.append(S)
        finals.append(torch.stack(heads) if heads else torch.zeros(0, K, V, dtype=dtype))
    zero = torch.zeros(V, dtype=dtype)
    out = torch.stack([torch.stack([torch.stack([outputs.get((b, h, t), zero) for t in range(T)]) if T else
                                    torch.zeros(0, V, dtype=dtype) for h in range(Hv)]) for b in range(B)]) \
        if B else torch.zeros(0, Hv, T, V, dtype=dtype)
    final = torch.stack(finals) if finals else torch.zeros(0, Hv, K, V, dtype=dtype)
    return out, final
