#!/usr/bin/env bash
# The bundle's CPU part, on a machine with none of ablate's dependencies installed (the bundle's
# test runs it inside a bare Debian root): every CPU plugin loads, the CUDA plugins fail to load
# naming the library they miss (no crash), a 20-step quickstart trains, and the shipped CPU test
# programs that need nothing outside the bundle pass. Usage: cpu-check.sh OUT
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: cpu-check.sh OUT}
mkdir -p "$out"
source "$here/env.sh"
status=0
fail() { echo "FAILED: $*"; status=1; }

echo "== plugins"
"$here/bin/ablate" plugins list --json > "$out/plugins.json" 2> "$out/plugins.err" || fail "ablate plugins list exited $?"
"$here/bin/ablate" plugins list 2>&1 | tee "$out/plugins.txt"
# Every plugin that did not load must be a CUDA one whose reason names the CUDA library it misses.
awk '/^not loaded:/ {on = 1; next} on && /^  [^ ]/ {file = $1; next} on && /^    / {print file "\t" $0}' "$out/plugins.txt" |
while IFS=$'\t' read -r file reason; do
  if echo "$reason" | grep -qE 'lib(cudart|cuda|nccl|cublas|cublasLt|cudnn)[^ ]*\.so'; then
    echo "  as expected without CUDA: $(basename "$file"): $reason"
  else
    echo "FAILED: $(basename "$file") did not load: $reason"
  fi
done | tee "$out/plugin-check.txt"
grep -q '^FAILED' "$out/plugin-check.txt" && status=1
for p in cpu_layers naive_cpu adamw adamw8bit packed padded bucketed samplers loggers single synthetic_probes text_files token_shards; do
  grep -q "libablate_$p.so" "$out/plugins.txt" || { echo "FAILED: libablate_$p.so is not in the bundle"; status=1; }
done

echo "== quickstart, 20 steps"
"$here/bin/ablate" train "$here/src/configs/quickstart.toml" --set run.steps=20 --set run.eval_every=0 \
  --run-dir "$out/quickstart" > "$out/quickstart.log" 2>&1 || fail "quickstart exited $?"
tail -2 "$out/quickstart.log"
grep -q '"status": "completed"' "$out/quickstart/summary.json" 2>/dev/null || fail "quickstart has no completed summary"

echo "== the mpi communicator, a singleton start from the bundle's Open MPI (nccl bootstraps through it)"
"$here/bin/ablate" train "$here/src/configs/quickstart.toml" --set run.steps=2 --set run.communicator=mpi \
  --run-dir "$out/mpi" > "$out/mpi.log" 2>&1 || { fail "a singleton mpi run exited $?"; tail -5 "$out/mpi.log"; }
grep -q '"communicator": "mpi"' "$out/mpi/run.json" 2>/dev/null && echo "  passed  mpi singleton" || fail "the mpi run left no run.json naming mpi"

echo "== two ranks on this machine through the bundle's mpirun (how the GPU run starts two nccl ranks)"
if [ -x "$here/openmpi/bin/mpirun" ]; then
  "$here/openmpi/bin/mpirun" --oversubscribe -np 2 "$here/bin/ablate" train "$here/src/configs/quickstart.toml" \
    --set run.steps=2 --set run.communicator=mpi --set run.threads=1 --run-dir "$out/mpi2" > "$out/mpi2.log" 2>&1 ||
    { fail "a 2-rank mpirun exited $?"; tail -5 "$out/mpi2.log"; }
  grep -q '"world": 2' "$out/mpi2/run.json" 2>/dev/null && echo "  passed  mpirun -np 2" || fail "the 2-rank run left no run.json of world 2"
else
  fail "the bundle has no openmpi/bin/mpirun"
fi

echo "== CPU test programs"
for p in ${ABLATE_BUNDLE_CPU_TESTS:-test_registry test_config test_schedule test_safetensors test_metrics test_device test_samplers test_batchers test_cpu_layers test_naive_cpu test_model test_adamw test_adamw8bit test_train}; do
  [ -x "$here/bin/$p" ] || { fail "$p is not in the bundle"; continue; }
  if "$here/bin/$p" > "$out/$p.log" 2>&1; then echo "  passed  $p"; else fail "$p (log: $out/$p.log)"; tail -20 "$out/$p.log"; fi
done
echo "== cpu-check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
