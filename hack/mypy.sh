#!/usr/bin/env bash
# Type-checks what pyproject.toml's [tool.mypy] names (the operator and the local cluster
# strictly; the tests, benchmarks and examples), then each conftest.py below tests/ on its own:
# pytest imports every conftest.py as `conftest`, and one mypy run cannot hold two modules of
# one name (the first run checks tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m mypy
find tests -mindepth 2 -name conftest.py -print0 | sort -z | xargs -0 -r -n1 .venv/bin/python -m mypy
