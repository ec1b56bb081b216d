"""The ConfigMap that carries the launcher into every training pod.

The launcher is a package (operator/torchrun_operator/launcher/), shipped as one zipapp: its
modules under ZIP_PACKAGE and a root ``__main__.py`` that runs ZIP_PACKAGE.main, built
byte-for-byte the same from the same sources (so its digest, in the ConfigMap's name and
checked by the pod before it runs the file, names the launcher's code and nothing else).
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from ..api import names
from ..launcher import contract
from .common import child_metadata

LAUNCHER_KEY = contract.LAUNCHER_FILE
ZIP_PACKAGE = "torchrun_launcher"  # the launcher package's name inside the zipapp
ZIP_MAIN = f"import sys\nfrom {ZIP_PACKAGE}.main import main\nsys.exit(main())\n"
# Fixed metadata so that two builds of the same sources are identical: the earliest date a zip
# can hold, and a read-only regular file made on Unix.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_ZIP_MODE = 0o100444 << 16
_ZIP_UNIX = 3


def build_zipapp(files: Mapping[str, bytes]) -> bytes:
    """A deterministic zip of ``files`` (archive name -> bytes): stored, sorted, fixed dates
    and modes. ``python <zip>`` and runpy.run_path run its root ``__main__.py``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = _ZIP_UNIX
            info.external_attr = _ZIP_MODE
            zf.writestr(info, files[name])
    return buf.getvalue()


def launcher_files() -> dict[str, bytes]:
    """The zipapp's files: every module of the launcher package, and the root __main__."""
    package = resources.files("torchrun_operator.launcher")
    files = {
        f"{ZIP_PACKAGE}/{entry.name}": entry.read_bytes()
        for entry in package.iterdir()
        if entry.name.endswith(".py") and entry.is_file()
    }
    files["__main__.py"] = ZIP_MAIN.encode()
    return files


@cache
def packaged_launcher() -> bytes:
    """The launcher this operator ships: the zipapp of operator/torchrun_operator/launcher/."""
    return build_zipapp(launcher_files())


@cache
def packaged_launcher_digest() -> str:
    return launcher_digest(packaged_launcher())


def launcher_digest(launcher: bytes) -> str:
    """sha256 of the launcher's bytes, as the pod checks it before running it."""
    return hashlib.sha256(launcher).hexdigest()


def render_launcher_configmap(job: dict[str, Any], launcher: bytes) -> dict[str, Any]:
    """One per job and launcher version, immutable: a job's pods run the launcher the operator
    rendered even when the operator is upgraded mid-run, and nobody can edit it in place."""
    name = names.launcher_configmap_name(job["metadata"]["name"], launcher_digest(launcher))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(job, name),
        "immutable": True,
        "binaryData": {LAUNCHER_KEY: base64.b64encode(launcher).decode("ascii")},
    }
