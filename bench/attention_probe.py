"""Where does the flash forward's time go? One line per (kernel generation, head dim, causal):
the kernel that served the call (rudnn.attention_last_algorithm), its median device time, the
achieved TFLOP/s, and torch SDPA (cuDNN) on the same inputs. Run by bench/gpu_diag.sh on the
GPU; `--ncu` makes one call per case and nothing else, for `ncu -k regex:forward_sm` to profile.

2026-11-30 (H200, commit bc8dffd): every flash case ran at 13-20 TFLOP/s against cuDNN's
~660, with correct results. This probe separates the sm80 and sm90 kernels (the environment
variable RUDNN_ATTENTION_FLASH picks one) so that the next GPU session sees which of them is slow
and, under ncu, why (occupancy, stall reasons, memory traffic).
"""

from __future__ import annotations

import os
import statistics
import sys

import torch
import torch.nn.functional as F

import rudnn

# (B, H, S, D, causal, softcap): softcap selects the kernels' general score path, None the plain one.
CASES = [(4, 16, 2048, 128, 0, None), (4, 16, 2048, 128, 1, None), (4, 32, 2048, 64, 1, None),
         (4, 16, 2048, 128, 1, 50.0), (1, 16, 8192, 128, 1, None), (4, 8, 2048, 256, 1, None)]
# Backward (default generation only): (B, H, S, D, causal).
BACKWARD_CASES = [(4, 16, 2048, 128, 1), (4, 32, 2048, 64, 1)]


def device_ms(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main() -> int:
    ncu = "--ncu" in sys.argv
    kernel = os.environ.get("RUDNN_ATTENTION_FLASH", "default")
    for B, H, S, D, causal, softcap in CASES:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        run = lambda: rudnn.attention(q, k, v, causal=bool(causal), softcap=softcap)  # noqa: E731
        if ncu:
            run()
            torch.cuda.synchronize()
            continue
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        ms = device_ms(run)
        algo = rudnn.attention_last_algorithm()
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))  # no softcap: err only without it
        err = ((run().float() - ref.float()).abs().max() / ref.float().abs().max()).item() if softcap is None else float("nan")
        peer = device_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
        print(f"RUDNN_ATTENTION_FLASH={kernel:7s} B={B} H={H} S={S} D={D} causal={causal} softcap={softcap}: {algo:10s} "
              f"{ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s | sdpa {peer:7.3f} ms {flops / peer / 1e9:6.1f} "
              f"TFLOP/s | rel err vs sdpa {err:.1e}", flush=True)
    if ncu:  # the backward's generations: sm90 (Hopper's default), sm90ws (its dk/dv) and sm80
        return 0
    for B, H, S, D, causal in BACKWARD_CASES:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out, lse = rudnn.attention(q.detach(), k.detach(), v.detach(), causal=bool(causal), return_lse=True)
        dout = torch.randn_like(out)
        ours = device_ms(lambda: rudnn.attention_backward(dout, q.detach(), k.detach(), v.detach(), out, lse,
                                                          causal=bool(causal)), reps=10)
        algo = rudnn.attention_last_algorithm()
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        peer = device_ms(lambda: torch.autograd.grad(ref, (q, k, v), dout, retain_graph=True), reps=10)
        flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
        print(f"backward B={B} H={H} S={S} D={D} causal={causal}: {algo:10s} {ours:8.3f} ms "
              f"{flops / ours / 1e9:6.1f} TFLOP/s | sdpa autograd {peer:7.3f} ms {flops / peer / 1e9:6.1f} TFLOP/s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
