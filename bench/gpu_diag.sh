#!/usr/bin/env bash
# bench/gpu_diag.sh — after bench/gpu_check.sh in the same device `run`: reproduce crashes seen in a
# GPU check one at a time and, where a repro still crashes, take its native stack with cuda-gdb
# (the device image has no gdb; cuda-gdb debugs host-only crashes too). Writes $OUT/diag.log.
#
#     run(command="RUDNN_COMMIT=<sha> GC_BUDGET=450 bash bench/gpu_check.sh; bash bench/gpu_diag.sh",
#         carry=[".whl"], timeout_s=570)
#
# Each repro is a short Python snippet run in a fresh process with faulthandler on. Add the next
# crash here when a check finds one; remove a repro once its crash is fixed and stays fixed.
set -u
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="${GC_SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/diag.log"
: > "$LOG"

repro() {  # NAME CODE: run CODE; on a crash, run it again under cuda-gdb for the native stack
  local name=$1 code=$2 rc
  echo "===== $name" >> "$LOG"
  (cd / && timeout 60 "$PY" -X faulthandler -c "$code") >> "$LOG" 2>&1
  rc=$?
  echo "----- exit status $rc" >> "$LOG"
  if [ $rc -ge 128 ] && command -v cuda-gdb >/dev/null 2>&1; then
    echo "----- cuda-gdb backtrace" >> "$LOG"
    (cd / && timeout 120 cuda-gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args "$PY" -c "$code") \
      2>&1 | grep -vE '^\[(New|Thread|Detaching)' | tail -150 >> "$LOG"
  fi
}

# 2026-11-30: every ShapeError raised for CUDA tensors killed pytest with SIGSEGV (DTypeError,
# ArgumentError and UnsupportedError for the same tensors did not); the bench parent died at start.
repro "ShapeError, CPU tensors" '
import torch, rudnn
try: rudnn.rms_norm(torch.zeros(4, 8), torch.ones(3))
except rudnn.ShapeError as e: print("raised:", e)'
repro "ShapeError, CUDA tensors" '
import torch, rudnn
try: rudnn.rms_norm(torch.zeros(4, 8, device="cuda"), torch.ones(3, device="cuda"))
except rudnn.ShapeError as e: print("raised:", e)'
repro "ShapeError, CUDA tensors, rudnn imported before torch" '
import rudnn, torch
q = torch.zeros(4, 5, 8, device="cuda")
try: rudnn.attention(q, torch.zeros(1, 2, 6, 8, device="cuda"), torch.zeros(1, 2, 6, 8, device="cuda"))
except rudnn.ShapeError as e: print("raised:", e)'
repro "bench parent start (rudnn first)" '
import sys; sys.argv = ["rudnn.bench", "--list", "--quick", "--device", "cuda"]
import runpy; runpy.run_module("rudnn.bench", run_name="__main__")'
# 2026-11-30: the flash forward ran at 13-20 TFLOP/s (cuDNN ~660) with correct results. Time
# each kernel generation, then profile one sm90 and one sm80 launch with ncu (--clock-control
# none, as the device notes advise).
for gen in sm90 sm90ws sm80; do
  echo "===== attention probe, RUDNN_ATTENTION_FLASH=$gen" >> "$LOG"
  (cd / && RUDNN_ATTENTION_FLASH=$gen timeout 60 "$PY" "$REPO/bench/attention_probe.py") >> "$LOG" 2>&1
done
if command -v ncu >/dev/null 2>&1; then
  for gen in sm90 sm90ws sm80; do
    echo "===== ncu, first forward_$gen launch" >> "$LOG"
    (cd / && RUDNN_ATTENTION_FLASH=$gen timeout 120 ncu --clock-control none -k "regex:forward_${gen}_kernel" -c 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis "$PY" "$REPO/bench/attention_probe.py" --ncu) 2>&1 | tail -120 >> "$LOG"
  done
fi
echo "===== done" >> "$LOG"
tail -c 6000 "$LOG"
