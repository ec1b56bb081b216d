"""Where a Go module lives in the module cache (downloading it if missing): cluster/build.sh
builds from the Go module proxy, and what it downloads is read in place, never copied."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def module_dir(module: str, version: str) -> Path:
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True, text=True, check=False, cwd="/",
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )  # fmt: skip
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or "Dir" not in info:
        raise RuntimeError(f"go mod download {module}@{version} failed: {out.stderr}")
    return Path(info["Dir"])
