#!/usr/bin/env bash
# Runs bench/bench_dp.py and keeps its console output in bench/results/bench_dp.log.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
python3 bench/bench_dp.py "$@" 2>&1 | tee bench/results/bench_dp.log
