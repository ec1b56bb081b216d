#!/usr/bin/env bash
# A second torch for the launcher's tests: a Debian root (mmdebstrap, trixie: Python 3.13 and
# Debian's CPU build of torch 2.6 with gloo) in which tests/integration/test_launcher_torchrun.py
# runs the launcher as a user's image would, beside the pinned torch of the test venv. Made
# once from Debian packages (no registry, about 200 MB to download) and kept in the cache;
# prints the root's path.
#
#   hack/torch-root.sh            the root (made when missing)
#
#   SUITE     Debian release (default trixie)
#   PACKAGES  what to install (default python3-torch,python-is-python3)
#   MIRROR, SECURITY_MIRROR as images/base/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${SUITE:-trixie}
packages=${PACKAGES:-python3-torch,python-is-python3}
mirror=${MIRROR:-http://deb.debian.org/debian}
security=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CACHE=${LOCALKUBE_CACHE:-$HOME/.cache/torchrun-operator}
key=$(printf '%s %s\n' "$suite" "$packages" | sha256sum | cut -c1-12)
root="$CACHE/torch-root-$suite-$key"
if [ ! -f "$root/.complete" ]; then
  [ "$(id -u)" = 0 ] || { echo "hack/torch-root.sh: making the root needs root (mmdebstrap)" >&2; exit 1; }
  hack/sysdeps/install.sh mmdebstrap
  echo "[torch-root] Debian $suite + $packages in $root" >&2
  rm -rf "$root"
  mkdir -p "$root"
  # shellcheck source=images/base/minbase.sh
  . images/base/minbase.sh
  minbase_rootfs "$suite" "$mirror" "$security" "$packages" | tar -x -C "$root"
  touch "$root/.complete"
fi
echo "$root"
