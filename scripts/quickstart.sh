#!/usr/bin/env bash
# The main job: set-up, build, then train the quickstart experiment (configs/quickstart.toml) on the
# CPU into runs/quickstart and sample from it. Extra arguments go to `ablate train` (e.g.
# --set run.steps=100). A second run starts over: it replaces runs/quickstart.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
ablate="${ABLATE_BUILD_DIR:-$root/build}/bin/ablate"
run_dir="${ABLATE_RUN_DIR:-$root/runs/quickstart}"
rm -rf "$run_dir"
"$ablate" train "$root/configs/quickstart.toml" --run-dir "$run_dir" "$@"
echo "--- a sample from the trained model (a probe session of host h7) ---"
"$ablate" sample --checkpoint "$run_dir" --prompt "#h7 " --tokens 120 --top-k 5 --temperature 0.8 --seed 1
echo "--- run directory: $run_dir (config.toml, metrics.jsonl, summary.json, checkpoints/) ---"
