"""Naive references for the MoE family, written from the math: loops over tokens and experts,
float64 unless a dtype is passed (the same code run in the input dtype measures what
same-precision arithmetic achieves). Built from differentiable torch ops so that
torch.autograd gives the reference gradients of the whole training chain."""

import math

import torch


def _is_bad_softmax_row(row):
    return bool(torch.isnan(row).any() or torch.isposinf(row).any() or torch.isneginf(row).all())


def _top(keys, k, allowed=None):
    """k indices of the largest keys, ties to the lower index (a stable sort by -key)."""
    order = sorted((i for i in range(len(keys)) if allowed is None or allowed[i]), key=lambda i: (-keys[i], i))
    return order[:k]


def route_softmax(logits, top_k, renormalize):
    """(indices [T, k] int64, weights float64 [T, k]) of softmax top-k routing."""
    T, E = logits.shape
    idx = torch.zeros(T, top_k, dtype=torch.int64)
    w = torch.zeros(T, top_k, dtype=torch.float64)
    for t in range(T):
        row = logits[t].double()
        if _is_bad_softmax_row(row):
            idx[t] = torch.arange(top_k)
            w[t] = float("nan")
            continue
        m = max(row.tolist())
        ex = [math.exp(v - m) for v in row.tolist()]
        z = sum(ex)
        p = [v / z for v in ex]
        sel = _top(p, top_k)
        ws = [p[e] for e in sel]
        if renormalize:
            s = sum(ws)
            ws = [v / s for v in ws]
        idx[t] = torch.tensor(sel)
        w[t] = torch.tensor(ws, dtype=torch.float64)
    return idx, w


def route_sigmoid_grouped(logits, bias, top_k, groups, selected_groups, group_top_two, renormalize, scale):
    T, E = logits.shape
    per = E // groups
    idx = torch.zeros(T, top_k, dtype=torch.int64)
    w = torch.zeros(T, top_k, dtype=torch.float64)
    b = [0.0] * E if bias is None else bias.double().tolist()
    for t in range(T):
        s = [1.0 / (1.0 + math.exp(-v)) if not math.isnan(v) else float("nan") for v in logits[t].double().tolist()]
        c = [s[e] + b[e] for e in range(E)]
        if any(math.isnan(v) for v in c):
            idx[t] = torch.arange(top_k)
            w[t] = float("nan")
            continue
        gscore = []
        for g in range(groups):
            members = sorted(c[g * per:(g + 1) * per], reverse=True)
            gscore.append(members[0] + members[1] if group_top_two else members[0])
        kept = _top(gscore, selected_groups)
        allowed = [False] * E
        for g in kept:
            for e in range(g * per, (g + 1) * per):
                allowed[e] = True
        sel = _top(c, top_k, allowed)
        ws = [s[e] for e in sel]
        if renormalize:
            tot = sum(ws)
            ws = [v / tot for v in ws]
        idx[t] = torch.tensor(sel)
        w[t] = torch.tensor([v * scale for v in ws], dtype=torch.float64)
    return idx, w


def dispatch_layout(indices, num_experts):
    """(offsets [E+1], [(token, slot)] per dispatched row): experts in order, tokens in order."""
    T, k = indices.shape
    rows = []
    offsets = [0]
    for e in range(num_experts):
        for t in range(T):
            for j in range(k):
                if int(indices[t, j]) == e:
                    rows.append((t, j))
        offsets.append(len(rows))
    return offsets, rows



def expert(x_row, gate_e, up_e, down_e, dtype=torch.float64):
    """One SwiGLU expert on one token row: down · (silu(gate · x) * (up · x)), computed in `dtype`
    (float64: exact reference) with the products rounded to `dtype` as a framework would."""
    x = x_row.to(dtype)
    a = gate_e.to(dtype) @ x
    b = up_e.to(dtype) @ x
    h = torch.nn.functional.silu(a) * b
    return down_e.to(dtype) @ h


def selected_weights(logits_row, sel, scoring, renormalize, scale):
    """Differentiable weights of the selected experts of one token (torch ops)."""
    if scoring == "softmax":
        p = torch.softmax(logits_row, dim=-1)
    else:
        p = torch.sigmoid(logits_row)
    q = torch.stack([p[e] for e in sel])
    if renormalize:
        q = q / q.sum()
    return q * scale


def moe_layer(x, logits, gate, up, down, indices, scoring="softmax", renormalize=True, scale=1.0,
              dtype=torch.float64):
    """out[t] = sum_j w_j(logits[t]) * expert_{e_j}(x[t]), by loops over tokens and slots.
    Differentiable in x, logits, gate, up and down (the selection is fixed)."""
    T = x.shape[0]
    outs = []
    for t in range(T):
        sel = [int(e) for e in indices[t]]
        w = selected_weights(logits[t].to(dtype), sel, scoring, renormalize, scale)
        acc = None
        for j, e in enumerate(sel):
            term = w[j] * expert(x[t], gate[e], up[e], down[e], dtype)
            acc = term if acc is None else acc + term
        outs.append(acc)
    if not outs:
        return torch.zeros(0, x.shape[1], dtype=dtype)
    return torch.stack(outs)
