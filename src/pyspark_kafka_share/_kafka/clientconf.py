"""The Kafka clients' configuration properties: librdkafka's names, which values are
secrets, and librdkafka's refusal of a setting as an :class:`OptionError` that names the
user's option, its value (never a secret's) and the fix, with a "did you mean" for a typo.

confluent-kafka has no API that lists librdkafka's properties. :data:`LIBRDKAFKA_PROPERTIES`
was derived once from librdkafka 2.16.0 (``rd_kafka_conf_properties_show``, called through
``ctypes`` on confluent-kafka's bundled library; ``tests/unit/test_client_logs.py`` compares
it with the installed library when it can). It only feeds the suggestions: whether a setting
exists is always librdkafka's own verdict, so a newer librdkafka's new properties are
accepted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any

from pyspark_kafka_share.errors import OptionError, kafka_error

__all__ = ["LIBRDKAFKA_PROPERTIES", "REDACTED", "client_config_error", "is_secret", "shown"]

_PROPERTY_NAMES = """
allow.auto.create.topics api.version.fallback.ms api.version.request
api.version.request.timeout.ms auto.commit.enable auto.commit.interval.ms auto.offset.reset
batch.num.messages batch.size bootstrap.servers broker.address.family broker.address.ttl
broker.version.fallback builtin.features check.crcs client.dns.lookup client.id client.rack
compression.codec compression.level compression.type connections.max.idle.ms
consume.callback.max.messages coordinator.query.interval.ms delivery.report.only.error
delivery.timeout.ms enable.auto.commit enable.auto.offset.store enable.gapless.guarantee
enable.idempotence enable.metrics.push enable.partition.eof enable.random.seed
enable.sasl.oauthbearer.unsecure.jwt enable.ssl.certificate.verification fetch.error.backoff.ms
fetch.max.bytes fetch.message.max.bytes fetch.min.bytes fetch.queue.backoff.ms
fetch.wait.max.ms group.id group.instance.id group.protocol group.protocol.type
group.remote.assignor heartbeat.interval.ms https.ca.location https.ca.pem
internal.termination.signal isolation.level linger.ms log.connection.close log.queue
log.thread.name max.in.flight max.in.flight.requests.per.connection max.partition.fetch.bytes
max.poll.interval.ms max.poll.records message.copy.max.bytes message.max.bytes
message.send.max.retries message.timeout.ms metadata.broker.list metadata.max.age.ms
metadata.recovery.rebootstrap.trigger.ms metadata.recovery.strategy offset.store.method
offset.store.path offset.store.sync.interval.ms partition.assignment.strategy
plugin.library.paths produce.offset.report queue.buffering.backpressure.threshold
queue.buffering.max.kbytes queue.buffering.max.messages queue.buffering.max.ms
queued.max.messages.kbytes queued.min.messages queuing.strategy receive.message.max.bytes
reconnect.backoff.jitter.ms reconnect.backoff.max.ms reconnect.backoff.ms request.required.acks
request.timeout.ms retry.backoff.max.ms retry.backoff.ms sasl.kerberos.keytab
sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin sasl.kerberos.principal
sasl.kerberos.service.name sasl.mechanism sasl.mechanisms sasl.oauthbearer.assertion.algorithm
sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub
sasl.oauthbearer.assertion.file sasl.oauthbearer.assertion.jwt.template.file
sasl.oauthbearer.assertion.private.key.file sasl.oauthbearer.assertion.private.key.passphrase
sasl.oauthbearer.assertion.private.key.pem sasl.oauthbearer.client.credentials.client.id
sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.client.id
sasl.oauthbearer.client.secret sasl.oauthbearer.config sasl.oauthbearer.extensions
sasl.oauthbearer.grant.type sasl.oauthbearer.metadata.authentication.type
sasl.oauthbearer.method sasl.oauthbearer.scope sasl.oauthbearer.sub.claim.name
sasl.oauthbearer.token.endpoint.url sasl.password sasl.username security.protocol
session.timeout.ms share.acknowledgement.mode socket.blocking.max.ms
socket.connection.setup.timeout.ms socket.keepalive.enable socket.max.fails
socket.nagle.disable socket.receive.buffer.bytes socket.send.buffer.bytes socket.timeout.ms
ssl.ca.certificate.stores ssl.ca.location ssl.ca.pem ssl.certificate.location
ssl.certificate.pem ssl.cipher.suites ssl.crl.location ssl.curves.list
ssl.endpoint.identification.algorithm ssl.engine.id ssl.engine.location ssl.key.location
ssl.key.password ssl.key.pem ssl.keystore.location ssl.keystore.password ssl.providers
ssl.sigalgs.list statistics.interval.ms sticky.partitioning.linger.ms topic.blacklist
topic.metadata.propagation.max.ms topic.metadata.refresh.fast.cnt
topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.interval.ms
topic.metadata.refresh.sparse transaction.timeout.ms transactional.id
"""
LIBRDKAFKA_PROPERTIES = frozenset(_PROPERTY_NAMES.split())
"""The configuration properties of librdkafka 2.16.0 (callbacks left out)."""

REDACTED = "<redacted>"
_SECRET = re.compile(r"password|secret|key|token|jaas|credential|oauthbearer\.config",
                     re.IGNORECASE)
_QUOTED = re.compile(r'"([A-Za-z0-9_.]+)"|`([A-Za-z0-9_.]+)`')
_DOCS = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"


def is_secret(key: str) -> bool:
    """True for settings whose values must never be shown (passwords, keys, tokens, ...)."""
    return bool(_SECRET.search(key))


def suggestion(key: str) -> str | None:
    """The librdkafka property closest to ``key``, if one is close enough."""
    close = difflib.get_close_matches(key.lower(), sorted(LIBRDKAFKA_PROPERTIES), n=1,
                                      cutoff=0.75)
    return close[0] if close else None


def shown(key: str, value: object) -> object:
    """``value`` as it may appear in an error: :data:`REDACTED` for a secret-looking key (or
    a typo of one)."""
    near = suggestion(key)
    return REDACTED if is_secret(key) or (near is not None and is_secret(near)) else value


def _client_text(exc: BaseException) -> str:
    err: Any = kafka_error(exc)
    text = err.str() if err is not None else str(exc)
    return str(text).strip().removeprefix("Failed to create share consumer: ")


def client_config_error(exc: BaseException, conf: Mapping[str, Any],
                        name_of: Callable[[str], str], everything: str) -> OptionError:
    """librdkafka's refusal ``exc`` of the configuration ``conf`` (raised when a client is
    created) as an :class:`OptionError`. ``name_of`` gives the user's name of a property
    (``kafka.group.id``, ``consumer_config['acks']``); ``everything``, what to name when the
    client's message names no property."""
    text = _redact(_client_text(exc), conf)
    unknown = text.startswith("No such configuration property")
    mentioned = [k for a, b in _QUOTED.findall(text)
                 if (k := a or b) in conf or k in LIBRDKAFKA_PROPERTIES or unknown]
    key = _culprit(text, mentioned, conf)
    if key is None:
        return OptionError(everything, REDACTED, f"the Kafka client (librdkafka) refuses "
                           f"them: {text}")
    value = shown(key, conf.get(key))
    if unknown:
        near = suggestion(key)
        hint = f"did you mean {name_of(near)!r}? " if near else ""
        return OptionError(name_of(key), value, f"not a Kafka client setting; {hint}The "
                           f"client settings are librdkafka's, listed in {_DOCS}")
    for k in dict.fromkeys(mentioned):  # librdkafka's names as the user's
        user = key if k not in conf and k == mentioned[0] else k  # an alias the user set
        for quoted in (f'"{k}"', f"`{k}`"):
            text = text.replace(quoted, repr(name_of(user)))
    return OptionError(name_of(key), value, f"the Kafka client (librdkafka) refuses it: {text}")


def _redact(text: str, conf: Mapping[str, Any]) -> str:
    for secret in (str(v) for k, v in conf.items() if shown(k, v) == REDACTED and str(v)):
        text = text.replace(f'"{secret}"', REDACTED)
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def _culprit(text: str, mentioned: list[str], conf: Mapping[str, Any]) -> str | None:
    """The user's setting the client's message is about: one it names, else one whose value
    it quotes (librdkafka names the canonical property of an alias: ``compression.codec``
    for ``compression.type``), else the first property it names."""
    for k in mentioned:
        if k in conf:
            return k
    for k, v in conf.items():
        if f'"{v}"' in text:
            return k
    return mentioned[0] if mentioned else None
