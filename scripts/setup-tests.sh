#!/usr/bin/env bash
# Installs what the tests use beyond scripts/setup.sh's packages: the Debian packages of
# third_party/apt-test-packages.txt (slurm-wlm, munge and libpmix-dev, for the tests that start a
# one-node Slurm cluster with tests/slurm/slurm_cluster.py and run Open MPI programs under srun), then
# the PyPI packages of third_party/pip-test-packages.txt (the `regex` module at the version
# plugins/token_shards/unicode_classes.inc was generated with, tiktoken, mlflow). Idempotent: it
# checks first and installs only what is missing (PyPI: or at another version), saying what it does.
# PYTHON names the interpreter (default python3). Last, scripts/setup-test-venv.sh: the venv of
# Debian's python3-torch (installed here with the Debian packages) and pinned transformers and peft.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

packages() { grep -Ev '^\s*(#|$)' "$1"; }

"$root/scripts/install-debian-packages.sh" "$root/third_party/apt-test-packages.txt" setup-tests

# Whether the installed package satisfies the line: present, and at the pinned version for "name==version".
satisfied() {
  local name=${1%%[<>=!]*} installed
  installed=$("$python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$installed" ] || return 1
  case "$1" in
    *==*) [ "$installed" = "${1#*==}" ] ;;
    *) return 0 ;;
  esac
}

missing=()
for p in $(packages "$root/third_party/pip-test-packages.txt"); do
  if ! satisfied "$p"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-tests: PyPI test packages present"
else
  echo "setup-tests: installing PyPI packages: ${missing[*]}"
  "$python" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${missing[@]}"
fi

# The venv of the tests against Hugging Face transformers and peft (Debian's python3-torch, pinned PyPI packages).
"$root/scripts/setup-test-venv.sh"
