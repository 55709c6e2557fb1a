"""Reaching and being allowed: the checks that make a secured Kafka's errors arrive in
seconds, with their cause, the option and the fix.

- :func:`probe_broker`: ApiVersions (and SASL) to the bootstrap servers with the protocol
  client over the configured security. A wrong password, an untrusted or mismatched
  certificate, a missing client certificate, plaintext to a TLS port (or the other way
  round), a refused connection or an unknown host fail definitively in well under a second;
  librdkafka would only report them as "no broker answered" after the broker timeout. Only a
  silent network is left to librdkafka's timeout.
- :func:`authorization_error`: a broker's ``*_AUTHORIZATION_FAILED`` as an
  :class:`AuthorizationError` naming the principal (where the client can know it), the
  resource, the operation and the ``kafka-acls.sh`` grant that fixes it.
"""

from __future__ import annotations

import re
import socket
from typing import TYPE_CHECKING

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.protocol import api_versions
from pyspark_kafka_share._kafka.protocol.client import parse_bootstrap
from pyspark_kafka_share.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerError,
    ErrorCode,
    KafkaConnectionError,
    OptionError,
    SecurityProtocolMismatchError,
    TlsError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark_kafka_share._kafka.settings import ClientSettings

__all__ = ["PROBE_TIMEOUT_S", "acl_command", "authorization_error", "principal_of",
           "probe_broker", "share_consumer_denial"]

PROBE_TIMEOUT_S = 3.0
"""How long the probe waits for one bootstrap server (a TLS handshake and SASL exchange take
milliseconds on a LAN, a few hundred across regions)."""

_KEY = re.compile(r"(?<![\w.'\[])((?:security|sasl|ssl)\.[a-z]+(?:\.[a-z]+)*|"
                  r"enable\.ssl\.certificate\.verification|oauth_cb)\b")


def _named(text: str, settings: ClientSettings) -> str:
    """``text`` with librdkafka's setting names as the user's (``kafka.ssl.ca.location``,
    ``consumer_config['ssl.ca.location']``)."""
    return _KEY.sub(lambda m: settings.names.of(m.group(1)), text)


def probe_broker(settings: ClientSettings,
                 bootstrap_name: str | None = None) -> dict[int, tuple[int, int]] | None:
    """The bootstrap broker's API versions, reached as every client will reach it; None when
    the protocol client cannot tell within :data:`PROBE_TIMEOUT_S` (a silent network: the
    caller's own timeout decides) or cannot use the settings.

    Raises :class:`AuthenticationError`, :class:`TlsError`,
    :class:`SecurityProtocolMismatchError` (at the first broker that says so) and
    :class:`KafkaConnectionError` (every bootstrap server refused or is unknown), each naming
    the user's options.
    """
    connection = settings.connection
    if connection is None:
        return None
    name = bootstrap_name or settings.names.bootstrap
    where = f"option {name!r} = {settings.bootstrap_servers!r}"
    try:
        servers = parse_bootstrap(settings.bootstrap_servers)
    except OptionError:
        return None  # librdkafka's reading of the list decides
    unreachable: list[str] = []
    for host, port in servers:
        try:
            return api_versions(host, port, min(settings.timeout_s, PROBE_TIMEOUT_S),
                                connection)
        except (AuthenticationError, TlsError, SecurityProtocolMismatchError) as exc:
            raise type(exc)(f"{where}: {_named(str(exc), settings)}") from None
        except KafkaConnectionError as exc:
            cause = exc.__cause__
            if isinstance(cause, socket.gaierror):
                unreachable.append(f"{host}: unknown host ({cause.strerror or cause})")
            elif isinstance(cause, ConnectionRefusedError):
                unreachable.append(f"{host}:{port}: connection refused")
            else:
                return None  # silent or slow: not definitive
        except BrokerError:
            return None  # it answered: librdkafka's checks follow and name any problem
    raise KafkaConnectionError(
        f"{where}: no broker can be reached ({'; '.join(unreachable)}). Check the host names "
        "and ports (the broker's advertised listener for this client), that the broker runs, "
        "and that no firewall rejects the connection")


def principal_of(connection: ConnectionConfig | None) -> str | None:
    """The client's Kafka principal, as far as the client knows it (``User:alice``); None
    when the broker derives it (a certificate's mapped name, a token's subject)."""
    if connection is None:
        return None
    if connection.security_protocol == "PLAINTEXT":
        return "User:ANONYMOUS"
    if connection.uses_sasl and connection.sasl_mechanism != "OAUTHBEARER" \
            and connection.username:
        return f"User:{connection.username}"
    return None


def _certificate_subject(path: str) -> str | None:
    """The subject of a PEM certificate (RFC 4514, as Kafka's default principal builder
    writes it), if the optional ``cryptography`` package can read it."""
    try:
        from cryptography import x509

        with open(path, "rb") as f:
            return str(x509.load_pem_x509_certificate(f.read()).subject.rfc4514_string())
    except Exception:  # noqa: BLE001 - only a hint: absent package, unreadable file
        return None


def _principal_hint(connection: ConnectionConfig | None) -> tuple[str, str]:
    """A principal for the grant where the broker derives it, and a note saying how."""
    if connection is not None and connection.security_protocol == "SSL":
        subject = _certificate_subject(connection.cert_file) if connection.cert_file else None
        return (f"User:{subject or '<the client certificate subject>'}",
                " (the certificate's subject; if the broker's ssl.principal.mapping.rules "
                "map it to a shorter name, such as User:alice, use that)")
    if connection is not None and connection.sasl_mechanism == "OAUTHBEARER":
        return "User:<the token's subject>", ""
    return "User:<principal>", ""


def acl_command(principal: str, resource: str, name: str, operations: tuple[str, ...], *,
                prefixed: bool = False) -> str:
    """The ``kafka-acls.sh`` command that grants ``operations`` on a topic, group or
    transactional id (``prefixed``: every name that starts with ``name``)."""
    ops = " ".join(f"--operation {op}" for op in operations)
    pattern = " --resource-pattern-type prefixed" if prefixed else ""
    return (f"kafka-acls.sh --bootstrap-server <broker> --command-config admin.properties "
            f"--add --allow-principal '{principal}' {ops} --{resource} '{name}'{pattern}")


def authorization_error(settings: ClientSettings, resource: str, name: str,
                        operations: tuple[str, ...], what: str, *,
                        code: int = ErrorCode.GROUP_AUTHORIZATION_FAILED,
                        prefixed: bool = False) -> AuthorizationError:
    """The error for a denied ``operations`` on a ``resource`` (``"topic"``/``"group"``/
    ``"transactional-id"``) called ``name`` (``prefixed``: names starting so), while doing
    ``what``."""
    connection = settings.connection
    principal = principal_of(connection)
    who = f"principal {principal!r}" if principal else "this client's principal"
    hint, note = ("", "") if principal else _principal_hint(connection)
    grant = acl_command(principal or hint, resource, name, operations, prefixed=prefixed) + note
    names = f"{resource}s starting {name!r}" if prefixed else f"{resource} {name!r}"
    return AuthorizationError(
        code, f"{what}: {who} is not allowed to {'/'.join(operations)} {names} "
        "(an ACL denies it, or none allows it)",
        hint=f"Grant it: {grant}", from_broker=False)


def share_consumer_denial(settings: ClientSettings, topics: Sequence[str], *, group: bool,
                          detail: str, code: int) -> AuthorizationError:
    """A share consumer's refusal (either client's: the broker's TOPIC_ or
    GROUP_AUTHORIZATION_FAILED, ``detail`` its text), naming the READ that fixes it: on the
    group, or on the subscribed topic ``detail`` names (the first one where it names none)."""
    if group:
        resource, name = "group", settings.group_id
    else:
        named = [t for t in topics if re.search(rf"\btopic {re.escape(t)}(?![\w.-])", detail)]
        resource, name = "topic", max(named, key=len) if named else (topics[0] if topics else "?")
    return authorization_error(
        settings, resource, name, ("READ",),
        f"the share consumer of group {settings.group_id!r} was refused ({detail})", code=code)
