"""localkube.kueue's pure parts: the manager's config and the webhook configurations."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from localkube import kueue

MANIFESTS = """\
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - apiGroups: [""]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [pods]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service:
      name: webhook-service
      namespace: system
      path: /mutate-kueue-x-k8s-io-v1beta2-workload
  failurePolicy: Fail
  name: mworkload.kb.io
  rules:
  - apiGroups: [kueue.x-k8s.io]
    apiVersions: [v1beta2]
    operations: [CREATE]
    resources: [workloads]
  sideEffects: None
"""


def test_only_kueues_own_webhooks_are_installed_and_they_call_the_host(tmp_path: Path) -> None:
    hooks = tmp_path / "config/components/webhook"
    hooks.mkdir(parents=True)
    (hooks / "manifests.yaml").write_text(MANIFESTS)
    [conf] = kueue.webhook_configurations(tmp_path, "172.18.0.1", 9443, b"CA PEM")
    assert conf["metadata"] == {"name": "localkube-kueue-mutating-webhook-configuration"}
    [hook] = conf["webhooks"]  # the pod webhook would gate every pod of the cluster
    assert hook["name"] == "mworkload.kb.io"
    assert hook["clientConfig"] == {
        "url": "https://172.18.0.1:9443/mutate-kueue-x-k8s-io-v1beta2-workload",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }


def test_the_manager_config_serves_webhooks_where_the_apiserver_calls_without_its_own_certs(
    tmp_path: Path,
) -> None:
    ports = kueue.KueuePorts(webhook=1, health=2, metrics=3)
    frameworks = ["DistributedTrainingJob.v1alpha1.torchrun.dev"]
    config = yaml.safe_load(kueue.render_config(ports, tmp_path, frameworks, "172.18.0.1"))
    assert config["webhook"] == {"port": 1, "host": "172.18.0.1", "certDir": str(tmp_path)}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:2"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["integrations"] == {
        "frameworks": [],
        "externalFrameworks": ["DistributedTrainingJob.v1alpha1.torchrun.dev"],
    }
    assert config["leaderElection"] == {"leaderElect": False}


def test_the_crds_come_from_the_module_cache(tmp_path: Path) -> None:
    bases = tmp_path / "config/components/crd/bases"
    bases.mkdir(parents=True)
    (bases / "b.yaml").write_text("kind: CustomResourceDefinition\nmetadata: {name: b}\n")
    (bases / "a.yaml").write_text("kind: CustomResourceDefinition\nmetadata: {name: a}\n")
    assert [c["metadata"]["name"] for c in kueue.crds(tmp_path)] == ["a", "b"]


def test_the_webhook_certificate_is_for_the_address_and_signed_by_the_returned_ca(
    tmp_path: Path,
) -> None:
    ca_pem = kueue.write_serving_cert(tmp_path, "172.18.0.1")
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["172.18.0.1"]
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600


def test_the_webhook_address_is_loopback_when_the_apiserver_runs_on_this_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    routes = {"10.201.0.1": "10.201.0.1", "172.18.0.2": "172.18.0.1"}
    monkeypatch.setattr(kueue, "route_source", routes.__getitem__)
    assert kueue.address_for_nodes(["10.201.0.1"]) == "127.0.0.1"
    assert kueue.address_for_nodes(["172.18.0.2", "172.18.0.3"]) == "172.18.0.1"
    with pytest.raises(RuntimeError, match="no node"):
        kueue.address_for_nodes([])
