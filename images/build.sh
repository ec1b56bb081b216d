#!/usr/bin/env bash
# Builds a Dockerfile of images/ from a small build context made for it, so that nothing else
# of the checkout (caches, __pycache__, the cluster's state) is sent to the engine or can
# invalidate the layer cache:
#   pyproject.toml, requirements-test.txt, operator/ (without __pycache__), the Dockerfile's
#   folder, and build-ca.crt: the build machine's CA bundle ($BUILD_CA), when it has one.
#
#   images/build.sh images/NAME/Dockerfile TAG [docker build flags...]   (what make runs)
#
# build-ca.crt is what pip trusts in a Dockerfile's build stage, for machines behind a
# TLS-inspecting proxy; the final stage of each image does not copy it, so no image carries
# the build machine's trust store. BUILD_CA= (empty) leaves it out: Debian's CAs then.
#   DOCKER    the docker CLI (default docker)
#   BUILD_CA  default /etc/ssl/certs/ca-certificates.crt
set -euo pipefail
cd "$(dirname "$0")/.."
if (($# < 2)); then
  echo "usage: images/build.sh images/NAME/Dockerfile TAG [docker build flags...]" >&2
  exit 2
fi
dockerfile=${1#./} tag=$2
shift 2
case $dockerfile in
  images/*/Dockerfile) [ -f "$dockerfile" ] || { echo "no $dockerfile" >&2; exit 2; } ;;
  *) echo "not a Dockerfile of images/: $dockerfile" >&2; exit 2 ;;
esac
docker=${DOCKER:-docker}
ca=${BUILD_CA-/etc/ssl/certs/ca-certificates.crt}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
tar -c --exclude=__pycache__ --exclude='*.pyc' \
  pyproject.toml requirements-test.txt operator "$(dirname "$dockerfile")" | tar -x -C "$ctx"
if [ -n "$ca" ] && [ -f "$ca" ]; then
  cp "$ca" "$ctx/build-ca.crt"
fi
start=$(date +%s)
tar -C "$ctx" -c . | "$docker" build -f "$dockerfile" -t "$tag" "$@" -
echo "[images] $tag built in $(($(date +%s) - start))s" >&2
