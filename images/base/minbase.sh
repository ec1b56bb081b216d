# shellcheck shell=bash
# Sourced by images/base/build.sh and hack/kind-node-image.sh: the one mmdebstrap recipe of our
# images, Debian's minbase plus the packages named, with every file an image does not need to
# run left out (man pages, info, locales, docs; the copyright files kept).
minbase_rootfs() {  # suite mirror security-mirror packages [mmdebstrap option...]: a tarball on stdout
  local suite=$1 mirror=$2 security=$3 packages=$4
  shift 4
  mmdebstrap --variant=minbase --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --aptopt='Acquire::Retries "3"' \
    "$@" \
    "$suite" - \
    "deb $mirror $suite main" \
    "deb $mirror $suite-updates main" \
    "deb $security $suite-security main"
}
