#!/usr/bin/env bash
# The fresh check on a fresh root: CI's `.ci/run`, from a clone of HEAD, inside a Debian root
# that has no more than a new machine of our kind (so a package the project forgets to install
# fails here, whatever this machine has installed by hand or by earlier runs), with every cache
# empty. Prints the wall time of each phase.
#
#   hack/fresh-root.sh [--dir DIR] [--keep]
#   hack/fresh-root.sh --again DIR
#
# The root (mmdebstrap, Debian bookworm, minbase) holds a subset of a new machine's Debian
# packages (ROOT_PACKAGES, each checked against hack/sysdeps/new-machine-packages.txt) and what a
# new machine has outside apt, copied from this one: Go, pyenv's Python 3.11, the Docker client,
# kubectl, and its network's CA certificates (the environment, GOFLAGS and the *_CA_* variables
# among it, passes through). It is entered in a private mount namespace (proc, sys, dev, the
# cgroup hierarchies) whose root it is made with pivot_root, sharing this machine's kernel and
# network: the local cluster's network
# namespaces, dockerd and the real node's containerd run there as they would on a new machine.
# Needs root and the Debian mirror; mmdebstrap is installed here through hack/sysdeps.
#
# --dir DIR  where the root goes (default /var/tmp/fresh-root.XXXXXX); it must not exist
# --keep     leave the root behind (the default removes it, with its caches, at the end)
# --again DIR  run .ci/run again in a root an earlier --keep left, on this checkout's HEAD: the
#            root's caches, built there from empty the first time, are reused (a second
#            figure, not the fresh one); the root is kept
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
dir="" keep=0 again=0
while (($#)); do
  case "$1" in
    --dir) dir=$2; shift ;;
    --keep) keep=1 ;;
    --again) dir=$2; again=1; keep=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "hack/fresh-root.sh needs root (mmdebstrap, chroot, mounts)" >&2; exit 1; }
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/fresh-root.XXXXXX)
if ((again)); then
  [ -x "$dir/enter.sh" ] || { echo "--again $dir: no root there (make one with --keep)" >&2; exit 2; }
elif [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  echo "--dir $dir is not empty" >&2
  exit 2
fi

# What the root starts with: Debian packages every new machine has (checked below), enough for
# a person to clone the repository and type make. Nothing the project's installer provides.
ROOT_PACKAGES="apt bash ca-certificates coreutils curl diffutils dpkg e2fsprogs file findutils \
gcc git grep gzip hostname iproute2 jq less libc-bin libc6-dev make mawk mount openssl passwd \
patch procps python3 sed sensible-utils tar tmux unzip util-linux xz-utils zstd"
for p in $ROOT_PACKAGES; do
  grep -qx "$p" "$REPO/hack/sysdeps/new-machine-packages.txt" ||
    { echo "hack/fresh-root.sh: $p is not on a new machine; the root may not have it" >&2; exit 2; }
done

"$REPO/hack/sysdeps/install.sh" mmdebstrap
# The commit checked, taken now: the checkout may move on during the hour the check runs.
head=$(git -C "$REPO" rev-parse HEAD)
phases=()
phase() {  # name command...: runs and records the wall time
  local name=$1 start rc=0
  shift
  echo "== $name" >&2
  start=$(date +%s)
  "$@" || rc=$?
  phases+=("$(printf '%-28s %6ss  exit %s' "$name" "$(($(date +%s) - start))" "$rc")")
  return "$rc"
}
report() {
  echo
  echo "fresh-root check of ${head:0:7}, root $dir"
  printf '%s\n' "${phases[@]}"
}
cleanup() {
  report
  if ((keep)); then echo "root kept: $dir"; else rm -rf --one-file-system "$dir"; fi
}
trap cleanup EXIT

make_root() {
  mmdebstrap --variant=minbase --include="${ROOT_PACKAGES// /,}" \
    --aptopt='Acquire::Retries "3"' bookworm "$dir" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  # Outside apt on a new machine: Go, pyenv's Python (python3 on PATH is 3.11 with pip), the
  # Docker client with no engine, kubectl. Same paths as here.
  local go py kubectl
  go=$(dirname "$(dirname "$(readlink -f "$(command -v go)")")")
  py=$(python3 -c 'import sys; print(sys.base_prefix)')
  kubectl=$(readlink -f "$(command -v kubectl)")
  mkdir -p "$dir$go" "$dir$py" "$dir/usr/local/bin"
  cp -a "$go/." "$dir$go/"
  cp -a "$py/." "$dir$py/"
  cp "$(command -v docker)" "$dir/usr/local/bin/docker"
  cp "$kubectl" "$dir/usr/local/bin/kubectl"
  # The machine's own names as a new machine has them: torchrun --standalone rendezvouses on
  # the hostname, which mmdebstrap's /etc/hosts (localhost only) does not resolve.
  cp /etc/resolv.conf /etc/hosts /etc/hostname "$dir/etc/"
  # A new machine trusts its network's TLS-inspecting CAs (every registry goes through them),
  # and pip is configured to use that bundle.
  cp -a /usr/local/share/ca-certificates/. "$dir/usr/local/share/ca-certificates/"
  chroot "$dir" update-ca-certificates >/dev/null
  [ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$dir/etc/pip.conf"
  git clone -q "$REPO" "$dir/src"
  git -C "$dir/src" checkout -q "$head"
  cat >"$dir/enter.sh" <<EOF
#!/bin/bash
# Inside the root, as a new machine's login shell would be.
export PATH=$go/bin:$py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
cd /src
exec "\$@"
EOF
  chmod +x "$dir/enter.sh"
}

# In a mount namespace of its own: the mounts go when the check ends, whatever happens.
in_root() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  unshare --mount --propagation private bash -c '
    set -e
    d=$1; shift
    # The root must be a mount point, as / is on a machine: `ip -n NS ...` makes / a slave
    # mount in a namespace of its own, which fails (EINVAL) on a plain directory, and every
    # pod sandbox of the process node failed so.
    mount --bind "$d" "$d"
    mount -t proc proc "$d/proc"
    mount --rbind /sys "$d/sys"
    mount --rbind /dev "$d/dev"
    mount -t tmpfs tmpfs "$d/run"
    # pivot_root, not a bare chroot: joining a mount namespace (setns) puts a process at the
    # namespace'"'"'s root, which under chroot is still this machine'"'"'s. runc exec joins a
    # container'"'"'s namespace so, and `kubectl exec` ran on this machine'"'"'s files
    # ("python": executable file not found); after pivot_root the root is the namespace'"'"'s.
    mkdir -p "$d/.old-root"
    cd "$d"
    pivot_root . .old-root
    umount -l /.old-root
    exec chroot . /enter.sh "$@"
  ' in_root "$dir" "$@"
}

to_head() {  # the kept root's clone, moved to this checkout's HEAD
  git -C "$dir/src" fetch -q "$REPO" HEAD
  git -C "$dir/src" checkout -qf "$head"
  git -C "$dir/src" clean -qfdx
}

if ((again)); then phase "clone to HEAD" to_head; else phase "mmdebstrap root" make_root; fi
phase ".ci/run in the root" in_root bash -c 'time .ci/run'
