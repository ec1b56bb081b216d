"""The fault campaign's scenarios (tests/integration/faultrun.py): each a job, what the driver
does while it runs, and what its cluster needs beyond two plain nodes.

Every scenario ends the same way whatever the faults: its fault-free run (the reference) is
what every run with faults must equal. Where the reference itself could be wrong in a way a
fault-free run does not show (a skewed node clock), `expect` says what it must be.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dtj import GROUP, JOB_LABEL, PLURAL, VERSION, quick_job
from hostile_bodies import hostile_server
from kubernetes import client
from torchrun_operator.api.names import KIND
from torchrun_operator.api.status_names import ConditionType
from torchrun_operator.render import kueue as kq
from torchrun_operator.render.gang import NATIVE_POD_GROUP

FINISHED = ("Succeeded", "Failed")
# What a scenario may need of the campaign's own cluster (campaign_cluster.local_cluster): Kueue's
# manager with its CRDs and webhooks, and two nodes with clocks of their own.
KUEUE = "kueue"
SKEWED_NODES = "skewed-nodes"
# Kueue's name for jobs it admits through Workloads another controller creates.
EXTERNAL_FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"
# The skewed nodes: labelled with their clock and tainted, so that only the scenario that
# asks for them (it tolerates the taint) runs pods there.
CLOCK_LABEL = "campaign.torchrun.dev/clock"
CLOCK_TAINT = {"key": CLOCK_LABEL, "value": "skewed", "effect": "NoSchedule"}
# An hour ahead, and far behind (six hours: anything compared with the operator's clock
# would be long past any timeout).
CLOCK_SKEWS = {"ahead": 3600.0, "behind": -6 * 3600.0}
# The harness's finalizer on the TTL scenario's job: the TTL's delete leaves the job, with a
# deletionTimestamp and the status it was deleted in, until the harness has read it and let it
# go (campaign_run.release). Without it a job that finished and was deleted (3 s later) while
# the harness's reads and watch waited out another run's apiserver restart took its outcome
# with it: a run the harness could not judge (ttl-43, 2026-11-28, once in about 150 runs).
HOLD = "campaign.torchrun.dev/hold"

Api = client.ApiClient
# A driver's wait: localkube.testing.wait_for's (what, check, timeout, interval), with the
# timeout counted on the cluster's time: the campaign's apiserver outages meanwhile (other
# runs' too: they share it) do not count (campaign_run.Campaign.wait).
Wait = Callable[..., Any]


def campaign_job(name: str, nodes: int = 2) -> dict[str, Any]:
    """quick_job with a rendezvous join timeout (180 s) that the faults of one run cannot
    use up: two 20 s apiserver stops and a killed operator's pods created late added to an
    8-pod job's start on the loaded 2-core machine ran past quick_job's 90 s (a
    RendezvousTimeout of the workload's own, not of the operator)."""
    return quick_job(name, nodes=nodes, rendezvous={"joinTimeoutSeconds": 180})


def py(code: str) -> list[str]:
    return ["python", "-c", code]


@dataclass
class Scenario:
    name: str
    doc: Callable[[str], dict[str, Any]]
    # Something the driver does while the job runs (suspend and resume), or None.
    during: Callable[[Api, str, str, Wait], None] | None = None
    ttl: bool = False
    nodes: int = 2
    # Something done in the run's namespace before the job is created (a Kueue queue).
    prepare: Callable[[Api, str], None] | None = None
    # More arguments for the operators of its runs (--kueue).
    operator_args: tuple[str, ...] = ()
    # What its cluster needs (KUEUE, SKEWED_NODES).
    needs: frozenset[str] = frozenset()
    # Fields of the outcome (campaign_invariants.outcome) the reference itself must have.
    expect: Mapping[str, Any] = field(default_factory=dict)


def expectation_missed(scenario: Scenario, outcome: Mapping[str, Any]) -> list[str]:
    """Where the fault-free run's outcome is not what the scenario expects of it."""
    return [
        f"outcome {key}: {outcome.get(key)!r}, expected {want!r}"
        for key, want in scenario.expect.items()
        if outcome.get(key) != want
    ]


def needs_of(scenarios: list[Scenario]) -> frozenset[str]:
    return frozenset().union(*(s.needs for s in scenarios))


def _trainer(doc: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = doc["spec"]["template"]["spec"]["containers"][0]
    return container


def _phase(custom: client.CustomObjectsApi, ns: str, name: str) -> str | None:
    job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return (job.get("status") or {}).get("phase")


def _condition_true(custom: client.CustomObjectsApi, ns: str, name: str, type_: str) -> bool:
    job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def _pods(core: client.CoreV1Api, ns: str, name: str) -> list[Any]:
    return list(core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={name}").items)


# ---- the original six ----------------------------------------------------------------------


def _raise_on_rank_1(name: str) -> dict[str, Any]:
    doc = campaign_job(name)
    code = "import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 fails')"
    _trainer(doc)["command"] = py(code)
    doc["spec"]["failurePolicy"] = {"maxRestarts": 2, "backoffSeconds": 1}
    return doc


def _retryable_once(name: str) -> dict[str, Any]:
    """Rank 0 exits 3 (listed as retryable) in attempt 0 only: TORCHELASTIC_RUN_ID is the
    rendezvous id, `<job uid>-<attempt>`."""
    doc = campaign_job(name)
    code = (
        "import os, sys\n"
        "first = os.environ['TORCHELASTIC_RUN_ID'].endswith('-0')\n"
        "sys.exit(3 if first and os.environ['RANK'] == '0' else 0)"
    )
    _trainer(doc)["command"] = py(code)
    doc["spec"]["failurePolicy"] = {
        "maxRestarts": 2,
        "backoffSeconds": 1,
        "retryableExitCodes": [3],
    }
    return doc


def _long(name: str) -> dict[str, Any]:
    """Attempt 0 runs long enough to be suspended whatever the faults (a 6 s sleep finished
    first once: the driver's suspend was held up by a 20 s apiserver stop, and the job
    Succeeded unsuspended); the attempt after the resume ends at once."""
    doc = campaign_job(name)
    code = (
        "import os, time\n"
        "time.sleep(120 if os.environ['TORCHELASTIC_RUN_ID'].endswith('-0') else 1)"
    )
    _trainer(doc)["command"] = py(code)
    return doc


def _ttl(name: str) -> dict[str, Any]:
    doc = campaign_job(name)
    doc["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 3}
    doc["metadata"]["finalizers"] = [HOLD]
    return doc


def _suspend_then_resume(api: Api, ns: str, name: str, wait: Wait) -> None:
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    wait("Running", lambda: _phase(custom, ns, name) in ("Running", *FINISHED), 120, interval=0.3)
    patch = {"spec": {"runPolicy": {"suspend": True}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, patch)

    def quiet() -> bool:
        return _phase(custom, ns, name) == "Suspended" and not _pods(core, ns, name)

    wait("Suspended with no pods", quiet, 120, interval=0.3)
    patch = {"spec": {"runPolicy": {"suspend": False}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, patch)


# ---- elastic: a lost pod replaced while the others train on -------------------------------

# A pod's first workers in a full round (3 nodes) run until the round changes, leaving a
# mark in the pod's own scratch volume; workers that find the mark (the survivors' agents
# start them anew once the replacement joins: a membership change, which torchrun does not
# count in TORCHELASTIC_RESTART_COUNT) end at once, as does the replacement's (its pod name
# has the `r<k>` suffix). So the job can only finish through a replacement, whatever the
# faults delay; a first round of 2 (a pod created late) leaves no mark.
ELASTIC = """\
import os, re, time
mark = "/scratch/full-round"
replacement = re.search(r"-a[0-9]+r[0-9]+$", os.environ["POD_NAME"]) is not None
later = os.path.exists(mark)
print(f"pod {os.environ['POD_NAME']} rank {os.environ['RANK']} world {os.environ['WORLD_SIZE']}"
      f" replacement {replacement} later {later}", flush=True)
if not (replacement or later):
    if os.environ["WORLD_SIZE"] == "3":
        open(mark, "w").close()
    time.sleep(3600)
"""


def _elastic(name: str) -> dict[str, Any]:
    doc = campaign_job(name, nodes=3)
    doc["spec"]["elastic"] = {"minNodes": 2, "maxNodes": 3}
    # The survivors' agents restart their workers in the pod when the round changes.
    doc["spec"]["torchrun"] = {"maxRestarts": 3}
    trainer = _trainer(doc)
    trainer["command"] = py(ELASTIC)
    trainer["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    doc["spec"]["template"]["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    trainer["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    return doc


def _delete_pod_2_while_running(api: Api, ns: str, name: str, wait: Wait) -> None:
    """Once all three pods rendezvoused (the job's RendezvousDone condition), pod 2 (not pod
    0: it hosts the c10d store) is deleted, as a node lost would take it. Not sooner: a pod
    deleted before its launcher joined leaves its place in round 0 to the replacement, no
    round changes, and the survivors' first workers never end (seen in a reference run)."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)

    def rendezvoused() -> bool:
        done = _condition_true(custom, ns, name, ConditionType.RENDEZVOUS_DONE)
        running = [p for p in _pods(core, ns, name) if p.status.phase == "Running"]
        return done and len(running) == 3

    wait("all three pods rendezvoused", rendezvoused, 180, interval=0.3)
    core.delete_namespaced_pod(f"{name}-2", ns)


# ---- hang detection: a rank stops reporting progress ---------------------------------------

# Each pod's one process writes its step to the progress file every 0.5 s. In attempt 0,
# global rank 1 stops after step 3 and sleeps: its pod's counter stops moving, and after
# progressTimeoutSeconds the operator restarts the gang (ProgressStalled). Attempt 1 writes
# three steps and ends.
HANG = """\
import os, time
path = os.environ["TORCHRUN_OPERATOR_PROGRESS_FILE"]
first = os.environ["TORCHELASTIC_RUN_ID"].endswith("-0")
for step in range(1, 7201):
    with open(path + ".tmp", "w") as fp:
        fp.write(f"{step}\\n")
    os.replace(path + ".tmp", path)
    if not first and step == 3:
        break
    if first and step == 3 and os.environ["RANK"] == "1":
        print("rank 1: hanging after step 3", flush=True)
        time.sleep(3600)
    time.sleep(0.5)
"""
PROGRESS_TIMEOUT = 20
# The hang's outcome on nodes whose clocks agree with the operator's (its fault-free run):
# one ProgressStalled restart into attempt 1, which succeeds. Skewed node clocks must not
# change it.
HANG_OUTCOME = {
    "phase": "Succeeded",
    "attempt": 1,
    "counters": {"infrastructureFailures": 1, "restarts": 1, "userFailures": 0},
    "restarts": [(1, "infrastructure", "ProgressStalled")],
}


def _hang(name: str) -> dict[str, Any]:
    doc = campaign_job(name)
    _trainer(doc)["command"] = py(HANG)
    doc["spec"]["failurePolicy"] = {"maxRestarts": 1, "backoffSeconds": 1}
    doc["spec"]["runPolicy"] = {"progressTimeoutSeconds": PROGRESS_TIMEOUT}
    return doc


def _hang_on_skewed_nodes(name: str) -> dict[str, Any]:
    """The hang scenario with one pod on the node an hour ahead and one on the node six
    hours behind (localkube's clockSkewSeconds: the times the kubelet writes)."""
    doc = _hang(name)
    pod = doc["spec"]["template"]["spec"]
    pod["tolerations"] = [{**CLOCK_TAINT, "operator": "Equal"}]
    on_skewed = {"key": CLOCK_LABEL, "operator": "Exists"}
    pod["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [on_skewed]}]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {JOB_LABEL: name}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
    }
    return doc


# ---- Kueue: admitted, evicted (the Workload deactivated), admitted again -------------------


def _kueue_queue(api: Api, ns: str) -> None:
    """A ResourceFlavor, a ClusterQueue with room for the job (both named for the run's
    namespace, left behind with the campaign's cluster) and LocalQueue `q` in `ns`."""
    custom = client.CustomObjectsApi(api)
    flavor, cq = f"f-{ns}", f"cq-{ns}"
    custom.create_cluster_custom_object(
        kq.GROUP, kq.VERSION, kq.RESOURCE_FLAVORS,
        {"apiVersion": kq.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
    )  # fmt: skip
    quota = [{"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "2Gi"}]
    custom.create_cluster_custom_object(
        kq.GROUP, kq.VERSION, "clusterqueues",
        {
            "apiVersion": kq.API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {"coveredResources": ["cpu", "memory"],
                     "flavors": [{"name": flavor, "resources": quota}]}
                ],
            },
        },
    )  # fmt: skip
    custom.create_namespaced_custom_object(
        kq.GROUP, kq.VERSION, ns, "localqueues",
        {"apiVersion": kq.API_VERSION, "kind": "LocalQueue", "metadata": {"name": "q"},
         "spec": {"clusterQueue": cq}},
    )  # fmt: skip


def _queued(name: str) -> dict[str, Any]:
    doc = campaign_job(name)
    doc["metadata"].setdefault("labels", {})[kq.QUEUE_LABEL] = "q"
    # Attempt 0 runs until it is evicted; the attempt after re-admission ends at once.
    _trainer(doc)["command"] = py(
        "import os, time\n"
        "time.sleep(3600 if os.environ['TORCHELASTIC_RUN_ID'].endswith('-0') else 1)"
    )
    # No restart allowed: an eviction that spent the budget would fail the job.
    doc["spec"]["failurePolicy"] = {"maxRestarts": 0}
    return doc


def _evict_then_readmit(api: Api, ns: str, name: str, wait: Wait) -> None:
    """Once the job runs, its Workload is deactivated (Kueue evicts it: the operator
    suspends the job and removes its pods), then activated again (re-admitted: attempt 1)."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    wait("Running", lambda: _phase(custom, ns, name) == "Running", 180, interval=0.3)

    def workload() -> str | None:
        listed: Any = custom.list_namespaced_custom_object(
            kq.GROUP, kq.VERSION, ns, kq.WORKLOADS, label_selector=f"{JOB_LABEL}={name}"
        )
        return listed["items"][0]["metadata"]["name"] if listed["items"] else None

    wl = wait("the job's Workload", workload, 60, interval=0.3)

    def active(on: bool) -> None:
        patch = {"spec": {"active": on}}
        custom.patch_namespaced_custom_object(kq.GROUP, kq.VERSION, ns, kq.WORKLOADS, wl, patch)

    active(False)

    def evicted() -> bool:
        return _phase(custom, ns, name) == "Queued" and not _pods(core, ns, name)

    wait("Queued with no pods", evicted, 120, interval=0.3)
    active(True)


# ---- gang: Native --------------------------------------------------------------------------


def _native_gang(name: str) -> dict[str, Any]:
    """The gang restart with kube-scheduler's own gang scheduling: a PodGroup per attempt."""
    doc = _retryable_once(name)
    doc["spec"]["scheduling"] = {"gang": "Native"}
    return doc


# ---- hostile status bodies -----------------------------------------------------------------

# The trainer: 90 steps of 0.5 s written to the progress file (the operator reads each pod
# every 15 s or more: several reads while it runs), then a file that ends the sidecar.
HOSTILE_TRAIN = """\
import os, time
path = os.environ["TORCHRUN_OPERATOR_PROGRESS_FILE"]
for step in range(1, 91):
    with open(path + ".tmp", "w") as fp:
        fp.write(f"{step} 90\\n")
    os.replace(path + ".tmp", path)
    time.sleep(0.5)
open("/shared/done", "w").close()
"""
# The sidecar: in pod 1 only (its hostname is `<job>-1`), it binds the launcher's status
# port before the launcher does (a plain socket against the launcher's imports) and answers
# every read in turn with a huge step, a NaN rate, 64 KiB of nested brackets, 64 KiB of
# empty objects, bytes that are no JSON, and a body held back past the reader's timeout.
# If the launcher got the port first it answers nothing (the job still ends as it must).
HOSTILE_SIDECAR = (
    hostile_server(1, more=True)
    + """
import os, socket, time
def done():
    return os.path.exists("/shared/done")
listener = None
if os.environ.get("HOSTNAME", "").endswith("-1"):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    while not done():
        try:
            listener.bind(("0.0.0.0", 29401))
            break
        except OSError:
            time.sleep(0.01)
if listener is not None and not done():
    listener.listen(16)
    serve_hostile(listener)
    print("sidecar serving hostile bodies", flush=True)
while not done():
    time.sleep(0.2)
"""
)


def _hostile_answers_refused(api: Api, ns: str, name: str, wait: Wait) -> None:
    """The run shows the operator read the hostile bodies and refused them: the job's
    PodInputRejected condition (it stays once set, also after the job ended); without it
    the scenario would prove nothing."""
    custom = client.CustomObjectsApi(api)

    def refused() -> bool:
        return _condition_true(custom, ns, name, ConditionType.POD_INPUT_REJECTED)

    wait("the PodInputRejected condition", refused, 200, interval=0.5)


def _hostile(name: str) -> dict[str, Any]:
    doc = campaign_job(name)
    trainer = _trainer(doc)
    trainer["command"] = py(HOSTILE_TRAIN)
    pod = doc["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "shared", "emptyDir": {}}]
    shared = [{"name": "shared", "mountPath": "/shared"}]
    trainer["volumeMounts"] = shared
    pod["containers"].append(
        {
            "name": "answer",
            "image": trainer["image"],
            "command": ["python", "-S", "-c", HOSTILE_SIDECAR],
            "resources": trainer["resources"],
            "volumeMounts": shared,
        }
    )
    return doc


def _pod_group_made(api: Api, ns: str, name: str, wait: Wait) -> None:
    """The run shows a Native PodGroup for the whole gang: without one the scenario would be
    the plain gang restart. (PodGroups stay until the job is deleted.)"""
    custom = client.CustomObjectsApi(api)
    pg = NATIVE_POD_GROUP

    def made() -> bool:
        listed: Any = custom.list_namespaced_custom_object(pg.group, pg.version, ns, pg.plural)
        return any(
            g["metadata"]["name"].startswith(f"{name}-a")
            and g["spec"].get("schedulingPolicy") == {"gang": {"minCount": 2}}
            for g in listed["items"]
        )

    wait("a Native PodGroup of 2", made, 200, interval=0.5)


SCENARIOS = [
    Scenario("success", campaign_job),
    Scenario("user-failure", _raise_on_rank_1),
    Scenario("gang-restart", _retryable_once),
    Scenario("suspend-resume", _long, during=_suspend_then_resume),
    Scenario("ttl", _ttl, ttl=True),
    Scenario("eight-pods", lambda name: campaign_job(name, nodes=8), nodes=8),
    Scenario("elastic", _elastic, during=_delete_pod_2_while_running, nodes=3),
    Scenario("hang", _hang),
    Scenario(
        "kueue-evict",
        _queued,
        during=_evict_then_readmit,
        prepare=_kueue_queue,
        operator_args=("--kueue",),
        needs=frozenset({KUEUE}),
    ),
    Scenario("gang-native", _native_gang, during=_pod_group_made),
    Scenario("hostile-status", _hostile, during=_hostile_answers_refused),
    Scenario(
        "skewed-clocks",
        _hang_on_skewed_nodes,
        needs=frozenset({SKEWED_NODES}),
        expect=HANG_OUTCOME,
    ),
]
BY_NAME = {s.name: s for s in SCENARIOS}
