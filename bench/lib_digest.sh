#!/usr/bin/env bash
# Prints the digest of every file libruDNN is built from (its sources, headers and CMake files),
# the same on this machine and on the device machine (which gets the tree without .git): a
# carried prebuilt library (bench/prebuild_lib.sh) is used there only if this digest matches.
set -euo pipefail
cd "$(dirname "$0")/.."
find CMakeLists.txt cmake third_party cpp/src cpp/include -type f ! -name '*.pyc' | LC_ALL=C sort |
  xargs sha256sum | sha256sum | cut -c1-16
