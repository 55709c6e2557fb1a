"""Client settings: the one place that derives consumer, producer and admin configurations.

Both front-ends hold a :class:`ClientSettings` (the source builds it from its ``kafka.*``
options, the workers from their arguments); every confluent-kafka client and the protocol
client is configured from it, so a security setting given once reaches all of them. Its
:class:`OptionNames` say what the front-end calls each setting, so that errors name the
user's option (``kafka.group.id``, ``consumer_config['acks']``); :func:`check_client_config`
has librdkafka judge every setting before anything starts.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.clientconf import client_config_error, shown
from pyspark_kafka_share._kafka.connection import ConnectionConfig, TokenProvider
from pyspark_kafka_share._kafka.connection_parse import CONNECTION_KEYS
from pyspark_kafka_share._kafka.logs import client_config
from pyspark_kafka_share._kafka.native.consumer import NativeConsumerConfig
from pyspark_kafka_share.errors import OptionError

_log = logging.getLogger(__name__)

__all__ = [
    "CLIENT_OPTIONS_REJECTED",
    "DEFAULT_MAX_POLL_RECORDS",
    "NATIVE_CONSUMER_KEYS",
    "SOURCE_NAMES",
    "WORKER_NAMES",
    "ClientSettings",
    "OptionNames",
    "check_bootstrap",
    "check_client_config",
    "check_group",
    "check_topics",
    "offset_reset",
]

DEFAULT_MAX_POLL_RECORDS = 2000
"""Records per share-consumer poll unless the caller says otherwise.

librdkafka's default (500) costs half the source's throughput: each poll is a broker round
trip, a journal slot and a commit. 2000 is the broker's default lock limit per share partition
(group.share.partition.max.record.locks); see docs/benchmarks."""

# Consumer-only settings an AdminClient or producer would reject or ignore.
_CONSUMER_ONLY = frozenset({
    "max.poll.records", "fetch.max.bytes", "fetch.min.bytes", "fetch.wait.max.ms",
    "max.poll.interval.ms", "client.id", "fetch.queue.backoff.ms", "queued.min.messages",
    "queued.max.messages.kbytes", "fetch.message.max.bytes", "fetch.error.backoff.ms",
    "check.crcs",
})
NATIVE_CONSUMER_KEYS = frozenset({"client.id", "max.poll.records", "fetch.wait.max.ms",
                                  "fetch.min.bytes", "fetch.max.bytes", "check.crcs"})
"""The consumer settings the native share client honours (besides the connection's,
``connection_parse.CONNECTION_KEYS``)."""
# Fetch sizes a plain consumer shares with the share consumer (oversized record batches).
_FETCH_SIZES = frozenset({"receive.message.max.bytes", "fetch.max.bytes",
                          "fetch.message.max.bytes", "max.partition.fetch.bytes"})
# What a producer shares with the consumer of the same cluster.
_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "socket.", "client.dns", "broker.address.")


@dataclass(frozen=True)
class OptionNames:
    """What a front-end calls the client settings in its errors. ``setting`` and
    ``producer_setting`` are templates of one pass-through setting (``{}``: its key);
    ``settings``, all of them."""

    setting: str = "kafka.{}"
    producer_setting: str = "kafka.{}"
    bootstrap: str = "kafka.bootstrap.servers"
    group: str = "kafka.group.id"
    topics: str = "subscribe"
    settings: str = "kafka.*"
    renamed: tuple[tuple[str, str], ...] = ()
    """``(librdkafka key, the user's key)`` where the user gave the setting in another dialect
    (a Java properties file: ``ssl.ca.location`` came from ``ssl.truststore.location``)."""

    def of(self, key: str, *, producer: bool = False) -> str:
        """The user's name of client setting ``key``."""
        if key == "group.id":
            return self.group
        if key in ("bootstrap.servers", "metadata.broker.list"):
            return self.bootstrap
        key = dict(self.renamed).get(key, key)
        return (self.producer_setting if producer else self.setting).format(key)


SOURCE_NAMES = OptionNames()
"""The ``kafka-share`` source's option names."""
WORKER_NAMES = OptionNames("consumer_config[{!r}]", "producer_config[{!r}]",
                           "bootstrap_servers", "group", "topics", "consumer_config")
"""The queue workers' argument names."""


@dataclass(frozen=True)
class ClientSettings:
    """How to reach one Kafka cluster and which share group to act for.

    ``extra``: the user's pass-through client settings (security, tuning); values may be
    secrets, so they are kept out of ``repr``. ``token_provider``: an OAUTHBEARER token
    callback (confluent-kafka's ``oauth_cb``), passed to every client as it is.
    ``names``: what errors call the settings.
    """

    bootstrap_servers: str
    group_id: str
    extra: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_s: float = 30.0
    names: OptionNames = SOURCE_NAMES
    token_provider: TokenProvider | None = field(default=None, repr=False, compare=False)

    @property
    def connection(self) -> ConnectionConfig | None:
        """How the protocol client connects: the same security settings as every
        confluent-kafka client (derived once per distinct settings). None when they use a
        feature the protocol client lacks (see :func:`protocol_connection`)."""
        return protocol_connection(self.extra, self.token_provider, self.names)

    def _security(self) -> dict[str, Any]:
        return {"oauth_cb": self.token_provider} if self.token_provider is not None else {}

    def consumer(self, *, client_id: str, max_poll_records: int | None = None) \
            -> dict[str, Any]:
        """An explicit-mode ``ShareConsumer``'s configuration.

        ``max_poll_records`` caps the user's (or the default) value; it is sent as ShareFetch
        MaxRecords, and the broker still hands out whole producer batches.
        """
        conf: dict[str, Any] = {**dict(self.extra), **self._security()}
        conf.update({"bootstrap.servers": self.bootstrap_servers, "group.id": self.group_id,
                     "share.acknowledgement.mode": "explicit"})
        conf.setdefault("client.id", client_id)
        conf.setdefault("max.poll.records", str(DEFAULT_MAX_POLL_RECORDS))
        if max_poll_records is not None:
            conf["max.poll.records"] = str(min(max_poll_records, int(conf["max.poll.records"])))
        return conf

    def native_consumer(self, *, client_id: str, max_poll_records: int | None = None,
                        record_limit: bool = False) -> NativeConsumerConfig:
        """The native share consumer's configuration (``_kafka/native/``).

        Forced: ``group.id`` and ``bootstrap.servers`` (this group, this cluster);
        acknowledgement is always explicit (the native consumer has no implicit mode);
        security comes from :attr:`connection` (the protocol client's, so a setting it cannot
        honour is an :class:`OptionError` here, not a silently plaintext connection). Read
        from the pass-through settings: ``client.id``, ``max.poll.records`` (capped by
        ``max_poll_records``, as for :meth:`consumer`), ``fetch.wait.max.ms``,
        ``fetch.min.bytes``, ``fetch.max.bytes``, ``check.crcs`` (:data:`NATIVE_CONSUMER_KEYS`),
        and the connection settings the protocol client reads (``connection_parse.
        CONNECTION_KEYS``); any other setting is refused by name, never ignored.
        """
        extra = dict(self.extra)
        for key, value in extra.items():
            if key not in NATIVE_CONSUMER_KEYS and key not in CONNECTION_KEYS:
                raise OptionError(self.names.of(key), shown(key, value),
                                  "the native share client does not honour it; remove it, or "
                                  "use the librdkafka client (client='librdkafka')")
        connection = self.connection
        if connection is None:
            raise OptionError(self.names.settings, "(security settings)",
                              "the native share client connects through the protocol client, "
                              "which cannot use them (see the warning above)")
        limit = int(extra.get("max.poll.records", DEFAULT_MAX_POLL_RECORDS))
        if max_poll_records is not None:
            limit = min(limit, max_poll_records)
        return NativeConsumerConfig(
            self.bootstrap_servers, self.group_id, extra.get("client.id", client_id),
            connection, limit, record_limit,
            int(extra.get("fetch.wait.max.ms", 500)), int(extra.get("fetch.min.bytes", 1)),
            int(extra.get("fetch.max.bytes", 52_428_800)), self.timeout_s,
            str(extra.get("check.crcs", "true")).lower() != "false")

    def _assigned(self, client_id: str, group_id: str) -> dict[str, Any]:
        """What every plain ``Consumer`` of ``assign()``-ed partitions shares: this cluster's
        connection and security settings and fetch sizes (oversized batches read as the
        share consumer reads them), and the forced keys below."""
        conf: dict[str, Any] = {k: v for k, v in self.extra
                                if k.startswith(_CONNECTION_PREFIXES) or k in _FETCH_SIZES}
        conf.update(self._security())
        conf.update({
            "bootstrap.servers": self.bootstrap_servers,
            # librdkafka insists on one; the consumer never joins it nor commits to it.
            "group.id": group_id,
            # assign() and explicit positions: nothing is committed ...
            "enable.auto.commit": False,
            # ... nor stored for a commit.
            "enable.auto.offset.store": False,
        })
        conf.setdefault("client.id", client_id)
        return conf

    def replay_consumer(self, *, isolation_level: str) -> dict[str, Any]:
        """A plain ``Consumer`` that reads given offsets of ``assign()``-ed partitions (the
        journal's replay, ``_kafka.replay``): no commits, and an offset out of range is
        reported, never reset. Its ``group.id`` is the share group's, which it never joins
        nor commits to (no JoinGroup, OffsetCommit or OffsetFetch; librdkafka's
        FindCoordinator for it needs DESCRIBE on the group, which the share group's READ
        grant includes)."""
        conf = self._assigned("pyspark-kafka-share-replay", self.group_id)
        # The share group's isolation level: the replay yields what the share consumer did.
        conf["isolation.level"] = isolation_level
        # An offset outside the log is data loss to report, never a silent reset.
        conf["auto.offset.reset"] = "error"
        # The end of each partition ends its read.
        conf["enable.partition.eof"] = True
        return client_config(conf)

    def control_consumer(self, who: str) -> dict[str, Any]:
        """A plain ``Consumer`` of one partition of the workers' control topic
        (``workers.control_kafka``), read from its end: ``who`` is ``driver`` or ``worker``.
        Its ``group.id`` is the share group's (only ``assign()``-ed, never committed: looking
        up the group's coordinator needs no ACL beyond the share group's READ)."""
        conf = self._assigned(f"kafka-share-control-{who}", self.group_id)
        # Control messages are latency-bound: a fetch answers within 100 ms.
        conf["fetch.wait.max.ms"] = 100
        # A request unanswered within the client's timeout fails, as the admin's.
        conf["socket.timeout.ms"] = int(self.timeout_s * 1000)
        return client_config(conf)

    def marker_reader(self, *, isolation_level: str, fetch_wait_ms: int | None = None,
                      error_cb: Callable[[Any], None] | None = None) -> dict[str, Any]:
        """A plain ``Consumer`` of the workers' marker topic (exactly-once outputs), read from
        its beginning with ``isolation_level`` (``read_committed``: the committed markers;
        ``read_uncommitted``: the topic's high watermark). ``fetch_wait_ms``: how long the
        broker may hold a fetch; ``error_cb``: librdkafka's errors."""
        conf = self._assigned("pyspark-kafka-share-markers",
                              # A group of its own: the markers' reader is no share-group member.
                              f"kafka-share-markers-{uuid.uuid4().hex[:8]}")
        # A request unanswered within the client's timeout fails, as the admin's.
        conf.setdefault("socket.timeout.ms", str(int(self.timeout_s * 1000)))
        conf["isolation.level"] = isolation_level
        # The whole compacted topic is read: no committed position, start at its beginning.
        conf["auto.offset.reset"] = "earliest"
        # The end of the partition is where the read has caught up.
        conf["enable.partition.eof"] = True
        if fetch_wait_ms is not None:
            conf["fetch.wait.max.ms"] = fetch_wait_ms
        if error_cb is not None:
            conf["error_cb"] = error_cb
        return client_config(conf)

    def admin(self) -> dict[str, Any]:
        """An ``AdminClient``'s configuration (security settings pass through)."""
        conf: dict[str, Any] = {k: v for k, v in self.extra if k not in _CONSUMER_ONLY}
        conf.update(self._security())
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf.setdefault("socket.timeout.ms", str(int(self.timeout_s * 1000)))
        return conf

    def producer(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A durable producer: connection and security settings of this cluster, then
        ``overrides``; ``acks=all`` and idempotence fixed; ``message.timeout.ms`` below the
        flush timeout callers use (``timeout_s + 5``), so an unreported record has failed.
        Its log lines go through Python logging (``_kafka.logs``)."""
        shared = {k: v for k, v in self.extra if k.startswith(_CONNECTION_PREFIXES)}
        conf: dict[str, Any] = {"linger.ms": 5, **shared, **self._security(),
                                **dict(overrides or {})}
        conf.update({"bootstrap.servers": self.bootstrap_servers, "acks": "all",
                     "enable.idempotence": True})
        conf.setdefault("message.timeout.ms", int(self.timeout_s * 1000))
        return client_config(conf)


@functools.lru_cache(maxsize=64)
def protocol_connection(extra: tuple[tuple[str, str], ...], token_provider: TokenProvider | None,
                        names: OptionNames = SOURCE_NAMES) -> ConnectionConfig | None:
    """The :class:`ConnectionConfig` of librdkafka settings ``extra`` (and ``oauth_cb``).

    None, with one WARNING naming what is lost and the fix, when they use a feature the
    protocol client lacks (PEM strings, keystores, Kerberos): confluent-kafka clients still
    connect, but lag, the drain probe, exact dedup expiry and the share-group admin calls are
    off. Bad values were refused by librdkafka before (:func:`check_client_config`).
    """
    settings: dict[str, Any] = dict(extra)
    if token_provider is not None:
        settings["oauth_cb"] = token_provider
    try:
        return ConnectionConfig.from_client_settings(settings)
    except OptionError as exc:
        _log.warning(
            "%s: the share-group protocol client cannot connect with %s = %r (%s); without it "
            "lag in progress, lag-bounded batches, the drain probe and exact dedup expiry are "
            "off (records are still read exactly once)", names.settings, names.of(exc.option),
            exc.value, exc.fix)
        return None


def check_client_config(settings: ClientSettings,
                        producer: Mapping[str, Any] | None = None) -> None:
    """Have librdkafka judge every client setting now, before any task starts.

    A share consumer with the consumer configuration (and, with ``producer``, a producer with
    those overrides) is created and closed at once, without subscribing or waiting for a
    broker (a few milliseconds). librdkafka's refusal becomes an :class:`OptionError` naming
    the user's setting, its value (never a secret's) and the fix; the client's own exception
    is not chained, since its text may hold a secret.
    """
    from confluent_kafka import KafkaException, Producer, ShareConsumer

    names = settings.names
    conf = settings.consumer(client_id="pyspark-kafka-share-check")
    try:
        ShareConsumer(client_config(conf)).close()
    except (KafkaException, ValueError, TypeError) as exc:
        raise client_config_error(exc, conf, names.of, names.settings) from None
    if producer is None:
        return
    pconf = settings.producer(producer)
    try:
        Producer(pconf).flush(0)
    except (KafkaException, ValueError, TypeError) as exc:
        raise client_config_error(
            exc, {k: v for k, v in pconf.items() if k != "logger"},
            lambda k: names.of(k, producer=k not in dict(settings.extra)),
            names.settings) from None


# -- validation shared by the front-ends (each names its own option/argument in errors) -------

CLIENT_OPTIONS_REJECTED: dict[str, str] = {
    "enable.auto.commit": "records are acknowledged one by one by this package; remove it",
    "auto.offset.reset": "use the source option 'startingOffsets' (earliest, latest or an "
    "ISO-8601 duration such as PT1H); it sets the share group's share.auto.offset.reset",
    "share.acknowledgement.mode": "acknowledgement is always explicit; choose the source's "
    "guarantee with the option 'delivery' (exactly-once or at-most-once)",
    "isolation.level": "share groups take it as the group config share.isolation.level; set it "
    "with `kafka-share groups` or an admin client, not as a client option",
    "group.instance.id": "share groups have no static membership; remove the option",
    "group.id": "use the source option 'kafka.group.id' (the share group name)",
    "group.protocol": "share consumers always use the share protocol; remove the option",
    "session.timeout.ms": "share groups set it on the broker/group (share.session.timeout.ms)",
    "heartbeat.interval.ms": "share groups set it on the broker/group "
    "(share.heartbeat.interval.ms)",
    "partition.assignment.strategy": "the broker assigns share-group partitions; remove it",
    "enable.partition.eof": "not applicable to share consumers; remove the option",
    "key.deserializer": "the source returns key and value as binary; cast or decode in Spark",
    "value.deserializer": "the source returns key and value as binary; cast or decode in Spark",
    "bootstrap.servers": "use the source option 'kafka.bootstrap.servers'",
}
"""Client settings that would break the guarantees or that share consumers reject, mapped to
what to use instead."""

_DURATION = re.compile(r"^P(?!$)(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def check_bootstrap(raw: str | None, name: str) -> str:
    text = (raw or "").strip()
    if not text:
        raise OptionError(name, raw, "set it to the broker list, e.g. 'host1:9092,host2:9092'")
    return text


def check_group(raw: str | None, name: str) -> str:
    text = (raw or "").strip()
    if not text:
        raise OptionError(name, raw, "set it to the share group's name; every query and worker "
                          "with the same name shares the records")
    return text


def check_topics(raw: str | Iterable[str] | None, name: str) -> tuple[str, ...]:
    """Topic names from ``"a,b"`` or an iterable of names: valid, at least one, no repeats."""
    items = (raw or "").split(",") if raw is None or isinstance(raw, str) else list(raw)
    topics = tuple(str(t).strip() for t in items if str(t).strip())
    if not topics:
        raise OptionError(name, raw, "set it to one or more comma-separated topic names")
    bad = [t for t in topics if not _TOPIC.match(t)]
    if bad:
        raise OptionError(name, raw, f"{bad[0]!r} is not a valid topic name")
    if len(set(topics)) != len(topics):
        raise OptionError(name, raw, "a topic is named twice")
    return topics


def offset_reset(raw: str | None, name: str) -> str | None:
    """``startingOffsets`` as a ``share.auto.offset.reset`` value (None: leave the group's)."""
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    if _DURATION.match(text.upper()):
        return f"by_duration:{text.upper()}"
    raise OptionError(
        name, raw,
        "use 'earliest', 'latest' or an ISO-8601 duration such as 'PT1H' or 'P1D' (start at "
        "records no older than that). Share groups take no per-partition JSON offsets",
    )
