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


# What the operator does in a namespace it serves (DESIGN "Operator mechanics" and the brief).
NAMESPACED_NEEDS = [
    *[
        ("", r, v)
        for r in ("pods", "services", "configmaps")
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ],
    *[
        ("torchrun.dev", "distributedtrainingjobs", v)
        for v in ("get", "list", "watch", "patch", "delete")
    ],  # delete: TTL after finished
    ("torchrun.dev", "distributedtrainingjobs/status", "patch"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
]
# kopf's runtime discovery, cluster-scoped whatever the namespaces served.
CLUSTER_READS = [
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
]


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
        "--log-format=json",
    ]


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
    for group, resource, verb in NAMESPACED_NEEDS + CLUSTER_READS:
        assert allows(role["rules"], group, resource, verb), (group, resource, verb)
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    assert not allows(role["rules"], "", "secrets", "get")
    assert not allows(role["rules"], "", "pods/exec", "create")
    assert not allows(role["rules"], "", "namespaces", "get")  # list/watch only
    assert not allows(role["rules"], "torchrun.dev", "distributedtrainingjobs", "create")
    assert not allows(role["rules"], "", "nodes", "list")
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
    for group, resource, verb in CLUSTER_READS:
        assert allows(cluster_role["rules"], group, resource, verb)
    for group, resource, verb in NAMESPACED_NEEDS:
        assert not allows(cluster_role["rules"], group, resource, verb), (group, resource, verb)

    for ns in ("team-a", "team-b"):
        role = one(objs, "Role", ns)
        for group, resource, verb in NAMESPACED_NEEDS:
            assert allows(role["rules"], group, resource, verb), (ns, group, resource, verb)
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
    for verb in ("get", "update", "patch"):
        assert allows(role["rules"], "coordination.k8s.io", "leases", verb, name="my-lease")
        assert not allows(role["rules"], "coordination.k8s.io", "leases", verb, name="other")
    assert allows(role["rules"], "coordination.k8s.io", "leases", "create")
    assert {g for r in role["rules"] for g in r["apiGroups"]} == {"coordination.k8s.io"}
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
        ("metrics.port=70000", "at '/metrics/port'"),
        ("replicaCont=2", "additional properties 'replicaCont' not allowed"),
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
    crd = yaml.safe_load((CHART / "crds" / source[0]).read_text())
    assert crd["spec"]["group"] == "torchrun.dev"
    assert crd["spec"]["names"]["plural"] == "distributedtrainingjobs"


@pytest.mark.parametrize(
    ("sets", "namespaces"),
    [((), []), (("watchNamespaces={team-a,team-b}",), ["team-a", "team-b"])],
)
def test_rendered_args_are_accepted_by_the_operator(
    sets: tuple[str, ...], namespaces: list[str]
) -> None:
    from torchrun_operator.main import parse

    args = parse(deployment_container(render(*sets))["args"])
    assert args.namespace == namespaces
    assert args.all_namespaces is (not namespaces)
    assert args.leader_election_namespace == NS
    assert (args.liveness_port, args.metrics_port, args.log_format) == (8080, 9090, "json")
