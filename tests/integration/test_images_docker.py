"""The operator image on a real Docker engine.

The operator image is built the way `make image-operator` builds it (its base image from
Debian packages by mmdebstrap, no registry) and run: `--help`, as its non-root user, under the
restrictions the chart puts on the pod, with the operator package and the launcher inside.
(The local cluster beside a running dockerd: tests/localkube/test_docker_bridge.py.)

No engine is no skip: hack/docker.sh installs (apt) and starts dockerd when none answers,
which needs root, as CI has; when it cannot, the tests fail with its output.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from docker_fixtures import OPERATOR_IMAGE, make, sh
from torchrun_operator.render.configmap import packaged_launcher_digest

UID = "65532"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Built:
    image: str
    launcher_digest: str  # the checkout's launcher as the build context was made


@pytest.fixture(scope="module")
def operator_image(docker_engine: None) -> Built:
    digest = packaged_launcher_digest()  # the checkout's launcher package, zipped
    make("image-operator", f"OPERATOR_IMAGE={OPERATOR_IMAGE}", timeout=540)
    return Built(OPERATOR_IMAGE, digest)


def test_operator_image_runs_help_as_its_non_root_user(operator_image: Built) -> None:
    user = sh("docker", "image", "inspect", "-f", "{{.Config.User}}", OPERATOR_IMAGE).stdout
    assert user.strip() == f"{UID}:{UID}"
    # As the chart runs it: read-only root filesystem with /tmp writable, no capabilities, no
    # privilege escalation, no network needed.
    restricted = [
        "--rm",
        "--network=none",
        "--read-only",
        "--tmpfs=/tmp",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
    ]
    helped = sh("docker", "run", *restricted, OPERATOR_IMAGE, "--help")
    assert helped.stdout.startswith("usage: torchrun-operator"), helped.stdout
    assert "--leader-election-namespace" in helped.stdout
    ident = sh("docker", "run", *restricted, "--entrypoint", "id", OPERATOR_IMAGE).stdout
    # A named user: kopf asks getpass.getuser() for its identity, which needs a passwd entry.
    assert ident.split()[:2] == [f"uid={UID}(nonroot)", f"gid={UID}(nonroot)"], ident


INSIDE = """
import hashlib, importlib.util, os, shutil, torchrun_operator
from torchrun_operator.render.configmap import packaged_launcher
print("PACKAGE", os.path.dirname(torchrun_operator.__file__))
print("LAUNCHER", hashlib.sha256(packaged_launcher()).hexdigest())
print("TORCH", importlib.util.find_spec("torch") is not None)
print("SCRIPTS", shutil.which("torchrun-operator"), shutil.which("kubectl-dtj"))
print("SRC", os.path.exists("/src"))
"""


def test_operator_image_holds_the_package_and_launcher(operator_image: Built) -> None:
    out = sh(
        "docker", "run", "--rm", "--network=none", "--entrypoint", "python", OPERATOR_IMAGE,
        "-c", INSIDE,
    ).stdout  # fmt: skip
    facts = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert facts["PACKAGE"] == "/opt/venv/lib/python3.11/site-packages/torchrun_operator"
    assert facts["LAUNCHER"] == operator_image.launcher_digest, "not the checkout's launcher"
    assert facts["TORCH"] == "False"  # the operator never imports torch
    assert facts["SCRIPTS"] == "/opt/venv/bin/torchrun-operator /opt/venv/bin/kubectl-dtj"
    # The build stage's sources, and the build machine's CA bundle with them, stay behind.
    assert facts["SRC"] == "False"
