#!/usr/bin/env bash
# Runs bench/bench_train.py and keeps its console output in bench/results/bench_train.log.
# Arguments go to the benchmark, e.g. --note "another build was running" or --steps 10.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
python3 bench/bench_train.py "$@" 2>&1 | tee bench/results/bench_train.log
