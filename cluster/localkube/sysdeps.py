"""The project's system dependencies: the Debian packages the build, the demo and the tests use,
read from their one list (hack/sysdeps/packages.tsv), and the one way to install them
(hack/sysdeps/install.sh). Code that runs a command a new machine lacks calls ensure() first,
so it installs the package or fails with a message naming it, never with FileNotFoundError."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SYSDEPS_DIR = Path(__file__).resolve().parents[2] / "hack" / "sysdeps"
PACKAGES_FILE = SYSDEPS_DIR / "packages.tsv"
INSTALLER = SYSDEPS_DIR / "install.sh"
NEW_MACHINE_COMMANDS = SYSDEPS_DIR / "new-machine-commands.txt"
# Who needs a package (the list's third column); .ci/run installs every group.
GROUPS = frozenset({"build", "demo", "test", "images", "realnode", "kind"})


@dataclass(frozen=True)
class Package:
    name: str
    provides: tuple[str, ...]  # commands on PATH, or absolute paths of files it installs
    groups: frozenset[str]
    why: str

    @property
    def commands(self) -> tuple[str, ...]:
        return tuple(p for p in self.provides if not p.startswith("/"))

    def present(self) -> bool:
        return all(
            Path(p).exists() if p.startswith("/") else shutil.which(p) is not None
            for p in self.provides
        )


@cache
def _parse(text: str) -> tuple[Package, ...]:
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, provides, groups, why = line.split("\t", 3)
        out.append(
            Package(
                name=name.strip(),
                provides=tuple(provides.split(",")),
                groups=frozenset(groups.split(",")),
                why=why.strip(),
            )
        )
    return tuple(out)


def packages() -> tuple[Package, ...]:
    return _parse(PACKAGES_FILE.read_text())


def new_machine_commands() -> frozenset[str]:
    """The commands a new machine of our kind has before anything is installed."""
    lines = NEW_MACHINE_COMMANDS.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def package_for(command: str) -> Package:
    for p in packages():
        if command in p.provides:
            return p
    raise KeyError(f"{command} is in no package of {PACKAGES_FILE}")


def ensure(*commands: str, timeout: float = 900) -> None:
    """Installs (through hack/sysdeps/install.sh) the packages that provide `commands` where
    any is missing; raises RuntimeError naming the packages when that fails (not root, no apt)."""
    missing = {package_for(c).name for c in commands if shutil.which(c) is None}
    if not missing:
        return
    out = subprocess.run(
        ["bash", str(INSTALLER), *commands], capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"missing Debian package(s) {', '.join(sorted(missing))} for {', '.join(commands)}, "
            f"and hack/sysdeps/install.sh could not install them:\n{out.stderr[-2000:]}"
        )
