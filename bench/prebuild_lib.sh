#!/usr/bin/env bash
# Builds libruDNN for the lent GPU here (sm_90a only), so that bench/gpu_check.sh compiles only the
# nanobind module on the device machine instead of spending 3-5 of its minutes on the kernels
# (libruDNN does not depend on Python; the module does, and must be built there, for its 3.12).
#
#     bash bench/prebuild_lib.sh        # then carry=[".whl", ".gpulib"] in the device call
#
# Writes the ignored .gpulib/: libruDNN.so.0, STAMP (the digest of the library's sources from
# bench/lib_digest.sh, the commit, the architectures) and ptxas.log (ptxas's resource report,
# which gpu_check.sh puts in its build.log). libstdc++ and libgcc are linked statically and kept
# local (the device image's toolchain does the same), so the library needs only glibc there.
# Uses ccache like scripts/install.sh; about 10-15 min cold on 2 cores. Knobs: GC_ARCHS (90a),
# PYTHON (.venv/bin/python, for CUTLASS's headers from the pinned wheel), PREBUILD_CMAKE_ARGS (more
# -D options; -DRUDNN_WITH_CUDA=OFF makes a CPU-only library in a minute, to try the mechanism:
# then `GC_BUILD_ONLY=1 GC_CMAKE_ARGS=-Ccmake.define.RUDNN_WITH_CUDA=OFF bash bench/gpu_check.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
archs=${GC_ARCHS:-90a}
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || { echo "prebuild_lib: $py not found; run scripts/install.sh first (or set PYTHON)" >&2; exit 1; }
git check-ignore -q .gpulib/ || { echo "prebuild_lib: .gpulib/ is not ignored by git" >&2; exit 1; }
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1
build=build/gpulib
start=$(date +%s)
"$(dirname "$py")/cmake" -S . -B "$build" -G Ninja -DCMAKE_MAKE_PROGRAM="$(dirname "$py")/ninja" \
  -DPython_EXECUTABLE="$py" -DRUDNN_CUDA_ARCHS="$archs" -DRUDNN_PTXAS_VERBOSE=ON -DRUDNN_WITH_SM90WS=ON \
  -DRUDNN_WITH_MOE_GEMM_VARIANTS=ON \
  -DCMAKE_SHARED_LINKER_FLAGS="-static-libstdc++ -static-libgcc" -DRUDNN_WITH_CUDA=ON ${PREBUILD_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 ||
  { tail -n 40 "$build.configure.log" >&2; exit 1; }
NINJA_STATUS="[%f/%t %es] " "$(dirname "$py")/cmake" --build "$build" --target ruDNN 2>&1 | tee "$build.log" |
  sed -u -n -E '/^\[[0-9]+\/[0-9]+ /{s#(Building|Linking) [A-Z+]+ (object|shared library) ##; p}'
[ "${PIPESTATUS[0]}" -eq 0 ] || { grep -E "error|FAILED" "$build.log" | head -n 40 >&2; exit 1; }
rm -rf .gpulib
mkdir -p .gpulib
cp "$build"/libruDNN.so.0.*.* .gpulib/libruDNN.so.0
grep -E "ptxas|Compiling entry|Function properties|spill|Used [0-9]+ registers" "$build.log" > .gpulib/ptxas.log || true
glibc=$(objdump -T .gpulib/libruDNN.so.0 | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
commit=$(git rev-parse --short=12 HEAD)
git diff --quiet HEAD -- CMakeLists.txt cmake third_party cpp/src cpp/include || commit="$commit+dirty"
cat > .gpulib/STAMP <<STAMP
digest $(bash bench/lib_digest.sh)
commit $commit
archs $archs
cmake_args ${PREBUILD_CMAKE_ARGS:-}
needs $glibc
built $(date -u '+%Y-%m-%d %H:%M:%S UTC') in $(( $(date +%s) - start )) s
STAMP
ls -l .gpulib
cat .gpulib/STAMP
