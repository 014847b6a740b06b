#!/usr/bin/env bash
# The plugin SDK end to end: install ablate into a temporary prefix, build the example plugin of
# docs/examples/ out of tree against it, and check the installed `ablate` lists and describes it
# (and that no test-only plugin was installed).
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
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
