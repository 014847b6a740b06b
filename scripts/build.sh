#!/usr/bin/env bash
# Configures (once) and builds ablate into build/ (override with ABLATE_BUILD_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ABLATE_BUILD_DIR:-$root/build}
source "$root/scripts/cmake-bin.sh"
if [ ! -f "$build/CMakeCache.txt" ]; then
  "$CMAKE" -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${ABLATE_CMAKE_ARGS:-}
fi
"$CMAKE" --build "$build" -j "$(nproc)"
