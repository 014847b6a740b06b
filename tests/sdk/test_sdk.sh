#!/usr/bin/env bash
# The plugin SDK end to end: install ablate into a temporary prefix, build the example plugins of
# docs/examples/ out of tree against it, and check the installed `ablate` lists and describes them
# (and that no test-only plugin was installed); then a norm added by a plugin, with no edit in core:
# docs/examples/scalenorm checked against its references (the formula, finite differences), chosen
# in a TOML file and trained, its first loss the built-in rmsnorm's bit for bit (at g = 1 the two
# are the same function), and its parameter in the checkpoint.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
[ -f "$work/prefix/include/ablate/plugin.hpp" ] && [ ! -e "$work/prefix/include/ablate/runtime" ] \
  || { echo "FAIL: the install holds the runtime's headers, or not the SDK's"; exit 1; }
cmake -S "$source_dir/docs/examples/reversed_sampler" -B "$work/example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/example" >/dev/null

listed=$(ABLATE_PLUGIN_PATH="$work/example" "$work/prefix/bin/ablate" plugins list)
echo "$listed"
grep -Eq '^sampler +reversed +1\.0\.0 +.*/libablate_reversed_sampler\.so$' <<<"$listed" \
  || { echo "FAIL: the example plugin is not listed"; exit 1; }
grep -Eq '^communicator +single .*/lib/ablate/plugins/libablate_single\.so$' <<<"$listed" \
  || { echo "FAIL: the installed plugins are not listed from lib/ablate/plugins"; exit 1; }
if grep -q 'test_' <<<"$listed" || ls "$work/prefix/lib/ablate/plugins" | grep -q test; then
  echo "FAIL: a test-only plugin was installed"; exit 1
fi
described=$(ABLATE_PLUGIN_PATH="$work/example" "$work/prefix/bin/ablate" plugins describe reversed)
grep -q 'stride' <<<"$described" || { echo "FAIL: describe does not show the schema"; exit 1; }
echo "PASS: out-of-tree plugin built against the installed SDK and loaded"

cmake -S "$source_dir/docs/examples/scalenorm" -B "$work/scalenorm" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/scalenorm" >/dev/null
"$work/scalenorm/check_scalenorm"
export ABLATE_PLUGIN_PATH="$work/scalenorm"
listed=$("$work/prefix/bin/ablate" plugins list)  # whole, before grep -q (which stops reading at a match)
grep -Eq '^layer +scalenorm +1\.0\.0 +cpu +.*/libablate_scalenorm\.so$' <<<"$listed" \
  || { echo "FAIL: the example norm is not listed as a layer"; exit 1; }
# The experiment file names the plugin's norm; the same file with rmsnorm is the reference.
# One thread each: the two first losses are compared bit for bit, so no reduction may change order.
sed -e 's/^\[model\]$/[model]\nnorm = "scalenorm"\nnorm_eps = 1e-6/' -e 's/^steps = .*/steps = 30/' -e 's/^threads = .*/threads = 1/' \
  "$source_dir/configs/quickstart.toml" > "$work/scalenorm.toml"
sed -e 's/^norm = "scalenorm"$/norm = "rmsnorm"/' -e 's/^steps = .*/steps = 1/' "$work/scalenorm.toml" > "$work/rmsnorm.toml"
grep -q '^norm = "scalenorm"$' "$work/scalenorm.toml" && grep -q '^threads = 1$' "$work/scalenorm.toml" \
  || { echo "FAIL: the experiment file was not written"; exit 1; }
"$work/prefix/bin/ablate" train "$work/scalenorm.toml" --run-dir "$work/run_scalenorm" > "$work/scalenorm.log" 2>&1 \
  || { cat "$work/scalenorm.log"; echo "FAIL: training with the plugin's norm"; exit 1; }
"$work/prefix/bin/ablate" train "$work/rmsnorm.toml" --run-dir "$work/run_rmsnorm" > "$work/rmsnorm.log" 2>&1 \
  || { cat "$work/rmsnorm.log"; echo "FAIL: the rmsnorm reference run"; exit 1; }
python3 - "$work" <<'PY'
import json, struct, sys
work = sys.argv[1]
s = json.load(open(f"{work}/run_scalenorm/summary.json"))
r = json.load(open(f"{work}/run_rmsnorm/summary.json"))
print(f"scalenorm: loss {s['first_loss']:.6f} -> {s['final_loss']:.6f} in {s['steps']} steps; rmsnorm's first loss {r['first_loss']:.6f}")
assert s["status"] == "completed" and s["steps"] == 30, s
assert s["first_loss"] == r["first_loss"], "the first loss differs from rmsnorm's at g = 1"
assert s["final_loss"] < 0.75 * s["first_loss"], "the loss did not fall"
with open(f"{work}/run_scalenorm/checkpoints/step_00000030/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
names = [n for n in header if n.endswith(".g")]
assert "blocks.0.ln1.g" in names and "ln_f.g" in names, names
assert not any(n.endswith("ln1.weight") for n in header), "rmsnorm's weights in a scalenorm model"
print(f"scalenorm: {len(names)} scalars g in the checkpoint")
PY
echo "PASS: a norm from an out-of-tree plugin trained from a TOML file"

# The plugin's own key, in [model.scalenorm]: every g starts at init_g (one step of AdamW moves a
# value by about the learning rate at most), and a key the layer does not declare is refused.
sed -e 's/^steps = .*/steps = 1/' "$work/scalenorm.toml" > "$work/scalenorm_g2.toml"
printf '\n[model.scalenorm]\ninit_g = 2.0\n' >> "$work/scalenorm_g2.toml"
"$work/prefix/bin/ablate" train "$work/scalenorm_g2.toml" --run-dir "$work/run_g2" > "$work/g2.log" 2>&1 \
  || { cat "$work/g2.log"; echo "FAIL: training with [model.scalenorm] init_g"; exit 1; }
python3 - "$work" <<'PY'
import glob, json, struct, sys
work = sys.argv[1]
last = sorted(glob.glob(f"{work}/run_g2/checkpoints/step_*/model.safetensors"))[-1]
with open(last, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
gs = []
for name, t in header.items():
    if name.endswith(".g"):
        a, b = t["data_offsets"]
        gs.append(struct.unpack("<f", data[a:b])[0])
assert len(gs) >= 3 and all(abs(g - 2.0) < 0.05 for g in gs), gs
print(f"scalenorm init_g = 2: {len(gs)} scalars g in [{min(gs):.4f}, {max(gs):.4f}] after one step")
PY
grep -q '^init_g = 2.0$' "$work/run_g2/config.toml" || { echo "FAIL: the run's config.toml lost [model.scalenorm]"; exit 1; }
set +e
bad=$("$work/prefix/bin/ablate" train "$work/scalenorm_g2.toml" --set model.scalenorm.init_gain=2 --run-dir "$work/run_bad" 2>&1)
code=$?
set -e
[ "$code" -eq 2 ] && grep -q "model.scalenorm.init_gain" <<<"$bad" && grep -q "init_g" <<<"$bad" \
  || { echo "$bad"; echo "FAIL: an unknown [model.scalenorm] key was not refused with exit 2 (exit $code)"; exit 1; }
echo "PASS: a plugin layer's own keys in [model.<layer>]"
