"""The Helm chart: lint, what `helm template` renders, Pod Security, RBAC scope, values schema.

Needs a helm binary (hack/find-helm.sh: $HELM, $LOCALKUBE_BIN/helm, cluster/build.sh's cache,
then PATH); without one these tests fail and say how to get it.
"""

from __future__ import annotations

import filecmp
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "torchrun-operator"
NS = "torchrun-system"
RELEASE = "torchrun-operator"

Obj = dict[str, Any]


@cache
def helm() -> str:
    found = subprocess.run([str(ROOT / "hack" / "find-helm.sh")], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail(f"{found.stderr.strip()} (cluster/build.sh builds it from the Go proxy)")
    return found.stdout.strip()


def template(*sets: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", RELEASE, str(CHART), "--namespace", NS]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        pytest.fail(f"helm template failed:\n{proc.stderr}")
    return proc


def render(*sets: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(template(*sets).stdout) if d]


def one(objs: Iterable[Obj], kind: str, namespace: str | None = None) -> Obj:
    found = [
        o
        for o in objs
        if o["kind"] == kind and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


Grant = tuple[str, str, str, str | None]  # (apiGroup, resource, verb, resourceName or None)


def grants(rules: list[Obj]) -> set[Grant]:
    """Every (group, resource, verb, name) a list of rules allows, spelled out."""
    out: set[Grant] = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [None]:
                        out.add((group, resource, verb, name))
    return out


def allows(rules: list[Obj], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    for rule in rules:
        if (
            group in rule.get("apiGroups", [])
            and resource in rule.get("resources", [])
            and verb in rule.get("verbs", [])
            and (not rule.get("resourceNames") or name in rule["resourceNames"])
        ):
            return True
    return False


# Exactly what the operator does in a namespace it serves (docs/security.md has the table):
# controller/, kube/podwatch.py, kube/events.py, and kopf's watch of the jobs.
NAMESPACED_NEEDS = [
    # podwatch lists and watches by label; gang restarts delete; get: the owner check after a
    # create's 409.
    *[("", "pods", v) for v in ("get", "list", "watch", "create", "delete")],
    # Created once per job; get: the owner check after a create's 409.
    *[("", r, v) for r in ("services", "configmaps") for v in ("get", "create")],
    *[("networking.k8s.io", "networkpolicies", v) for v in ("get", "create")],
    # kopf lists and watches; get: re-read after a conflict; delete: TTL after finished.
    *[("torchrun.dev", "distributedtrainingjobs", v) for v in ("get", "list", "watch", "delete")],
    ("torchrun.dev", "distributedtrainingjobs/status", "patch"),
    # kube/runtimes.py: the runtime a job names, by name, until the job records it.
    ("torchrun.dev", "distributedtrainingruntimes", "get"),
    # Only for OwnerReferencesPermissionEnforcement (blockOwnerDeletion on children).
    ("torchrun.dev", "distributedtrainingjobs/finalizers", "update"),
    ("", "events", "create"),  # ours and kopf's, core/v1, never patched
    # kube/gangobjects.py: each attempt's Workload and PodGroup (gangScheduling.native, on by
    # default); get after a 409, list by label and delete an earlier attempt's.
    *[
        ("scheduling.k8s.io", r, v)
        for r in ("workloads", "podgroups")
        for v in ("get", "list", "create", "delete")
    ],
]
# kopf's runtime discovery, cluster-scoped whatever the namespaces served.
CLUSTER_READS = [
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("torchrun.dev", "clusterdistributedtrainingruntimes", "get"),
]
# What a least-privilege role must not allow: each was granted once, or is a near miss.
NAMESPACED_DENIALS = [
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "configmaps", "delete"),
    ("", "configmaps", "patch"),
    ("", "services", "list"),
    ("", "services", "patch"),
    ("", "services", "delete"),
    ("", "pods", "patch"),
    ("", "pods", "update"),
    ("", "pods/exec", "create"),
    ("", "secrets", "get"),
    ("", "events", "patch"),
    ("events.k8s.io", "events", "create"),
    ("networking.k8s.io", "networkpolicies", "list"),
    ("networking.k8s.io", "networkpolicies", "patch"),
    ("networking.k8s.io", "networkpolicies", "delete"),
    ("torchrun.dev", "distributedtrainingjobs", "create"),
    ("torchrun.dev", "distributedtrainingjobs", "patch"),
    ("torchrun.dev", "distributedtrainingjobs", "update"),
    ("torchrun.dev", "distributedtrainingjobs/status", "get"),
    # Runtimes are the platform team's: the operator reads them, never writes them.
    *[
        ("torchrun.dev", "distributedtrainingruntimes", v)
        for v in ("create", "patch", "update", "delete")
    ],
]


def exactly(needs: Iterable[tuple[str, str, str]]) -> set[Grant]:
    return {(g, r, v, None) for g, r, v in needs}


def deployment_container(objs: list[Obj]) -> Obj:
    containers = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Obj = containers[0]
    return container


def test_helm_lint_passes() -> None:
    proc = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_values_render_the_expected_objects() -> None:
    kinds = sorted(o["kind"] for o in render())
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
        ]
    )
    assert all(o["metadata"].get("namespace") in (None, NS) for o in render())


def test_deployment_image_is_the_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == "0.1.0"
    container = deployment_container(render())
    assert container["image"] == f"ghcr.io/torchrun-dev/torchrun-operator:{chart['appVersion']}"
    assert deployment_container(render("image.tag=dev"))["image"].endswith(":dev")


def test_deployment_args_default_to_all_namespaces_with_leader_election() -> None:
    objs = render()
    args = deployment_container(objs)["args"]
    lease_role = one(objs, "Role", NS)
    lease_name = next(r["resourceNames"][0] for r in lease_role["rules"] if r.get("resourceNames"))
    assert args == [
        "--all-namespaces",
        "--liveness-port=8080",
        "--metrics-port=9090",
        f"--leader-election-namespace={NS}",
        f"--leader-election-id={lease_name}",
        "--network-policy",
        "--log-format=json",
        "--kube-api-qps=50",
        "--kube-api-burst=100",
    ]


def test_job_network_policy_value_becomes_the_operator_flag() -> None:
    objs = render("jobNetworkPolicy.enabled=false")
    args = deployment_container(objs)["args"]
    assert "--no-network-policy" in args and "--network-policy" not in args
    # Still granted: a job's own spec.networkPolicy.enabled=true asks for one.
    rules = one(objs, "ClusterRole")["rules"]
    assert grants(rules) == exactly(NAMESPACED_NEEDS + CLUSTER_READS)


def test_probes_hit_healthz_on_the_liveness_port() -> None:
    container = deployment_container(render("livenessPort=8181"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["healthz"] == 8181
    assert "--liveness-port=8181" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert ports[get["port"]] == 8181


def test_deployment_meets_pod_security_restricted() -> None:
    objs = render()
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    container = deployment_container(objs)
    sc = container["securityContext"]
    pod_sc = pod["securityContext"]
    # Each check of the "restricted" profile, at the level where it is set.
    assert pod_sc["runAsNonRoot"] is True and sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532 and pod_sc["runAsUser"] == 65532
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["readOnlyRootFilesystem"] is True
    assert not sc.get("privileged", False)
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(forbidden, False)
    # restricted allows only these volume types; /tmp must be writable.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(
        set(v) - {"name"}
        <= {
            "emptyDir",
            "configMap",
            "secret",
            "projected",
            "downwardAPI",
            "persistentVolumeClaim",
            "ephemeral",
            "csi",
        }
        for v in volumes.values()
    )
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in volumes[tmp["name"]]
    assert not tmp.get("readOnly", False)
    assert container["resources"]["limits"]["memory"]


def test_cluster_wide_rbac_grants_what_the_operator_does_and_no_more() -> None:
    objs = render()
    role = one(objs, "ClusterRole")
    assert grants(role["rules"]) == exactly(NAMESPACED_NEEDS + CLUSTER_READS)
    for group, resource, verb in NAMESPACED_DENIALS:
        assert not allows(role["rules"], group, resource, verb), (group, resource, verb)
    assert not allows(role["rules"], "", "namespaces", "get")  # list/watch only
    assert not allows(role["rules"], "", "nodes", "list")
    for rule in role["rules"]:
        assert not {"escalate", "bind", "impersonate", "*"} & set(rule["verbs"])
    binding = one(objs, "ClusterRoleBinding")
    sa = one(objs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NS}
    ]
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]


def test_watch_namespaces_use_roles_per_namespace() -> None:
    objs = render("watchNamespaces={team-a,team-b}")
    args = deployment_container(objs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args

    cluster_role = one(objs, "ClusterRole")
    assert grants(cluster_role["rules"]) == exactly(CLUSTER_READS)

    for ns in ("team-a", "team-b"):
        role = one(objs, "Role", ns)
        assert grants(role["rules"]) == exactly(NAMESPACED_NEEDS), ns
        binding = one(objs, "RoleBinding", ns)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"][0]["namespace"] == NS


def test_lease_role_is_confined_to_the_release_namespace_and_its_lease() -> None:
    objs = render("leaderElection.id=my-lease")
    role = one(objs, "Role", NS)
    assert "--leader-election-id=my-lease" in deployment_container(objs)["args"]
    # kube/leader.py reads, creates and replaces its one Lease: no list, watch or patch.
    # create cannot be limited by name (RBAC authorizes it before the name is known).
    assert grants(role["rules"]) == {
        ("coordination.k8s.io", "leases", "create", None),
        ("coordination.k8s.io", "leases", "get", "my-lease"),
        ("coordination.k8s.io", "leases", "update", "my-lease"),
    }
    binding = one(objs, "RoleBinding", NS)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_without_leader_election_no_lease_role_and_no_flags() -> None:
    objs = render("leaderElection.enabled=false")
    assert not [o for o in objs if o["kind"] == "Role"]
    assert not [a for a in deployment_container(objs)["args"] if "leader-election" in a]


def test_metrics_service_selects_the_operator_pods() -> None:
    objs = render()
    svc = one(objs, "Service")
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    port = svc["spec"]["ports"][0]
    assert port["name"] == "metrics" and port["port"] == 9090
    container_ports = {p["name"]: p["containerPort"] for p in deployment_container(objs)["ports"]}
    assert container_ports[port["targetPort"]] == 9090


def test_metrics_disabled_drops_service_and_flag() -> None:
    objs = render("metrics.enabled=false")
    assert not [o for o in objs if o["kind"] == "Service"]
    assert not [a for a in deployment_container(objs)["args"] if a.startswith("--metrics-port")]


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objs = render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=kp")
    monitor = one(objs, "ServiceMonitor")
    svc = one(objs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kp"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NS]


def test_pdb_only_with_several_replicas() -> None:
    assert not [o for o in render() if o["kind"] == "PodDisruptionBudget"]
    objs = render("replicaCount=2")
    pdb = one(objs, "PodDisruptionBudget")
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert one(objs, "Deployment")["spec"]["replicas"] == 2


def test_several_replicas_without_leader_election_are_refused() -> None:
    proc = template("replicaCount=2", "leaderElection.enabled=false", check=False)
    assert proc.returncode != 0
    assert "replicaCount > 1 needs leaderElection.enabled=true" in proc.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("replicaCount=-1", "at '/replicaCount': minimum: got -1, want 0"),
        ("watchNamespaces=x", "at '/watchNamespaces': got string, want array"),
        ("watchNamespaces={Bad_NS}", "at '/watchNamespaces/0'"),
        ("logFormat=xml", "at '/logFormat'"),
        ("kubeApiQPS=-1", "at '/kubeApiQPS'"),
        ("kubeApiBurst=0", "at '/kubeApiBurst'"),
        ("metrics.port=70000", "at '/metrics/port'"),
        ("replicaCont=2", "additional properties 'replicaCont' not allowed"),
        ("jobNetworkPolicy.enabled=maybe", "at '/jobNetworkPolicy/enabled'"),
    ],
)
def test_schema_rejects_bad_values_with_a_clear_message(value: str, message: str) -> None:
    proc = template(value, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_chart_crds_are_a_copy_of_the_generated_ones() -> None:
    source = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert source, "crds/ holds no CRD: generate it first"
    copied = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert copied == source, "run hack/sync-chart-crds.sh"
    match, mismatch, errors = filecmp.cmpfiles(ROOT / "crds", CHART / "crds", source, shallow=False)
    assert not mismatch and not errors, f"{mismatch + errors} differ: run hack/sync-chart-crds.sh"
    plurals = set()
    for name in source:
        crd = yaml.safe_load((CHART / "crds" / name).read_text())
        assert crd["spec"]["group"] == "torchrun.dev"
        plurals.add(crd["spec"]["names"]["plural"])
    assert plurals == {
        "distributedtrainingjobs",
        "clusterdistributedtrainingruntimes",
        "distributedtrainingruntimes",
    }


@pytest.mark.parametrize(
    ("sets", "namespaces", "network_policy"),
    [
        ((), [], True),
        (("watchNamespaces={team-a,team-b}",), ["team-a", "team-b"], True),
        (("jobNetworkPolicy.enabled=false",), [], False),
    ],
)
def test_rendered_args_are_accepted_by_the_operator(
    sets: tuple[str, ...], namespaces: list[str], network_policy: bool
) -> None:
    from torchrun_operator.main import parse

    args = parse(deployment_container(render(*sets))["args"])
    assert args.namespace == namespaces
    assert args.all_namespaces is (not namespaces)
    assert args.network_policy is network_policy
    assert args.leader_election_namespace == NS
    assert (args.liveness_port, args.metrics_port, args.log_format) == (8080, 9090, "json")
    assert (args.kube_api_qps, args.kube_api_burst) == (50.0, 100)


def test_rate_limit_values_become_the_operator_flags_and_bad_ones_are_refused() -> None:
    from torchrun_operator.main import parse

    args = parse(deployment_container(render("kubeApiQPS=7", "kubeApiBurst=9"))["args"])
    assert (args.kube_api_qps, args.kube_api_burst) == (7.0, 9)
    assert parse(["--kube-api-qps=0"]).kube_api_qps == 0.0  # no limit
    for bad in (["--kube-api-qps=-1"], ["--kube-api-qps=nan"], ["--kube-api-burst=0"]):
        with pytest.raises(SystemExit):
            parse(bad)


# Kueue (kueue.enabled, docs/scheduling.md): kube/kueue.py watches the job's Workload by label,
# creates it, deletes it (a job changed while it waited, or unlabelled), patches spec.active,
# gets it after a create's 409, patches its status (released after an eviction, Finished),
# and gets the ResourceFlavors it was admitted on and the WorkloadPriorityClass a job names.
KUEUE_NEEDS = [
    *[
        ("kueue.x-k8s.io", "workloads", v)
        for v in ("get", "list", "watch", "create", "delete", "patch")
    ],
    ("kueue.x-k8s.io", "workloads/status", "patch"),
]
KUEUE_CLUSTER_READS = [
    ("kueue.x-k8s.io", "resourceflavors", "get"),
    ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
]


def test_kueue_rbac_and_flag_only_when_enabled() -> None:
    objs = render("kueue.enabled=true")
    role = one(objs, "ClusterRole")
    assert grants(role["rules"]) == exactly(
        NAMESPACED_NEEDS + CLUSTER_READS + KUEUE_NEEDS + KUEUE_CLUSTER_READS
    )
    for verb in ("update", "deletecollection"):
        assert not allows(role["rules"], "kueue.x-k8s.io", "workloads", verb)
    for resource in ("clusterqueues", "localqueues", "resourceflavors"):
        assert not allows(role["rules"], "kueue.x-k8s.io", resource, "list")
    assert "--kueue" in deployment_container(objs)["args"]
    scoped = render("kueue.enabled=true", "watchNamespaces={team-a}")
    assert grants(one(scoped, "Role", "team-a")["rules"]) == exactly(NAMESPACED_NEEDS + KUEUE_NEEDS)
    assert grants(one(scoped, "ClusterRole")["rules"]) == exactly(
        CLUSTER_READS + KUEUE_CLUSTER_READS
    )
    plain = render()
    assert "--kueue" not in deployment_container(plain)["args"]
    assert not allows(one(plain, "ClusterRole")["rules"], "kueue.x-k8s.io", "workloads", "get")
    from torchrun_operator.main import parse

    assert parse(deployment_container(objs)["args"]).kueue is True


@pytest.mark.parametrize(
    ("value", "group"),
    [("coscheduling", "scheduling.x-k8s.io"), ("volcano", "scheduling.volcano.sh")],
)
def test_podgroup_rbac_of_a_gang_scheduler_only_when_enabled(value: str, group: str) -> None:
    def podgroup_verbs(*sets: str) -> set[str]:
        rules = one(render(*sets), "ClusterRole")["rules"]
        return {v for g, r, v, _ in grants(rules) if g == group and r == "podgroups"}

    assert podgroup_verbs() == set()
    assert podgroup_verbs(f"gangScheduling.{value}=true") == {"get", "list", "create", "delete"}


def test_native_gang_rbac_can_be_turned_off() -> None:
    rules = one(render("gangScheduling.native=false"), "ClusterRole")["rules"]
    assert not [g for g in grants(rules) if g[0] == "scheduling.k8s.io"]
