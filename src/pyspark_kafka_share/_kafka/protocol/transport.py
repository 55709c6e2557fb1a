"""The protocol client's sockets: TCP, optionally TLS (standard library ``ssl``), with every
handshake failure turned into an error that names its cause, the option and the fix.

Why so careful about errors: a mis-configured client otherwise sees ``[SSL:
CERTIFICATE_VERIFY_FAILED]``, a reset, or -- a plaintext client reading a TLS alert as a frame
length -- "response of size 352518912". Each case is recognised here:

=====================================  ===============================================
what happened                          raised
=====================================  ===============================================
broker certificate from an unknown CA  :class:`TlsError` (``ssl.ca.location``)
certificate does not name the host     :class:`TlsError` (``ssl.endpoint.identification...``)
broker wants a client certificate      :class:`TlsError` (``ssl.certificate.location``)
plaintext client, TLS port             :class:`SecurityProtocolMismatchError` (SSL/SASL_SSL)
TLS client, plaintext port             :class:`SecurityProtocolMismatchError` (PLAINTEXT)
=====================================  ===============================================
"""

from __future__ import annotations

import socket
import ssl
import time

from pyspark_kafka_share._kafka.connection import MASK, ConnectionConfig
from pyspark_kafka_share.errors import (
    KafkaConnectionError,
    OptionError,
    SecurityProtocolMismatchError,
    TlsError,
)

__all__ = ["check_not_tls_alert", "open_socket", "ssl_context", "tls_error"]

_HOSTNAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH
_IP_MISMATCH = 64  # X509_V_ERR_IP_ADDRESS_MISMATCH
_NOT_YET_VALID, _EXPIRED = 9, 10  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED


def ssl_context(config: ConnectionConfig) -> ssl.SSLContext:
    """The client TLS context: CA file (or the system's), hostname check, client certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if config.ca_file:
            ctx.load_verify_locations(cafile=config.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise OptionError("ssl.ca.location", config.ca_file,
                          f"cannot read it as PEM CA certificates ({_reason(exc)}): give the "
                          "path of a PEM file of the CA certificates to trust") from None
    if config.cert_file:
        _load_client_cert(ctx, config)
    ctx.check_hostname = config.check_hostname and config.verify_certificates
    if not config.verify_certificates:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, config: ConnectionConfig) -> None:
    assert config.cert_file is not None
    try:
        ctx.load_cert_chain(config.cert_file, config.key_file or None,
                            password=config.key_password or "")
    except FileNotFoundError:
        missing = config.key_file if config.key_file and config.cert_file and \
            _exists(config.cert_file) else config.cert_file
        option = "ssl.key.location" if missing == config.key_file else "ssl.certificate.location"
        raise OptionError(option, missing, "no such file: give the path of a PEM file") \
            from None
    except (OSError, ssl.SSLError) as exc:
        if config.key_password is not None or "password" in str(exc).lower() or \
                "BAD_DECRYPT" in str(exc):
            raise OptionError("ssl.key.password", MASK if config.key_password else None,
                              "the client key cannot be decrypted with it (or is not a PEM "
                              "key matching the certificate): check ssl.key.password and "
                              "ssl.key.location") from None
        raise OptionError("ssl.certificate.location", config.cert_file,
                          f"cannot load the client certificate and key ({_reason(exc)}): give "
                          "PEM files, the key matching the certificate (an encrypted key needs "
                          "ssl.key.password)") from None


def _exists(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


def remaining_s(deadline: float) -> float:
    """Seconds left before ``deadline`` (monotonic); a timeout error once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise KafkaConnectionError("timed out")
    return left


def open_socket(host: str, port: int, config: ConnectionConfig,
                deadline: float) -> socket.socket:
    """A connected socket to ``host:port``, TLS-wrapped and handshaken for SSL/SASL_SSL."""
    try:
        sock = socket.create_connection((host, port), timeout=remaining_s(deadline))
    except OSError as exc:
        raise KafkaConnectionError(f"cannot connect to broker {host}:{port}: {exc}") from exc
    if not config.uses_tls:
        return sock
    try:
        ctx = ssl_context(config)
        tls = ctx.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    except BaseException:
        sock.close()
        raise
    try:
        tls.settimeout(remaining_s(deadline))
        tls.do_handshake()
    except TimeoutError as exc:
        tls.close()
        raise KafkaConnectionError(f"TLS handshake with {host}:{port}: no answer within the "
                                   "timeout") from exc
    except (ssl.SSLError, OSError) as exc:
        tls.close()
        raise tls_error(exc, f"{host}:{port}", config, handshake=True) from None
    return tls


def tls_error(exc: BaseException, address: str, config: ConnectionConfig,
              handshake: bool) -> Exception:
    """The error for a TLS failure: cause, option and fix (the OpenSSL text appended)."""
    detail = f" [{type(exc).__name__}: {_reason(exc)}]"
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
            return TlsError(
                f"the certificate of broker {address} does not name the host "
                f"{address.rpartition(':')[0]!r} connected to (hostname mismatch): connect "
                "with a host name the certificate names (the broker's advertised listener), or "
                "set "
                "ssl.endpoint.identification.algorithm=none to skip the check" + detail)
        if exc.verify_code in (_NOT_YET_VALID, _EXPIRED):
            return TlsError(
                f"the certificate of broker {address} (or of a CA in its chain) "
                f"{'has expired' if exc.verify_code == _EXPIRED else 'is not valid yet'}: "
                "renew the broker's certificate, or check this machine's clock" + detail)
        where = f"ssl.ca.location={config.ca_file!r}" if config.ca_file else \
            "the system's trust store (ssl.ca.location is not set)"
        return TlsError(
            f"the certificate of broker {address} is not trusted by {where} "
            f"({exc.verify_message}): set ssl.ca.location to the PEM file of the CA that "
            "signed the broker's certificate" + detail)
    text = str(exc).upper()
    if "CERTIFICATE_REQUIRED" in text or "BAD_CERTIFICATE" in text or (
            "HANDSHAKE_FAILURE" in text and not config.cert_file):
        return TlsError(
            f"broker {address} requires a client certificate (mutual TLS) "
            + ("and rejected the one given" if config.cert_file else "and none was given")
            + ": set ssl.certificate.location and ssl.key.location to the client's PEM "
            "certificate and key, signed by a CA the broker trusts" + detail)
    if handshake and (isinstance(exc, (ssl.SSLEOFError, ConnectionResetError,
                                       BrokenPipeError, ssl.SSLZeroReturnError))
                      or "WRONG_VERSION_NUMBER" in text or "EOF" in text
                      or "RECORD_LAYER_FAILURE" in text or "PACKET_LENGTH_TOO_LONG" in text):
        plain = "SASL_PLAINTEXT" if config.uses_sasl else "PLAINTEXT"
        return SecurityProtocolMismatchError(
            f"broker {address} broke off the TLS handshake: its port speaks plaintext, not TLS. "
            f"Set security.protocol={plain}, or use the port of the broker's "
            f"{config.security_protocol} listener" + detail)
    return TlsError(f"TLS with broker {address} failed: check ssl.ca.location, "
                    "ssl.certificate.location and ssl.key.location" + detail)


def check_not_tls_alert(first: bytes, address: str, config: ConnectionConfig) -> None:
    """A plaintext client's first response bytes: a TLS record (alert 0x15 or handshake 0x16,
    version 0x03xx) means the port speaks TLS; read as a length it would be ~350 MB."""
    if not config.uses_tls and len(first) >= 2 and first[0] in (0x15, 0x16) and first[1] == 3:
        tls = "SASL_SSL" if config.uses_sasl else "SSL"
        raise SecurityProtocolMismatchError(
            f"the broker's port {address} speaks TLS (it answered with a TLS record): set "
            f"security.protocol={tls} (or SASL_SSL for a SASL listener), with ssl.ca.location "
            "if its CA is not in the system's trust store")
