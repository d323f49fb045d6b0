#!/usr/bin/env bash
# Fill the ignored .whl/ folder with the pure-Python wheels that bench/gpu_check.sh installs on the
# device machine, which reaches no package registry (GPU.md rule 3). Run here, from any directory:
#
#     bash bench/fetch_wheels.sh
#
# Pins: nvidia-cutlass and nanobind are the versions pyproject.toml builds with; scikit-build-core
# and pytest-timeout are the versions last checked; fla-core is flash-linear-attention's kernel
# package (`fla.ops`, Triton; needs only einops, which the device image has), the gated delta
# benchmark's peer (the flash-linear-attention wheel itself adds models that need a newer
# transformers). All five are py3-none-any (about 8 MB together, well inside the 64 MiB that
# travels with a device call). Keep one version of each: two wheels of one package stop the
# whole install there.
# Not carried: flashinfer-python (the paged benchmark's peer; 0.7.2.post1 is a 62 MB wheel before its
# cubins, and a device call carries 64 MiB in all, .gpulib's libruDNN included), so the paged rows
# report FlashInfer "absent" (checked 2026-12-03; see bench/NOTES.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=(nvidia-cutlass==4.2.0.0 nanobind==3.1.0 scikit-build-core==1.1.2 pytest-timeout==2.4.0 fla-core==0.6.0)

git check-ignore -q .whl/ || { echo "fetch_wheels: .whl/ is not ignored by git; add /.whl/ to .gitignore" >&2; exit 1; }
rm -rf .whl
mkdir -p .whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 -d .whl "${WHEELS[@]}"
ls -l .whl
