"""The parts of a connection's settings that the config type
(:mod:`~pyspark_kafka_share._kafka.connection`) and its parsers
(:mod:`~pyspark_kafka_share._kafka.connection_parse`) share: how a secret is shown, the
OAUTHBEARER token sources, and Java properties files' syntax.

A leaf: it imports nothing of the package, so that the type and the parsers each import it
and not each other. Both re-export what their users need; this module does no I/O.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MASK", "OidcSettings", "TokenProvider", "parse_java_properties", "unsecured_jwt"]

MASK = "***"
"""What a secret's value is shown as."""

TokenProvider = Callable[
    [str], "tuple[str, float] | tuple[str, float, str, Mapping[str, str]]"]
"""confluent-kafka's ``oauth_cb``: ``(sasl.oauthbearer.config) -> (token, expiry epoch s)``, or
``(token, expiry, principal, SASL extensions)``."""


@dataclass(frozen=True)
class OidcSettings:
    """OAUTHBEARER tokens from an OIDC provider by the client-credentials grant
    (librdkafka's ``sasl.oauthbearer.method=oidc``)."""

    token_endpoint_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None = None
    extensions: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"OidcSettings(token_endpoint_url={self.token_endpoint_url!r}, "
                f"client_id={self.client_id!r}, client_secret={MASK!r}, scope={self.scope!r})")

    __str__ = __repr__


# -- Java properties -------------------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str) -> str:
    def one(m: re.Match[str]) -> str:
        c = m.group(1)
        if c.startswith("u"):
            return chr(int(c[1:], 16))
        return _ESCAPES.get(c, c)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, s)


def _logical_lines(text: str) -> list[str]:
    """Join continuation lines (an odd number of trailing backslashes), drop comments."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def parse_java_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load``'s format: ``key=value``, ``key: value`` or ``key value``;
    ``#``/``!`` comments; backslash continuations and escapes."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        m = re.match(r"((?:\\.|[^=:\s\\])*)\s*[=:\s]?\s*(.*)$", line, re.S)
        assert m is not None  # the pattern matches every string
        props[_unescape(m.group(1))] = _unescape(m.group(2))
    return props


# -- unsecured JWTs (tests and local brokers) ------------------------------------------------


def unsecured_jwt(principal: str, lifetime_s: float = 3600.0, scope: str | None = None,
                  now: float | None = None) -> tuple[str, float]:
    """An unsigned JWT (``alg: none``) for ``principal``, as Kafka's unsecured OAUTHBEARER
    validator (the default on a broker without an OIDC validator) accepts it; and its
    expiry (epoch seconds). For local brokers and tests only."""
    issued = time.time() if now is None else now
    expiry = issued + lifetime_s
    claims: dict[str, Any] = {"sub": principal, "iat": int(issued), "exp": int(expiry)}
    if scope:
        claims["scope"] = scope

    def b64(obj: dict[str, Any]) -> str:
        data = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")

    return f"{b64({'alg': 'none'})}.{b64(claims)}.", float(int(expiry))
