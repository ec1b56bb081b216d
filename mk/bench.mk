# `make bench`: the CPU control-plane benchmarks (bench/scale, KWOK fake nodes) for our operator,
# Kubeflow's training-operator (built from its Go module by cluster/build.sh all) and a direct
# client; prints the table and writes the figures into bench/README.md. About 20 minutes on
# 2 cores. `make bench-smoke`: the same on tiny workloads (about 2 minutes).
.PHONY: bench bench-smoke bench-build

bench-build:
	nice -n 19 cluster/build.sh all

bench: bench-build venv
	LOCALKUBE_BIN=$$(cluster/build.sh all) PYTHONPATH=cluster:operator \
		.venv/bin/python -m bench.scale --json bench/scale/results.json --readme bench/README.md

bench-smoke: bench-build venv
	LOCALKUBE_BIN=$$(cluster/build.sh all) PYTHONPATH=cluster:operator \
		.venv/bin/python -m bench.scale --smoke
