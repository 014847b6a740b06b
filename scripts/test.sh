#!/usr/bin/env bash
# The whole test suite: set-up if needed, build, then every CTest test (GPU tests skip cleanly
# where there is no GPU). Extra arguments go to ctest (e.g. -L cpu, -R config).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
# What only the tests use (third_party/pip-test-packages.txt: the tokenizer references).
"$root/scripts/setup-tests.sh"
"$root/scripts/build.sh"
source "$root/scripts/cmake-bin.sh"
# The kernel interpreter's tests (label emu) are outside the main build: built here.
"$CMAKE" --build "${ABLATE_BUILD_DIR:-$root/build}" --target ablate_emu_tests -j "$(nproc)"
"$CTEST" --test-dir "${ABLATE_BUILD_DIR:-$root/build}" -j "$(nproc)" --output-on-failure "$@"
