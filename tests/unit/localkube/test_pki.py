"""Certificates: what the apiserver and clients will check."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from localkube import pki


def _sans(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        set(ext.get_values_for_type(x509.DNSName)),
        {str(i) for i in ext.get_values_for_type(x509.IPAddress)},
    )


def test_apiserver_cert_covers_host_bridge_service_ip_and_cluster_names() -> None:
    ca = pki.make_ca()
    dns, ips = pki.apiserver_sans("10.244.0.1")
    cert = pki.make_serving_cert(ca, "kube-apiserver", dns, ips).cert
    names, addrs = _sans(cert)
    assert addrs == {"127.0.0.1", "10.244.0.1", "10.96.0.1"}
    assert names == {
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku


def test_client_cert_carries_user_as_cn_and_groups_as_o() -> None:
    ca = pki.make_ca()
    cert = pki.make_client_cert(ca, "alice", ["dev", "system:masters"]).cert
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["alice"]
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["dev", "system:masters"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_leaf_certs_verify_against_the_ca() -> None:
    ca = pki.make_ca()
    leaf = pki.make_client_cert(ca, "bob").cert
    leaf.verify_directly_issued_by(ca.cert)
    assert ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_written_pki_loads_into_python_ssl() -> None:
    with tempfile.TemporaryDirectory() as d:
        paths = pki.write_pki(Path(d), "10.201.0.1")
        ctx = ssl.create_default_context(cafile=str(paths.ca_cert))
        ctx.load_cert_chain(str(paths.apiserver_cert), str(paths.apiserver_key))
        assert paths.sa_key.stat().st_mode & 0o777 == 0o600
        assert b"PUBLIC KEY" in paths.sa_pub.read_bytes()
        cert = x509.load_pem_x509_certificate(paths.apiserver_cert.read_bytes())
        assert "10.201.0.1" in _sans(cert)[1]
