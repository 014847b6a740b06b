#!/usr/bin/env bash
# The main job: set-up, build, then the quickstart experiment (configs/quickstart.toml).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
ablate="${ABLATE_BUILD_DIR:-$root/build}/bin/ablate"
"$ablate" plugins list
"$ablate" config show "$root/configs/quickstart.toml" "$@"
"$ablate" data analyze "$root/configs/quickstart.toml" --documents 2000 "$@"
