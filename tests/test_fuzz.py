"""The fuzz suite (tests/fuzz/driver.py) in a subprocess: a crash or a hang fails this test, and any
property the driver checks (oracle match or a rudnn.Error naming the op, inputs untouched, no
unwritten output memory) fails it with the shrunk case in the output. Derandomized: the same cases
on every run; 400 per family keep the seventeen families within about a minute of CPU."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_fuzz_suite():
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fuzz", "driver.py"), "--examples", "400"],
                          capture_output=True, text=True, timeout=600, cwd=HERE)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report[-6000:]
    for family in ("norm", "pooling", "interpolate", "attention", "moe", "conv", "grid_sample", "ctc", "backward",
                   "gated_delta", "paged", "moe_dispatch", "moe_experts", "moe_router", "gated_delta_backward",
                   "paged_backward", "paged_append"):
        assert f"fuzz {family}: " in proc.stdout, report[-2000:]
    print(proc.stdout)
