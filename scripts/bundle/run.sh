#!/usr/bin/env bash
# Runs ablate's GPU checks on this machine in one call (docs/gpu-machine.md): the machine and the
# libraries found, every test program labelled gpu once under compute-sanitizer memcheck and once
# plainly (JUnit XML from the doctest programs), the GPU benchmarks and the PyTorch peer, then a
# one-screen summary. Everything goes to OUT: run.log, summary.txt, summary.json, the benchmarks'
# JSON, and all.tar.gz with every log and XML. Exit status 0 only when nothing failed.
# Usage: run.sh OUT   (or with $OUT set)
# ABLATE_STAGES (comma-separated, default all: tests,memcheck,bench,gpt2,llama,comm,numerics) runs a part, so
# that the whole can be split over device calls: tests,bench,numerics in one, gpt2,llama in the next;
# sweeps (the GPU sweeps with their reports) runs only when named.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:?usage: run.sh OUT}}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
source "$here/env.sh"
# Everything to run.log as well; the tee is waited for at the end, so the log keeps its tail.
exec 3>&1 4>&2
exec > >(tee "$out/run.log") 2>&1
tee_pid=$!
results="$out/logs/results.tsv"
: > "$results"
t_start=$(date +%s)

echo "== machine"
date -u +%Y-%m-%dT%H:%M:%SZ
cat "$here/BUNDLE.txt" | head -4
uname -a
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || echo "nvidia-smi: not available"
command -v nvcc >/dev/null && nvcc --version | tail -1
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 || true
echo "CUDA libraries for ablate's plugins:"
cuda_libraries_report
"$here/bin/ablate" plugins list 2>&1 | tail -n +1

# One program, one mode: records passed / failed / skipped (exit 77) with its time.
run_program() {  # mode prog [args...]
  local mode=$1 prog=$2; shift 2
  local log="$out/logs/$prog.$mode.log" xml="$out/logs/$prog.$mode.xml" t0 rc status
  local cmd=("$here/bin/$prog")
  if grep -q -- "--reporters" "$here/bin/$prog" 2>/dev/null; then  # a doctest program
    cmd+=(--reporters=junit --out="$xml")
  fi
  [ "$mode" = memcheck ] && cmd=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 "${cmd[@]}")
  t0=$(date +%s%N)
  # Plainly, the program's CTest limit (the manifest's third column); under memcheck, 150 s.
  local own
  own=$(awk -F'\t' -v p="$prog" '$1 == p {print $3}' "$here/manifest/tests.tsv")
  [ -n "$own" ] || own=300
  # ABLATE_PROGRAM_LIMIT caps each program plainly, so that one hung program cannot take a short call.
  [[ "${ABLATE_PROGRAM_LIMIT:-}" =~ ^[1-9][0-9]*$ ]] && [ "$own" -gt "$ABLATE_PROGRAM_LIMIT" ] && own=$ABLATE_PROGRAM_LIMIT
  timeout "$(limit "$([ "$mode" = memcheck ] && echo 150 || echo "$own")")" "${cmd[@]}" "$@" > "$log" 2>&1
  rc=$?
  case $rc in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf '%s\t%s\t%s\t%d\t%s\n' "$prog" "$mode" "$status" "$rc" "$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b - a) / 1e9}')" >> "$results"
  printf '  %-26s %-9s %-8s (exit %d)\n' "$prog" "$mode" "$status" "$rc"
}

# The device call is cut at 600 s (ABLATE_CALL_SECONDS, default 570, for a shorter call): each
# stage starts only with enough time left for it, so the summary is always written.
call_seconds=${ABLATE_CALL_SECONDS:-570}
[[ "$call_seconds" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: ABLATE_CALL_SECONDS must be a positive number of seconds, not '$call_seconds'" >&2; exit 2; }
left() { echo $(( call_seconds - ($(date +%s) - t_start) )); }
# A command's own limit: at most $1 seconds, and never past the call's end.
limit() { local l; l=$(( $(left) - 10 )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
stages=",${ABLATE_STAGES:-tests,memcheck,bench,gpt2,llama,comm,numerics},"
want() { [[ "$stages" == *",$1,"* ]]; }
skip_stage() {  # name seconds_needed
  if [ "$(left)" -lt "$2" ]; then
    echo "  $1: skipped, $(left) s left of the call"
    printf '%s\tskipped-for-time\tskipped\t0\t0\n' "$1" >> "$results"
    return 0
  fi
  return 1
}

gpu_programs=$(awk -F'\t' '$2 ~ /(^|,)gpu(,|$)/ {print $1}' "$here/manifest/tests.tsv")
# memcheck slows a program tens of times: the end-to-end training program runs plainly, and two
# training steps of a small model run under memcheck on their own below; cudnn_flash's test runs
# plainly too (cuDNN's own kernels under memcheck take minutes and are not ours). CUDA API calls
# that return an error are not counted (--report-api-errors no): ours are checked where they are
# made, and libraries' probes (NCCL's, cuBLAS's) fail on purpose.
# The layers go under memcheck through test_cpu_layers' device cases (every layer once, fp32): the
# full dtype suite, test_cuda_layers, runs plainly.
memcheck_programs=$(for p in $gpu_programs; do case $p in test_cuda_train | test_cudnn_flash | test_cuda_layers) ;; *) echo "$p" ;; esac; done)
want tests && echo "== gpu tests"
for p in $gpu_programs; do
  want tests && [ -x "$here/bin/$p" ] && { skip_stage "$p" 60 || run_program plain "$p"; }
done
# Device cases inside programs labelled cpu: every layer on every device (cuda_layers against the
# float64 CPU layers), which runs its cuda half where a GPU is.
want tests && echo "== device cases of the layer tests"
want tests && [ -x "$here/bin/test_cpu_layers" ] && { skip_stage test_cpu_layers 30 || run_program plain test_cpu_layers "--test-case=every layer on every device*"; }

if ! want memcheck; then
  :
elif command -v compute-sanitizer >/dev/null; then
  echo "== gpu tests under compute-sanitizer memcheck"
  for p in $memcheck_programs; do
    [ -x "$here/bin/$p" ] && { skip_stage "$p memcheck" 120 || run_program memcheck "$p"; }
  done
  [ -x "$here/bin/test_cpu_layers" ] && { skip_stage "test_cpu_layers memcheck" 120 || run_program memcheck test_cpu_layers "--test-case=every layer on every device*"; }
  if ! skip_stage "two training steps under memcheck" 120; then
    t0=$(date +%s%N)
    rm -rf "$out/memcheck_run"
    timeout "$(limit 200)" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 20 "$here/bin/ablate" train \
      "$here/src/configs/quickstart.toml" --set run.device=cuda --set attention.name=naive_cuda --set optimizer.name=adamw_fused \
      --set run.steps=2 --set model.dropout=0.1 --set run.eval_batches=1 --set checkpoint.every=100 \
      --run-dir "$out/memcheck_run" > "$out/logs/train_2_steps.memcheck.log" 2>&1
    rc=$?
    case $rc in 0) status=passed ;; *) status=failed ;; esac
    printf 'train_2_steps\tmemcheck\t%s\t%d\t%s\n' "$status" "$rc" "$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b - a) / 1e9}')" >> "$results"
    printf '  %-26s %-9s %-8s (exit %d)\n' train_2_steps memcheck "$status" "$rc"
  fi
else
  echo "  compute-sanitizer not found: skipped"
fi
want bench && echo "== benchmarks"
for b in bench_optim bench_attention bench_epilogues bench_layers; do
  want bench || continue
  [ -x "$here/bin/$b" ] || continue
  skip_stage "$b" 60 && continue
  t0=$(date +%s)
  timeout "$(limit 240)" "$here/bin/$b" --json "$out/$b.json" > "$out/logs/$b.log" 2>&1
  case $? in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf '%s\tbenchmark\t%s\t0\t%d\n' "$b" "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -25 "$out/logs/$b.log"
done
# bench_layers again under FP8 products (run.dtype = "fp8"), where the device has them.
if want bench && [ -x "$here/bin/bench_layers" ] && ! skip_stage bench_layers_fp8 60; then
  t0=$(date +%s)
  timeout "$(limit 240)" "$here/bin/bench_layers" --dtype fp8 --json "$out/bench_layers_fp8.json" > "$out/logs/bench_layers_fp8.log" 2>&1
  case $? in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf 'bench_layers_fp8\tbenchmark\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -25 "$out/logs/bench_layers_fp8.log"
fi
want bench && echo "== peer: PyTorch SDPA at bench_attention's shapes (bench/peers/pytorch_sdpa.py)"
if want bench && ! skip_stage pytorch_sdpa 60; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$(limit 120)" python3 "$here/src/bench/peers/pytorch_sdpa.py" --json "$out/pytorch_sdpa.json" \
    > "$out/logs/pytorch_sdpa.log" 2>&1
  case $? in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf 'pytorch_sdpa\tpeer\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -8 "$out/logs/pytorch_sdpa.log"
fi
want bench && echo "== peer: PyTorch's products at GPT-2 124M's shapes (bench/peers/pytorch_gemm.py), the ceiling of cuda_layers'"
if want bench && ! skip_stage pytorch_gemm 60; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$(limit 90)" python3 "$here/src/bench/peers/pytorch_gemm.py" --rows 65536 --json "$out/pytorch_gemm.json" \
    > "$out/logs/pytorch_gemm.log" 2>&1
  case $? in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf 'pytorch_gemm\tpeer\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -20 "$out/logs/pytorch_gemm.log"
fi
# ablate itself on GPT-2 124M (the gpt2-124m config's model; synthetic tokens, as the peer's random
# ones: the shapes, not the text, set the speed), T = 1024, bf16 products (ABLATE_GPT2_DTYPE to change)
# with adamw_fused; the last 3 steps profiled op by op (profile.json). Once with naive_cuda, once with
# cudnn_flash, then the PyTorch peer with the time left.
# The micro-batch: ABLATE_GPT2_BATCH, or (auto, the default) the largest the memory plan fits with
# naive_cuda (whose score blocks make it the hungriest backend), up to 64: ablate tune batch-size
# --plan-only, which builds the model and trains nothing. Every GPT-2 run and the peer use it.
gpt2_batch() {
  local b="${ABLATE_GPT2_BATCH:-auto}"
  if [ "$b" = auto ]; then
    b=$(timeout "$(limit 60)" "$here/bin/ablate" tune batch-size "$here/src/configs/gpt2-124m.toml" --set run.device=cuda           --set run.dtype="${ABLATE_GPT2_DTYPE:-bf16}" --set attention.name=naive_cuda --set optimizer.name=adamw_fused           --set data.name=synthetic_probes --set run.grad_accum_steps=1 --max-batch 64 --plan-only --json 2> "$out/logs/gpt2_batch.log" |
        python3 -c 'import json, sys; t = sys.stdin.read(); print(json.loads(t[t.index("{"):])["largest_fitting"])' 2>> "$out/logs/gpt2_batch.log")
    [[ "$b" =~ ^[1-9][0-9]*$ ]] || b=8
  fi
  echo "$b"
}
if want gpt2 || want comm; then
  GPT2_BATCH=$(gpt2_batch)
  echo "== GPT-2 micro-batch: $GPT2_BATCH (ABLATE_GPT2_BATCH=${ABLATE_GPT2_BATCH:-auto})"
fi
LAUNCH=""  # a launcher before ablate in ablate_train (mpirun for the two-rank runs)
ablate_train() {  # stage name config batch attention [--set key=value ...]
  want "$1" || return 0
  local stage=$1 name=$2 config=$3 batch=$4 attention=$5
  shift 5
  local dtype="${ABLATE_GPT2_DTYPE:-bf16}"
  echo "== ablate: $config on cuda ($dtype, $attention, adamw_fused${1:+, $*})"
  skip_stage "$name" 150 && return 0
  local t0 status
  t0=$(date +%s)
  rm -rf "${out:?}/$name"
  # shellcheck disable=SC2086  # $LAUNCH: empty, or mpirun and its arguments
  if timeout "$(limit 240)" $LAUNCH "$here/bin/ablate" train "$here/src/configs/$config" --set run.device=cuda --set run.dtype="$dtype" --set attention.name="$attention" \
       --set optimizer.name=adamw_fused --set data.name=synthetic_probes --set run.grad_accum_steps=1 \
       --set batching.batch_size="$batch" --set run.steps=16 --set run.eval_every=0 --set run.eval_batches=0 \
       --set run.profile_steps=3 --set checkpoint.every=1000 --set checkpoint.keep=1 "$@" --run-dir "$out/$name" \
       > "$out/logs/$name.log" 2>&1; then status=passed; else status=failed; fi
  [ -f "$out/$name/summary.json" ] && cp "$out/$name/summary.json" "$out/$name.json"
  [ -f "$out/$name/profile.json" ] && cp "$out/$name/profile.json" "$out/${name}_profile.json"
  rm -rf "$out/$name/checkpoints"  # gigabytes of weights and moments: not worth bringing back
  printf '%s\tbenchmark\t%s\t0\t%d\n' "$name" "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  grep -E "op profile|^  |done:" "$out/logs/$name.log" | head -30
  tail -3 "$out/logs/$name.log"
}
ablate_gpt2() {  # stage name attention [--set key=value ...]: GPT-2 124M at the GPT-2 micro-batch
  ablate_train "$1" "$2" gpt2-124m.toml "$GPT2_BATCH" "${@:3}"
}
# The PyTorch peer (bench/peers/pytorch_gpt.py) on a config's model at ablate's micro-batch; where
# that does not fit (out of memory), the largest below it that does. With --float8, torchao's float8
# training of the blocks' linear layers (the bundle's torchao wheel, installed under /tmp here when
# python3 lacks it); exit 77 (skipped) when torchao cannot be imported.
pytorch_peer() {  # stage name config batch [peer args...]
  local stage=$1 name=$2 config=$3 batch=$4
  shift 4
  want "$stage" || return 0
  echo "== peer: PyTorch on $config (bench/peers/pytorch_gpt.py${1:+ $*}, ablate's micro-batch $batch)"
  skip_stage "$name" 150 && return 0
  if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "  python3 has no torch with CUDA: skipped"
    printf '%s\tpeer\tskipped\t77\t0\n' "$name" >> "$results"
    return 0
  fi
  local t0 status rc
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 PYTHONPATH="$peer_site${PYTHONPATH:+:$PYTHONPATH}" timeout "$(( $(left) - 20 ))" \
    python3 "$here/src/bench/peers/pytorch_gpt.py" --config "$here/src/configs/$config" --batch "$batch" "$@" \
    --json "$out/$name.json" > "$out/logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ "$(left)" -gt 90 ] && [ "$batch" -gt 1 ]; then
    PYTHONUNBUFFERED=1 PYTHONPATH="$peer_site${PYTHONPATH:+:$PYTHONPATH}" timeout "$(( $(left) - 20 ))" \
      python3 "$here/src/bench/peers/pytorch_gpt.py" --config "$here/src/configs/$config" --batch auto --max-batch "$batch" "$@" \
      --json "$out/$name.json" > "$out/logs/${name}_auto.log" 2>&1
    rc=$?  # at ablate's micro-batch it did not run (out of memory?): the largest below it that does
  fi
  case $rc in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf '%s\tpeer\t%s\t%d\t%d\n' "$name" "$status" "$rc" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -6 "$out/logs/$name.log"
}
# torchao for the float8 peers: carried as a wheel (scripts/device-bundle.sh), installed once here.
peer_site=""
if { want gpt2 || want llama; } && ! python3 -c "import torchao" 2>/dev/null && ls "$here"/wheels/torchao-*.whl >/dev/null 2>&1; then
  peer_site=/tmp/ablate-peer-site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$peer_site" \
    "$here"/wheels/torchao-*.whl > "$out/logs/torchao_install.log" 2>&1 ||
    echo "  torchao's wheel did not install (logs/torchao_install.log): the float8 peers will be skipped"
fi
# Each twice: on the packed probe rows above (short documents, about 28% of dense causal attention's
# FLOPs), then on dense rows, one 1024-token document a row, as the PyTorch peer trains (its random
# tokens fill every row): only the dense runs compare like with like (summary.py's vs_pytorch).
GPT2_DENSE=(--set data.synthetic_probes.min_length=1024 --set data.synthetic_probes.max_length=1024
            --set batching.long_documents=truncate)
ablate_gpt2 gpt2 ablate_gpt2 naive_cuda
ablate_gpt2 gpt2 ablate_gpt2_dense naive_cuda "${GPT2_DENSE[@]}"
flash_built=false
[ -f "$here/bin/plugins/libablate_cudnn_flash.so" ] && flash_built=true
if $flash_built; then
  ablate_gpt2 gpt2 ablate_gpt2_flash cudnn_flash
  ablate_gpt2 gpt2 ablate_gpt2_flash_dense cudnn_flash "${GPT2_DENSE[@]}"
fi
# The peer before the variants below, so that a call running short of time skips a variant, not
# the ratio every run is read against.
pytorch_peer gpt2 pytorch_gpt gpt2-124m.toml "$GPT2_BATCH"
if $flash_built; then
  # The residual stream in bf16 too (run.residual_dtype = "bf16", llm.c's choice) on the same rows.
  ablate_gpt2 gpt2 ablate_gpt2_flash_bf16res_dense cudnn_flash "${GPT2_DENSE[@]}" --set run.residual_dtype=bf16
  # FP8 linear and MLP products (run.dtype = "fp8", current scaling) on the same dense rows, where
  # the device has them (SM 8.9 on; elsewhere ablate refuses it with exit 2 and the stage fails).
  ablate_gpt2 gpt2 ablate_gpt2_flash_fp8_dense cudnn_flash "${GPT2_DENSE[@]}" --set run.dtype=fp8
  # torch's float8 (torchao, tensorwise scaling) on the same model: the peer of the FP8 run.
  pytorch_peer gpt2 pytorch_gpt_fp8 gpt2-124m.toml "$GPT2_BATCH" --float8
  # The classifier's products in FP8 too ([model.cross_entropy] fp8, its weight quantised once a
  # step), last: a call short of time skips it first.
  ablate_gpt2 gpt2 ablate_gpt2_flash_fp8head_dense cudnn_flash "${GPT2_DENSE[@]}" --set run.dtype=fp8 \
    --set model.cross_entropy.fp8=true
  # A captured step replayed (run.cuda_graph) on the same dense rows, no profiled steps: the saving
  # GPT-2's ~380 launches leave (predicted none), and whether cuDNN's graphs capture.
  ablate_gpt2 gpt2 ablate_gpt2_flash_dense_graph cudnn_flash "${GPT2_DENSE[@]}" --set run.cuda_graph=true \
    --set run.profile_steps=0
fi

# Launch-bound or not: the quickstart's small model (4 layers of d 128, 8 x 256 tokens) on cuda,
# whose kernels are a few microseconds each, at its micro-batch and at 8 times it. summary.json's
# host_pct is the host's share of each step (near 100: the GPU waits for the launches), what a
# captured step (run.cuda_graph, docs/performance.md) would take away; `ablate doctor` reads it.
# Then the same model on dense rows (one 256-token document a row, every step one layout) issued
# call by call and replayed from a captured step (run.cuda_graph; no profiled steps, which are
# issued call by call): what the graph saves where launches set the pace.
QUICK_DENSE=(--set data.synthetic_probes.min_length=256 --set data.synthetic_probes.max_length=256
             --set batching.long_documents=truncate --set run.profile_steps=0 --set run.steps=40)
if want bench; then
  ablate_train bench ablate_quickstart quickstart.toml 8 naive_cuda
  ablate_train bench ablate_quickstart_b64 quickstart.toml 64 naive_cuda
  for q in ablate_quickstart ablate_quickstart_b64; do
    [ -f "$out/$q/summary.json" ] && timeout 30 "$here/bin/ablate" doctor "$out/$q" > "$out/logs/${q}_doctor.log" 2>&1
  done
  cat "$out/logs/ablate_quickstart_doctor.log" 2>/dev/null | head -12
  ablate_train bench ablate_quickstart_dense quickstart.toml 8 naive_cuda "${QUICK_DENSE[@]}"
  ablate_train bench ablate_quickstart_dense_graph quickstart.toml 8 naive_cuda "${QUICK_DENSE[@]}" --set run.cuda_graph=true
fi

# llama: configs/llama-1b.toml (1,175M parameters, TinyLlama's shape), dense rows of one 2048-token
# document each, in bf16 and in FP8 (linear and MLP products; attention and the classifier bf16),
# beside the PyTorch peer in bf16 and in torchao's float8. The micro-batch: ABLATE_LLAMA_BATCH, else
# the config's 8.
LLAMA_BATCH=${ABLATE_LLAMA_BATCH:-8}
LLAMA_DENSE=(--set data.synthetic_probes.min_length=2048 --set data.synthetic_probes.max_length=2048
             --set batching.long_documents=truncate)
if [ -f "$here/bin/plugins/libablate_cudnn_flash.so" ]; then
  ablate_train llama ablate_llama_dense llama-1b.toml "$LLAMA_BATCH" cudnn_flash "${LLAMA_DENSE[@]}"
  ablate_train llama ablate_llama_fp8_dense llama-1b.toml "$LLAMA_BATCH" cudnn_flash "${LLAMA_DENSE[@]}" --set run.dtype=fp8
  pytorch_peer llama pytorch_llama llama-1b.toml "$LLAMA_BATCH"
  pytorch_peer llama pytorch_llama_fp8 llama-1b.toml "$LLAMA_BATCH" --float8
elif want llama; then
  echo "== llama: skipped, no cudnn_flash plugin in this bundle (naive attention at T 2048 would not fit the call)"
fi

# comm: the nccl communicator's collectives on a 124M-element buffer (bench_nccl), then one rank
# of nccl against single on the same GPT-2 run (the machinery's overhead).
if want comm && [ -x "$here/bin/bench_nccl" ] && ! skip_stage bench_nccl 60; then
  echo "== bench_nccl: all-reduce / reduce-scatter / all-gather of a GPT-2 124M-sized buffer"
  t0=$(date +%s)
  timeout "$(limit 120)" "$here/bin/bench_nccl" --json "$out/bench_nccl.json" > "$out/logs/bench_nccl.log" 2>&1
  case $? in 0) status=passed ;; 77) status=skipped ;; *) status=failed ;; esac
  printf 'bench_nccl\tbenchmark\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -6 "$out/logs/bench_nccl.log"
fi
flash=naive_cuda
[ -f "$here/bin/plugins/libablate_cudnn_flash.so" ] && flash=cudnn_flash
ablate_gpt2 comm ablate_gpt2_single "$flash" --set run.communicator=single
ablate_gpt2 comm ablate_gpt2_nccl "$flash" --set run.communicator=nccl
# Two ranks on the one GPU (mpirun from the bundle), 8 rows each: with gradient buckets and with
# one reduction after the backward pass. comm_pct of the two says how much of the communication
# the buckets hide; if NCCL refuses two ranks on one GPU, the log says so.
# NCCL refuses two ranks on one GPU ("Duplicate GPU"): with fewer GPUs than ranks the runs are
# skipped, with a line in the summary, rather than failed.
LAUNCH=""
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if want comm && [ -x "$here/openmpi/bin/mpirun" ] && [ "${gpus:-0}" -lt 2 ]; then
  echo "== nccl with 2 ranks: skipped, this machine has ${gpus:-0} GPU(s) and NCCL needs one per rank"
  for name in ablate_gpt2_nccl_2ranks ablate_gpt2_nccl_2ranks_flat; do
    printf '%s\tneeds-2-gpus\tskipped\t0\t0\n' "$name" >> "$results"
  done
elif want comm && [ -x "$here/openmpi/bin/mpirun" ]; then
  LAUNCH="$here/openmpi/bin/mpirun --oversubscribe -np 2"
  ablate_gpt2 comm ablate_gpt2_nccl_2ranks "$flash" --set run.communicator=nccl --set batching.batch_size=8
  ablate_gpt2 comm ablate_gpt2_nccl_2ranks_flat "$flash" --set run.communicator=nccl --set batching.batch_size=8 --set run.bucket_mb=0
  LAUNCH=""
fi

# numerics: the bf16 plan against fp32 on real text (configs/shakespeare-gpt2.toml on cuda, 300 steps,
# validation at 100, 200 and 300): the mean training loss of the last 100 steps within 0.02 nats and
# the validation loss within 1% (bench/numerics_pair.py); both curves in numerics.json and
# numerics.png. Then FP8 (run.dtype = "fp8", current scaling) against that bf16 run, where the
# device has FP8 products: within 0.03 nats and 2% (numerics_fp8.json, numerics_fp8.png). Then the
# bf16 plan with the residual stream in bf16 (run.residual_dtype = "bf16") against fp32, within
# 0.02 nats and 1% (numerics_bf16res). About a minute each: the model is 7.2M parameters.
numerics_run() {  # name dtype attention [--set key=value ...]
  (cd "$here" && timeout "$(limit 150)" "$here/bin/ablate" train "$here/src/configs/shakespeare-gpt2.toml" --set run.device=cuda \
     --set run.dtype="$2" --set attention.name="$3" --set optimizer.name=adamw --set run.steps=300 --set run.eval_every=100 \
     --set run.threads=4 --set checkpoint.every=1000 "${@:4}" --run-dir "$out/$1") > "$out/logs/$1.log" 2>&1
}
numerics_pair() {  # result reference candidate [numerics_pair.py options]
  python3 "$here/src/bench/numerics_pair.py" --reference "$out/$2" --candidate "$out/$3" --json "$out/$1.json" \
    --plot "$out/$1.png" "${@:4}"
}
fp8_capable() {  # compute capability 8.9 or later
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 |
    awk -F. '{exit !($1 > 8 || ($1 == 8 && $2 >= 9))}'
}
if want numerics; then
  echo "== numerics: the bf16 plan against fp32 on Shakespeare (300 steps), then FP8 against bf16"
  if [ ! -f "$here/data/shakespeare/gpt2_train_000000.bin" ]; then
    echo "  no data/shakespeare in the bundle (scripts/device-bundle.sh could not prepare it): skipped"
    printf 'numerics\tbenchmark\tskipped\t0\t0\n' >> "$results"
  elif ! skip_stage numerics 150; then
    t0=$(date +%s)
    flash=naive
    [ -f "$here/bin/plugins/libablate_cudnn_flash.so" ] && flash=cudnn_flash
    rm -rf "${out:?}/numerics_fp32" "${out:?}/numerics_bf16" "${out:?}/numerics_fp8"
    status=failed
    if numerics_run numerics_fp32 fp32 naive && numerics_run numerics_bf16 bf16 "$flash"; then
      numerics_pair numerics numerics_fp32 numerics_bf16 && status=passed
    fi
    printf 'numerics\tbenchmark\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
    if [ ! -d "$out/numerics_bf16" ] || ! fp8_capable; then
      echo "  numerics_fp8: skipped (no bf16 run, or no FP8 products on this device)"
      printf 'numerics_fp8\tbenchmark\tskipped\t0\t0\n' >> "$results"
    elif ! skip_stage numerics_fp8 60; then
      t0=$(date +%s)
      status=failed
      if numerics_run numerics_fp8 fp8 "$flash"; then
        numerics_pair numerics_fp8 numerics_bf16 numerics_fp8 --max-loss-gap 0.03 --max-val-rel 0.02 && status=passed
      fi
      printf 'numerics_fp8\tbenchmark\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
    fi
    if [ ! -d "$out/numerics_fp32" ]; then
      printf 'numerics_bf16res\tbenchmark\tskipped\t0\t0\n' >> "$results"
    elif ! skip_stage numerics_bf16res 60; then
      t0=$(date +%s)
      status=failed
      rm -rf "${out:?}/numerics_bf16res"
      if numerics_run numerics_bf16res bf16 "$flash" --set run.residual_dtype=bf16; then
        numerics_pair numerics_bf16res numerics_fp32 numerics_bf16res && status=passed
      fi
      printf 'numerics_bf16res\tbenchmark\t%s\t0\t%d\n' "$status" "$(( $(date +%s) - t0 ))" >> "$results"
    fi
    rm -rf "$out/numerics_fp32/checkpoints" "$out/numerics_bf16/checkpoints" "$out/numerics_fp8/checkpoints" \
      "$out/numerics_bf16res/checkpoints"
  fi
fi

# sweeps (only when asked: ABLATE_STAGES=sweeps): the packing sweep and the optimisations sweep
# (configs/sweep-packing-gpu.toml, configs/sweep-optimisations-gpu.toml, each sized for a few
# minutes), their report.md, results.json and results.csv kept; each run's final checkpoint (1.5 GB
# of weights and moments) removed.
for sweep in packing-gpu optimisations-gpu; do
  want sweeps || break
  echo "== ablate sweep configs/sweep-$sweep.toml"
  skip_stage "sweep_$sweep" 200 && continue
  t0=$(date +%s)
  rm -rf "${out:?}/sweep-$sweep"
  if timeout "$(limit 420)" "$here/bin/ablate" sweep "$here/src/configs/sweep-$sweep.toml" --out "$out/sweep-$sweep" \
       > "$out/logs/sweep-$sweep.log" 2>&1; then status=passed; else status=failed; fi
  find "$out/sweep-$sweep" -name checkpoints -type d -prune -exec rm -rf {} + 2>/dev/null
  printf 'sweep_%s\tbenchmark\t%s\t0\t%d\n' "$sweep" "$status" "$(( $(date +%s) - t0 ))" >> "$results"
  tail -5 "$out/logs/sweep-$sweep.log"
  [ -f "$out/sweep-$sweep/report.md" ] &&
    awk '/^## Expected against measured/ {p = 1; print; next} p && /^## / {p = 0} p' "$out/sweep-$sweep/report.md" | head -20
done

echo "== done in $(( $(date +%s) - t_start )) s"
python3 "$here/summary.py" "$out" || echo "summary.py failed"
failed=0
awk -F'\t' '$3 == "failed" {found = 1} END {exit !found}' "$results" && failed=1
# Close the tee's input and wait for it, so run.log is whole before it is packed.
exec 1>&3 2>&4 3>&- 4>&-
wait "$tee_pid" 2>/dev/null
tar czf "$out/all.tar.gz" -C "$out" logs run.log 2>/dev/null
exit "$failed"
