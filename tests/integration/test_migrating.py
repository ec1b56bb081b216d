"""Scripts brought as they are (docs/migrating.md), on the real local cluster with real torchrun.

- a launch-era script whose argparse requires --local_rank/--local-rank gets it, equal to
  LOCAL_RANK (spec.torchrun.localRankArg, or implied by python -m torch.distributed.launch);
  without the setting, the job fails with argparse's line and a hint naming it;
- a launcher in the command (torchrun, python -m torch.distributed.run) is unwrapped: the
  script runs under the operator's torchrun; the apiserver refuses flags the operator owns
  (CEL) but not the script's own arguments of the same names;
- init_process_group as the tutorials teach it works unchanged: the default env://, explicit
  rank and world_size from the environment, and init_method="tcp://$MASTER_ADDR:$MASTER_PORT"
  (with torchrun's rendezvous store shared with the workers, and without);
- `kubectl dtj convert` of a Kubeflow training-operator example runs.

Every script prints what its rank saw (one line, `SEEN <json>`), which the test reads from
the pods' logs through the API: the same on any cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import jobs
import pace
import pytest
import yaml
from dtj import (
    EXAMPLE_WORK_S,
    GROUP,
    IMAGE,
    PLURAL,
    REPO,
    SMALL,
    VERSION,
    apply,
    create_job,
    job_pods,
    pod_log,
    wait_phase,
)
from kubeflow_examples import example
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.usefixtures("operator")


# Prints what the rank saw, after a gloo all_reduce across the world: one write, so that the
# lines of two workers of a pod never mix.
RECORD = textwrap.dedent(
    """
    def record(**extra):
        import json, os, sys
        import torch
        import torch.distributed as dist
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size(), t
        seen = {
            "rank": dist.get_rank(),
            "worldSize": dist.get_world_size(),
            "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
            "argv": sys.argv[1:],
            **extra,
        }
        sys.stdout.write(f"{MARK}{json.dumps(seen)}\\n")
        sys.stdout.flush()
        dist.barrier()
        dist.destroy_process_group()
    """
)
MARK = "SEEN "
RECORD = f"MARK = {MARK!r}\n{RECORD}"

SCRIPTS = {
    # As torch.distributed.launch's documentation taught it.
    "launch_era.py": RECORD
    + textwrap.dedent(
        """
        import argparse, os
        import torch.distributed as dist
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", "--local-rank", type=int, required=True)
        parser.add_argument("--epochs", type=int, default=1)
        args = parser.parse_args()
        assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args, os.environ["LOCAL_RANK"])
        dist.init_process_group("gloo")
        record(localRankArg=args.local_rank, epochs=args.epochs)
        """
    ),
    "init_env.py": RECORD
    + textwrap.dedent(
        """
        import torch.distributed as dist
        dist.init_process_group(backend="gloo")  # init_method defaults to env://
        record()
        """
    ),
    "init_explicit.py": RECORD
    + textwrap.dedent(
        """
        import os
        import torch.distributed as dist
        dist.init_process_group(
            "gloo",
            init_method="env://",
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
        record()
        """
    ),
    "init_tcp.py": RECORD
    + textwrap.dedent(
        """
        import os
        import torch.distributed as dist
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
        record()
        """
    ),
}


def scripts_configmap(name: str, scripts: dict[str, str]) -> dict[str, Any]:
    return jobs.configmap(f"{name}-scripts", scripts)


def job_doc(
    name: str, command: list[str], *, nodes: int = 2, nproc: int = 1, **spec: Any
) -> dict[str, Any]:
    """A small CPU job, the scripts at /workspace; its pods are kept (and their logs, read by
    `seen`) once it finished."""
    spec.setdefault("runPolicy", {"cleanPodPolicy": "KeepAll"})
    doc = jobs.job(
        name,
        nodes=nodes,
        nproc=nproc,
        image=IMAGE,
        command=command,
        trainer={"resources": SMALL},
        pod={"terminationGracePeriodSeconds": 2},
        **{"rendezvous": {"joinTimeoutSeconds": 90}, **spec},
    )
    return jobs.mount(
        doc, {"name": "scripts", "configMap": {"name": f"{name}-scripts"}}, jobs.WORKSPACE
    )


def run_jobs(
    kube: client.ApiClient, namespace: str, docs: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Applies every job (with its scripts) at once, then waits for each to finish: within
    the start of all of their pods and workers, and the examples' work."""
    names = []
    for doc in docs:
        name = doc["metadata"]["name"]
        apply(kube, namespace, [scripts_configmap(name, SCRIPTS), doc])
        names.append(name)
    budget = sum(pace.job(doc["spec"]) for doc in docs) + EXAMPLE_WORK_S
    return {n: wait_phase(kube, namespace, n, {"Succeeded", "Failed"}, budget) for n in names}


def seen(kube: client.ApiClient, namespace: str, job: str) -> list[dict[str, Any]]:
    """What each rank of the job printed (RECORD), in rank order."""
    out = []
    for pod in job_pods(kube, namespace, job):
        for line in pod_log(kube, namespace, pod.metadata.name).splitlines():
            if MARK in line:
                out.append(json.loads(line.partition(MARK)[2]))
    return sorted(out, key=lambda r: int(r["rank"]))


def test_launch_era_scripts_get_their_local_rank_argument(
    kube: client.ApiClient, namespace: str
) -> None:
    docs = {
        # the setting, with torch < 2.0's spelling
        "setting": job_doc(
            "setting",
            ["python", "/workspace/launch_era.py", "--epochs", "2"],
            nproc=2,
            torchrun={"localRankArg": "--local_rank"},
        ),
        # the launch module in the command: unwrapped, and it implies --local-rank
        "launch": job_doc(
            "launch",
            ["python", "-m", "torch.distributed.launch", "--nproc_per_node=2"],
            nproc=2,
        ),
    }
    docs["launch"]["spec"]["template"]["spec"]["containers"][0]["args"] = [
        "/workspace/launch_era.py",
        "--epochs",
        "2",
    ]
    done = run_jobs(kube, namespace, list(docs.values()))
    for name, flag in (("setting", "--local_rank"), ("launch", "--local-rank")):
        assert done[name]["status"]["phase"] == "Succeeded", done[name]["status"]
        ranks = seen(kube, namespace, name)
        assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
        for r in ranks:
            local = int(r["env"]["LOCAL_RANK"])
            assert r["argv"] == [f"{flag}={local}", "--epochs", "2"]
            assert r["localRankArg"] == local and r["epochs"] == 2
        assert sorted(int(r["env"]["LOCAL_RANK"]) for r in ranks) == [0, 0, 1, 1]


def test_a_launch_era_script_without_its_argument_fails_saying_why(
    kube: client.ApiClient, namespace: str
) -> None:
    # No localRankArg: argparse exits 2 and records no error. The job's failure quotes the
    # worker's stderr and names the setting that fixes it.
    doc = job_doc("no-arg", ["python", "/workspace/launch_era.py"], nodes=1)
    status = run_jobs(kube, namespace, [doc])["no-arg"]["status"]
    assert status["phase"] == "Failed", status
    failure = status["failure"]
    assert (failure["kind"], failure["exitCode"]) == ("exit", 2), failure
    message = failure["message"]
    assert message.endswith(
        "launch_era.py: error: the following arguments are required: --local_rank/--local-rank"
    ), message
    assert "spec.torchrun.localRankArg" in message.splitlines()[0], message


@pytest.mark.parametrize(
    ("script", "command", "spec"),
    [
        # the default env://, the script written for torchrun and left as it was
        ("init_env.py", ["torchrun", "--nproc-per-node", "1", "/workspace/init_env.py"], {}),
        # explicit rank and world_size from the environment
        (
            "init_explicit.py",
            ["python3", "-m", "torch.distributed.run", "/workspace/init_explicit.py"],
            {},
        ),
        # tcp://MASTER_ADDR:MASTER_PORT, the workers with a store of their own
        ("init_tcp.py", ["python", "/workspace/init_tcp.py"], {}),
        # and sharing torchrun's rendezvous store (no restart possible: the operator lets
        # torch share it)
        (
            "init_tcp.py",
            ["python", "/workspace/init_tcp.py"],
            {"failurePolicy": {"maxRestarts": 0}},
        ),
    ],
    ids=["env", "explicit-rank", "tcp", "tcp-shared-store"],
)
def test_init_methods_the_tutorials_teach(
    kube: client.ApiClient,
    namespace: str,
    script: str,
    command: list[str],
    spec: dict[str, Any],
) -> None:
    doc = job_doc("init", [*command, "--some-arg"], **spec)
    done = run_jobs(kube, namespace, [doc])["init"]
    assert done["status"]["phase"] == "Succeeded", done["status"]
    ranks = seen(kube, namespace, "init")
    assert [(r["rank"], r["worldSize"]) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r["argv"] == ["--some-arg"] for r in ranks)


def _refusal(kube: client.ApiClient, namespace: str, doc: dict[str, Any]) -> str | None:
    try:
        create_job(kube, namespace, doc)
    except ApiException as e:
        assert e.status == 422, e.body
        return str(json.loads(str(e.body))["message"])
    return None


def test_launcher_flags_at_admission(kube: client.ApiClient, namespace: str) -> None:
    def doc(name: str, command: list[str], args: list[str] | None = None) -> dict[str, Any]:
        d = job_doc(name, command)
        if args is not None:
            d["spec"]["template"]["spec"]["containers"][0]["args"] = args
        return d

    # CEL refuses a flag the operator owns right after the launcher ...
    for i, (command, args) in enumerate(
        [
            (["torchrun", "--nnodes=2", "t.py"], None),
            (["torchrun"], ["--nproc-per-node=1", "--rdzv_backend=c10d", "t.py"]),
            (["/opt/conda/bin/torchrun", "--standalone", "t.py"], None),
            (["python", "-m", "torch.distributed.launch"], ["--master_port=1234", "t.py"]),
        ]
    ):
        message = _refusal(kube, namespace, doc(f"refused-{i}", command, args))
        assert message is not None and "spec.nodes, spec.elastic" in message, message
    # ... but never the script's own arguments of the same names,
    own = doc("own-args", ["torchrun", "/workspace/init_env.py", "--nnodes", "2"])
    apply(kube, namespace, [scripts_configmap("own-args", SCRIPTS), own])
    # and what it cannot see (a flag after a value given apart) is admitted, for the model to
    # refuse (tests/unit/api/test_launchcmd.py: the reconciler turns it into InvalidSpec).
    hidden = doc("hidden", ["torchrun", "--nproc-per-node", "1", "--nnodes", "2", "t.py"])
    created: Any = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, hidden, dry_run="All"
    )
    assert created["metadata"]["name"] == "hidden"
    done = wait_phase(kube, namespace, "own-args", {"Succeeded", "Failed"}, timeout=300)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert [r["argv"] for r in seen(kube, namespace, "own-args")] == [["--nnodes", "2"]] * 2


def test_a_converted_kubeflow_example_runs(kube: client.ApiClient, namespace: str) -> None:
    """examples/pytorch/cpu-demo of the training operator, converted by `kubectl dtj convert`.
    Its image is not pulled here: demo.py comes from a ConfigMap at the image's WORKDIR."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrun_operator.cli.main",
            "convert",
            "-f",
            str(example("cpu-demo-demo.yaml")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    job = yaml.safe_load(res.stdout)
    assert job["spec"]["nodes"] == 2 and job["spec"]["nprocPerNode"] == 2
    pod = job["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert trainer["command"] == ["torchrun", "demo.py"]
    # What differs here: the image (the Kubeflow example's is in no registry these clusters
    # reach), the script's place, and small requests.
    trainer["image"] = IMAGE
    trainer["workingDir"] = "/workspace"
    trainer["volumeMounts"] = [{"name": "demo", "mountPath": "/workspace"}]
    trainer["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    pod["volumes"] = [{"name": "demo", "configMap": {"name": "demo"}}]
    pod["terminationGracePeriodSeconds"] = 2
    script = (example("cpu-demo-demo.py")).read_text()
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo"},
        "data": {"demo.py": script},
    }
    created = apply(kube, namespace, [cm, job])
    done = wait_phase(kube, namespace, created["metadata"]["name"], {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["worldSize"] == 4
    assert sorted(r["globalRanks"] for r in done["status"]["ranks"]) == ["0-1", "2-3"]
