"""How to reach a secured Kafka: one typed, validated :class:`ConnectionConfig`.

Every managed Kafka (MSK, Confluent Cloud, Aiven, Strimzi) runs TLS and SASL. The settings
arrive in two dialects, and both end up here:

- librdkafka's (confluent-kafka's) keys, as a user gives them to the source or the admin:
  :meth:`ConnectionConfig.from_client_settings`;
- Kafka's Java client properties, as ``kafka-share-groups.sh --command-config`` takes them:
  :meth:`ConnectionConfig.from_properties`, which also returns the librdkafka equivalent, so
  that confluent-kafka clients and the protocol client connect the same way.

:meth:`ConnectionConfig.client_settings` goes back to librdkafka's keys. Secrets (passwords,
key passwords, client secrets, token callbacks) never appear in ``repr``/``str`` or in an error;
every error is an :class:`~pyspark_kafka_share.errors.OptionError` naming the option, its value
(``'***'`` for a secret) and the fix. This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pyspark_kafka_share._kafka.connection_parse import (
    connection_fields,
    translate_java_properties,
)
from pyspark_kafka_share._kafka.connection_parts import (
    MASK,
    OidcSettings,
    TokenProvider,
    parse_java_properties,
    unsecured_jwt,
)
from pyspark_kafka_share.errors import OptionError

__all__ = [
    "MASK",
    "MECHANISMS",
    "PLAINTEXT",
    "SECURITY_PROTOCOLS",
    "ConnectionConfig",
    "OidcSettings",
    "TokenProvider",
    "parse_java_properties",
    "unsecured_jwt",
]


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

_GSSAPI_FIX = ("GSSAPI (Kerberos) is not supported by the share-group admin client; use "
               "SCRAM-SHA-512, SCRAM-SHA-256, PLAIN (over SASL_SSL) or OAUTHBEARER, or Kafka's "
               "kafka-share-groups.sh for a Kerberos-only cluster")


def _fail(option: str, value: object, fix: str, *, secret: bool = False) -> OptionError:
    return OptionError(option, MASK if secret and value is not None else value, fix)


_SECRET_FIELDS = frozenset({"password", "key_password", "token_provider"})


@dataclass(frozen=True, repr=False)
class ConnectionConfig:
    """How the protocol client connects and authenticates: security protocol, SASL, TLS.

    Attributes:
        security_protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
        sasl_mechanism: ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` or ``OAUTHBEARER``
            (SASL protocols only).
        username, password: for PLAIN and SCRAM.
        token_provider: OAUTHBEARER tokens: ``(oauthbearer_config) -> (token, expiry_epoch_s)``.
        oauthbearer_config: the string the token provider is called with.
        oidc: OAUTHBEARER tokens from an OIDC token endpoint instead of ``token_provider``.
        ca_file: PEM file of the CAs to trust (``None``: the system's trust store).
        cert_file, key_file, key_password: the client certificate (mutual TLS); the key may be
            encrypted; ``key_file`` may be omitted when ``cert_file`` holds the key too.
        check_hostname: verify that the broker's certificate names the host connected to.
        verify_certificates: verify the broker's certificate at all (off: testing only).
    """

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    token_provider: TokenProvider | None = field(default=None, compare=False)
    oauthbearer_config: str = ""
    oidc: OidcSettings | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    check_hostname: bool = True
    verify_certificates: bool = True

    def __post_init__(self) -> None:
        proto = self.security_protocol.strip().upper()
        if proto not in SECURITY_PROTOCOLS:
            raise _fail("security.protocol", self.security_protocol,
                        f"use one of {', '.join(SECURITY_PROTOCOLS)}")
        object.__setattr__(self, "security_protocol", proto)
        if self.sasl_mechanism is not None and not self.uses_sasl:
            object.__setattr__(self, "sasl_mechanism", None)  # unused, as librdkafka ignores it
        if self.sasl_mechanism is not None:
            mech = self.sasl_mechanism.strip().upper()
            if mech == "GSSAPI":
                raise _fail("sasl.mechanism", self.sasl_mechanism, _GSSAPI_FIX)
            if mech not in MECHANISMS:
                raise _fail("sasl.mechanism", self.sasl_mechanism,
                            f"use one of {', '.join(MECHANISMS)}")
            object.__setattr__(self, "sasl_mechanism", mech)
        if self.uses_sasl:
            self._check_sasl()
        if self.key_file and not self.cert_file:
            raise _fail("ssl.certificate.location", None,
                        "a client key (ssl.key.location) needs its certificate: set "
                        "ssl.certificate.location to the client certificate's PEM file")

    def _check_sasl(self) -> None:
        mech = self.sasl_mechanism
        if mech is None:
            raise _fail("sasl.mechanism", None,
                        f"security.protocol={self.security_protocol} needs a SASL mechanism: "
                        f"set sasl.mechanism to one of {', '.join(MECHANISMS)}")
        if mech == "OAUTHBEARER":
            if self.token_provider is None and self.oidc is None:
                raise _fail("oauth_cb", None,
                            "OAUTHBEARER needs tokens: give oauth_cb (a callable "
                            "config_str -> (token, expiry_epoch_s)), or set "
                            "sasl.oauthbearer.method=oidc with its token endpoint, client id "
                            "and secret")
            return
        if not self.username:
            raise _fail("sasl.username", self.username,
                        f"SASL {mech} needs a username: set sasl.username")
        if self.password is None:
            raise _fail("sasl.password", None, f"SASL {mech} needs a password: set sasl.password")

    @property
    def uses_tls(self) -> bool:
        """True for SSL and SASL_SSL."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """True for SASL_PLAINTEXT and SASL_SSL."""
        return self.security_protocol.startswith("SASL_")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default or (f.name == "oauthbearer_config" and not value):
                continue
            shown.append(f"{f.name}={MASK!r}" if f.name in _SECRET_FIELDS else
                         f"{f.name}={value!r}")
        return f"ConnectionConfig({', '.join(shown)})"

    __str__ = __repr__

    def with_changes(self, **changes: Any) -> ConnectionConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    # -- librdkafka's dialect ------------------------------------------------------------

    @classmethod
    def from_client_settings(cls, settings: Mapping[str, Any]) -> ConnectionConfig:
        """From librdkafka-style settings (other keys, such as ``group.id``, are ignored)."""
        return cls(**connection_fields(settings))

    def client_settings(self) -> dict[str, Any]:
        """The librdkafka (confluent-kafka) settings that connect the same way."""
        out: dict[str, Any] = {"security.protocol": self.security_protocol}
        if self.uses_sasl and self.sasl_mechanism:
            out["sasl.mechanism"] = self.sasl_mechanism
            if self.username is not None:
                out["sasl.username"] = self.username
            if self.password is not None:
                out["sasl.password"] = self.password
            if self.token_provider is not None:
                out["oauth_cb"] = self.token_provider
                if self.oauthbearer_config:
                    out["sasl.oauthbearer.config"] = self.oauthbearer_config
            if self.oidc is not None:
                out.update(_oidc_settings(self.oidc))
        if self.uses_tls:
            for key, value in (("ssl.ca.location", self.ca_file),
                               ("ssl.certificate.location", self.cert_file),
                               ("ssl.key.location", self.key_file or self.cert_file
                                if self.cert_file else None),
                               ("ssl.key.password", self.key_password)):
                if value is not None:
                    out[key] = value
            out["ssl.endpoint.identification.algorithm"] = \
                "https" if self.check_hostname else "none"
            if not self.verify_certificates:
                out["enable.ssl.certificate.verification"] = "false"
        return out

    # -- Kafka's Java dialect --------------------------------------------------------------

    @classmethod
    def from_properties(cls, text: str) -> tuple[ConnectionConfig, dict[str, Any]]:
        """From a Java client properties file's text (``--command-config``): the typed config
        and the equivalent librdkafka settings. Java-only settings without an equivalent the
        client can use (JKS/PKCS12 stores, Kerberos, login callback classes) raise
        :class:`OptionError` naming the librdkafka setting to use instead."""
        settings = translate_java_properties(parse_java_properties(text))
        return cls.from_client_settings(settings), settings


def _oidc_settings(oidc: OidcSettings) -> dict[str, str]:
    out = {"sasl.oauthbearer.method": "oidc",
           "sasl.oauthbearer.token.endpoint.url": oidc.token_endpoint_url,
           "sasl.oauthbearer.client.id": oidc.client_id,
           "sasl.oauthbearer.client.secret": oidc.client_secret}
    if oidc.scope:
        out["sasl.oauthbearer.scope"] = oidc.scope
    if oidc.extensions:
        out["sasl.oauthbearer.extensions"] = ",".join(f"{k}={v}"
                                                      for k, v in oidc.extensions.items())
    return out


PLAINTEXT = ConnectionConfig()
"""The default: plaintext, no authentication."""
