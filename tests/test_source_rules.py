"""Rules of the C++ core that a grep can hold (ARCHITECTURE.md; issue 25: decode-size calls must
stay capturable in a CUDA graph): libruDNN never allocates or frees device memory (workspaces
come from the caller's framework) and never synchronizes the host with the device, except where
listed here with the reason. A new cudaMalloc, a blocking copy or a stream synchronization in a
kernel's host code fails this test until it is either removed or added below with its reason."""

import os
import re

from util import ROOT

SRC = os.path.join(ROOT, "cpp", "src")
# allocation, blocking copies and sets, reads of device memory into the host, host waits
FORBIDDEN = re.compile(r"\b(cudaMalloc\w*|cudaFree\w*|cudaHostAlloc|cudaMemcpy(?:2D|3D|Peer|ToSymbol|FromSymbol)?(?=\s*\()|"
                       r"cudaMemset(?:2D|3D)?(?=\s*\()|cudaMemcpyDeviceToHost|cudaStreamSynchronize|"
                       r"cudaDeviceSynchronize|cudaEventSynchronize|cudaStreamQuery)\b")
# file -> (call, why it is allowed)
ALLOWED = {
    os.path.join("core", "device.cpp"): ("cudaEventSynchronize", "autotune's timing (time_on_stream), documented "
                                                                 "as one synchronization per new shape"),
}


def _sources():
    for root, _, files in os.walk(SRC):
        for name in files:
            if name.endswith((".cpp", ".cu", ".cuh", ".hpp")):
                yield os.path.join(root, name)


def _code(text):
    """The text without // comments (the rules are about calls, not their mention)."""
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def test_no_device_allocation_or_host_synchronization():
    found = []
    for path in _sources():
        rel = os.path.relpath(path, SRC)
        for m in FORBIDDEN.finditer(_code(open(path).read())):
            allowed = ALLOWED.get(rel)
            if allowed and m.group(1) == allowed[0]:
                continue
            found.append(f"{rel}: {m.group(1)}")
    assert not found, found


def test_the_allowed_calls_still_exist():
    # an allowance whose call went away is stale: remove it
    for rel, (call, _) in ALLOWED.items():
        assert call in _code(open(os.path.join(SRC, rel)).read()), rel
