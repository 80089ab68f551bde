"""Mutual TLS for the store and the mesh (PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA).

Every endpoint presents its certificate and requires the other's, signed by the job's CA
(peers are dialled by address, so host names are not checked: a certificate signed by the CA
is the credential). ``contexts()`` is None without TLS; a partial or unreadable setting is a
ValueError naming the variables.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass

from ..core.errors import SettingError
from ..core.settings import settings

VARIABLES = ("PYDIST_TLS_CERT", "PYDIST_TLS_KEY", "PYDIST_TLS_CA")
#: The first byte of a TLS record carrying a handshake (a ClientHello starts every TLS connection).
HANDSHAKE_RECORD = 0x16


@dataclass(frozen=True)
class Contexts:
    server: ssl.SSLContext
    client: ssl.SSLContext


_cache: dict[tuple[str, str, str], Contexts] = {}


def _context(purpose: int, cert: str, key: str, ca: str) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def contexts() -> Contexts | None:
    """The server and client contexts of the TLS settings in force (made once per setting),
    or None when TLS is off."""
    found = settings()
    values = (found.tls_cert, found.tls_key, found.tls_ca)
    if not any(values):
        return None
    if not all(values):
        missing = [name for name, value in zip(VARIABLES, values) if not value]
        raise SettingError(f"TLS needs {', '.join(VARIABLES)} together; {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not set")
    key = (str(values[0]), str(values[1]), str(values[2]))
    if key not in _cache:
        try:
            _cache[key] = Contexts(_context(ssl.PROTOCOL_TLS_SERVER, *key), _context(ssl.PROTOCOL_TLS_CLIENT, *key))
        except (OSError, ssl.SSLError) as error:
            raise SettingError(f"TLS: cannot load PYDIST_TLS_CERT={key[0]}, PYDIST_TLS_KEY={key[1]}, "
                             f"PYDIST_TLS_CA={key[2]}: {error}") from None
    return _cache[key]


def reason(error: BaseException) -> str:
    """A TLS failure in words: the library's reason (``certificate verify failed: unable to get
    local issuer certificate``) rather than its error tuple."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {error.verify_message}"
    if isinstance(error, ssl.SSLError) and error.reason:
        return error.reason.replace("_", " ").lower()
    return str(error)
