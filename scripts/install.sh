#!/usr/bin/env bash
# Creates .venv (or uses $RUDNN_VENV), installs the build/test stack and builds rudnn
# (libruDNN + rudnn._C; CUDA kernels for RUDNN_CUDA_ARCHS, default 80;90a, when nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RUDNN_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-dev.txt
cuda_flag=()
if ! command -v nvcc >/dev/null 2>&1; then
  echo "install: nvcc not found, building the CPU backend only"
  cuda_flag=(-Ccmake.define.RUDNN_WITH_CUDA=OFF)
fi
archs=()
[ -n "${RUDNN_CUDA_ARCHS:-}" ] && archs=(-Ccmake.define.RUDNN_CUDA_ARCHS="$RUDNN_CUDA_ARCHS")
start=$(date +%s)
python -m pip install --no-build-isolation --no-deps "${cuda_flag[@]}" "${archs[@]}" .
echo "install: rudnn built and installed in $(( $(date +%s) - start )) s"
