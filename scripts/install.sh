#!/usr/bin/env bash
# Creates .venv (or uses $RUDNN_VENV), installs the build/test stack and builds rudnn
# (libruDNN + rudnn._C; CUDA kernels for RUDNN_CUDA_ARCHS, default 80;90a, when nvcc exists).
#
# Compiles go through ccache (installed here from Debian's packages when missing and we may):
# keyed on paths relative to the clone, so a second clone in another folder hits the cache.
# The build's progress is shown one line per finished step ([done/total elapsed] what); the
# whole build log is kept in build/install.log.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv="${RUDNN_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-dev.txt

if ! command -v ccache >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install: installing ccache (Debian package)"
    { apt-get install -y -q ccache || { apt-get update -q && apt-get install -y -q ccache; }; } >/dev/null 2>&1 ||
      echo "install: could not install ccache; compiling without a cache"
  else
    echo "install: ccache not found (install it to make rebuilds and second clones fast)"
  fi
fi
# Paths under the clone are hashed relative to it, and the working directory is not hashed,
# so /a/rudnn and /b/rudnn share cache entries (CI's fresh clone hits what a session built).
# Depend mode takes the headers from the compiler's -MD output instead of running the
# preprocessor a second time: a miss then costs ~nothing over the compile (CuTe's headers make
# preprocessing nvcc's sources slow).
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1
command -v ccache >/dev/null 2>&1 && ccache --zero-stats >/dev/null

cuda_flag=()
if ! command -v nvcc >/dev/null 2>&1; then
  echo "install: nvcc not found, building the CPU backend only"
  cuda_flag=(-Ccmake.define.RUDNN_WITH_CUDA=OFF)
fi
archs=()
[ -n "${RUDNN_CUDA_ARCHS:-}" ] && archs=(-Ccmake.define.RUDNN_CUDA_ARCHS="$RUDNN_CUDA_ARCHS")
if [ ${#cuda_flag[@]} -eq 0 ]; then
  echo "install: building rudnn with CUDA for ${RUDNN_CUDA_ARCHS:-80;90a} on $(nproc) cores:" \
       "about 15-20 min cold on 2 cores, 2-3 min when ccache holds the objects"
else
  echo "install: building rudnn (CPU backend): about 1 min on 2 cores"
fi
mkdir -p build
log=build/install.log
start=$(date +%s)
# pip -v streams the build; only ninja's step lines reach the terminal.
if ! NINJA_STATUS="[%f/%t %es] " python -m pip install -v --no-build-isolation --no-deps \
      "${cuda_flag[@]}" "${archs[@]}" . 2>&1 | tee "$log" |
      sed -u -n -E '/^ *\[[0-9]+\/[0-9]+ /{s/^ *//; s#(Building|Linking) [A-Z+]+ (object|shared library|shared module) ##; p}'; then
  echo "install: the build failed; the end of $log:" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
echo "install: rudnn built and installed in $(( $(date +%s) - start )) s"
if command -v ccache >/dev/null 2>&1; then
  ccache --print-stats 2>/dev/null | awk -F'\t' '$1=="direct_cache_hit"||$1=="preprocessed_cache_hit"{h+=$2} $1=="cache_miss"{m=$2}
    END{if (h+m) printf "install: ccache %d hits, %d misses\n", h, m}'
fi
