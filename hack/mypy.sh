#!/usr/bin/env bash
# Type-checks what pyproject.toml's [tool.mypy] names (the operator and the local cluster
# strictly; the tests, benchmarks and examples), then tests/integration/conftest.py on its own:
# pytest imports it and tests/conftest.py both as `conftest`, and one mypy run cannot hold two
# modules of one name.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m mypy
.venv/bin/python -m mypy tests/integration/conftest.py
