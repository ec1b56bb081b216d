"""kubectl-dtj against a real cluster: `kubectl dtj ...` through kubectl's plugin mechanism,
with the plugin on PATH as users install it, on a job whose rank 3 raised."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from dtj import REPO, apply, load_docs, pod_log, wait_phase
from kubernetes import client

pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture(scope="module")
def failed_job(kube: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """examples/fail-rank3.yaml run to Failed in a namespace of this module."""
    core = client.CoreV1Api(kube)
    ns = f"kubectl-dtj-{os.getpid()}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        job = apply(kube, ns, load_docs(REPO / "examples" / "fail-rank3.yaml"))
        done = wait_phase(kube, ns, job["metadata"]["name"], {"Succeeded", "Failed"}, 180)
        assert done["status"]["phase"] == "Failed", done["status"]
        yield done
    finally:
        core.delete_namespace(ns)


@pytest.fixture(scope="module")
def kubectl_env(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PATH with kubectl and a `kubectl-dtj` as `pip install` would put it there."""
    assert shutil.which("kubectl"), "kubectl is not on PATH"
    bin_dir = tmp_path_factory.mktemp("plugin-bin")
    plugin = bin_dir / "kubectl-dtj"
    plugin.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{REPO / "operator"}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec "{sys.executable}" -m torchrun_operator.cli.main "$@"\n'
    )
    plugin.chmod(0o755)
    return dict(
        os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", KUBECONFIG=str(cluster.kubeconfig)
    )


def dtj(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["kubectl", "dtj", *args], env=env, capture_output=True, text=True, timeout=60
    )
    if ok:
        assert proc.returncode == 0, f"kubectl dtj {' '.join(args)}: {proc.stderr}"
    return proc


def holder_of(job: Any, rank: int) -> dict[str, Any]:
    from torchrun_operator.cli.format import parse_rank_ranges

    return next(
        r
        for r in job["status"]["ranks"]
        if rank in parse_rank_ranges(str(r.get("globalRanks") or ""))
    )


def test_list_shows_the_job_in_its_namespace_and_across_namespaces(
    failed_job: Any, kubectl_env: dict[str, str]
) -> None:
    ns, name = failed_job["metadata"]["namespace"], failed_job["metadata"]["name"]
    lines = dtj(kubectl_env, "list", "-n", ns).stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "PHASE"]
    row = next(line.split() for line in lines[1:] if line.split()[0] == name)
    assert row[1] == "Failed"

    lines = dtj(kubectl_env, "list", "-A").stdout.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "PHASE"]
    assert [ns, name, "Failed"] in [line.split()[:3] for line in lines[1:]]

    items = json.loads(dtj(kubectl_env, "list", "-n", ns, "-o", "json").stdout)
    items = items.get("items", items) if isinstance(items, dict) else items
    assert [i["metadata"]["name"] for i in items] == [name]


def test_status_shows_every_rank_and_the_root_cause(
    failed_job: Any, kubectl_env: dict[str, str]
) -> None:
    ns, name = failed_job["metadata"]["namespace"], failed_job["metadata"]["name"]
    out = dtj(kubectl_env, "status", name, "-n", ns).stdout
    for entry in failed_job["status"]["ranks"]:
        row = next(
            (line.split() for line in out.splitlines() if entry["pod"] in line.split()), None
        )
        assert row is not None, f"no row for pod {entry['pod']}:\n{out}"
        assert entry["globalRanks"] in row and entry["node"] in row
    cause = out[out.index("Root cause:") :]
    holder = holder_of(failed_job, 3)
    assert "RuntimeError: rank 3 failed on purpose" in cause
    assert holder["pod"] in cause and holder["node"] in cause

    as_json = json.loads(dtj(kubectl_env, "status", name, "-n", ns, "-o", "json").stdout)
    assert as_json["status"]["failure"]["rank"] == 3
    assert as_json["metadata"]["uid"] == failed_job["metadata"]["uid"]


def test_logs_of_rank_3_come_from_the_pod_that_holds_it(
    failed_job: Any, kubectl_env: dict[str, str], kube: client.ApiClient
) -> None:
    ns, name = failed_job["metadata"]["namespace"], failed_job["metadata"]["name"]
    holder = holder_of(failed_job, 3)
    proc = dtj(kubectl_env, "logs", name, "--rank", "3", "-n", ns, ok=False)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeError: rank 3 failed on purpose" in proc.stdout
    # The same as kubectl's own logs of the pod that holds rank 3.
    trainer = failed_job["spec"]["template"]["spec"]["containers"][0]["name"]
    assert proc.stdout.strip() == pod_log(kube, ns, holder["pod"], trainer).strip()


def test_unknown_job_is_a_clear_error(failed_job: Any, kubectl_env: dict[str, str]) -> None:
    ns = failed_job["metadata"]["namespace"]
    proc = dtj(kubectl_env, "status", "no-such-job", "-n", ns, ok=False)
    assert proc.returncode == 1
    assert f"distributedtrainingjob 'no-such-job' not found in namespace '{ns}'" in proc.stderr
