#!/usr/bin/env bash
# The whole test suite: set-up if needed, build, then every CTest test (GPU tests skip cleanly
# where there is no GPU). Extra arguments go to ctest (e.g. -L cpu, -R config).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
source "$root/scripts/cmake-bin.sh"
"$CTEST" --test-dir "${ABLATE_BUILD_DIR:-$root/build}" -j "$(nproc)" --output-on-failure "$@"
