"""python -m rudnn.bench [--quick] [--family NAME] [--op OP] [--out FILE.md] [--device auto|cpu|cuda] [--seed N]

Times rudnn against its peers (torch eager for norm/softmax), checks every result against a
float64 reference first, and prints a markdown report; --out also writes it to a file.
Exits 1 when any check fails or any case errors, crashes or times out.

The cases run in a worker process that streams one JSON line per case back to this one. A
case that crashes the worker, loses the CUDA context or hangs past --case-timeout becomes a
failed row, and a fresh worker carries on with the next case. SIGTERM (what `timeout` sends)
still writes the report of the cases done so far.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback

from . import all_cases, family_names, family_table, row_ok, target_line

MARK = "@@rudnn-bench@@ "


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m rudnn.bench", description=__doc__.split("\n\n")[1])
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (the GPU check uses this)")
    p.add_argument("--family", action="append", choices=family_names(), help="only this family (repeatable)")
    p.add_argument("--op", action="append", help="only this op, e.g. layer_norm_backward (repeatable)")
    p.add_argument("--out", help="also write the report to this markdown file")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when torch sees a GPU, else cpu")
    p.add_argument("--seed", type=int, help="base seed of the random inputs (default: fresh each run)")
    p.add_argument("--case-timeout", type=float, default=120.0, help="seconds one case may take (default 120)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--ceilings", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------------------------------------
# worker: runs cases, prints one MARK line per case


def _emit(obj) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _cuda_alive() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except Exception:  # a sticky error (illegal address, launch failure): the context is gone
        return False


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


def run_case(index: int, spec, device: str, timer, seed: int) -> dict:
    import torch

    from . import family

    row = {"kind": "row", "index": index, "family": spec.family, "op": spec.op, "shape": spec.shape_label,
           "dtype": spec.dtype, "seed": seed, "status": "ok", "note": "", "ms": None, "peer_ms": None,
           "err": None, "peer_err": None, "bytes": 0, "flops": 0, "checks": []}
    prepared = None
    host_timing = getattr(family(spec.family), "TIMING", "device") == "host"
    try:
        torch.manual_seed(seed)
        prepared = family(spec.family).prepare(spec, device)
        if host_timing or prepared.timing == "host":
            timer = timer.host
        elif prepared.flush_l2:
            timer = functools.partial(timer, flush_l2=True)
        row["bytes"], row["flops"] = prepared.bytes, prepared.flops
        checks = prepared.check()
        row["checks"] = [dict(c.__dict__) for c in checks]
        errs = [c.err for c in checks if c.name != "out="]
        peer_errs = [c.peer_err for c in checks if c.peer_err is not None]
        row["err"] = max(errs, key=lambda v: math.inf if not math.isfinite(v) else v) if errs else None
        row["peer_err"] = max(peer_errs) if peer_errs else None
        bad = [c for c in checks if not c.ok]
        if bad:
            row["status"] = "FAIL"
            row["note"] = "; ".join(f"{c.name} {c.note} (err {c.err:.2e}, budget {c.budget:.2e})"
                                    if c.note != "result is not the out= tensor" else f"{c.name} {c.note}"
                                    for c in bad)
        row["ms"] = timer(prepared.run)
        if prepared.algorithm is not None:
            row["algorithm"] = prepared.algorithm()
    except Exception as e:
        row["status"] = "ERROR"
        row["note"] = _first_line(e)
        print(f"[bench] {spec.op} {spec.shape_label} {spec.dtype}: rudnn raised", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
    if prepared is not None:
        try:
            row["peer_ms"] = timer(prepared.peer)
        except Exception as e:  # a peer that cannot run this case is not a rudnn failure
            row["peer_note"] = _first_line(e)
            print(f"[bench] {spec.op} {spec.shape_label} {spec.dtype}: the peer raised {row['peer_note']}",
                  file=sys.stderr)
    del prepared
    if device == "cuda":
        if not _cuda_alive():
            row["fatal"] = True
            row["status"] = "ERROR"
            row["note"] = (row["note"] + "; " if row["note"] else "") + "CUDA context lost"
        else:
            torch.cuda.empty_cache()
    return row


def worker(args) -> int:
    import torch

    from . import Timer, copy_ceiling, environment, matmul_ceiling

    device = args.device
    timer = Timer(device, args.quick)
    if args.ceilings:
        env = environment(device)
        env["kind"] = "env"
        env["timing"] = timer.method
        try:
            env.update(copy_ceiling(device, timer, args.quick))
            env.update(matmul_ceiling(device, timer, args.quick))
        except Exception as e:
            env["ceiling_note"] = _first_line(e)
            traceback.print_exc(file=sys.stderr)
        if device == "cuda":
            torch.cuda.empty_cache()
        _emit(env)
    specs = all_cases(device, args.quick, args.family, args.op)
    for i in range(args.start, len(specs)):
        row = run_case(i, specs[i], device, timer, args.seed + i)
        _emit(row)
        if row.get("fatal"):
            return 3
    return 0


# ---------------------------------------------------------------------------------------------
# parent: starts workers, collects rows, writes the report


class _Terminated(Exception):
    pass


def _on_term(signum, frame):
    raise _Terminated()


def _commit() -> str:
    c = os.environ.get("RUDNN_COMMIT")
    if c:
        return c
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not sha:
            return "unknown (not in a git checkout; set RUDNN_COMMIT)"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return sha + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown (set RUDNN_COMMIT)"


def _lines(proc, timeouts: dict):
    """Lines from the worker's stdout; yields None when timeouts["next"] seconds pass without one."""
    fd = proc.stdout.fileno()
    buf = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeouts["next"])
        if not ready:
            yield None
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            if buf:
                yield buf.decode(errors="replace")
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode(errors="replace")


def _placeholder(index, spec, status, note) -> dict:
    return {"kind": "row", "index": index, "family": spec.family, "op": spec.op, "shape": spec.shape_label,
            "dtype": spec.dtype, "status": status, "note": note, "ms": None, "peer_ms": None, "err": None,
            "peer_err": None, "bytes": 0, "flops": 0}


def _progress(row) -> None:
    ms, pms = row.get("ms"), row.get("peer_ms")
    timing = f"rudnn {ms:.4f} ms, peer {pms:.4f} ms" if ms and pms else (f"rudnn {ms:.4f} ms" if ms else "")
    err = row.get("err")
    err_s = f"err {err:.1e}" if isinstance(err, float) and math.isfinite(err) else ""
    note = f" — {row['note']}" if row.get("note") else ""
    print(f"[bench] {row['status']:>7} {row['op']} {row['shape']} {row['dtype']} {timing} {err_s}{note}",
          file=sys.stderr, flush=True)


def _run_workers(args, device, specs, rows, state) -> None:
    start, dead_in_a_row = 0, 0
    while start < len(specs):
        cmd = [sys.executable, "-m", "rudnn.bench", "--worker", "--device", device, "--seed", str(args.seed),
               "--start", str(start)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--ceilings"] if state["env"] is None else []
        for f in args.family or []:
            cmd += ["--family", f]
        for o in args.op or []:
            cmd += ["--op", o]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        state["proc"], state["running"] = proc, start
        next_index, timed_out, last = start, False, None
        # A worker's first answer also waits for its start-up (imports, CUDA context) and, once, the ceilings.
        timeouts = {"next": args.case_timeout + (90 if state["env"] is None else 30)}
        for line in _lines(proc, timeouts):
            timeouts["next"] = args.case_timeout
            if line is None:
                timed_out = True
                break
            if not line.startswith(MARK):
                sys.stderr.write(line + "\n")  # something in the worker printed to stdout
                continue
            msg = json.loads(line[len(MARK):])
            if msg["kind"] == "env":
                state["env"] = msg
                continue
            rows[msg["index"]] = last = msg
            next_index = state["running"] = msg["index"] + 1
            _progress(msg)
            if msg.get("fatal"):  # the worker exits: its CUDA context is gone
                break
        if timed_out:
            proc.kill()
        rc = proc.wait()
        state["proc"] = None
        if state["env"] is None:  # it died measuring the ceilings: blame no case, measure none again
            state["env"] = {"kind": "env", "device": device, "device_name": device,
                            "ceiling_note": f"the worker died before reporting (exit status {rc})"}
        elif next_index < len(specs) and (timed_out or rc != 0) and not (last and last.get("fatal")):
            why = (("TIMEOUT", f"no result within {args.case_timeout:g} s") if timed_out
                   else ("CRASH", f"worker died (exit status {rc})"))
            rows[next_index] = _placeholder(next_index, specs[next_index], *why)
            _progress(rows[next_index])
            next_index += 1
        elif next_index < len(specs) and not (last and last.get("fatal")):
            print(f"[bench] the worker stopped early (exit status {rc})", file=sys.stderr)
            break
        dead_in_a_row = 0 if last is not None else dead_in_a_row + 1
        if dead_in_a_row >= 5:
            print("[bench] five workers in a row produced no row: giving up", file=sys.stderr)
            break
        start = next_index


def _report(args, device, specs, rows, env, interrupted) -> str:
    env = env or {"device": device, "device_name": device}
    done = [r if r is not None else _placeholder(i, s, "NOT RUN", "interrupted" if interrupted else "not reached")
            for i, (s, r) in enumerate(zip(specs, rows))]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# rudnn benchmark — {now}", ""]
    if device == "cpu":
        out += ["> **CPU mode: these are CPU timings of rudnn's C++ reference backend against torch's CPU kernels, "
                "at small sizes. They check that the harness and the ops run; they are not a performance claim.**", ""]
    out += [f"- device: {env.get('device_name', device)}",
            f"- torch {env.get('torch', '?')}" + (f" (CUDA {env['torch_cuda']})" if env.get("torch_cuda") else "")
            + f", Python {env.get('python', '?')}",
            f"- rudnn {env.get('rudnn', '?')} from {env.get('rudnn_path', '?')}; CUDA backend compiled in: "
            f"{'yes' if env.get('rudnn_has_cuda') else 'NO'}; commit {_commit()}"]
    if device == "cuda" and env.get("rudnn_has_cuda") is False:
        out.append("- **WARNING: rudnn was built without CUDA, so every GPU case fails**")
    ceil = []
    if env.get("copy_gbs"):
        ceil.append(f"device copy {env['copy_gbs']:.0f} GB/s (dst.copy_(src) of {env['copy_bytes'] / 1e9:.2f} GB, "
                    f"bytes read + written)")
    if env.get("matmul_tflops"):
        n = env["matmul_n"]
        ceil.append(f"bf16 matmul {env['matmul_tflops']:.0f} TFLOP/s ({n}×{n}×{n}, random data)")
    if env.get("ceiling_note"):
        ceil.append(f"ceiling failed: {env['ceiling_note']}")
    out.append(f"- ceilings measured in this run: {'; '.join(ceil) or 'none'}")
    out.append(f"- timing: {env.get('timing', '?')}")
    flags = " --quick" if args.quick else ""
    flags += "".join(f" --family {f}" for f in args.family or []) + "".join(f" --op {o}" for o in args.op or [])
    out.append(f"- mode: {'quick' if args.quick else 'full'}; random inputs with base seed {args.seed} "
               f"(same inputs again: python -m rudnn.bench{flags} --device {device} --seed {args.seed})")
    out += ["- columns: ms = median time of one call; peer/rudnn > 1 means rudnn is faster; GB/s = bytes that must "
            "move (inputs read once + outputs written once) over rudnn's time; % copy = that over the copy "
            "ceiling; rel err = max |out − ref| / max |ref| against a float64 reference, worst output; check = "
            "every output within 2× the peer's error plus a few ulps of its dtype, every element written", ""]
    for name in dict.fromkeys(s.family for s in specs):
        fam_rows = [r for r in done if r["family"] == name]
        out += [family_table(name, fam_rows, env), ""]
    bad = [r for r in done if not row_ok(r)]
    out.append("### summary")
    out.append("")
    out.append(f"- {len(done) - len(bad)} of {len(done)} cases ok" + (f"; **{len(bad)} not ok**" if bad else ""))
    for r in bad:
        out.append(f"  - **{r['status']}** {r['op']} {r['shape']} {r['dtype']}: {r.get('note', '')}")
    for name in dict.fromkeys(s.family for s in specs):
        line = target_line(name, [r for r in done if r["family"] == name], env)
        if line:
            out.append(f"- {line}")
    if interrupted:
        out.append("- **interrupted before the end: the rows marked NOT RUN did not run**")
    if device == "cpu":
        out.append("- CPU mode: timings of the reference backend, not a performance claim")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker(args)
    device = _device(args.device)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    specs = all_cases(device, args.quick, args.family, args.op)
    if args.list:
        for s in specs:
            print(f"{s.family} {s.op} {s.shape_label} {s.dtype}")
        return 0
    if not specs:
        print("no cases selected", file=sys.stderr)
        return 2
    rows = [None] * len(specs)
    state = {"env": None, "proc": None, "running": None}
    interrupted = False
    old = signal.signal(signal.SIGTERM, _on_term)
    t0 = time.time()
    try:
        _run_workers(args, device, specs, rows, state)
    except (_Terminated, KeyboardInterrupt):
        interrupted = True
        if state["proc"] is not None:
            state["proc"].kill()
            i = state["running"]
            if i is not None and i < len(specs) and rows[i] is None:
                rows[i] = _placeholder(i, specs[i], "INTERRUPTED", "was running when the benchmark was stopped")
    finally:
        signal.signal(signal.SIGTERM, old)
    report = _report(args, device, specs, rows, state["env"], interrupted)
    print(f"[bench] {len(specs)} cases in {time.time() - t0:.0f} s", file=sys.stderr)
    sys.stdout.write(report)
    sys.stdout.flush()
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(report)
    ok = not interrupted and all(r is not None and row_ok(r) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
