"""The Dockerfiles agree with the package: entrypoints exist, the torch pin is the tested one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    result: dict[str, str] = project["scripts"]
    return result


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_operator_image_runs_the_operator_script_as_non_root() -> None:
    steps = instructions(ROOT / "images" / "operator" / "Dockerfile")
    entrypoint = [args for word, args in steps if word == "ENTRYPOINT"][-1]
    command = re.findall(r'"([^"]+)"', entrypoint)[0]
    assert command in scripts(), f"{command} is not a console script in pyproject.toml"
    assert scripts()[command] == "torchrun_operator.main:main"
    froms = [args for word, args in steps if word == "FROM"]
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    # The last USER wins; the chart's runAsUser is 65532.
    user = [a for word, a in steps if word == "USER"][-1]
    assert user.split(":")[0] == "65532"


def test_runtime_image_pins_the_tested_torch() -> None:
    pin = re.search(r"^torch==(\S+)$", (ROOT / "requirements-test.txt").read_text(), re.M)
    assert pin, "requirements-test.txt pins no torch"
    steps = instructions(ROOT / "images" / "runtime" / "Dockerfile")
    args = dict(a.split("=", 1) for word, a in steps if word == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == pin.group(1)
    froms = [a for word, a in steps if word == "FROM"]
    # torch is pip-installed in a build stage on our own Debian base (images/base), so the
    # image runs the very wheel the tests run.
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    assert any('"torch==${TORCH_VERSION}"' in a for w, a in steps if w == "RUN")
    assert [a for w, a in steps if w == "USER"][-1].split(":")[0] == "65532"


def test_images_make_target_builds_both() -> None:
    text = (ROOT / "mk" / "images.mk").read_text()
    assert re.search(r"^images: .*image-operator.*image-runtime", text, re.M)
    assert "images/operator/Dockerfile" in text and "images/runtime/Dockerfile" in text
