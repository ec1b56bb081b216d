#!/usr/bin/env bash
# Installs the project's system dependencies from their one list (packages.tsv, beside this
# script): only the packages that are missing, with apt, without recommends. Idempotent.
#
#   hack/sysdeps/install.sh --all          every package of the list (.ci/run)
#   hack/sysdeps/install.sh --group G...   the packages of groups G (build demo test images realnode kind)
#   hack/sysdeps/install.sh CMD...         the packages that provide these commands (or paths)
#   hack/sysdeps/install.sh --missing ...  print the missing packages, install nothing
#
# A package is missing when any command or file it provides (second column) is not there.
# Installing needs root and apt; without them it exits 1 naming the packages to install.
set -euo pipefail
list=$(dirname "$0")/packages.tsv
mode=commands dry=0 wanted=()
while (($#)); do
  case "$1" in
    --all) mode=all ;;
    --group) mode=group ;;
    --missing) dry=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "hack/sysdeps/install.sh: unknown flag $1" >&2; exit 2 ;;
    *) wanted+=("$1") ;;
  esac
  shift
done

present() {  # provides (comma-separated): every command on PATH, every path there
  local item
  IFS=, read -ra items <<<"$1"
  for item in "${items[@]}"; do
    if [[ $item == /* ]]; then [ -e "$item" ] || return 1
    else command -v "$item" >/dev/null || return 1
    fi
  done
}

selected() {  # package provides groups: does this row answer the request?
  local w
  [ "$mode" = all ] && return 0
  for w in "${wanted[@]}"; do
    if [ "$mode" = group ]; then [[ ,$3, == *",$w,"* ]] && return 0
    elif [[ ,$2, == *",$w,"* || $1 == "$w" ]]; then return 0
    fi
  done
  return 1
}

need=() found=()
while IFS=$'\t' read -r pkg provides groups _why; do
  [[ -z $pkg || $pkg == \#* ]] && continue
  selected "$pkg" "$provides" "$groups" || continue
  found+=("$pkg")
  present "$provides" || need+=("$pkg")
done <"$list"

if [ "$mode" = commands ]; then
  for w in "${wanted[@]}"; do
    printf '%s\n' "${found[@]}" | grep -qx -- "$w" && continue
    grep -qP "^[^#][^\t]*\t([^\t]*,)?\Q$w\E(,[^\t]*)?\t" "$list" ||
      { echo "hack/sysdeps/install.sh: $w is in no package of $list" >&2; exit 2; }
  done
fi
if ((dry)); then
  ((${#need[@]})) && printf '%s\n' "${need[@]}"
  exit 0
fi
((${#need[@]})) || exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "hack/sysdeps/install.sh: missing Debian package(s): ${need[*]} (apt-get install ${need[*]}); installing needs root and apt" >&2
  exit 1
fi
# apt's and dpkg's own lines go to a log, printed only when the install fails.
log=${TMPDIR:-/tmp}/torchrun-operator-sysdeps.log
echo "[sysdeps] installing ${need[*]} (apt; log: $log)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
  echo "[sysdeps] apt-get failed; the last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
