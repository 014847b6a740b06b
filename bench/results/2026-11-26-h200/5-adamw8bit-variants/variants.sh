#!/usr/bin/env bash
# adamw8bit kernel variants side by side on one GPU, in one call: test_cuda_optimizers and
# bench_optim for each, each variant's plugin (built beforehand, RUNPATH made relative as the
# bundle's) in a copy of the bundle's bin/ folder. A: the kernel as of de477a8 (a thread block per
# quantization block, 62 registers); B: a warp per quantization block, __launch_bounds__(256)
# (159 registers); C: the same with (256, 2) (128 registers, 164 bytes spilled); D: (256, 3)
# (80 registers, 572 bytes spilled). Usage: variants.sh OUT, with .bundle and .variants/{A,B,C,D}.
set -u
out=${1:?}
ABLATE_STAGES=none .bundle/run.sh "$out" > /dev/null 2>&1
T=$(ls -d /tmp/ablate-bundle-* | head -1)
source "$T/env.sh"
for v in A B C D; do
  d="$T/bin_$v"
  mkdir -p "$d/plugins"
  cp "$T/bin/bench_optim" "$T/bin/test_cuda_optimizers" "$d/"
  cp "$T"/bin/plugins/*.so "$d/plugins/"
  cp ".variants/$v/libablate_adamw8bit.so" "$d/plugins/"
  ABLATE_PLUGIN_DIR="$d/plugins" timeout 60 "$d/test_cuda_optimizers" > "$out/test_$v.log" 2>&1
  echo "variant $v: test_cuda_optimizers exit $? ($(grep -o 'test cases:.*' "$out/test_$v.log" | head -1))"
  ABLATE_PLUGIN_DIR="$d/plugins" timeout 90 "$d/bench_optim" --json "$out/bench_optim_$v.json" > "$out/bench_optim_$v.log" 2>&1
  echo "variant $v: bench_optim exit $?"
  sed -n '/^device:/,/^adamw8bit \//p' "$out/bench_optim_$v.log"
done
tar czf "$out/variants.tar.gz" -C "$out" $(cd "$out" && ls test_*.log bench_optim_*.log bench_optim_*.json 2>/dev/null)
rm -f "$out"/test_*.log "$out"/bench_optim_*.log "$out"/bench_optim_*.json
