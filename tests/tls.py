"""A throwaway certificate authority for TLS tests, made with the ``openssl`` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

__all__ = ["Certs", "make_certs"]


class Certs(NamedTuple):
    """PEM files: the CA, a server certificate for IP 127.0.0.1 and its key (and both in one
    file, as a Kafka PEM keystore wants), and a client certificate and key."""

    ca: Path
    server_cert: Path
    server_key: Path
    server_pem: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certs(folder: Path, server_names: str = "IP:127.0.0.1") -> Certs | None:
    """A CA and two certificates signed by it in ``folder`` (the server's for
    ``server_names``, a subjectAltName); None without ``openssl``."""
    if shutil.which("openssl") is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    _openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca"),
        *("-keyout", str(ca_key), "-out", str(ca)),
    )
    made = []
    for name, ext in (
        ("server", f"subjectAltName={server_names}"),
        ("client", "basicConstraints=CA:FALSE"),
    ):
        key, csr, cert = (folder / f"{name}.{s}" for s in ("key", "csr", "crt"))
        _openssl(
            *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
            *("-keyout", str(key), "-out", str(csr)),
        )
        extfile = folder / f"{name}.ext"
        extfile.write_text(ext + "\n")
        _openssl(
            *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
            *("-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(extfile)),
        )
        made += [cert, key]
    server_pem = folder / "server.pem"
    server_pem.write_text(made[1].read_text() + made[0].read_text())
    return Certs(ca, made[0], made[1], server_pem, made[2], made[3])
