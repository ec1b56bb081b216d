"""Control-plane scale benchmarks on KWOK fake nodes: our operator beside Kubeflow's
training-operator, and a direct client with no operator as the machine's limit.

Run `python -m bench.scale` from the repository root (`make bench`); see bench/README.md.
"""
