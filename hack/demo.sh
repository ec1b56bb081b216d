#!/usr/bin/env bash
# The demo: brings up the local cluster, installs the CRD, starts the operator, runs the CPU
# example and prints its per-rank status. The cluster stays up for you to explore:
#   export PYTHONPATH=$PWD/operator:$PWD/cluster
#   export KUBECONFIG=$(.venv/bin/python -m localkube kubeconfig); kubectl get dtj
# and `make down` stops everything. LOCALKUBE_DIR, LOCALKUBE_NAME and LOCALKUBE_BASE choose
# another folder, bridge name and pod network (tests/localkube/test_demo.py runs it so).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/sysdeps/install.sh --group demo
PY=$(hack/venv.sh)
export PYTHONPATH=$PWD/operator:$PWD/cluster
DIR=${LOCALKUBE_DIR:-$PWD/.cluster}
# A few lines in all (a cold `make demo` prints under 40): each step says what it did in one
# line, and the commands' own output is shown only when one fails.
lk=("$PY" -m localkube --dir "$DIR" --name "${LOCALKUBE_NAME:-local}" --base "${LOCALKUBE_BASE:-244}")
"${lk[@]}" up --quiet
KUBECONFIG=$("${lk[@]}" kubeconfig)
export KUBECONFIG
quietly() {  # command...: its output only when it fails
  local out
  out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}
quietly kubectl apply --server-side -f crds/
quietly kubectl wait --for=condition=Established crd/distributedtrainingjobs.torchrun.dev --timeout=60s
echo "CRDs installed (crds/)"

if [ -f "$DIR/operator.pid" ] && kill -0 "$(cat "$DIR/operator.pid")" 2>/dev/null; then
  echo "operator already running (pid $(cat "$DIR/operator.pid"))"
else
  nohup "$PY" -m torchrun_operator.main --all-namespaces --liveness-port 0 --metrics-port 0 \
    >"$DIR/logs/operator.log" 2>&1 &
  echo $! >"$DIR/operator.pid"
  echo "operator started (pid $!, log $DIR/logs/operator.log)"
fi

kubectl delete -f examples/cpu-ddp.yaml --ignore-not-found --wait=true >/dev/null
quietly kubectl apply -f examples/cpu-ddp.yaml
job=$(kubectl get -f examples/cpu-ddp.yaml -o jsonpath='{range .items[?(@.kind=="DistributedTrainingJob")]}{.metadata.name}{end}')
echo "applied examples/cpu-ddp.yaml; waiting for job $job to finish..."
for _ in $(seq 1 180); do
  phase=$(kubectl get dtj "$job" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  case "$phase" in Succeeded|Failed) break ;; esac
  sleep 1
done
"$PY" -m torchrun_operator.cli.main status "$job"
[ "$phase" = Succeeded ]
