#!/usr/bin/env bash
# The demo: brings up the local cluster, installs the CRD, starts the operator, runs the CPU
# example and prints its per-rank status. The cluster stays up for you to explore:
#   export KUBECONFIG=$(.venv/bin/python -m localkube kubeconfig); kubectl get dtj
# and `make down` stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/sysdeps/install.sh --group demo
PY=$(hack/venv.sh)
export PYTHONPATH=$PWD/operator:$PWD/cluster
DIR=${LOCALKUBE_DIR:-$PWD/.cluster}
"$PY" -m localkube --dir "$DIR" up
KUBECONFIG=$("$PY" -m localkube --dir "$DIR" kubeconfig)
export KUBECONFIG
kubectl apply --server-side -f crds/
kubectl wait --for=condition=Established crd/distributedtrainingjobs.torchrun.dev --timeout=60s

if [ -f "$DIR/operator.pid" ] && kill -0 "$(cat "$DIR/operator.pid")" 2>/dev/null; then
  echo "operator already running (pid $(cat "$DIR/operator.pid"))"
else
  nohup "$PY" -m torchrun_operator.main --all-namespaces --liveness-port 0 --metrics-port 0 \
    >"$DIR/logs/operator.log" 2>&1 &
  echo $! >"$DIR/operator.pid"
  echo "operator started (pid $!, log $DIR/logs/operator.log)"
fi

kubectl delete -f examples/cpu-ddp.yaml --ignore-not-found --wait=true >/dev/null
kubectl apply -f examples/cpu-ddp.yaml
job=$(kubectl get -f examples/cpu-ddp.yaml -o jsonpath='{range .items[?(@.kind=="DistributedTrainingJob")]}{.metadata.name}{end}')
echo "waiting for $job to finish..."
for _ in $(seq 1 180); do
  phase=$(kubectl get dtj "$job" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  case "$phase" in Succeeded|Failed) break ;; esac
  sleep 1
done
"$PY" -m torchrun_operator.cli.main status "$job"
[ "$phase" = Succeeded ]
