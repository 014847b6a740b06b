#!/usr/bin/env bash
# install-debian-packages.sh LIST PREFIX: installs the Debian packages named in LIST (one a line,
# '#' comments) that are not installed yet, with apt-get (through sudo when not root), and says
# what it does, each line starting with PREFIX. Used by setup.sh and setup-tests.sh.
set -euo pipefail
list=$1
prefix=$2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
missing=()
for p in $(grep -Ev '^\s*(#|$)' "$list"); do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then missing+=("$p"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "$prefix: installing Debian packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "$prefix: Debian packages of $(basename "$list") present"
fi
