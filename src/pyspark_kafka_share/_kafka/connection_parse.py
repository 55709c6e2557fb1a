"""Reading the fields of a :class:`~pyspark_kafka_share._kafka.connection.ConnectionConfig`
from librdkafka settings and translating Kafka's Java client properties into librdkafka's.

Kept apart from the config type so that the type stays a screenful; see that module for the
why. The type imports this module, never the reverse (what both need is in
:mod:`~pyspark_kafka_share._kafka.connection_parts`). Errors are :class:`OptionError` naming
the option, its (masked) value and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyspark_kafka_share._kafka.connection_parts import MASK, OidcSettings, unsecured_jwt
from pyspark_kafka_share.errors import OptionError

__all__ = ["CONNECTION_KEYS", "JAVA_PROPERTY_OF", "connection_fields", "parse_flag",
           "translate_java_properties"]

_SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password", "sasl.oauthbearer.client.secret",
                          "sasl.jaas.config", "ssl.keystore.password", "ssl.truststore.password",
                          "ssl.keystore.key", "ssl.key.pem", "oauth_cb"})

# librdkafka keys the protocol client cannot honour, and what to use instead.
_UNSUPPORTED_CLIENT_KEYS = {
    "ssl.ca.pem": "put the CA certificates in a PEM file and set ssl.ca.location",
    "ssl.certificate.pem": "put the certificate in a PEM file and set ssl.certificate.location",
    "ssl.key.pem": "put the key in a PEM file and set ssl.key.location",
    "ssl.keystore.location": "convert the PKCS#12 keystore to PEM (openssl pkcs12 -in ks.p12 "
                             "-out client.pem) and set ssl.certificate.location and "
                             "ssl.key.location",
    "ssl_engine_id": "the protocol client reads PEM files only: set ssl.certificate.location "
                     "and ssl.key.location",
    "ssl.ca.certificate.stores": "export the CA to a PEM file and set ssl.ca.location",
}


CONNECTION_KEYS = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "sasl.oauthbearer.config", "sasl.oauthbearer.method", "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions", "enable.sasl.oauthbearer.unsecure.jwt", "ssl.ca.location",
    "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
})
"""The librdkafka settings :func:`connection_fields` reads (``oauth_cb`` aside): what a
client on the protocol client honours of the user's connection settings."""


def _str(settings: Mapping[str, Any], key: str) -> str | None:
    value = settings.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise OptionError(key, MASK if key in _SECRET_KEYS else value, "give a string")
    return value


def parse_flag(option: str, value: object, default: bool,
               fix: str = "give true or false") -> bool:
    """``value`` as a boolean (true/1/yes, false/0/no; None: ``default``); else an
    :class:`OptionError` naming ``option`` with ``fix``."""
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(option, value, fix)


def _flag(settings: Mapping[str, Any], key: str, default: bool) -> bool:
    return parse_flag(key, settings.get(key), default)


def _hostname_check(settings: Mapping[str, Any]) -> bool:
    value = settings.get("ssl.endpoint.identification.algorithm")
    if value is None:
        return True  # librdkafka >= 2.0 and Kafka's Java client default to https
    text = str(value).strip().lower()
    if text in ("https",):
        return True
    if text in ("none", ""):
        return False
    raise OptionError("ssl.endpoint.identification.algorithm", value,
                      "give https (check the broker's host name) or none")


def _mechanism(settings: Mapping[str, Any]) -> str | None:
    mech = _str(settings, "sasl.mechanism")
    mechs = _str(settings, "sasl.mechanisms")
    if mech and mechs and mech.strip().upper() != mechs.strip().upper():
        raise OptionError("sasl.mechanisms", mechs,
                          f"it disagrees with sasl.mechanism={mech!r}: set only one of them")
    return mech or mechs


def _oidc(settings: Mapping[str, Any]) -> OidcSettings | None:
    method = (_str(settings, "sasl.oauthbearer.method") or "default").strip().lower()
    if method == "default":
        return None
    if method != "oidc":
        raise OptionError("sasl.oauthbearer.method", method, "give default or oidc")
    values: dict[str, str] = {}
    for key in ("token.endpoint.url", "client.id", "client.secret"):
        full = f"sasl.oauthbearer.{key}"
        value = _str(settings, full)
        if not value:
            raise OptionError(full, None, f"sasl.oauthbearer.method=oidc needs {full}")
        values[key] = value
    ext = _str(settings, "sasl.oauthbearer.extensions") or ""
    extensions = dict(kv.split("=", 1) for kv in ext.split(",") if "=" in kv)
    return OidcSettings(values["token.endpoint.url"], values["client.id"],
                        values["client.secret"], _str(settings, "sasl.oauthbearer.scope"),
                        extensions)


def _token_provider(settings: Mapping[str, Any]) -> Any:
    """``oauth_cb``, or (``enable.sasl.oauthbearer.unsecure.jwt=true``) librdkafka's unsecured
    JWT builder from ``sasl.oauthbearer.config`` ("principal=... lifeSeconds=... scope=...")."""
    cb = settings.get("oauth_cb")
    if cb is not None:
        if not callable(cb):
            raise OptionError("oauth_cb", MASK, "give a callable config_str -> (token, expiry)")
        return cb
    if not _flag(settings, "enable.sasl.oauthbearer.unsecure.jwt", False):
        return None
    conf = dict(kv.split("=", 1) for kv in
                (_str(settings, "sasl.oauthbearer.config") or "").split() if "=" in kv)
    principal = conf.get("principal")
    if not principal:
        raise OptionError("sasl.oauthbearer.config", settings.get("sasl.oauthbearer.config"),
                          "an unsecured JWT needs principal=<name> (e.g. 'principal=alice')")
    life = float(conf.get("lifeSeconds", "3600"))
    scope = conf.get("scope")
    return lambda _config: unsecured_jwt(principal, life, scope)


def connection_fields(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ConnectionConfig`` fields of librdkafka-style ``settings`` (see
    ``ConnectionConfig.from_client_settings``, which validates them)."""
    proto = (_str(settings, "security.protocol") or "PLAINTEXT").upper()
    if proto.startswith("SSL") or proto.endswith("SSL"):
        for key, fix in _UNSUPPORTED_CLIENT_KEYS.items():
            if settings.get(key) is not None:
                raise OptionError(key, MASK if key in _SECRET_KEYS else settings[key],
                                  f"the share-group admin client cannot use it: {fix}")
    if settings.get("sasl.kerberos.keytab") or settings.get("sasl.kerberos.principal"):
        mech = _mechanism(settings) or "GSSAPI"
        if mech.upper() == "GSSAPI":
            # the config refuses GSSAPI, with the fix
            return {"security_protocol": proto, "sasl_mechanism": "GSSAPI"}
    return {
        "security_protocol": proto,
        "sasl_mechanism": _mechanism(settings),
        "username": _str(settings, "sasl.username"),
        "password": _str(settings, "sasl.password"),
        "token_provider": _token_provider(settings),
        "oauthbearer_config": _str(settings, "sasl.oauthbearer.config") or "",
        "oidc": _oidc(settings),
        "ca_file": _str(settings, "ssl.ca.location"),
        "cert_file": _str(settings, "ssl.certificate.location"),
        "key_file": _str(settings, "ssl.key.location"),
        "key_password": _str(settings, "ssl.key.password"),
        "check_hostname": _hostname_check(settings),
        "verify_certificates": _flag(settings, "enable.ssl.certificate.verification", True),
    }


# -- Java properties -> librdkafka --------------------------------------------------------------

# Java keys with the same name and meaning in librdkafka.
JAVA_PROPERTY_OF = {
    "ssl.ca.location": "ssl.truststore.location",
    "ssl.certificate.location": "ssl.keystore.location",
    "ssl.key.location": "ssl.keystore.location",
    "sasl.username": "sasl.jaas.config's username",
    "sasl.password": "sasl.jaas.config's password",
    "sasl.oauthbearer.client.id": "sasl.jaas.config's clientId",
    "sasl.oauthbearer.client.secret": "sasl.jaas.config's clientSecret",
    "sasl.oauthbearer.method": "sasl.jaas.config",
    "sasl.oauthbearer.config": "sasl.jaas.config",
    "enable.sasl.oauthbearer.unsecure.jwt": "sasl.jaas.config",
}
"""The Java client property that :func:`translate_java_properties` made each librdkafka
setting from (where the names differ), for errors that name what the user wrote."""

_SAME = ("security.protocol", "sasl.mechanism", "ssl.key.password", "client.id",
         "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope",
         "ssl.cipher.suites", "request.timeout.ms", "sasl.kerberos.service.name",
         "sasl.oauthbearer.client.credentials.client.id",
         "sasl.oauthbearer.client.credentials.client.secret")

# Java keys that need no translation for the clients this package runs (they are ignored).
_IGNORED = ("ssl.keystore.password", "ssl.truststore.password", "ssl.protocol",
            "ssl.enabled.protocols", "default.api.timeout.ms", "bootstrap.servers",
            "sasl.login.connect.timeout.ms", "sasl.login.read.timeout.ms",
            "sasl.login.refresh.buffer.seconds", "sasl.login.refresh.min.period.seconds",
            "sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter",
            "connections.max.idle.ms", "retries", "retry.backoff.ms")

_JAVA_ONLY = {
    "ssl.truststore.location": "ssl.ca.location (a PEM file of the CA certificates; export "
                               "them with: keytool -exportcert -rfc -keystore truststore.jks "
                               "-alias <alias> -file ca.pem)",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location (PEM files; "
                             "convert with: keytool -importkeystore -srckeystore ks.jks "
                             "-destkeystore ks.p12 -deststoretype PKCS12, then openssl pkcs12 "
                             "-in ks.p12 -out client.pem)",
    "sasl.login.callback.handler.class": "sasl.oauthbearer.method=oidc with "
                                         "sasl.oauthbearer.token.endpoint.url, "
                                         "sasl.oauthbearer.client.id and "
                                         "sasl.oauthbearer.client.secret (or an oauth_cb)",
    "sasl.client.callback.handler.class": "sasl.username and sasl.password, or an oauth_cb",
    "ssl.truststore.certificates": "ssl.ca.location (write the PEM to a file)",
    "ssl.keystore.certificate.chain": "ssl.certificate.location (write the PEM to a file)",
    "ssl.keystore.key": "ssl.key.location (write the PEM to a file)",
    "ssl.keymanager.algorithm": "nothing: remove it",
    "ssl.trustmanager.algorithm": "nothing: remove it",
    "ssl.secure.random.implementation": "nothing: remove it",
    "ssl.engine.factory.class": "ssl.ca.location, ssl.certificate.location, ssl.key.location",
}

_JAAS = re.compile(r'\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?);?\s*$', re.S)
_JAAS_OPTION = re.compile(r'([\w.]+)\s*=\s*(?:"((?:\\.|[^"\\])*)"|(\S+))')


def _jaas(value: str) -> tuple[str, dict[str, str]]:
    """``sasl.jaas.config``: ``(login module class, {option: value})``."""
    m = _JAAS.match(value)
    if m is None:
        raise OptionError("sasl.jaas.config", MASK,
                          "give '<LoginModule class> required key=\"value\" ...;'")
    options = {k: (q if q is not None else bare).replace('\\"', '"')
               for k, q, bare in _JAAS_OPTION.findall(m.group(3))}
    return m.group(1), options


def _translate_jaas(value: str, out: dict[str, Any]) -> None:
    module, options = _jaas(value)
    short = module.rsplit(".", 1)[-1]
    if short in ("PlainLoginModule", "ScramLoginModule"):
        for java, rd in (("username", "sasl.username"), ("password", "sasl.password")):
            if java not in options:
                raise OptionError("sasl.jaas.config", MASK,
                                  f'{short} needs {java}="..." in sasl.jaas.config')
            out[rd] = options[java]
    elif short == "OAuthBearerLoginModule":
        if "clientId" in options:
            out["sasl.oauthbearer.method"] = "oidc"
            out["sasl.oauthbearer.client.id"] = options["clientId"]
            out["sasl.oauthbearer.client.secret"] = options.get("clientSecret", "")
            if "scope" in options:
                out["sasl.oauthbearer.scope"] = options["scope"]
        elif "unsecuredLoginStringClaim_sub" in options:
            out["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
            out["sasl.oauthbearer.config"] = \
                f"principal={options['unsecuredLoginStringClaim_sub']}"
    elif short == "Krb5LoginModule":
        raise OptionError("sasl.jaas.config", MASK,
                          "Kerberos (GSSAPI) is not supported by the share-group admin "
                          "client; use SCRAM-SHA-512 or OAUTHBEARER, or kafka-share-groups.sh")
    else:
        raise OptionError("sasl.jaas.config", MASK,
                          f"login module {module} is unknown: use PlainLoginModule, "
                          "ScramLoginModule or OAuthBearerLoginModule")


def _store(props: Mapping[str, str], kind: str) -> str | None:
    """The PEM file of ``ssl.<kind>store.location``, or an error for JKS/PKCS12."""
    location = props.get(f"ssl.{kind}store.location")
    if location is None:
        return None
    typ = props.get(f"ssl.{kind}store.type", "JKS").strip().upper()
    if typ != "PEM":
        key = f"ssl.{kind}store.location"
        raise OptionError(f"ssl.{kind}store.type", typ,
                          f"a {typ} {kind}store is Java-only: use {_JAVA_ONLY[key]}")
    return location


def translate_java_properties(props: Mapping[str, str]) -> dict[str, Any]:
    """Java client properties -> librdkafka settings (see ``ConnectionConfig.from_properties``)."""
    out: dict[str, Any] = {}
    ca = _store(props, "trust")
    if ca is not None:
        out["ssl.ca.location"] = ca
    keystore = _store(props, "key")
    if keystore is not None:  # a PEM keystore holds the key and the certificate chain
        out["ssl.certificate.location"] = keystore
        out["ssl.key.location"] = keystore
    for key, value in props.items():
        if key in _SAME:
            out[key] = value
        elif key == "sasl.jaas.config":
            _translate_jaas(value, out)
        elif key == "ssl.endpoint.identification.algorithm":
            out[key] = value if value.strip() else "none"
        elif key in ("ssl.truststore.location", "ssl.truststore.type", "ssl.keystore.location",
                     "ssl.keystore.type") or key in _IGNORED:
            continue
        elif key in _JAVA_ONLY:
            raise OptionError(key, MASK if key in _SECRET_KEYS else value,
                              f"it is Java-only: use {_JAVA_ONLY[key]}")
        else:
            raise OptionError(key, MASK if key in _SECRET_KEYS else value,
                              "not a setting the share-group admin client understands; "
                              "remove it (the librdkafka name may differ: see librdkafka's "
                              "CONFIGURATION.md)")
    return out
