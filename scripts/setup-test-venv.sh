#!/usr/bin/env bash
# Makes the Python environment of the tests that compare ablate against Hugging Face transformers and
# peft (tests/train/check_export.py; CMake's ABLATE_TEST_PYTHON, tests/CMakeLists.txt): a venv at
# ${ABLATE_TEST_VENV:-/opt/ablate-test-venv} of Debian's /usr/bin/python3 with --system-site-packages,
# so that it uses Debian's python3-torch 1.13.1 (CPU; third_party/apt-test-packages.txt, installed by
# scripts/setup-tests.sh before it calls this), with the pinned PyPI packages of
# third_party/pip-test-venv-packages.txt. Idempotent: creates the venv only when missing and installs
# only the packages missing or at another version, saying what it does. They are installed with
# --no-deps (the list is complete; see its header for why pip must not resolve peft's torch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ABLATE_TEST_VENV:-/opt/ablate-test-venv}
list=$root/third_party/pip-test-venv-packages.txt
python=$venv/bin/python

if [ ! -x "$python" ]; then
  echo "setup-test-venv: creating $venv (/usr/bin/python3 -m venv --system-site-packages)"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
elif ! grep -qx 'include-system-site-packages = true' "$venv/pyvenv.cfg" 2>/dev/null; then
  echo "setup-test-venv: $venv is not a venv with --system-site-packages (it would not see Debian's torch);" \
       "remove it or set ABLATE_TEST_VENV to another directory" >&2
  exit 1
fi

# "name==version" with the name normalized (PEP 503: lower case, runs of -_. as one -).
normalize() { awk -F'==' '{ n = tolower($1); gsub(/[-_.]+/, "-", n); print n "==" $2 }'; }
installed=$("$python" -m pip list --local --format=freeze --disable-pip-version-check 2>/dev/null | normalize)
missing=()
for p in $(grep -Ev '^\s*(#|$)' "$list"); do
  if ! grep -qxF "$(normalize <<<"$p")" <<<"$installed"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-test-venv: $venv has the packages of $(basename "$list")"
else
  echo "setup-test-venv: installing into $venv: ${missing[*]}"
  # --no-warn-conflicts: pip would report peft's torch>=1.13.0 against Debian's 1.13.0a0, as the list says.
  "$python" -m pip install -q --no-deps --no-warn-conflicts --disable-pip-version-check \
    --root-user-action=ignore "${missing[@]}"
fi
if ! err=$("$python" -c 'import torch, transformers, peft, safetensors, accelerate, numpy' 2>&1); then
  echo "setup-test-venv: $python cannot import torch, transformers, peft, safetensors, accelerate, numpy" \
       "(is python3-torch installed?):" >&2
  echo "$err" | tail -3 >&2
  exit 1
fi
