"""The launcher's log: one structured line on stderr per event."""

from __future__ import annotations

import json
import sys
from typing import Any


def log(message: str, **fields: Any) -> None:
    """One structured line on stderr: ``[launcher] message key=value ...``."""
    extra = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
    line = f"[launcher] {message}" + (f" {extra}" if extra else "")
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _fmt(v: Any) -> str:
    s = str(v)
    if not s or '"' in s or any(c.isspace() for c in s):
        return json.dumps(s, ensure_ascii=False)
    return s
