"""Benchmark harness: rudnn against its framework peers, side by side in one run.

    python -m rudnn.bench [--quick] [--family norm] [--op layer_norm] [--out FILE.md]

One module per op family lives beside this file (norm.py, ...). A family module defines

    FAMILY   its name (what --family selects)
    PEER     what it is compared with, in words ("torch eager")
    BOUND    "memory" (rate in GB/s against the copy ceiling) or "compute" (TFLOP/s against matmul)
    TARGET   (fraction of the ceiling, speed-up over the peer) from SPEC section 8, or None
    cases(device, quick) -> list[CaseSpec]
    prepare(spec, device) -> Prepared

and is found by name: adding a family means adding one file. This module holds what the
families share: the case and result types, the error check against a float64 reference,
output poisoning, the timer, the two ceilings (device copy, bf16 matmul) and the table.
__main__.py runs the cases in a worker process (so a crash or a lost CUDA context costs one
row, not the run) and writes the report.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import pkgutil
import platform
import statistics
import time
from typing import Callable, Optional

# Relative error (max |ours - ref| / max |ref|) that any result may have whatever the peer got:
# a few ulps of the output dtype. Matches tests/util.py's FLOOR.
FLOOR = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}
# Float32 statistics (mean, rstd) reduced over long rows.
STATS_FLOOR = 1e-5


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """One row of the table: an op of a family at one shape and dtype."""

    family: str
    op: str
    shape: tuple
    dtype: str  # "float32", "float16", "bfloat16"

    @property
    def shape_label(self) -> str:
        return "×".join(str(d) for d in self.shape)


@dataclasses.dataclass
class OutputCheck:
    """One output compared with the float64 reference (errors are relative to max |ref|)."""

    name: str
    err: float
    peer_err: Optional[float]
    budget: float
    ok: bool
    note: str = ""


@dataclasses.dataclass
class Prepared:
    """A case ready to run: inputs live inside the closures.

    run   calls rudnn once (what is timed)
    peer  calls the peer once (what is timed for the peer; for backward ops, the backward alone)
    check calls rudnn once more on poisoned outputs and compares every output with the
          float64 reference and with the peer; returns one OutputCheck per output
    bytes the fewest bytes the op must move (each input read once, each output written once)
    flops the arithmetic it must do (compute-bound families)
    """

    run: Callable[[], object]
    peer: Callable[[], object]
    check: Callable[[], list]
    bytes: int = 0
    flops: int = 0
    algorithm: Optional[Callable[[], str]] = None  # which kernel served the last call (shown in the table)
    # "host": back-to-back calls, one synchronization (Timer.host) for rudnn and the peer alike: the
    # host-inclusive time of decode-size rows, where a call's launch and argument cost is the floor
    timing: str = "device"
    # True: the L2 cache is flushed before every timed call of rudnn and of the peer (inputs that
    # fit in L2 would otherwise be read from it after the first repetition)
    flush_l2: bool = False


# ---------------------------------------------------------------------------------------------
# families


def family_names() -> list:
    """Family modules beside this file, in name order."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name for m in pkgutil.iter_modules([here]) if not m.name.startswith("_"))


def family(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def all_cases(device: str, quick: bool, families=None, ops=None) -> list:
    """Every case of the selected families, in a fixed order (the worker and the parent agree on it).

    Quick runs take the families in turn, one case each, so that a run cut short by its time
    limit (the GPU check gives it ~150 s) still has rows of every family; the report groups the
    rows by family either way."""
    per_family = [[spec for spec in family(name).cases(device, quick) if not ops or spec.op in ops]
                  for name in families or family_names()]
    if not quick:
        return [spec for specs in per_family for spec in specs]
    longest = max((len(specs) for specs in per_family), default=0)
    return [specs[i] for i in range(longest) for specs in per_family if i < len(specs)]


# ---------------------------------------------------------------------------------------------
# correctness


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _rel_err(a, ref, scale: float) -> float:
    if a.shape != ref.shape:
        a = a.reshape(ref.shape)
    # torch's max propagates NaN, so an unwritten (poisoned) element shows as a NaN error.
    return (a.double() - ref).abs().max().item() / scale


def same_precision_floor(ours, same, ref) -> float:
    """A budget floor where no peer runs (or none gives this output): the floor of `ours`' dtype
    plus twice the relative error of `same` (the reference computed in the precision the kernels
    accumulate in, rounded to `ours`' dtype) against the float64 `ref`: the test suite's rule."""
    scale = max(ref.abs().max().item(), 1e-30)
    return FLOOR.get(dtype_name(ours), 2e-6) + 2 * _rel_err(same.detach().to(ours.dtype), ref, scale)


def compare(name, ours, ref, peer=None, *, expect_dtype=None, floor=None) -> OutputCheck:
    """Check `ours` against the float64 `ref`; `peer` is the peer's same output (any dtype).

    Passes when finite and within 2x the peer's error plus `floor` (a few ulps of the
    output dtype by default), the budget the test suite uses.
    """
    if ours is None:
        return OutputCheck(name, math.nan, None, 0.0, False, "missing")
    if tuple(ours.shape) != tuple(ref.shape):
        return OutputCheck(name, math.nan, None, 0.0, False, f"shape {tuple(ours.shape)} != {tuple(ref.shape)}")
    if expect_dtype is not None and ours.dtype != expect_dtype:
        return OutputCheck(name, math.nan, None, 0.0, False,
                           f"dtype {dtype_name(ours)} != {str(expect_dtype).replace('torch.', '')}")
    if ours.numel() == 0:
        return OutputCheck(name, 0.0, None, 0.0, True)
    scale = max(ref.abs().max().item(), 1e-30)
    err = _rel_err(ours, ref, scale)
    peer_err = None
    if peer is not None:
        try:
            peer_err = _rel_err(peer.detach(), ref, scale)
        except RuntimeError:  # the peer's output does not line up with ours: no peer budget
            peer_err = None
    if floor is None:
        floor = FLOOR.get(dtype_name(ours), 2e-6)
    budget = floor + (2 * peer_err if peer_err is not None and math.isfinite(peer_err) else 0.0)
    ok = math.isfinite(err) and err <= budget
    note = "" if ok else ("non-finite (unwritten or NaN)" if not math.isfinite(err) else "over budget")
    return OutputCheck(name, err, peer_err, budget, ok, note)


def with_env(fn, name: str, value: str):
    """fn run with the environment variable `name` set to `value` (for a library knob read on every
    call), restored after: a bench row that times a kernel variant beside the default in one run."""

    def run(*args):
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn(*args)
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return run


def poison_allocator(device: str, shapes_dtypes) -> None:
    """Best effort for ops that allocate their own outputs: release the CUDA caching
    allocator's free blocks, then allocate NaN-filled buffers of the outputs' sizes and free
    them, so the op's outputs most likely reuse these blocks and an unwritten element shows as
    NaN. A no-op on the CPU (its allocator caches nothing)."""
    if device != "cuda":
        return
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    bufs = [torch.full(tuple(shape), float("nan"), dtype=dtype, device="cuda") for shape, dtype in shapes_dtypes]
    torch.cuda.synchronize()
    del bufs


# ---------------------------------------------------------------------------------------------
# timing


class Timer:
    """Median time of one call in milliseconds.

    CUDA: each call sits between two CUDA events. Before each batch a spin kernel
    (torch.cuda._sleep) holds the stream while the host queues the whole batch, so the events
    measure the device time of back-to-back calls, without Python and launch overhead.
    CPU: wall clock around each call, repeated for a time budget.
    """

    def __init__(self, device: str, quick: bool):
        import torch

        self.torch = torch
        self.device = device
        self.reps, self.batches = (20, 5) if quick else (50, 10)
        self.warmup = 3
        self.cpu_budget_s = 0.04 if quick else 0.25
        self._cycles_per_ms = None

    @property
    def method(self) -> str:
        if self.device == "cuda":
            hold = ("the stream held by a spin kernel while each batch is queued (host overhead excluded)"
                    if hasattr(self.torch.cuda, "_sleep") else "no spin kernel (torch.cuda._sleep missing): host gaps may count")
            return (f"CUDA events around each call, {self.warmup} warm-up calls, median of "
                    f"{self.reps * self.batches} calls in {self.batches} batches; {hold}")
        return f"wall clock around each call, 1 warm-up call, median over ~{self.cpu_budget_s:g} s (at least 3 calls)"

    def __call__(self, fn, reps: Optional[int] = None, batches: Optional[int] = None, flush_l2: bool = False) -> float:
        if self.device == "cuda":
            return self._cuda(fn, reps or self.reps, batches or self.batches, flush_l2)
        return self._cpu(fn)

    _flush_buffer = None

    def _flush(self) -> None:
        """Overwrites 256 MB (over four times an H200's 60 MB L2) on the stream: whatever the next
        call reads comes from device memory."""
        if Timer._flush_buffer is None:
            Timer._flush_buffer = self.torch.empty(256 << 20, dtype=self.torch.uint8, device="cuda")
        Timer._flush_buffer.zero_()

    def host(self, fn, reps: int = 200, batches: int = 7) -> float:
        """Milliseconds per call of `reps` back-to-back calls with one synchronization at the end
        (median of `batches`): on tiny inputs this is the host cost of a call (argument checks,
        DLPack exports, allocation, launch), unless the device is the slower side. Families that
        set TIMING = "host" are timed this way (the `overhead` family)."""
        sync = self.torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        for _ in range(self.warmup):
            fn()
        sync()
        samples = []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            samples.append((time.perf_counter() - t0) * 1e3 / reps)
        return statistics.median(samples)

    def _cpu(self, fn) -> float:
        fn()
        samples = []
        end = time.perf_counter() + self.cpu_budget_s
        while len(samples) < 3 or (time.perf_counter() < end and len(samples) < 1000):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    def _hold(self, ms: float) -> None:
        cuda = self.torch.cuda
        if not hasattr(cuda, "_sleep"):
            return
        if self._cycles_per_ms is None:
            cuda._sleep(1000)
            s, e = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            s.record()
            cuda._sleep(2_000_000)
            e.record()
            e.synchronize()
            self._cycles_per_ms = 2_000_000 / max(s.elapsed_time(e), 1e-3)
        cuda._sleep(int(min(ms, 200.0) * self._cycles_per_ms))

    # Device time one case may spend in its timed batches: a slow call (the fallback at large
    # sizes takes hundreds of ms) gets fewer repetitions, so that one case cannot eat a GPU
    # check's whole benchmark budget (2026-11-30: 16 of 71 quick cases fit in 150 s).
    case_budget_ms = 1500.0

    def _cuda(self, fn, reps: int, batches: int, flush_l2: bool = False) -> float:
        cuda = self.torch.cuda
        for _ in range(self.warmup):
            fn()
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        one_ms = start.elapsed_time(end)
        if one_ms * reps * batches > self.case_budget_ms:
            batches = min(batches, 3)
            reps = max(1, min(reps, int(self.case_budget_ms / (max(one_ms, 1e-3) * batches))))
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        host_ms = (time.perf_counter() - t0) * 1e3 / 3
        cuda.synchronize()
        samples = []
        for _ in range(batches):
            events = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(reps)]
            # Twice the host time of the batch: the clock may drop while the spinner runs.
            self._hold(2.0 * host_ms * reps * (2 if flush_l2 else 1) + 0.5)  # a flush doubles the launches
            for start, end in events:
                if flush_l2:
                    self._flush()  # between the events of two calls: not timed
                start.record()
                fn()
                end.record()
            cuda.synchronize()
            samples.extend(start.elapsed_time(end) for start, end in events)
        return statistics.median(samples)


# ---------------------------------------------------------------------------------------------
# ceilings measured in the same run


def copy_ceiling(device: str, timer: Timer, quick: bool) -> dict:
    """Device-to-device copy bandwidth: dst.copy_(src), bytes = read + written."""
    import torch

    nbytes = (1 << 30 if quick else 2 << 30) if device == "cuda" else 64 << 20
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), reps=10, batches=3)
    return {"copy_gbs": 2 * nbytes / ms / 1e6, "copy_bytes": nbytes, "copy_ms": ms}


def matmul_ceiling(device: str, timer: Timer, quick: bool) -> dict:
    """bf16 matrix product rate on random data (CUDA only; the CPU has no meaningful one here)."""
    if device != "cuda":
        return {}
    import torch

    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: a @ b, reps=10, batches=2 if quick else 5)
    return {"matmul_tflops": 2 * n ** 3 / ms / 1e9, "matmul_n": n, "matmul_ms": ms}


def environment(device: str) -> dict:
    import torch

    import rudnn

    env = {
        "device": device,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "rudnn": getattr(rudnn, "__version__", "?"),
        "rudnn_path": os.path.dirname(os.path.abspath(rudnn.__file__)),
        "rudnn_has_cuda": bool(getattr(rudnn, "has_cuda", False)),
    }
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env["device_name"] = (f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, "
                              f"compute capability {p.major}.{p.minor})")
    else:
        env["device_name"] = f"CPU: {_cpu_model()} ({torch.get_num_threads()} torch threads, {os.cpu_count()} cores)"
    return env


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------------------------------
# the report


def _fmt_ms(v) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if v < 1000 else f"{v:.0f}"


def _fmt_err(v) -> str:
    if v is None:
        return "—"
    return "NaN" if not math.isfinite(v) else f"{v:.1e}"


def row_ok(row: dict) -> bool:
    return row.get("status") == "ok"


def family_table(name: str, rows: list, env: dict) -> str:
    """Markdown table of one family's rows (dicts made by __main__.run_case)."""
    mod = family(name)
    compute = getattr(mod, "BOUND", "memory") == "compute"
    peer = getattr(mod, "PEER", "peer")
    peer_short = peer.split()[0]
    rate_col, pct_col = ("TFLOP/s", "% matmul") if compute else ("GB/s", "% copy")
    ceiling = env.get("matmul_tflops") if compute else env.get("copy_gbs")
    head = (f"| op | shape | dtype | rudnn ms | {peer_short} ms | {peer_short}/rudnn | {rate_col} | {pct_col} "
            f"| rel err rudnn | rel err {peer_short} | check |")
    lines = [f"### {name} (peer: {peer})", "", head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        ms, pms = r.get("ms"), r.get("peer_ms")
        ratio = f"{pms / ms:.2f}×" if ms and pms else "—"
        rate = pct = "—"
        if ms:
            if compute and r.get("flops"):
                val = r["flops"] / ms / 1e9
                rate = f"{val:.0f}"
            elif not compute and r.get("bytes"):
                val = r["bytes"] / ms / 1e6
                rate = f"{val:.0f}" if val >= 10 else f"{val:.2f}"
            else:
                val = None
            if val is not None and ceiling:
                pct = f"{100 * val / ceiling:.0f}%"
        status = r.get("status", "?")
        check = "ok" if status == "ok" else f"**{status}**" + (f": {r['note']}" if r.get("note") else "")
        if r.get("algorithm"):
            check += f" ({r['algorithm']})"
        if r.get("peer_note"):
            check += f" ({peer_short} failed: {r['peer_note']})"
        check = check.replace("|", "/")
        lines.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {_fmt_ms(ms)} | {_fmt_ms(pms)} | {ratio} "
                     f"| {rate} | {pct} | {_fmt_err(r.get('err'))} | {_fmt_err(r.get('peer_err'))} | {check} |")
    return "\n".join(lines)


def target_line(name: str, rows: list, env: dict) -> Optional[str]:
    """How many bf16 rows meet the family's SPEC section 8 target (GPU runs only). TARGET is
    (fraction of the ceiling, speed-up over the peer): the copy bandwidth for memory-bound
    families, the bf16 matmul rate for compute-bound ones; TARGETS, where a family has it, gives
    one such pair per op (MoE: the grouped GEMM's share of matmul, the layer's speed-up)."""
    mod = family(name)
    per_op = getattr(mod, "TARGETS", None) or {None: getattr(mod, "TARGET", None)}
    if env.get("device") != "cuda" or not any(per_op.values()):
        return None
    compute = getattr(mod, "BOUND", "memory") == "compute"
    ceiling = env.get("matmul_tflops" if compute else "copy_gbs")
    unit = "of the bf16 matmul rate" if compute else "of copy bandwidth"
    parts = []
    for op, target in per_op.items():
        if not target:
            continue
        frac, speedup = target
        mine = [r for r in rows if r.get("dtype") == "bfloat16" and r.get("ms") and (op is None or r["op"] == op)]
        if not mine or (frac and not ceiling):
            continue

        def rate(r):
            amount = r.get("flops") if compute else r.get("bytes")
            return amount / r["ms"] / (1e9 if compute else 1e6) if amount else 0.0

        met = [r for r in mine if row_ok(r) and (not frac or rate(r) >= frac * ceiling)
               and (not speedup or (r.get("peer_ms") and r["peer_ms"] / r["ms"] >= speedup))]
        ratios = [r["peer_ms"] / r["ms"] for r in mine if r.get("peer_ms")]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")
        want = " and ".join(w for w in ((f"≥{frac:.0%} {unit}" if frac else ""),
                                        (f"≥{speedup:g}× the peer" if speedup else "")) if w)
        parts.append(f"{op + ': ' if op else ''}target ({want}) met by {len(met)} of {len(mine)} bf16 rows, "
                     f"geometric-mean speed-up over the peer {geo:.2f}×")
    return f"{name}: SPEC §8 " + "; ".join(parts) if parts else None
