#!/usr/bin/env bash
# bench/gpu_diag.sh — the dense attention experiment (issue 24) in one device `run` of at most
# DIAG_BUDGET = 540 s, build included:
#
#     bash bench/fetch_wheels.sh && bash bench/prebuild_lib.sh           # here, first
#     run(command="RUDNN_COMMIT=<sha> bash bench/gpu_diag.sh", carry=[".whl", ".gpulib"], timeout_s=570)
#
# 1. bench/gpu_check.sh, narrowed: install the carried wheels, build (only the nanobind module when
#    .gpulib/ carries this tree's libruDNN), run the attention tests (CUDA variants included; not
#    the paged family's, not the host emulators: GC_PYTEST_ARGS takes whitespace-free words only)
#    with the per-test limit, no benchmark (GC_SKIP_BENCH=1): summary.md, build.log, pytest.log,
#    junit.xml.
# 2. bench/attention_probe.py: every flash generation (sm80, sm90, sm90ws) forward and backward on
#    the benchmark's shapes, plain and softcapped, causal and not, next to SDPA's cuDNN and flash
#    backends in the same process (no synchronization between timed calls).
# 3. ncu (--clock-control none): one profile of the first launch of each kernel on one case
#    (B·S = 16k, H = 16, S = 4096, D = 128, causal) with the sections SpeedOfLight,
#    ComputeWorkloadAnalysis, MemoryWorkloadAnalysis, SchedulerStats, WarpStateStats and
#    InstructionStats. Without ncu on the machine the summary says so (never silently).
# Everything lands in $OUT/attention.md (steps, timings, the probe table, the ncu reports), besides
# gpu_check's files. Each step has its own limit, clipped to what the budget has left; a step
# that does not fit is reported as skipped.
set -u
set +e
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${DIAG_BUDGET:-540}
SUMMARY="$OUT/attention.md"
export PYTHONPATH="${GC_SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

now() { date +%s; }
left() { echo $(( BUDGET - ($(now) - T0) )); }
say() { echo "[gpu_diag $(( $(now) - T0 ))s] $*"; }
section() { printf '\n## %s\n\n' "$1" >> "$SUMMARY"; }

{
  echo "# Dense attention experiment (bench/gpu_diag.sh)"
  echo
  echo "commit ${RUDNN_COMMIT:-unknown}; $(date -u '+%Y-%m-%d %H:%M UTC'); budget ${BUDGET} s"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null |
    sed 's/^/GPU: /'
} > "$SUMMARY"

# ---------------------------------------------------------------- 1. build + attention tests
say "gpu_check (build, attention tests)"
GC_BUDGET=$(( $(left) < 270 ? $(left) - 10 : 260 )) GC_T_BUILD=${DIAG_T_BUILD:-160} GC_T_TEST=${DIAG_T_TEST:-95} \
  GC_SKIP_BENCH=1 GC_PYTEST_ARGS="${DIAG_PYTEST_ARGS:---ignore-glob=*paged* --ignore-glob=*emulation* -k attention}" OUT="$OUT" PYTHON="$PY" \
  bash bench/gpu_check.sh > "$OUT/gpu_check.out" 2>&1
rc=$?
section "Build and attention tests (bench/gpu_check.sh, exit $rc)"
sed -n '1,60p' "$OUT/summary.md" >> "$SUMMARY" 2>/dev/null || tail -n 30 "$OUT/gpu_check.out" >> "$SUMMARY"
rm -f "$OUT/gpu_check.out"
if ! (cd / && timeout 60 "$PY" -c "import rudnn, sys; sys.exit(0 if rudnn.has_cuda else 1)") >/dev/null 2>&1; then
  section "Stopped"
  echo "rudnn with CUDA does not import after the build: no timings, no profiles." >> "$SUMMARY"
  say "no importable CUDA rudnn; stopping"
  tail -c 4000 "$SUMMARY"
  exit 1
fi

# ---------------------------------------------------------------- 2. timings
NCU_RESERVE=${DIAG_NCU:-150}
lim=$(( $(left) - NCU_RESERVE - 10 ))
[ "$lim" -gt 200 ] && lim=200
section "Timings (bench/attention_probe.py, limit ${lim}s)"
if [ "$lim" -ge 40 ]; then
  say "probe (limit ${lim}s)"
  quick=""
  [ "$lim" -lt 120 ] && quick="--quick" && echo "(--quick: ${lim}s left)" >> "$SUMMARY"
  (cd / && timeout -k 5 "$lim" "$PY" "$REPO/bench/attention_probe.py" $quick --out "$OUT/probe.md") \
    > "$OUT/probe.log" 2>&1
  rc=$?
  cat "$OUT/probe.md" >> "$SUMMARY" 2>/dev/null
  [ $rc -ne 0 ] && { echo; echo "probe exit status $rc (124: out of time, the table is partial); its log's tail:";
                     echo '```'; tail -n 25 "$OUT/probe.log"; echo '```'; } >> "$SUMMARY"
  rm -f "$OUT/probe.md" "$OUT/probe.log"
else
  echo "skipped: ${lim}s left" >> "$SUMMARY"
fi

# ---------------------------------------------------------------- 3. one ncu profile per kernel
section "ncu profiles (first launch of each kernel; B=4, H=16, S=4096, D=128, causal, bf16)"
if ! command -v ncu >/dev/null 2>&1; then
  echo "**ncu is not on this machine: no profiles.**" >> "$SUMMARY"
  say "ncu absent"
else
  # GEN DIRECTION KERNEL-REGEX
  PROFILES=("sm90 forward forward_sm90_kernel" "sm90ws forward forward_sm90ws_kernel" "sm80 forward forward_sm80_kernel"
            "sm90 backward dkdv_sm90_kernel" "sm90 backward dq_sm90_kernel" "sm90ws backward dkdv_sm90ws_kernel"
            "sm80 backward dkdv_kernel" "sm80 backward dq_kernel")
  for p in "${PROFILES[@]}"; do
    read -r gen dir kernel <<< "$p"
    lim=$(( $(left) - 10 ))
    [ "$lim" -gt 40 ] && lim=40
    echo "### $kernel (RUDNN_ATTENTION_FLASH=$gen, $dir)" >> "$SUMMARY"
    if [ "$lim" -lt 15 ]; then
      echo "skipped: out of budget" >> "$SUMMARY"
      continue
    fi
    say "ncu $kernel (limit ${lim}s)"
    echo '```' >> "$SUMMARY"
    (cd / && timeout -k 5 "$lim" ncu --clock-control none -k "regex:${kernel}" -c 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats --section InstructionStats \
      "$PY" "$REPO/bench/attention_probe.py" --ncu "$gen" "$dir") 2>&1 |
      grep -vE '^==PROF== (Connected|Disconnected)' | tail -n 160 >> "$SUMMARY"
    echo "(exit ${PIPESTATUS[0]})" >> "$SUMMARY"
    echo '```' >> "$SUMMARY"
  done
fi

section "Done"
echo "$(( $(now) - T0 )) s of ${BUDGET} s" >> "$SUMMARY"
say "done"
grep -E '^\| (forward|backward) ' "$SUMMARY" | cut -c1-160 | tail -n 40
