#!/usr/bin/env bash
# Builds the base image the operator and runtime images start FROM, from Debian packages and
# without any image registry: mmdebstrap makes a minimal Debian root filesystem with Python
# (python3, python3-venv, python-is-python3, ca-certificates; no docs or man pages), which
# `docker import` turns into an image.
#
#   images/base/build.sh [TAG]        default local/python:3.11-bookworm
#
# Does nothing when TAG exists already (FORCE=1 rebuilds it, e.g. for Debian's updates).
# Installs mmdebstrap when it is missing (hack/sysdeps/install.sh; root, as mmdebstrap itself here).
#
#   SUITE           Debian release (default bookworm: Python 3.11; name TAG to match)
#   MIRROR          Debian mirror (default http://deb.debian.org/debian)
#   SECURITY_MIRROR (default http://deb.debian.org/debian-security)
#   PACKAGES        what to install (default above, comma-separated)
#   MMDEBSTRAP_FLAGS extra flags for mmdebstrap
#   DOCKER          the docker CLI (default docker)
#
# The image trusts Debian's CA certificates only. Builds that need the build machine's own
# trust store (a TLS-inspecting proxy) get it in their build stage alone: see images/build.sh.
set -euo pipefail
tag=${1:-local/python:3.11-bookworm}
suite=${SUITE:-bookworm}
mirror=${MIRROR:-http://deb.debian.org/debian}
security=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
packages=${PACKAGES:-python3,python3-venv,python-is-python3,ca-certificates}
docker=${DOCKER:-docker}

if [ "${FORCE:-0}" != 1 ] && "$docker" image inspect "$tag" >/dev/null 2>&1; then
  exit 0
fi
"$(dirname "$0")/../../hack/sysdeps/install.sh" mmdebstrap

echo "[base] $tag: Debian $suite + $packages" >&2
start=$(date +%s)
# The tarball goes straight into `docker import`.
# shellcheck source=images/base/minbase.sh
. "$(dirname "$0")/minbase.sh"
# shellcheck disable=SC2086  # MMDEBSTRAP_FLAGS is a list of flags
minbase_rootfs "$suite" "$mirror" "$security" "$packages" ${MMDEBSTRAP_FLAGS:-} |
  "$docker" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "mmdebstrap $suite: $packages" \
    - "$tag" >/dev/null
echo "[base] $tag built in $(($(date +%s) - start))s" >&2
