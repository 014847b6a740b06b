#!/usr/bin/env bash
# Instructions per training step of this build against another (BASELINE = its `ablate`), counted
# by valgrind's callgrind: unlike seconds on a shared machine, the count repeats exactly for the
# same binary and input. Each build trains the quickstart model twice on one thread, for S1 and S2
# steps (no evaluation, checkpoints or peak measurement); the difference divided by S2 - S1 is the
# cost of one step, start-up excluded. Writes bench/results/bench_train_instructions.{json,log}.
# Usage: bench/run_bench_train_instructions.sh BASELINE_ABLATE [S1=2] [S2=5]
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=${1:?usage: $0 BASELINE_ABLATE [S1] [S2]}
s1=${2:-2}
s2=${3:-5}
this=build/bin/ablate
mkdir -p bench/results
log=bench/results/bench_train_instructions.log
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count() {  # build steps -> instructions
  local out="$tmp/cg.$RANDOM"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$1" train configs/quickstart.toml --run-dir "$tmp/run.$RANDOM" \
    --set run.steps="$2" --set run.threads=1 --set run.eval_batches=0 --set checkpoint.every=0 \
    --set metrics.peak_tflops=1 --set data.synthetic_probes.documents=600 --set data.synthetic_probes.validation_documents=10 --set logging.sinks='["jsonl"]' >/dev/null 2>&1
  grep -E '^(summary|totals):' "$out" | head -1 | awk '{print $2}'
}
{
  echo "bench_train_instructions: $(git rev-parse --short HEAD) vs $baseline, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "quickstart, 1 thread, steps $s1 and $s2 (callgrind instructions, the whole process)"
  declare -A per_step
  for side in this baseline; do
    bin=$this; [ "$side" = baseline ] && bin=$baseline
    a=$(count "$bin" "$s1"); b=$(count "$bin" "$s2")
    per_step[$side]=$(( (b - a) / (s2 - s1) ))
    echo "$side: $a instructions for $s1 steps, $b for $s2 steps: ${per_step[$side]} per step"
  done
  ratio=$(python3 -c "print(f'{${per_step[this]} / ${per_step[baseline]}:.4f}')")
  echo "instructions per step, this / baseline: $ratio"
  python3 - "$ratio" "${per_step[this]}" "${per_step[baseline]}" "$baseline" "$s1" "$s2" <<'PY'
import json, subprocess, sys, datetime
ratio, this, base, baseline, s1, s2 = sys.argv[1:]
out = {"benchmark": "bench_train_instructions", "what": "callgrind instructions per quickstart training step, 1 thread",
       "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
       "baseline_build": baseline, "steps": [int(s1), int(s2)],
       "this_per_step": int(this), "baseline_per_step": int(base), "ratio_this_over_baseline": float(ratio)}
json.dump(out, open("bench/results/bench_train_instructions.json", "w"), indent=2)
print("wrote bench/results/bench_train_instructions.json")
PY
} 2>&1 | tee "$log"
