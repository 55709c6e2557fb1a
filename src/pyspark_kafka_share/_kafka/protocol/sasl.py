"""SASL authentication on a Kafka connection: SaslHandshake v1, then SaslAuthenticate v0-2.

Mechanisms (standard library only: ``hashlib``, ``hmac``, ``secrets``):

- ``PLAIN`` (RFC 4616): ``\\0user\\0password``; only over TLS outside tests.
- ``SCRAM-SHA-256`` / ``SCRAM-SHA-512`` (RFC 5802, RFC 7677): the server's signature is
  verified, so a man in the middle cannot fake a successful login.
- ``OAUTHBEARER`` (RFC 7628): the initial client response carries a token from the
  configured provider (a callback, or an OIDC client-credentials request).

:func:`authenticate` runs the exchange over a ``roundtrip(name, frame, deadline) -> bytes``
callable (one request frame out, one response frame in), and returns the session lifetime the
broker granted (KIP-368): the connection must re-authenticate before it ends.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pyspark_kafka_share._kafka.connection import ConnectionConfig, OidcSettings
from pyspark_kafka_share._kafka.protocol.codec import (
    ApiKey,
    Framer,
    Reader,
    Roundtrip,
    Writer,
    common_version,
    is_flexible,
)
from pyspark_kafka_share.errors import (
    AuthenticationError,
    ErrorCode,
    ProtocolDecodeError,
    SecurityProtocolMismatchError,
    error_name,
)

__all__ = ["SASL_AUTHENTICATE", "SASL_HANDSHAKE", "Mechanism", "ScramClient", "authenticate",
           "mechanism_for", "oauthbearer_initial_response", "oidc_token", "plain_initial_response",
           "session_deadline"]

SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE
SASL_AUTHENTICATE = ApiKey.SASL_AUTHENTICATE


class Mechanism(Protocol):
    """A client-side SASL mechanism: the first message, then one answer per server challenge."""

    name: str

    def first(self) -> bytes: ...

    def answer(self, challenge: bytes) -> bytes | None:
        """The next message, or ``None`` when the exchange is complete."""


# -- PLAIN and OAUTHBEARER -----------------------------------------------------------------------


def plain_initial_response(username: str, password: str) -> bytes:
    """RFC 4616: empty authorization id, NUL, user, NUL, password."""
    return b"\0" + username.encode() + b"\0" + password.encode()


def oauthbearer_initial_response(token: str, extensions: Mapping[str, str] | None = None) -> bytes:
    """RFC 7628 section 3.1: ``n,,`` ^A ``auth=Bearer <token>`` ^A [extensions ^A] ^A."""
    parts = [f"auth=Bearer {token}"] + [f"{k}={v}" for k, v in (extensions or {}).items()]
    return ("n,," + "\x01" + "\x01".join(parts) + "\x01\x01").encode()


class _OneShot:
    """PLAIN and OAUTHBEARER: one client message; an OAUTHBEARER error challenge (JSON) is
    acknowledged with ^A, after which the broker reports the failure (RFC 7628 3.2.2)."""

    def __init__(self, name: str, message: bytes) -> None:
        self.name, self._message = name, message

    def first(self) -> bytes:
        return self._message

    def answer(self, challenge: bytes) -> bytes | None:
        return b"\x01" if challenge and self.name == "OAUTHBEARER" else None


# -- SCRAM --------------------------------------------------------------------------------------


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """RFC 5802 client for SCRAM-SHA-256 / SCRAM-SHA-512 (no channel binding: ``n,,``).

    ``nonce`` is for tests against published vectors; by default 24 random bytes.
    """

    def __init__(self, mechanism: str, username: str, password: str,
                 nonce: str | None = None) -> None:
        self.name = mechanism
        self._hash = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self._password = password.encode()
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self.done = False

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def first(self) -> bytes:
        return ("n,," + self._first_bare).encode()

    def answer(self, challenge: bytes) -> bytes | None:
        if self._server_signature is None:
            return self._client_final(challenge.decode())
        self._verify_server_final(challenge.decode())
        return None

    def _client_final(self, server_first: str) -> bytes:
        attrs = dict(kv.split("=", 1) for kv in server_first.split(",") if "=" in kv)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "0")
        if not nonce.startswith(self._nonce) or salt is None or not iterations.isdigit():
            raise AuthenticationError(f"{self.name}: the broker's first message is not valid "
                                      "SCRAM (nonce, salt or iteration count)")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, base64.b64decode(salt),
                                     int(iterations))
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify_server_final(self, server_final: str) -> None:
        assert self._server_signature is not None
        attrs = dict(kv.split("=", 1) for kv in server_final.split(",") if "=" in kv)
        if "e" in attrs:
            raise AuthenticationError(f"{self.name} failed: the broker answered {attrs['e']}")
        got = base64.b64decode(attrs.get("v", ""))
        if not hmac.compare_digest(got, self._server_signature):
            raise AuthenticationError(f"{self.name}: the broker's signature is wrong: it does "
                                      "not know this user's credentials (or is not the broker)")
        self.done = True


# -- tokens -------------------------------------------------------------------------------------


def oidc_token(oidc: OidcSettings, timeout_s: float) -> tuple[str, float]:
    """A token by the OAuth 2 client-credentials grant: ``(access_token, expiry epoch s)``."""
    form = {"grant_type": "client_credentials"}
    if oidc.scope:
        form["scope"] = oidc.scope
    basic = base64.b64encode(
        f"{urllib.parse.quote(oidc.client_id)}:{urllib.parse.quote(oidc.client_secret)}"
        .encode()).decode()
    req = urllib.request.Request(
        oidc.token_endpoint_url, data=urllib.parse.urlencode(form).encode(),
        headers={"Authorization": f"Basic {basic}", "Accept": "application/json",
                 "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
        return str(body["access_token"]), time.time() + float(body.get("expires_in", 3600))
    except (OSError, ValueError, KeyError) as exc:
        raise AuthenticationError(
            f"OAUTHBEARER: no token from sasl.oauthbearer.token.endpoint.url="
            f"{oidc.token_endpoint_url} for client id {oidc.client_id!r} "
            f"({type(exc).__name__}: {exc}); check the URL, client id and secret") from None


def _token(config: ConnectionConfig, timeout_s: float) -> tuple[str, Mapping[str, str]]:
    """``(token, SASL extensions)``. Like confluent-kafka's ``oauth_cb``, a provider may
    return ``(token, expiry)`` or ``(token, expiry, principal, extensions)``."""
    if config.token_provider is None:
        assert config.oidc is not None  # ConnectionConfig checks one of them is set
        return oidc_token(config.oidc, timeout_s)[0], config.oidc.extensions
    try:
        result: tuple[Any, ...] = tuple(config.token_provider(config.oauthbearer_config))
        token = str(result[0])
        extensions = dict(result[3]) if len(result) > 3 and result[3] else {}
    except Exception as exc:
        raise AuthenticationError(
            "OAUTHBEARER: the oauth_cb token provider failed or returned no (token, expiry) "
            f"tuple ({type(exc).__name__})") from exc  # the provider's own error, as the cause
    return token, extensions


def mechanism_for(config: ConnectionConfig, timeout_s: float) -> Mechanism:
    """The mechanism object for a (validated) SASL config; fetches an OAUTHBEARER token."""
    mech = config.sasl_mechanism
    if mech == "PLAIN":
        assert config.username is not None and config.password is not None
        return _OneShot(mech, plain_initial_response(config.username, config.password))
    if mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        assert config.username is not None and config.password is not None
        return ScramClient(mech, config.username, config.password)
    if mech == "OAUTHBEARER":
        return _OneShot(mech, oauthbearer_initial_response(*_token(config, timeout_s)))
    raise AuthenticationError(f"SASL mechanism {mech!r} is not supported")


# -- the two APIs (framed by the connection's Framer, versions from the codec's table) ---------


def _read_bytes(r: Reader) -> bytes:
    n = r.uvarint() - 1 if r.flexible else r.int32()
    if n < 0:
        return b""
    if n > r.remaining():
        raise ProtocolDecodeError("truncated SaslAuthenticate response")
    data = r.data[r.pos:r.pos + n]
    r.pos += n
    return data


def _handshake(send: Callable[[ApiKey, int, bytes], Reader], mechanism: str,
               address: str) -> None:
    r = send(SASL_HANDSHAKE, 1, Writer(flexible=False).string(mechanism).getvalue())
    code = r.int16()
    enabled = r.string_array()
    if code == ErrorCode.ILLEGAL_SASL_STATE and not enabled:  # the listener has no SASL
        raise SecurityProtocolMismatchError(
            f"the listener at {address} does not use SASL (it answered SaslHandshake "
            "with ILLEGAL_SASL_STATE): set security.protocol=PLAINTEXT or SSL, or use the "
            "port of the broker's SASL listener")
    if code:
        raise AuthenticationError(
            f"SASL mechanism {mechanism} is not enabled on the listener at {address} "
            f"(broker answered {error_name(code)}; it offers {', '.join(enabled) or 'none'})"
            f": set sasl.mechanism to one of those")


def _authenticate(send: Callable[[ApiKey, int, bytes], Reader], version: int,
                  message: bytes) -> tuple[int, str | None, bytes, int]:
    w = Writer(flexible=is_flexible(SASL_AUTHENTICATE, version))
    if w.flexible:
        w.uvarint(len(message) + 1)
        body = w.getvalue() + message + b"\x00"  # the body's (empty) tagged fields
    else:
        body = w.int32(len(message)).getvalue() + message
    r = send(SASL_AUTHENTICATE, version, body)
    code, text, data = r.int16(), r.nullable_string(), _read_bytes(r)
    lifetime = r.int64() if version >= 1 else 0
    r.skip_tags()
    r.expect_end("SaslAuthenticate response")
    return code, text, data, lifetime


def authenticate(roundtrip: Roundtrip, config: ConnectionConfig,
                 versions: Mapping[int, tuple[int, int]], *, framer: Framer,
                 deadline: float) -> int:
    """Authenticate the connection; return the session lifetime in ms (0: unlimited).
    ``framer``: the connection's, so that SASL's requests take its correlation ids.

    Raises :class:`AuthenticationError` naming the mechanism, the user and the options to
    check (never a secret).
    """
    mech_name, address = config.sasl_mechanism or "", framer.address
    version = common_version(SASL_AUTHENTICATE, versions.get(SASL_AUTHENTICATE))
    if version is None or common_version(SASL_HANDSHAKE, versions.get(SASL_HANDSHAKE)) is None:
        lo, hi = versions.get(SASL_AUTHENTICATE, (-1, -1))
        hs_lo, hs_hi = versions.get(SASL_HANDSHAKE, (-1, -1))
        raise AuthenticationError(
            f"the broker at {address} does not offer SaslHandshake v1 and SaslAuthenticate "
            f"v0-2 (it offers v{hs_lo}-{hs_hi} and v{lo}-{hi}; Kafka 1.0 to 4.4 do)")

    def send(api_key: ApiKey, v: int, body: bytes) -> Reader:
        return framer.send(roundtrip, api_key, v, body, deadline)

    _handshake(send, mech_name, address)
    mech = mechanism_for(config, max(deadline - time.monotonic(), 0.1))
    message: bytes | None = mech.first()
    lifetime = 0
    while message is not None:
        code, text, challenge, lifetime = _authenticate(send, version, message)
        if code:
            who = f" as {config.username!r}" if config.username else ""
            raise AuthenticationError(
                f"SASL {mech_name} authentication{who} to {address} failed: "
                f"{error_name(code)}{': ' + text if text else ''}. Check "
                + ("the token (oauth_cb / sasl.oauthbearer.*)" if mech_name == "OAUTHBEARER"
                   else "sasl.username and sasl.password") + " and sasl.mechanism")
        message = mech.answer(challenge)
    if isinstance(mech, ScramClient) and not mech.done:
        raise AuthenticationError(f"{mech_name}: the broker ended the exchange early")
    return lifetime


def session_deadline(lifetime_ms: int, now: float | None = None) -> float | None:
    """When to re-authenticate (monotonic seconds): at 85% of the session lifetime, like the
    Java client's window (KIP-368), at least 1 s early; ``None`` for an unlimited session."""
    if lifetime_ms <= 0:
        return None
    start = time.monotonic() if now is None else now
    life_s = lifetime_ms / 1000.0
    return start + max(min(life_s * 0.85, life_s - 1.0), 0.0)

