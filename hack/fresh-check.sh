#!/usr/bin/env bash
# Proves that the README's test command works on a fresh machine: clones this repository's
# HEAD into a temporary folder and runs `make test` there with every cache empty (a temporary
# HOME, LOCALKUBE_CACHE, Go module and build caches, pip cache), then prints the wall time of
# each phase. With --warm it then clones again and runs the same phases on the caches the
# first run filled, to show the warm times.
#
#   hack/fresh-check.sh [--warm] [--root DIR] [--keep]
#
# --root DIR   put the temporary HOME and caches under DIR (default: a new mktemp folder)
# --keep       leave DIR behind (its caches can seed a development machine)
# Needs root (the local cluster makes network namespaces), Go, Python 3.11, git and make.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
warm=0 keep=0 root=""
while (($#)); do
  case "$1" in
    --warm) warm=1 ;;
    --keep) keep=1 ;;
    --root) root=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$root" ]; then
  root=$(mktemp -d /tmp/fresh-check.XXXXXX)
elif [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then
  echo "--root $root is not empty: a fresh check needs empty caches" >&2
  exit 2
fi
mkdir -p "$root"
((keep)) || trap 'rm -rf "$root"' EXIT

orig_home=$HOME
# Every cache the build and the tests use, inside $root. PYENV_ROOT keeps pyenv's python3
# shims working under the temporary HOME.
export HOME=$root/home
export XDG_CACHE_HOME=$HOME/.cache
export LOCALKUBE_CACHE=$root/cache/torchrun-operator
export GOPATH=$root/go GOMODCACHE=$root/go/pkg/mod GOCACHE=$root/cache/go-build
export PIP_CACHE_DIR=$root/cache/pip
export PYENV_ROOT=${PYENV_ROOT:-/root/.pyenv}
unset LOCALKUBE_BIN KUBECONFIG LOCALKUBE_USE_KUBECONFIG
mkdir -p "$HOME" "$XDG_CACHE_HOME"
cp "$orig_home/.gitconfig" "$HOME/" 2>/dev/null || true  # identity and safe.directory

rev=$(git -C "$REPO" rev-parse --short HEAD)  # what the clones hold, whatever HEAD does later
phases=()
phase() {  # name command...: runs and records the wall time; stops the check on failure
  local name=$1 start rc=0
  shift
  echo "== $name: $*" >&2
  start=$(date +%s)
  "$@" || rc=$?
  phases+=("$(printf '%-28s %6ss  exit %s' "$name" "$(($(date +%s) - start))" "$rc")")
  if ((rc)); then report; echo "FAILED: $name (exit $rc)" >&2; exit "$rc"; fi
}
report() {
  echo
  echo "fresh check of $rev, caches under $root"
  printf '%s\n' "${phases[@]}"
}

run_once() {  # label
  local dir=$root/clone-$1
  phase "$1: clone" git clone -q "$REPO" "$dir"
  git -C "$dir" checkout -q "$rev"
  cd "$dir"
  export PYTHONPATH=$dir/operator:$dir/cluster
  phase "$1: cluster/build.sh all" bash cluster/build.sh all
  phase "$1: hack/venv.sh" hack/venv.sh
  phase "$1: make test" make test
  cd "$REPO"
}

run_once cold
((warm)) && run_once warm
report
