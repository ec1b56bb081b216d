#!/usr/bin/env bash
# Prints the path of a helm binary: $HELM, then $LOCALKUBE_BIN/helm, then the one
# cluster/build.sh builds into its cache, then helm on PATH.
set -euo pipefail
if [ -n "${HELM:-}" ]; then echo "$HELM"; exit 0; fi
if [ -n "${LOCALKUBE_BIN:-}" ] && [ -x "$LOCALKUBE_BIN/helm" ]; then echo "$LOCALKUBE_BIN/helm"; exit 0; fi
for h in "${LOCALKUBE_CACHE:-$HOME/.cache/torchrun-operator}"/bin/*/helm; do
  if [ -x "$h" ]; then echo "$h"; exit 0; fi
done
if command -v helm >/dev/null; then command -v helm; exit 0; fi
echo "helm not found: set HELM, or run cluster/build.sh" >&2
exit 1
