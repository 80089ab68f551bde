"""Certificates for tests and benchmarks of mutual TLS: a CA made on the spot and
certificates it signs (valid, expired), written as PEM files. Needs ``cryptography`` (the
``test`` extra); pydist's TLS itself needs only Python's ``ssl``."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Identity:
    """PEM files: a certificate, its key, and the CA that signed it."""
    cert: str
    key: str
    ca: str

    def env(self) -> dict[str, str]:
        """The PYDIST_TLS_* variables that make a rank present this identity."""
        return {"PYDIST_TLS_CERT": self.cert, "PYDIST_TLS_KEY": self.key, "PYDIST_TLS_CA": self.ca}


class Authority:
    """A CA whose files live in ``directory``; ``issue`` signs certificates."""

    def __init__(self, directory: str, name: str = "pydist test CA"):
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        self.directory, self.name = directory, name
        os.makedirs(directory, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(self._subject).issuer_name(self._subject)
                   .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - _DAY).not_valid_after(now + 30 * _DAY)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True))
        self.ca = self._write("ca.pem", self._sign(builder))

    def _sign(self, builder) -> bytes:
        from cryptography.hazmat.primitives import hashes, serialization
        return builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.directory, name)
        with open(path, "wb") as file:
            file.write(data)
        return path

    def issue(self, name: str, expired: bool = False) -> Identity:
        """A certificate for ``name`` signed by this CA (``expired``: valid until yesterday)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = (now - 10 * _DAY, now - _DAY) if expired else (now - _DAY, now + 30 * _DAY)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(self._subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end))
        cert = self._write(f"{name}.pem", self._sign(builder))
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return Identity(cert, self._write(f"{name}.key", key_pem), self.ca)
