"""localkube process node: a kubelet stand-in that runs the pods bound to its Nodes as local
processes, each pod in its own network namespace on the cluster bridge.

Run it as `python -m localkube.node --kubeconfig ... --state-dir ... --nodes-json ...`
(see `__main__.py`); where logs and state live is described in `pods.py`.
"""
