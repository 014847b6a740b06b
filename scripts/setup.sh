#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test ablate: the Debian packages of
# third_party/apt-packages.txt and the PyPI packages of third_party/pip-packages.txt. Idempotent:
# it checks first and installs only what is missing, saying what it does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages() { grep -Ev '^\s*(#|$)' "$1"; }

"$root/scripts/install-debian-packages.sh" "$root/third_party/apt-packages.txt" setup

python=${PYTHON:-python3}
pip_missing=()
for p in $(packages "$root/third_party/pip-packages.txt"); do
  if ! "$python" -m pip show -q "${p%%[<>=!]*}" >/dev/null 2>&1; then pip_missing+=("$p"); fi
done
if [ ${#pip_missing[@]} -gt 0 ]; then
  echo "setup: installing PyPI packages: ${pip_missing[*]}"
  "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${pip_missing[@]}"
else
  echo "setup: PyPI packages present"
fi

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found ($( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) ))"
else
  echo "setup: no CUDA toolkit found; CUDA plugins will not be built"
fi
