"""bench/attention_probe.py (the dense attention experiment bench/gpu_diag.sh runs on a lent GPU)
has never a GPU to try it on before its minutes count: its table logic runs here on the CPU
backend with the CUDA-only pieces (events, SDPA backends, the shapes' sizes) stood in, so a
typo or a broken row cannot cost a GPU session."""

import contextlib
import importlib.util
import os

import pytest
import torch

import rudnn
from util import ROOT


def _probe():
    spec = importlib.util.spec_from_file_location("attention_probe", os.path.join(ROOT, "bench", "attention_probe.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_probe_table_rows(monkeypatch):
    p = _probe()
    calls = []

    def device_ms(fn, reps=10, groups=5):
        fn()
        calls.append(reps)
        return 2.0

    def inputs(H, S, D, grad=False):  # tiny CPU stand-ins of the shapes
        return [torch.randn(1, 2, 16, D, dtype=torch.float32, requires_grad=grad) for _ in range(3)]

    monkeypatch.setattr(p, "device_ms", device_ms)
    monkeypatch.setattr(p, "inputs", inputs)
    monkeypatch.setattr(p, "sdpa_kernel", lambda backends: contextlib.nullcontext())
    rows = list(p.table(quick=False))
    assert rows[0].startswith("| dir |") and set(rows[1]) == {"|", "-"}
    body = rows[2:]
    assert len(body) == 3 * len(p.FORWARD) + 4 * (len(p.BACKWARD) + len(p.BACKWARD_SOFTCAP)), body
    assert sum(line.startswith("| backward") and ",30.0 |" in line for line in body) == 4, body
    asked = [[c.strip() for c in line.strip("|").split("|")][2] for line in body if line.startswith("| backward")]
    assert asked[:4] == ["sm80", "sm90", "sm90ws", "sm90ws,deterministic"], asked
    for line in body:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == rows[0].count("|") - 1, line
        assert cells[3] == "cpu" and cells[4] == "2.000" and cells[7] == cells[9] == "1.00x", line
        if "30.0" in cells[1]:
            assert cells[6].endswith("(plain peer)") and cells[10] == "-", line
        else:
            assert float(cells[10]) < 1e-5, line  # rudnn's CPU backend against torch's SDPA on the same inputs
    assert os.environ.get("RUDNN_ATTENTION_FLASH") is None  # restored after each generation


def test_probe_flops_follow_flashattention():
    p = _probe()
    q = torch.empty(2, 4, 128, 64)
    assert p.flops(q, causal=False) == 4 * 2 * 4 * 128 * 128 * 64
    assert p.flops(q, causal=True) == p.flops(q, causal=False) / 2
    assert p.flops(q, causal=True, backward=True) == 2.5 * p.flops(q, causal=True)


@pytest.mark.parametrize("name", ["gpu_diag.sh", "gpu_check.sh"])
def test_gpu_scripts_parse(name):
    import subprocess

    done = subprocess.run(["bash", "-n", os.path.join(ROOT, "bench", name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
