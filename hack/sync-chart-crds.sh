#!/usr/bin/env bash
# Copies the generated CRDs (crds/, the source of truth) into the Helm chart, which must carry
# its own copy: Helm reads a chart's crds/ folder only from inside the chart.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/charts/torchrun-operator/crds"
mkdir -p "$dest"
rm -f "$dest"/*.yaml
cp "$root"/crds/*.yaml "$dest/"
