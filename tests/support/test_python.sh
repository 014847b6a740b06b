#!/bin/sh
# The interpreter of the tests against Hugging Face transformers and peft, chosen when the test runs
# (not when CMake configured the build: a build configured before scripts/setup-tests.sh made the
# venv still finds it). Usage: test_python.sh --configured=PYTHON SCRIPT [ARGS...], where PYTHON is
# -DABLATE_TEST_PYTHON's value (empty: the venv of scripts/setup-test-venv.sh,
# ${ABLATE_TEST_VENV:-/opt/ablate-test-venv}/bin/python). A missing interpreter is a failure naming
# the set-up that makes it, never a skip.
case "${1:-}" in
  --configured=*) configured=${1#--configured=}; shift ;;
  *) echo "usage: test_python.sh --configured=PYTHON SCRIPT [ARGS...]" >&2; exit 2 ;;
esac
python=${configured:-${ABLATE_TEST_VENV:-/opt/ablate-test-venv}/bin/python}
if [ ! -x "$python" ]; then
  echo "FAIL: $python does not exist: scripts/setup-tests.sh makes the test venv (or configure with -DABLATE_TEST_PYTHON=...)" >&2
  exit 1
fi
exec "$python" "$@"
