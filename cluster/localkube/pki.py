"""Certificates for the local control plane: one CA, the apiserver's serving certificate,
client certificates (CN=user, O=groups) and the service-account signing key pair.

ECDSA P-256 throughout: kube-apiserver, etcd clients and Python's ssl all accept it, and
generating a key takes microseconds instead of RSA's tens of milliseconds.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The first address of --service-cluster-ip-range: pods that use the in-cluster
# `kubernetes` Service by IP check it against the serving certificate.
FIRST_SERVICE_IP = "10.96.0.1"
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyCert:
    key_pem: bytes
    cert_pem: bytes

    @property
    def key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return key

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    # Back-dated a little so a freshly minted certificate is valid on a clock that lags.
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def make_ca(common_name: str = "localkube-ca") -> KeyCert:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def _key_usage(ca: bool) -> x509.KeyUsage:
    """Signing for every certificate; certificate and CRL signing only for the CA."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf(
    ca: KeyCert,
    subject: x509.Name,
    usages: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName] | None = None,
) -> KeyCert:
    key = _new_key()
    ca_cert = ca.cert
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    return KeyCert(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def apiserver_sans(host_ip: str) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) the apiserver's serving certificate must cover: loopback for
    the host, the bridge IP for pods, the first service IP and the in-cluster names."""
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    ips = ["127.0.0.1", host_ip, FIRST_SERVICE_IP]
    return dns, list(dict.fromkeys(ips))


def make_serving_cert(ca: KeyCert, common_name: str, dns: list[str], ips: list[str]) -> KeyCert:
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return _leaf(ca, subject, [ExtendedKeyUsageOID.SERVER_AUTH], sans)


def make_client_cert(ca: KeyCert, user: str, groups: list[str] | tuple[str, ...] = ()) -> KeyCert:
    """Kubernetes reads the user name from CN and each group from an O attribute."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    return _leaf(ca, x509.Name(attrs), [ExtendedKeyUsageOID.CLIENT_AUTH])


def make_service_account_keys() -> tuple[bytes, bytes]:
    """(private key PEM, public key PEM) for signing and verifying service-account tokens."""
    key = _new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


@dataclass(frozen=True)
class PkiPaths:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def node_cert(self) -> Path:
        """The process node's serving certificate (its log endpoint, localkube.node.logserver)."""
        return self.dir / "node.crt"

    @property
    def node_key(self) -> Path:
        return self.dir / "node.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def client_cert(self, user: str) -> Path:
        return self.dir / f"client-{_safe(user)}.crt"

    def client_key(self, user: str) -> Path:
        return self.dir / f"client-{_safe(user)}.key"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def write_pki(dir: Path, host_ip: str) -> PkiPaths:
    """Writes a fresh CA, apiserver serving cert and service-account keys under `dir`."""
    dir.mkdir(parents=True, exist_ok=True)
    paths = PkiPaths(dir)
    ca = make_ca()
    _write(paths.ca_cert, ca.cert_pem)
    _write(paths.ca_key, ca.key_pem, private=True)
    dns, ips = apiserver_sans(host_ip)
    serving = make_serving_cert(ca, "kube-apiserver", dns, ips)
    _write(paths.apiserver_cert, serving.cert_pem)
    _write(paths.apiserver_key, serving.key_pem, private=True)
    node = make_serving_cert(ca, "localkube-node", [], [host_ip])
    _write(paths.node_cert, node.cert_pem)
    _write(paths.node_key, node.key_pem, private=True)
    sa_key, sa_pub = make_service_account_keys()
    _write(paths.sa_key, sa_key, private=True)
    _write(paths.sa_pub, sa_pub)
    return paths


def load_ca(paths: PkiPaths) -> KeyCert:
    return KeyCert(paths.ca_key.read_bytes(), paths.ca_cert.read_bytes())
