"""Host mountpoints the node had to create (bind mounts need an existing target).

Every path created is recorded in `STATE_DIR/created-paths.json`, so a later run or the
shutdown path removes them again (only if still empty: never anyone else's data, and never
while a mount namespace still mounts on it: another cluster's pods may use the same path).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from ..procs import mounted_in_any_namespace


class CreatedPaths:
    def __init__(self, record: Path) -> None:
        self.record = record
        self.lock = threading.Lock()
        try:
            self.paths: list[str] = json.loads(record.read_text())
        except (OSError, ValueError):
            self.paths = []

    def ensure(self, target: str, is_file: bool) -> None:
        """Create `target` (and missing parents) on the host, recording what was created."""
        path = Path(target)
        with self.lock:
            if path.exists() or path.is_symlink():
                return
            missing = [p for p in reversed(path.parents) if not p.exists()]
            for p in missing:
                p.mkdir()
                self.paths.append(str(p))
            if is_file:
                path.touch()
            else:
                path.mkdir()
            self.paths.append(str(path))
            self._save()

    def _save(self) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.record.write_text(json.dumps(self.paths))

    def remove_all(self) -> None:
        with self.lock:
            left = []
            for p in reversed(self.paths):
                path = Path(p)
                if mounted_in_any_namespace(path):
                    left.append(p)  # in use by some pod, this host's or another cluster's
                    continue
                try:
                    if path.is_dir() and not path.is_symlink():
                        path.rmdir()
                    elif path.is_file() and path.stat().st_size == 0:
                        path.unlink()
                except OSError:
                    left.append(p)
            self.paths = list(reversed(left))
            self._save()
