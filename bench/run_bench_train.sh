#!/usr/bin/env bash
# Runs bench/bench_train.py and keeps its console output in bench/results/bench_train.log (with
# --baseline OTHER_ABLATE, a build-vs-build comparison: bench/results/bench_train_builds.log).
# Arguments go to the benchmark, e.g. --note "another build was running" or --steps 10.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
log=bench/results/bench_train.log
for a in "$@"; do [ "$a" = "--baseline" ] && log=bench/results/bench_train_builds.log; done
python3 bench/bench_train.py "$@" 2>&1 | tee "$log"
