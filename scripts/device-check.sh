#!/usr/bin/env bash
# One call on a GPU machine (CUDA toolkit present, no package registry): build ablate (or use a
# build brought along in build-device/), run the GPU tests once under compute-sanitizer and once
# plainly, run the benchmarks and the PyTorch peer, and write every log and JSON result to the
# folder given ($1 or $OUT).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-$root/device-out}}
mkdir -p "$out"
build=${ABLATE_BUILD_DIR:-$root/build-device}
exec > >(tee "$out/device-check.log") 2>&1

echo "== machine"
nvidia-smi || true
nvcc --version || true
date -u +"%Y-%m-%dT%H:%M:%SZ"
git -C "$root" rev-parse HEAD 2>/dev/null || true

echo "== build ($build)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 ${ABLATE_CMAKE_ARGS:-} \
  && cmake --build "$build" -j "$(nproc)" || { echo "build failed"; exit 1; }

status=0
echo "== gpu tests under compute-sanitizer"
if command -v compute-sanitizer >/dev/null 2>&1; then
  for t in "$build"/bin/test_gpu_* "$build"/bin/test_cuda_*; do
    [ -x "$t" ] || continue
    compute-sanitizer --tool memcheck --error-exitcode 3 "$t" || status=1
  done
else
  echo "compute-sanitizer not found"
fi
echo "== gpu tests"
ctest --test-dir "$build" -L gpu --output-on-failure --output-junit "$out/gpu-tests.xml" || status=1
echo "== cpu tests"
ctest --test-dir "$build" -L cpu -j 8 --output-on-failure || status=1

echo "== benchmarks"
for b in "$build"/bin/bench_*; do
  [ -x "$b" ] || continue
  name=$(basename "$b")
  "$b" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { echo "$name failed"; status=1; }
  cat "$out/$name.log"
done
echo "== peer: PyTorch on the same model (bench/peers/pytorch_gpt.py, largest micro-batch that fits)"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  PYTHONUNBUFFERED=1 python3 "$root/bench/peers/pytorch_gpt.py" --config "$root/configs/gpt2-124m.toml" --batch auto \
    --json "$out/pytorch_gpt.json" > "$out/pytorch_gpt.log" 2>&1 || { echo "pytorch_gpt failed"; status=1; }
  cat "$out/pytorch_gpt.log"
else
  echo "python3 has no torch with CUDA: the peer is skipped"
fi
echo "== done, status $status"
exit $status
