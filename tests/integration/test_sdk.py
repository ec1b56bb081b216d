"""The Python SDK (torchrun_operator.client) against a real cluster: a notebook's submit,
wait, logs and delete; and the same from a clean virtualenv that has only `pip install .`
(no extras: no kopf, no prometheus-client)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtj import REPO, pod_log, quick_job, wait_for
from kubernetes import client
from torchrun_operator.client import Client, JobNotFound

pytestmark = pytest.mark.usefixtures("operator")


def gone(c: Client, name: str) -> bool:
    try:
        c.get(name)
    except JobNotFound:
        return True
    return False


def test_submit_wait_logs_of_rank_0_and_delete(kube: client.ApiClient, namespace: str) -> None:
    c = Client(kube, namespace=namespace)
    # KeepAll: the pods stay once the job succeeded, so that their logs can be read.
    job = c.submit(quick_job("sdk-hello", runPolicy={"cleanPodPolicy": "KeepAll"}))
    assert job.uid and job.namespace == namespace
    assert [j.name for j in c.list()] == ["sdk-hello"]

    status = c.wait("sdk-hello", timeout=180)
    assert status.phase == "Succeeded"
    assert status.ranks and {r.phase for r in status.ranks} == {"Succeeded"}

    holder = next(r for r in status.ranks if r.global_ranks == "0")
    lines = list(c.logs("sdk-hello", rank=0))
    # The log of the pod that holds rank 0, as the apiserver gives it.
    assert lines == pod_log(kube, namespace, str(holder.pod)).splitlines()
    assert "user program ran" in lines

    c.delete("sdk-hello")
    wait_for("the job deleted", lambda: gone(c, "sdk-hello"), timeout=60)


CLEAN_SCRIPT = """
import json, sys
from torchrun_operator.client import Client, JobNotFound
c = Client()  # $KUBECONFIG, as a laptop has it
job = c.submit(json.loads(sys.argv[1]))
for j in c.watch(job.name, timeout=180):
    print("phase", j.phase, flush=True)
    if j.finished:
        break
print("final", c.wait(job.name, timeout=10).phase, flush=True)
c.delete(job.name)
print("deleted", flush=True)
"""


def test_a_clean_virtualenv_with_only_pip_install_dot_submits_follows_and_deletes(
    kube: client.ApiClient, namespace: str, cluster: Any, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    # A plain venv: no site-packages of this interpreter (--system-site-packages would see
    # the test environment's kopf). pip fetches the base dependencies from its index (needs
    # the network), at the versions the tests pin.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [venv / "bin/pip", "install", "-q", "-c", REPO / "requirements-test.txt", REPO],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, f"pip install . failed (no network?):\n{pip.stderr[-3000:]}"
    python = venv / "bin/python"
    for extra in ("kopf", "prometheus_client"):
        probe = subprocess.run([python, "-c", f"import {extra}"], capture_output=True)
        assert probe.returncode != 0, f"{extra} came with the base install"

    # The namespace is the kubeconfig context's, as for a user: a kubeconfig of our own.
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    env = dict(PATH=f"{venv / 'bin'}:/usr/bin:/bin", KUBECONFIG=str(kubeconfig), HOME=str(tmp_path))
    run = subprocess.run(
        [python, "-c", CLEAN_SCRIPT, json.dumps(quick_job("sdk-clean"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not the repository: the installed package is the one imported
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout.splitlines()
    assert out[-2:] == ["final Succeeded", "deleted"], run.stdout
    assert "phase Succeeded" in out
    # kubectl-dtj, installed by the same pip install, lists the namespace's jobs: none left.

    def listed() -> str | None:
        dtj = subprocess.run(
            [venv / "bin/kubectl-dtj", "list"], env=env, capture_output=True, text=True, timeout=60
        )
        assert dtj.returncode == 0, dtj.stderr
        return None if "sdk-clean" in dtj.stdout else dtj.stdout

    assert "No resources found." in wait_for(
        "the job gone from kubectl-dtj list", listed, timeout=60
    )
