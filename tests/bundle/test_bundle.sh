#!/usr/bin/env bash
# The device bundle is self-contained: it is made from this build (scripts/device-bundle.sh), put
# into a bare Debian 12 root made by debootstrap (minbase, none of ablate's packages, cached under
# ${XDG_CACHE_HOME:-~/.cache}/ablate between runs), and its CPU part runs there under chroot
# (cpu-check.sh: every CPU plugin loads, the CUDA plugins fail to load naming the library they
# miss, a 20-step quickstart trains, the shipped CPU test programs pass).
# Skips (77) when not root (chroot) or when no Debian mirror can be reached for a first root.
# Usage: test_bundle.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?usage: test_bundle.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: test_bundle.sh SOURCE_DIR BUILD_DIR}
mirror=${ABLATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ablate
rootfs=$cache/debian12-root

[ "$(id -u)" = 0 ] || { echo "skipped: chroot into the bare root needs root"; exit 77; }
command -v debootstrap >/dev/null || { echo "FAIL: debootstrap is not installed (scripts/setup.sh installs it)"; exit 1; }
if [ ! -f "$rootfs/.complete" ]; then
  echo "making a bare Debian 12 root (debootstrap --variant=minbase) in $rootfs"
  rm -rf "$rootfs.tmp"
  mkdir -p "$cache"
  if ! debootstrap --variant=minbase bookworm "$rootfs.tmp" "$mirror" > "$cache/debootstrap.log" 2>&1; then
    tail -5 "$cache/debootstrap.log"
    echo "skipped: debootstrap could not make a root from $mirror (log: $cache/debootstrap.log)"
    exit 77
  fi
  rm -rf "$rootfs"
  mv "$rootfs.tmp" "$rootfs"
  touch "$rootfs/.complete"
fi
# None of ablate's dependencies may be in the root: the bundle must carry them.
if chroot "$rootfs" sh -c 'ls /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu 2>/dev/null' |
   grep -E '^lib(boost|openblas|spdlog|fmt|tomlplusplus|mpi|gfortran|cudart)' ; then
  echo "FAILED: the root holds libraries the bundle should carry"
  exit 1
fi

work=$(mktemp -d)
inside=/opt/ablate-bundle
cleanup() {
  mountpoint -q "$rootfs/proc" && umount "$rootfs/proc"
  rm -rf "$rootfs$inside" "$rootfs/tmp/ablate-bundle-"* "$rootfs/tmp/cpu-check" "$work"
}
trap cleanup EXIT
ABLATE_BUILD_DIR="$build" ABLATE_BUNDLE_NO_BUILD=1 ABLATE_BUNDLE_NO_DATA=1 "$src/scripts/device-bundle.sh" "$work/bundle"
rm -rf "$rootfs$inside"
cp -a "$work/bundle" "$rootfs$inside"
mountpoint -q "$rootfs/proc" || mount -t proc proc "$rootfs/proc"
chroot "$rootfs" env -i PATH=/usr/bin:/bin HOME=/root "$inside/cpu-check.sh" /tmp/cpu-check
