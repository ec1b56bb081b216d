"""Installing the operator as users do: `helm install` of the chart, `kubectl apply` of
deploy/install.yaml. The operator then runs as a pod, under its own ServiceAccount, with
in-cluster configuration from the projected token, and runs a job.

On the local cluster no image is pulled: the operator pod, on the process node, runs this
checkout with the test environment's Python. The chart's `command` value (default
`[torchrun-operator]`, the image's entrypoint) becomes `python -m torchrun_operator.main`, and
`env` adds PYTHONPATH pointing at a copy of `operator/` — values any user could set; nothing is
installed into the Python environment. On another cluster (kind) the pod runs the operator
image that TORCHRUN_OPERATOR_IMAGE names, which its nodes must hold (tests/e2e/kind.sh loads it
and sets it). The install manifest gets the same changes through `kubectl patch` after
`kubectl apply`.

While these tests run, the session's own operator (fixture `operator`) is stopped, so that
the installed operator alone can make the job succeed: a missing permission cannot hide
behind another operator doing the work. Both then ask the apiserver's authorizer
(SubjectAccessReview, as `kubectl auth can-i --as` does) that the operator's ServiceAccount may
make every call the operator makes, and none of a list of calls it does not make.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtj import REPO, OperatorProcess, apply, load_docs, pod_log, wait_for, wait_phase
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.controlplane import Cluster
from operator_fixtures import install_crd

CHART = REPO / "charts" / "torchrun-operator"
INSTALL = REPO / "deploy" / "install.yaml"
CPU_EXAMPLE = REPO / "examples" / "cpu-ddp.yaml"
RELEASE = "dtj-op"
FULLNAME = f"{RELEASE}-torchrun-operator"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
CRD_NAME = "distributedtrainingjobs.torchrun.dev"
# How the operator pod runs this checkout on the process node (see the module docstring).
SOURCE_COMMAND = ["python", "-m", "torchrun_operator.main"]
# The operator image for other clusters, which their nodes hold (see the module docstring).
IMAGE_ENV = "TORCHRUN_OPERATOR_IMAGE"
CONTAINER = "/spec/template/spec/containers/0"


@contextmanager
def source_env() -> Iterator[list[dict[str, str]]]:
    """The env that points the operator pod at a copy of this checkout's package.

    The chart mounts an emptyDir at /tmp, and a checkout under /tmp (CI clones there) would be
    hidden by it inside the pod; so the package is copied under the user's cache instead, into
    a directory of this test process's own: xdist's workers all run this module's fixtures,
    and one worker's copy must not be removed under another's operator pod.
    """
    root = Path.home() / ".cache" / "torchrun-operator" / "pod-src"
    root.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="src-", dir=root))
    dest.chmod(0o755)  # mkdtemp's 0700 would hide it from the pod's non-root user
    try:
        shutil.copytree(
            REPO / "operator" / "torchrun_operator",
            dest / "torchrun_operator",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        yield [{"name": "PYTHONPATH", "value": str(dest)}]
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def deployment_patch(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart values `how` gives (command and env, or image), as a JSON patch of the install
    manifest's Deployment."""
    patch: list[dict[str, Any]] = []
    if "command" in values:
        patch.append({"op": "replace", "path": f"{CONTAINER}/command", "value": values["command"]})
    for env in values.get("env", []):
        patch.append({"op": "add", "path": f"{CONTAINER}/env/-", "value": env})
    if "image" in values:
        image = values["image"]
        ref = f"{image['repository']}:{image['tag']}"
        patch.append({"op": "add", "path": f"{CONTAINER}/image", "value": ref})
        policy = image["pullPolicy"]
        patch.append({"op": "add", "path": f"{CONTAINER}/imagePullPolicy", "value": policy})
    return patch


@pytest.fixture(scope="module")
def how(cluster: Any) -> Iterator[dict[str, Any]]:
    """Chart values for how the installed operator pod runs: this checkout on the process
    node, the image IMAGE_ENV names elsewhere (module docstring)."""
    if isinstance(cluster, Cluster):
        with source_env() as env:
            yield {"command": SOURCE_COMMAND, "env": env}
        return
    image = os.environ.get(IMAGE_ENV)
    if not image:
        pytest.fail(f"{IMAGE_ENV} must name an operator image this cluster's nodes hold")
    repository, _, tag = image.rpartition(":")
    yield {"image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}}


@pytest.fixture
def sole_operator(operator: OperatorProcess) -> Iterator[None]:
    """Stops the session's operator for the test, and starts it again afterwards."""
    operator.kill()
    try:
        yield
    finally:
        operator.start()


def helm_bin(cluster: Any) -> str:
    path = Path(cluster.bin_dir) / "helm"
    assert path.exists(), f"no helm in {cluster.bin_dir}: run cluster/build.sh"
    return str(path)


def kubectl_bin() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is not on PATH"
    return found


def run(argv: list[str], timeout: float = 180, check: bool = True) -> str:
    """`argv`'s stdout; `check`: it must exit 0 (a clean-up step does not)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


def rbac_denials(log: str) -> list[str]:
    """Log records (JSON, the chart's default format) that show a permission the operator
    lacks. A 403 is also what creates in a terminating namespace get (another test's, while
    a cluster-wide operator runs): the operator logs those at info, and they say nothing
    about RBAC; a denial by RBAC reads "... is forbidden: User ... cannot ..." or is logged
    as a warning or error."""
    found = []
    for line in log.splitlines():
        if "forbidden" not in line.lower():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            found.append(line)
            continue
        text = str(record.get("message", "")) + str(record.get("exc_info", ""))
        if " cannot " in text or record.get("severity") != "info":
            found.append(line)
    return found


def operator_pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[Any]:
    pods: list[Any] = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def name_of(obj: Any) -> str:
    """metadata.name of an object the apiserver returned (the client types metadata optional)."""
    return str(obj.metadata.name)


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def allowed(
    auth: client.AuthorizationV1Api,
    user: str,
    verb: str,
    resource: str,
    namespace: str | None = None,
    group: str = "",
    name: str | None = None,
) -> bool:
    """What the apiserver's authorizer answers for `user` (a ServiceAccount), as
    `kubectl auth can-i --as` asks it: a SubjectAccessReview with the groups the token carries."""
    sa_namespace = user.split(":")[2]
    review: Any = auth.create_subject_access_review(
        {  # type: ignore[arg-type]  # the client sends a dict body as it is
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{sa_namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    **({"namespace": namespace} if namespace else {}),
                    **({"name": name} if name else {}),
                },
            },
        }
    )
    return bool(review.status.allowed)


# Every call the operator makes in a namespace it serves, as (verb, resource, group); the
# chart's unit test holds the rules to the same set (tests/unit/test_chart.py).
NAMESPACED_NEEDS = [
    *[(v, "pods", "") for v in ("get", "list", "watch", "create", "delete")],
    *[(v, r, "") for r in ("services", "configmaps") for v in ("get", "create")],
    *[(v, "networkpolicies", "networking.k8s.io") for v in ("get", "create")],
    *[(v, "distributedtrainingjobs", "torchrun.dev") for v in ("get", "list", "watch", "delete")],
    ("patch", "distributedtrainingjobs/status", "torchrun.dev"),
    ("update", "distributedtrainingjobs/finalizers", "torchrun.dev"),
    ("create", "events", ""),
    # Each attempt's Workload and PodGroup (gangScheduling.native, on by default).
    *[
        (v, r, "scheduling.k8s.io")
        for r in ("workloads", "podgroups")
        for v in ("get", "list", "create", "delete")
    ],
]
# Namespaced calls it never makes: each was granted once, or is a near miss.
NAMESPACED_DENIALS = [
    ("list", "configmaps", ""),
    ("delete", "configmaps", ""),
    ("patch", "configmaps", ""),
    ("list", "services", ""),
    ("patch", "services", ""),
    ("delete", "services", ""),
    ("patch", "pods", ""),
    ("update", "pods", ""),
    ("create", "pods/exec", ""),
    ("get", "secrets", ""),
    ("patch", "events", ""),
    ("create", "events", "events.k8s.io"),
    ("list", "networkpolicies", "networking.k8s.io"),
    ("delete", "networkpolicies", "networking.k8s.io"),
    ("create", "distributedtrainingjobs", "torchrun.dev"),
    ("patch", "distributedtrainingjobs", "torchrun.dev"),
    # Gang schedulers whose RBAC is off by default, and what no gang needs.
    ("create", "podgroups", "scheduling.x-k8s.io"),
    ("create", "podgroups", "scheduling.volcano.sh"),
    ("patch", "podgroups", "scheduling.k8s.io"),
]


def check_operator_access(
    auth: client.AuthorizationV1Api,
    sa: str,
    served: str,
    release_ns: str,
    lease: str,
    cluster_wide: bool = False,
) -> None:
    """Every verb the operator needs is allowed in namespace `served`, and the ones it does
    not need are denied; `cluster_wide`: it serves every namespace (a ClusterRole)."""
    missing = [
        (verb, resource, served)
        for verb, resource, group in NAMESPACED_NEEDS
        if not allowed(auth, sa, verb, resource, served, group)
    ]
    lease_needs = [("create", None), ("get", lease), ("update", lease)]
    missing += [
        (verb, f"leases/{name}", release_ns)
        for verb, name in lease_needs
        if not allowed(auth, sa, verb, "leases", release_ns, "coordination.k8s.io", name)
    ]
    cluster_reads = [
        ("customresourcedefinitions", "apiextensions.k8s.io"),
        ("namespaces", ""),
    ]
    missing += [
        (verb, resource, "")
        for resource, group in cluster_reads
        for verb in ("list", "watch")
        if not allowed(auth, sa, verb, resource, None, group)
    ]
    assert not missing, f"the operator lacks {missing}"

    denied: list[tuple[str, str, str | None, str, str | None]] = [
        (verb, resource, served, group, None) for verb, resource, group in NAMESPACED_DENIALS
    ]
    if not cluster_wide:
        denied += [
            ("create", "pods", "default", "", None),  # namespaces it does not serve
            ("create", "pods", release_ns, "", None),
        ]
    denied += [
        ("list", "secrets", release_ns, "", None),
        ("list", "leases", release_ns, "coordination.k8s.io", None),
        ("watch", "leases", release_ns, "coordination.k8s.io", None),
        ("patch", "leases", release_ns, "coordination.k8s.io", lease),
        ("update", "leases", release_ns, "coordination.k8s.io", "another-lease"),
        ("delete", "leases", release_ns, "coordination.k8s.io", lease),
        ("create", "leases", served, "coordination.k8s.io", None),
        ("get", "namespaces", None, "", None),
        ("create", "clusterroles", None, "rbac.authorization.k8s.io", None),
        ("delete", "nodes", None, "", None),
    ]
    wrongly = [
        (verb, resource, ns, name)
        for verb, resource, ns, group, name in denied
        if allowed(auth, sa, verb, resource, ns, group, name)
    ]
    assert not wrongly, f"the operator may do more than it needs: {wrongly}"


def dep_args(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def run_cpu_example(kube: client.ApiClient, namespace: str) -> dict[str, Any]:
    job = apply(kube, namespace, load_docs(CPU_EXAMPLE))
    done = wait_phase(kube, namespace, job["metadata"]["name"], {"Succeeded", "Failed"}, 180)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    return done


def check_installed_operator(
    cluster: Any,
    kube: client.ApiClient,
    namespace: str,
    operator_ns: str,
    selector: str,
    lease: str,
    cluster_wide: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """What every way of installing must give: one ready operator pod that runs the CPU
    example in `namespace` to success, logs no RBAC denial and no traceback, and may do what
    it needs and no more. Returns the pod and the finished job."""
    (pod,) = operator_pods(client.CoreV1Api(kube), operator_ns, selector)
    assert ready(pod), pod.status
    done = run_cpu_example(kube, namespace)
    log = pod_log(kube, operator_ns, pod.metadata.name, container="operator")
    assert log, "the operator pod wrote no log"
    assert not rbac_denials(log), log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    sa = f"system:serviceaccount:{operator_ns}:{pod.spec.service_account_name}"
    auth = client.AuthorizationV1Api(kube)
    check_operator_access(auth, sa, namespace, operator_ns, lease, cluster_wide=cluster_wide)
    return pod, done


def test_helm_install_runs_a_job_with_least_privilege_then_upgrades_and_uninstalls(
    cluster: Any,
    kube: client.ApiClient,
    namespace: str,
    sole_operator: None,
    tmp_path: Path,
    how: dict[str, Any],
) -> None:
    helm = helm_bin(cluster)
    kubeconfig = str(cluster.kubeconfig)
    release_ns = f"{namespace[:55]}-op"
    core = client.CoreV1Api(kube)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"watchNamespaces": [namespace], **how}))
    base = ["--kubeconfig", kubeconfig, "--namespace", release_ns]
    try:
        run(
            [helm, "install", RELEASE, str(CHART), *base, "--create-namespace"]
            + ["--values", str(values), "--wait", "--timeout", "120s"]
        )
        pod, done = check_installed_operator(
            cluster, kube, namespace, release_ns, INSTANCE, lease=FULLNAME
        )
        assert pod.spec.service_account_name == FULLNAME
        # In-cluster configuration: the projected token and the service host, no kubeconfig.
        container = pod.spec.containers[0]
        assert "KUBECONFIG" not in {e.name for e in container.env or []}
        mounts = {m.mount_path for m in container.volume_mounts}
        assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
        assert done["status"]["worldSize"] == 4
        # The chart's default (jobNetworkPolicy.enabled): the job got its NetworkPolicy, created
        # with the chart's RBAC. (Whether it is enforced is the CNI's business:
        # test_network_policy_enforced.py.)
        policy: Any = client.NetworkingV1Api(kube).read_namespaced_network_policy(
            done["metadata"]["name"], namespace
        )
        assert [r.uid for r in policy.metadata.owner_references] == [done["metadata"]["uid"]]
        assert policy.spec.policy_types == ["Ingress"]

        # helm upgrade: a changed value rolls out, and the new pod is ready.
        run(
            [helm, "upgrade", RELEASE, str(CHART), *base, "--reuse-values"]
            + ["--set", "extraArgs={--workers=2}", "--wait", "--timeout", "120s"]
        )
        apps = client.AppsV1Api(kube)
        dep: Any = apps.read_namespaced_deployment(FULLNAME, release_ns)
        assert "--workers=2" in dep.spec.template.spec.containers[0].args
        new_pods = wait_for(
            "the upgraded operator pod",
            lambda: [
                p
                for p in operator_pods(core, release_ns, INSTANCE)
                if "--workers=2" in p.spec.containers[0].args and ready(p)
            ],
            timeout=120,
        )
        assert len(new_pods) == 1
    finally:
        manifest = run([helm, "get", "manifest", RELEASE, *base], check=False)
        run([helm, "uninstall", RELEASE, *base, "--wait", "--timeout", "120s"], check=False)

    # helm uninstall leaves nothing of the release behind but the CRD.
    installed = [d for d in yaml.safe_load_all(manifest) if d]
    assert {d["kind"] for d in installed} >= {"Deployment", "ClusterRole", "Role", "Service"}
    rbac = client.RbacAuthorizationV1Api(kube)
    apps = client.AppsV1Api(kube)

    def leftovers() -> list[str]:
        found = [
            f"ClusterRole/{name_of(r)}"
            for r in rbac.list_cluster_role(label_selector=INSTANCE).items
        ]
        found += [
            f"ClusterRoleBinding/{name_of(r)}"
            for r in rbac.list_cluster_role_binding(label_selector=INSTANCE).items
        ]
        for ns in (namespace, release_ns):
            found += [
                f"Role/{ns}/{name_of(r)}"
                for r in rbac.list_namespaced_role(ns, label_selector=INSTANCE).items
            ]
            found += [
                f"RoleBinding/{ns}/{name_of(r)}"
                for r in rbac.list_namespaced_role_binding(ns, label_selector=INSTANCE).items
            ]
        found += [
            f"Deployment/{name_of(d)}"
            for d in apps.list_namespaced_deployment(release_ns, label_selector=INSTANCE).items
        ]
        found += [
            f"ReplicaSet/{name_of(d)}"
            for d in apps.list_namespaced_replica_set(release_ns, label_selector=INSTANCE).items
        ]
        found += [
            f"Pod/{name_of(p)}"
            for p in core.list_namespaced_pod(release_ns, label_selector=INSTANCE).items
        ]
        found += [
            f"Service/{name_of(s)}"
            for s in core.list_namespaced_service(release_ns, label_selector=INSTANCE).items
        ]
        found += [
            f"ServiceAccount/{name_of(s)}"
            for s in core.list_namespaced_service_account(release_ns, label_selector=INSTANCE).items
        ]
        return found

    try:
        wait_for("nothing of the release left", lambda: not leftovers(), timeout=90)
    except TimeoutError:
        raise AssertionError(f"helm uninstall left {leftovers()}") from None
    ext = client.ApiextensionsV1Api(kube)
    assert name_of(ext.read_custom_resource_definition(CRD_NAME)) == CRD_NAME
    core.delete_namespace(release_ns)


def test_kubectl_apply_of_the_install_manifest_runs_a_job_and_deletes_cleanly(
    cluster: Any,
    kube: client.ApiClient,
    namespace: str,
    sole_operator: None,
    how: dict[str, Any],
) -> None:
    kubectl = kubectl_bin()
    k = [kubectl, "--kubeconfig", str(cluster.kubeconfig)]
    docs = [d for d in yaml.safe_load_all(INSTALL.read_text()) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
    core = client.CoreV1Api(kube)
    apps = client.AppsV1Api(kube)
    selector = ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
    try:
        run([*k, "apply", "--server-side", "-f", str(INSTALL)])
        # This checkout on the process node, the image others hold elsewhere (module doc).
        patch = json.dumps(deployment_patch(how))
        run([*k, "-n", ns, "patch", "deployment", name, "--type=json", "-p", patch])
        run([*k, "-n", ns, "rollout", "status", f"deployment/{name}", "--timeout=120s"])
        lease = next(a for a in dep_args(dep) if a.startswith("--leader-election-id="))
        check_installed_operator(
            cluster, kube, namespace, ns, selector, lease.split("=", 1)[1], cluster_wide=True
        )
    finally:
        delete = [*k, "delete", "-f", str(INSTALL), "--ignore-not-found", "--wait"]
        delete.append("--timeout=120s")
        deleted = subprocess.run(delete, capture_output=True, text=True, timeout=180)
        # The manifest carries the CRD: deleting it deletes the CRD, which the session's
        # other tests need. Put it back.
        install_crd(kube)
    assert deleted.returncode == 0, deleted.stderr

    def gone() -> bool:
        try:
            core.read_namespace(ns)
            return False
        except ApiException as e:
            if e.status != 404:
                raise
        rbac = client.RbacAuthorizationV1Api(kube)
        roles = rbac.list_cluster_role(field_selector=f"metadata.name={name}").items
        bindings = rbac.list_cluster_role_binding(field_selector=f"metadata.name={name}").items
        return (
            not roles
            and not bindings
            and not apps.list_deployment_for_all_namespaces(label_selector=selector).items
        )

    wait_for(f"namespace {ns} and the cluster roles to be deleted", gone, timeout=120)
