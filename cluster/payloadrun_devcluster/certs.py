"""Certificates and keys for a local control plane, made with the ``openssl`` command.

One self-signed CA signs the API server's serving certificate and the client certificates of
the admin user and of kube-controller-manager. A separate RSA key pair signs service-account
tokens. Keys are ECDSA P-256 (fast to generate); the service-account key is RSA because
kube-apiserver's ``--service-account-signing-key-file`` wants RSA or ECDSA and RSA is the most
widely accepted by token consumers.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 3650


class CertificateError(RuntimeError):
    """openssl is missing or failed."""


@dataclass(frozen=True)
class ClusterPKI:
    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    controller_manager_cert: Path
    controller_manager_key: Path
    service_account_key: Path
    service_account_pub: Path


def _openssl() -> str:
    path = shutil.which("openssl")
    if not path:
        raise CertificateError(
            "the openssl command is not on PATH; install it (Debian: apt-get install openssl)"
        )
    return path


def _run(args: list[str], cwd: Path) -> None:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CertificateError(
            f"openssl failed (exit {result.returncode}): {' '.join(args)}\n{result.stderr.strip()}"
        )


def _ec_key(openssl: str, key: Path) -> None:
    # genpkey writes PKCS#8, which every consumer (Go, Python ssl) reads.
    _run(
        [
            openssl,
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            str(key),
        ],
        key.parent,
    )


def _signed_cert(
    openssl: str,
    directory: Path,
    name: str,
    subject: str,
    extensions: str,
    ca_cert: Path,
    ca_key: Path,
) -> tuple[Path, Path]:
    key = directory / f"{name}.key"
    csr = directory / f"{name}.csr"
    cert = directory / f"{name}.crt"
    ext = directory / f"{name}.ext"
    _ec_key(openssl, key)
    _run([openssl, "req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr)], directory)
    ext.write_text(extensions)
    _run(
        [
            openssl,
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca_cert),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-days",
            str(VALID_DAYS),
            "-sha256",
            "-extfile",
            str(ext),
            "-out",
            str(cert),
        ],
        directory,
    )
    csr.unlink()
    ext.unlink()
    return cert, key


SERVER_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth\n"
)
CLIENT_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=clientAuth\n"
)


def issue_client_cert(pki: ClusterPKI, name: str, subject: str) -> tuple[Path, Path]:
    """A client certificate signed by the cluster CA, ``<name>.crt``/``.key`` beside it.

    The subject's CN is the user and each O a group, as the API server reads them.
    """
    cert, key = _signed_cert(
        _openssl(), pki.ca_cert.parent, name, subject, CLIENT_EXTENSIONS, pki.ca_cert, pki.ca_key
    )
    key.chmod(0o600)
    return cert, key


def issue_serving_cert(
    pki: ClusterPKI, name: str, common_name: str, alt_names: list[str]
) -> tuple[Path, Path]:
    """A serving certificate signed by the cluster CA for ``alt_names`` (``IP:...``/``DNS:...``)."""
    extensions = SERVER_EXTENSIONS + f"subjectAltName={','.join(alt_names)}\n"
    cert, key = _signed_cert(
        _openssl(),
        pki.ca_cert.parent,
        name,
        f"/CN={common_name}",
        extensions,
        pki.ca_cert,
        pki.ca_key,
    )
    key.chmod(0o600)
    return cert, key


def generate_pki(
    directory: Path, service_cluster_ip: str, extra_ips: tuple[str, ...] = ()
) -> ClusterPKI:
    """Write a CA, serving and client certificates and a service-account key pair.

    The API server's certificate names 127.0.0.1, the ``kubernetes`` Service's cluster IP and
    ``extra_ips`` (the node address, when a node runs).
    """
    openssl = _openssl()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)

    ca_key = directory / "ca.key"
    ca_cert = directory / "ca.crt"
    _ec_key(openssl, ca_key)
    _run(
        [
            openssl,
            "req",
            "-x509",
            "-new",
            "-key",
            str(ca_key),
            "-sha256",
            "-days",
            str(VALID_DAYS),
            "-subj",
            "/CN=payloadrun-devcluster-ca",
            "-out",
            str(ca_cert),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ],
        directory,
    )

    alt_names = ",".join(
        [
            "IP:127.0.0.1",
            f"IP:{service_cluster_ip}",
            *(f"IP:{ip}" for ip in extra_ips),
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    server_ext = SERVER_EXTENSIONS + f"subjectAltName={alt_names}\n"
    client_ext = CLIENT_EXTENSIONS
    apiserver_cert, apiserver_key = _signed_cert(
        openssl, directory, "apiserver", "/CN=kube-apiserver", server_ext, ca_cert, ca_key
    )
    # system:masters is bound to cluster-admin by the RBAC bootstrap policy.
    admin_cert, admin_key = _signed_cert(
        openssl,
        directory,
        "admin",
        "/O=system:masters/CN=payloadrun-admin",
        client_ext,
        ca_cert,
        ca_key,
    )
    # The bootstrap policy binds system:kube-controller-manager; with
    # --use-service-account-credentials each controller then runs as its own service account.
    kcm_cert, kcm_key = _signed_cert(
        openssl,
        directory,
        "controller-manager",
        "/CN=system:kube-controller-manager",
        client_ext,
        ca_cert,
        ca_key,
    )

    sa_key = directory / "service-account.key"
    sa_pub = directory / "service-account.pub"
    _run(
        [
            openssl,
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            str(sa_key),
        ],
        directory,
    )
    _run([openssl, "pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)], directory)

    for key in (ca_key, apiserver_key, admin_key, kcm_key, sa_key):
        key.chmod(0o600)
    return ClusterPKI(
        ca_cert=ca_cert,
        ca_key=ca_key,
        apiserver_cert=apiserver_cert,
        apiserver_key=apiserver_key,
        admin_cert=admin_cert,
        admin_key=admin_key,
        controller_manager_cert=kcm_cert,
        controller_manager_key=kcm_key,
        service_account_key=sa_key,
        service_account_pub=sa_pub,
    )
