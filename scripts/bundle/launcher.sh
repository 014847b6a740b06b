#!/usr/bin/env bash
# Launcher of the bundle's @SCRIPT@: unpacks payload.tar.gz beside it into a folder of its own
# (ABLATE_BUNDLE_TREE, default a folder under /tmp named after the payload's checksum) on first
# use, then runs @SCRIPT@ from there with the same arguments.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sum=$(cksum "$here/payload.tar.gz" | cut -d' ' -f1)
tree=${ABLATE_BUNDLE_TREE:-/tmp/ablate-bundle-$sum}
if [ ! -f "$tree/.unpacked" ]; then
  rm -rf "$tree"
  mkdir -p "$tree"
  tar xzf "$here/payload.tar.gz" -C "$tree"
  touch "$tree/.unpacked"
fi
exec "$tree/@SCRIPT@" "$@"
