# `make bench`: the CPU control-plane benchmarks (bench/scale, KWOK fake nodes) for our operator,
# Kubeflow's training-operator and Kubeflow Trainer v2 + JobSet (built from their Go modules by
# cluster/build.sh all) and a direct client, then the scaling series; prints the tables and
# writes the figures into bench/README.md and the chart into bench/scale/scaling.png. Every
# operator runs at two client-limit settings (bench/scale/limits.py). 66 minutes on 2 cores
# (2026-11-29: the cluster 2, the tables 29 at the anchors' defaults and 18 at raised limits,
# the series 17). `make bench-smoke`: the tables on tiny workloads (about 3 minutes).
.PHONY: bench bench-smoke bench-build bench-venv

bench-build:
	nice -n 19 cluster/build.sh all

# The benchmarks' own requirements (matplotlib, for the chart) on top of the test environment.
bench-venv: venv
	.venv/bin/python -m pip install -q -r bench/requirements.txt

bench: bench-build bench-venv
	LOCALKUBE_BIN=$$(cluster/build.sh all) PYTHONPATH=cluster:operator \
		.venv/bin/python -m bench.scale --json bench/scale/results.json --readme bench/README.md

bench-smoke: bench-build venv
	LOCALKUBE_BIN=$$(cluster/build.sh all) PYTHONPATH=cluster:operator \
		.venv/bin/python -m bench.scale --smoke
