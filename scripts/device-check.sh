#!/usr/bin/env bash
# The GPU checks in one call, on a GPU machine without ablate's dependencies (docs/gpu-machine.md):
# runs the bundle that `scripts/device-bundle.sh .bundle` made here and that travelled in the
# ignored folder .bundle (or $ABLATE_BUNDLE). Without a bundle, says how to make one.
# Usage: scripts/device-check.sh OUT   (or with $OUT set)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${ABLATE_BUNDLE:-$root/.bundle}
if [ ! -x "$bundle/run.sh" ]; then
  echo "device-check: no bundle at $bundle: make it where ablate builds (scripts/device-bundle.sh .bundle)" >&2
  echo "and carry .bundle to this machine" >&2
  exit 2
fi
exec "$bundle/run.sh" "${1:-${OUT:?usage: scripts/device-check.sh OUT}}"
