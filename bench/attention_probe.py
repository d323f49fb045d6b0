"""The dense attention experiment's timings (bench/gpu_diag.sh runs it on the lent GPU): every
flash kernel generation (sm80, sm90, sm90ws; picked per call through RUDNN_ATTENTION_FLASH) side
by side with torch SDPA's cuDNN and flash backends on the benchmark's shapes (rudnn.bench's
attention family: B·S = 16k tokens), plain and softcapped, causal and not, forward and backward.
Writes one markdown table (--out FILE, and stdout): per row the kernel that served the call
(rudnn.attention_last_algorithm), its time, TFLOP/s and its ratio to each peer, and the relative
error against SDPA for the plain rows.

Timing: CUDA events around 5 back-to-back calls (no synchronization between them), the median
of 3 such groups per row, after a warm-up call; the backward times only the gradient call (the
forward runs once outside). FLOPs as FlashAttention counts them: 4·B·H·S²·D forward, halved
under causal masking, backward 2.5× the forward. SDPA has no softcap: a softcapped row's peer
times are those of the plain case of the same shape (marked "plain peer").

    python bench/attention_probe.py [--out FILE] [--quick]
    python bench/attention_probe.py --ncu GEN forward|backward   # one call of the profiling case

--ncu runs the one profiling case (B·S = 16k, H = 16, S = 4096, D = 128, causal) once with
generation GEN, and nothing else, for `ncu -k regex:...` to profile.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import rudnn
from rudnn.bench.attention import _GPU_BACKWARD, _GPU_QUICK, TOKENS

GENERATIONS = ("sm80", "sm90", "sm90ws")
# The backward rows: each generation with deterministic=False (the default; sm90ws then adds dQ
# into a float32 accumulator from its dk/dv kernel, 5 products), and sm90ws once more with
# deterministic=True (its dq kernel recomputes S and dP: 7 products), so one run prices both.
BACKWARD_VARIANTS = tuple((gen, False) for gen in GENERATIONS) + (("sm90ws", True),)
PEERS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
SOFTCAP = 30.0
# (H, S, D, causal, softcap): the bench's quick forward shapes (MHA rows; its GQA row needs
# enable_gqa, which the peers' backends handle differently) plus softcapped D = 128 rows.
FORWARD = [(h, s, d, c, None) for h, kv, s, d, c in _GPU_QUICK if h == kv] + \
          [(16, 2048, 128, 1, SOFTCAP), (16, 8192, 128, 1, SOFTCAP), (16, 2048, 128, 0, SOFTCAP)]
# (H, S, D, causal, softcap): the bench's backward shapes, then a softcapped D = 128 row (the sm90ws
# dk/dv kernel's inline softcap instantiation; the others' general one), in quick runs too.
BACKWARD = [(h, s, d, c, None) for h, kv, s, d, c in _GPU_BACKWARD if h == kv and s >= 2048]
BACKWARD_SOFTCAP = [(16, 4096, 128, 1, SOFTCAP)]
NCU_CASE = (16, 4096, 128, 1)


def device_ms(fn, reps=5, groups=3):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(groups):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    return statistics.median(times)


@contextlib.contextmanager
def generation(gen):
    old = os.environ.get("RUDNN_ATTENTION_FLASH")
    os.environ["RUDNN_ATTENTION_FLASH"] = gen
    try:
        yield
    finally:
        if old is None:
            del os.environ["RUDNN_ATTENTION_FLASH"]
        else:
            os.environ["RUDNN_ATTENTION_FLASH"] = old


def inputs(H, S, D, grad=False):
    B = max(1, TOKENS // S)
    return [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]


def flops(q, causal, backward=False):
    B, H, S, D = q.shape
    f = 4 * B * H * S * S * D / (2 if causal else 1)
    return f * 2.5 if backward else f


def peer_forward(q, k, v, causal):
    out = {}
    for name, backend in PEERS:
        try:
            with sdpa_kernel([backend]):
                out[name] = device_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
        except RuntimeError as e:  # a backend that does not take the case
            out[name] = f"n/a ({str(e).splitlines()[0][:60]})"
    return out


def peer_backward(q, k, v, dout, causal):
    out = {}
    for name, backend in PEERS:
        try:
            with sdpa_kernel([backend]):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                out[name] = device_ms(lambda: torch.autograd.grad(ref, (q, k, v), dout, retain_graph=True), reps=3)
        except RuntimeError as e:
            out[name] = f"n/a ({str(e).splitlines()[0][:60]})"
    return out


def row(direction, shape, gen, algo, ms, fl, peers, err, plain_peer=False):
    cells = [direction, shape, gen, algo, f"{ms:.3f}", f"{fl / ms / 1e9:.1f}"]
    for name, _ in PEERS:
        p = peers.get(name)
        if isinstance(p, float):
            cells += [f"{p:.3f}{' (plain peer)' if plain_peer else ''}", f"{p / ms:.2f}x"]
        else:
            cells += [str(p), "-"]
    cells.append("-" if err is None else f"{err:.1e}")
    return "| " + " | ".join(cells) + " |"


def table(quick):
    head = ("| dir | B,H,S,D,causal,softcap | asked | ran | ms | TFLOP/s | cuDNN ms | rudnn vs cuDNN | "
            "flash ms | rudnn vs flash | rel err vs SDPA |")
    yield head
    yield "|" + "---|" * (head.count("|") - 1)
    plain_peers = {}
    for H, S, D, causal, softcap in FORWARD[:3] if quick else FORWARD:
        q, k, v = inputs(H, S, D)
        peers = plain_peers.get((H, S, D, causal)) if softcap else None
        if peers is None:
            peers = peer_forward(q, k, v, causal)
            plain_peers[(H, S, D, causal)] = peers
        ref = None if softcap else F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)).float()
        shape = f"{q.shape[0]},{H},{S},{D},{causal},{softcap}"
        for gen in GENERATIONS:
            with generation(gen):
                try:
                    run = lambda: rudnn.attention(q, k, v, causal=bool(causal), softcap=softcap)  # noqa: E731
                    ms = device_ms(run)
                    algo = rudnn.attention_last_algorithm()
                    err = None if ref is None else ((run().float() - ref).abs().max() / ref.abs().max()).item()
                except rudnn.Error as e:
                    yield f"| forward | {shape} | {gen} | error: {str(e)[:80]} |"
                    continue
            yield row("forward", shape, gen, algo, ms, flops(q, causal), peers, err, plain_peer=bool(softcap))
        del q, k, v, ref
    for H, S, D, causal, softcap in (BACKWARD[:2] if quick else BACKWARD) + BACKWARD_SOFTCAP:
        q, k, v = inputs(H, S, D, grad=True)
        out, lse = rudnn.attention(q.detach(), k.detach(), v.detach(), causal=bool(causal), softcap=softcap,
                                   return_lse=True)
        dout = torch.randn_like(out)
        peers = peer_backward(q, k, v, dout, causal)  # SDPA has no softcap: the plain peer
        want = None
        if not softcap:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                want = torch.autograd.grad(ref, (q, k, v), dout)
        shape = f"{q.shape[0]},{H},{S},{D},{causal},{softcap}"
        for gen, deterministic in BACKWARD_VARIANTS:
            asked = gen + (",deterministic" if deterministic else "")
            with generation(gen):
                try:
                    run = lambda: rudnn.attention_backward(dout, q.detach(), k.detach(), v.detach(), out, lse,  # noqa: E731
                                                           causal=bool(causal), softcap=softcap,
                                                           deterministic=deterministic)
                    ms = device_ms(run, reps=3)
                    algo = rudnn.attention_last_algorithm()
                    err = None if want is None else max(((g.float() - w.float()).abs().max() / w.float().abs().max())
                                                        .item() for g, w in zip(run(), want))
                except rudnn.Error as e:
                    yield f"| backward | {shape} | {asked} | error: {str(e)[:80]} |"
                    continue
            yield row("backward", shape, asked, algo, ms, flops(q, causal, True), peers, err, plain_peer=bool(softcap))
        del q, k, v, out, lse, dout, want


def ncu_once(gen, direction):
    H, S, D, causal = NCU_CASE
    q, k, v = inputs(H, S, D)
    with generation(gen):
        if direction == "forward":
            rudnn.attention(q, k, v, causal=bool(causal))
        else:
            out, lse = rudnn.attention(q, k, v, causal=bool(causal), return_lse=True)
            torch.cuda.synchronize()
            rudnn.attention_backward(torch.randn_like(out), q, k, v, out, lse, causal=bool(causal))
    torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="3 forward and 3 backward shapes (2 plain, 1 softcapped)")
    ap.add_argument("--ncu", nargs=2, metavar=("GEN", "DIRECTION"))
    a = ap.parse_args()
    if a.ncu:
        ncu_once(*a.ncu)
        return 0
    out = open(a.out, "w") if a.out else None
    for line in table(a.quick):
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
