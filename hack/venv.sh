#!/usr/bin/env bash
# Makes (or reuses) the pinned test environment and prints its python. The venv lives in a
# cache folder keyed by the pins, so a fresh clone reuses it; pip's own cache makes a rebuild
# download nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${LOCALKUBE_CACHE:-$HOME/.cache/torchrun-operator}
key=$(cat requirements-test.txt | sha256sum | cut -c1-12)
VENV="$CACHE/venv-$key"
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[venv] creating $VENV" >&2
  rm -rf "$VENV"
  # A PIP_FIND_LINKS folder that is not there (machines of our kind set /opt/wheels) makes pip
  # warn once per requirement, ~90 lines: keep only the folders that exist.
  if [ -n "${PIP_FIND_LINKS:-}" ]; then
    links=""
    for l in $PIP_FIND_LINKS; do
      case $l in *://*) links="$links $l" ;; *) [ -e "$l" ] && links="$links $l" ;; esac
    done
    links=${links# }
    if [ -n "$links" ]; then export PIP_FIND_LINKS=$links; else unset PIP_FIND_LINKS; fi
  fi
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  "$VENV/bin/pip" install -q -r requirements-test.txt >&2
  touch "$VENV/.complete"
fi
ln -sfn "$VENV" .venv
echo "$VENV/bin/python"
