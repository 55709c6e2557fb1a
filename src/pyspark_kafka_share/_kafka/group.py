"""The share group and its topics, as the broker sees them: checks done before a query or a
worker job starts, the group's configs, its backlog (lag) and start offsets, and the check
that the subscribed topics still exist.

Clients are cached per process: the driver asks on every trigger, and a new client costs a
connection and a metadata round trip (~60 ms measured), a cached one ~1 ms. Every call is
bounded by the settings' timeout; every failure is a :class:`BrokerError`, never "no data";
a subscribed topic that is gone is an :class:`UnknownTopicError`, never "no data" either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.access import authorization_error, probe_broker
from pyspark_kafka_share._kafka.clientconf import client_config_error
from pyspark_kafka_share._kafka.lines import delivery_limit
from pyspark_kafka_share._kafka.logs import ClientLog, client_config
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.progress import PartitionOffset, group_offsets
from pyspark_kafka_share._kafka.protocol import KafkaProtocolClient
from pyspark_kafka_share._kafka.protocol.codec import ApiKey
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    LagUnavailableError,
    UnknownTopicError,
    from_client_error,
    is_denied,
)

__all__ = [
    "RENEW_CONFIG",
    "Backlog",
    "BrokerFacts",
    "TopicWatch",
    "admin_client",
    "ensure_topics",
    "inspect_broker",
    "latest_offsets",
    "list_offsets",
    "protocol_client",
    "read_backlog",
    "read_group_configs",
    "read_start_offsets",
    "waiting_partitions",
    "write_group_configs",
]

_log = logging.getLogger(__name__)
RENEW_CONFIG = "share.renew.acknowledge.enable"
"""The group config that allows RENEW (KIP-1240, Apache Kafka 4.3+; default true)."""
_LAG_TIMEOUT_CAP_S = 5.0  # a lag read is an optimisation: never wait long for it


@dataclass(frozen=True)
class BrokerFacts:
    partitions: dict[str, int]
    lock_ms: int
    delivery_limit: int
    # The group's share.isolation.level: what the journal's replay consumer reads with.
    isolation_level: str = "read_uncommitted"
    # The group's share.renew.acknowledge.enable (KIP-1240, 4.3+); None: the broker has no
    # such config (4.2, which honours RENEW).
    renew_enabled: bool | None = None
    # The group's share.partition.max.record.locks (KIP-1240, 4.3+): records in flight per
    # share partition; None: the broker has no such group config (4.2: its default, 2,000).
    record_locks: int | None = None


_ADMINS: dict[tuple[tuple[str, str], ...], tuple[Any, ClientLog]] = {}
_ADMINS_LOCK = threading.Lock()


def admin_client(settings: ClientSettings) -> Any:
    """A confluent-kafka ``AdminClient`` for ``settings``, shared within the process.

    An admin client hands its log lines over only when polled: each call serves them."""
    return _admin(settings)[0]


def _admin(settings: ClientSettings) -> tuple[Any, ClientLog]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    conf = settings.admin()
    key = tuple(sorted(conf.items()))
    with _ADMINS_LOCK:
        entry = _ADMINS.get(key)
        if entry is None:
            full = client_config(conf)
            try:
                entry = _ADMINS[key] = (AdminClient(full), full["logger"])
            except (KafkaException, ValueError, TypeError) as exc:
                names = settings.names
                raise client_config_error(exc, conf, names.of, names.settings) from None
    entry[0].poll(0)
    return entry


def _last_problem(settings: ClientSettings) -> str:
    """What the admin client's hidden log lines last complained about, as a suffix."""
    problem = _admin(settings)[1].last_problem
    return f"; the client last reported: {problem}" if problem else ""


def read_group_configs(admin: Any, group: str, timeout_s: float) -> dict[str, Any]:
    """The group's configs, ``{name: ConfigEntry}`` (defaults included)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.GROUP, group)
    future = next(iter(admin.describe_configs([resource],
                                              request_timeout=timeout_s).values()))
    return dict(future.result(timeout=timeout_s))


def write_group_configs(admin: Any, group: str, configs: Mapping[str, str | int],
                        timeout_s: float, *, validate_only: bool = False) -> None:
    """Set group configs (``incrementalAlterConfigs`` SET); raises the client's error.

    Returns once a DescribeConfigs shows them (at most ``timeout_s``): the controller
    confirms a change before the brokers apply it, and a share consumer joining in between
    would still get the old value (e.g. ``share.auto.offset.reset``). ``validate_only``: the
    broker checks the request (ALTER_CONFIGS on the group, the values) and changes nothing.
    """
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(key, str(value), incremental_operation=AlterConfigOpType.SET)
        for key, value in configs.items()])
    for fut in admin.incremental_alter_configs([resource], request_timeout=timeout_s,
                                               validate_only=validate_only).values():
        fut.result(timeout=timeout_s)
    if validate_only:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = read_group_configs(admin, group, timeout_s)
        if all(k in seen and str(seen[k].value) == str(v) for k, v in configs.items()):
            return
        time.sleep(0.05)


def inspect_broker(settings: ClientSettings, topics: Sequence[str], *,
                   bootstrap_name: str | None = None,
                   topics_name: str | None = None) -> BrokerFacts:
    """Check reachability, topics and share-group support; read the group's lock settings.

    ``bootstrap_name``/``topics_name``: what errors call those settings (option or argument;
    default: the settings' :class:`OptionNames`). Credentials, certificates, the security
    protocol and the address are probed first (:func:`probe_broker`: seconds, not the broker
    timeout); a topic or group the principal may not use raises :class:`AuthorizationError`.
    """
    timeout = settings.timeout_s
    bootstrap_name = bootstrap_name or settings.names.bootstrap
    topics_name = topics_name or settings.names.topics
    versions = probe_broker(settings, bootstrap_name)
    admin = admin_client(settings)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception as exc:
        raise from_client_error(
            exc, f"option {bootstrap_name!r} = {settings.bootstrap_servers!r}: no broker "
            f"answered within {timeout:.0f}s{_last_problem(settings)}",
            "Check the address, the network and the security settings") from exc
    _check_topics(settings, admin, md, topics, topics_name)
    if versions is not None:
        _check_share_support(settings.bootstrap_servers, versions)
    configs = _group_configs(settings, admin)
    _check_group_access(settings)
    if "share.record.lock.duration.ms" not in configs:
        raise BrokerError(
            f"the broker at {settings.bootstrap_servers} has no share-group configs: share "
            "groups need Apache Kafka 4.2 or newer (or share.version=1 enabled on 4.0/4.1)"
        )
    return BrokerFacts(
        partitions={t: len(md.topics[t].partitions) for t in topics},
        lock_ms=int(configs["share.record.lock.duration.ms"].value),
        delivery_limit=delivery_limit(admin, md, configs, timeout),
        isolation_level=_config_value(configs, "share.isolation.level", "read_uncommitted"),
        renew_enabled=_flag_value(configs, RENEW_CONFIG),
        record_locks=_int_value(configs, "share.partition.max.record.locks"),
    )


def _config_value(configs: Mapping[str, Any], name: str, default: str) -> str:
    entry = configs.get(name)
    value = getattr(entry, "value", None)
    return str(value) if value else default


def _int_value(configs: Mapping[str, Any], name: str) -> int | None:
    """An integer group config; None when the broker does not know it."""
    value = getattr(configs.get(name), "value", None)
    return int(value) if value not in (None, "") else None


def _flag_value(configs: Mapping[str, Any], name: str) -> bool | None:
    """A boolean group config; None when the broker does not know it."""
    value = getattr(configs.get(name), "value", None)
    return None if value is None else str(value).strip().lower() == "true"


def _check_share_support(bootstrap: str, versions: Mapping[int, tuple[int, int]]) -> None:
    if ApiKey.SHARE_FETCH not in versions or ApiKey.SHARE_GROUP_HEARTBEAT not in versions \
            or versions[ApiKey.SHARE_FETCH][1] < 1:
        raise BrokerError(
            f"the broker at {bootstrap} does not support share groups "
            "(no ShareFetch v1 / ShareGroupHeartbeat API): Apache Kafka 4.2 or newer is needed"
        )


def _check_topics(settings: ClientSettings, admin: Any, md: Any, topics: Sequence[str],
                  topics_name: str) -> None:
    """Every subscribed topic exists and may be described; a topic the principal may not
    see (absent from the full listing) is asked for by name: the broker then answers
    TOPIC_AUTHORIZATION_FAILED, never "does not exist"."""
    denied = [t for t in topics if t in md.topics and is_denied(md.topics[t].error)]
    for t in _missing(md, topics):
        try:
            one = admin.list_topics(topic=t, timeout=settings.timeout_s)
        except Exception:  # noqa: BLE001 - the listing above decides
            continue
        if t in one.topics and is_denied(one.topics[t].error):
            denied.append(t)
    if denied:
        raise authorization_error(
            settings, "topic", denied[0], ("DESCRIBE", "READ"),
            f"option {topics_name!r} = {','.join(topics)!r}",
            code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    missing = _missing(md, topics)
    if missing:
        raise UnknownTopicError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"option {topics_name!r} = {','.join(topics)!r}: topic(s) {missing} do not "
            f"exist on {settings.bootstrap_servers}. Create them first (share consumers do "
            "not create topics)", from_broker=False)


def _check_group_access(settings: ClientSettings) -> None:
    """READ on the group, which every share consumer needs, tried before any task starts
    (then a denial fails load()/start_workers(), not every task); and the group's offsets
    (DESCRIBE on the group and topics): without them lag is unknown, said once."""
    group = settings.group_id
    try:
        with protocol_client(settings) as client:
            client.check_share_group_access(group)
    except AuthorizationError:
        raise authorization_error(settings, "group", group, ("READ",),
                                  f"joining share group {group!r}") from None
    except Exception:  # noqa: BLE001 - the consumers report any other problem themselves
        return
    try:
        _read_group_offsets(settings)
    except AuthorizationError as exc:
        _log.warning(
            "share group %r: lag is unknown (%s): progress shows no lag, batches are not "
            "bounded by it, and tasks end by pollTimeoutMs instead of when the group is "
            "drained. Grant DESCRIBE on the group and its topics to restore it",
            group, exc)
    except Exception:  # noqa: BLE001 - not an ACL: later reads say more, or go on unknown
        return


def _group_configs(settings: ClientSettings, admin: Any) -> dict[str, Any]:
    """The group's configs; a denial names the ACL (DESCRIBE_CONFIGS) that allows it."""
    try:
        return read_group_configs(admin, settings.group_id, settings.timeout_s)
    except Exception as exc:
        if is_denied(exc):
            raise authorization_error(
                settings, "group", settings.group_id, ("DESCRIBE_CONFIGS",),
                f"reading the configs of share group {settings.group_id!r} (lock duration, "
                "delivery limit)") from None
        raise from_client_error(
            exc, f"cannot read the configs of share group {settings.group_id!r}",
            "share groups need Apache Kafka 4.2 or newer") from exc


def set_group_configs(settings: ClientSettings, configs: Mapping[str, str], *,
                      option: str, validate_only: bool = False) -> None:
    """Set the group's configs on behalf of ``option`` (named in the error); with
    ``validate_only``, only check that the principal may (ALTER_CONFIGS) and the values."""
    try:
        write_group_configs(admin_client(settings), settings.group_id, configs,
                            settings.timeout_s, validate_only=validate_only)
    except Exception as exc:
        if is_denied(exc):
            raise authorization_error(
                settings, "group", settings.group_id, ("ALTER_CONFIGS",),
                f"option {option!r}: setting {', '.join(configs)} of share group "
                f"{settings.group_id!r}") from None
        shown = ", ".join(f"{k}={v}" for k, v in configs.items())
        raise from_client_error(
            exc, f"option {option!r}: could not set {shown} on group "
            f"{settings.group_id!r}") from exc


def latest_offsets(settings: ClientSettings, topics: Sequence[str],
                   partitions: Sequence[TopicPartition] | None = None) \
        -> dict[TopicPartition, int]:
    """High watermarks; ``partitions``: every partition of ``topics``, when the caller knows
    them (else from metadata)."""
    if partitions is None:
        md = admin_client(settings).list_topics(timeout=settings.timeout_s)
        ensure_topics(settings, topics, md)
        partitions = _of_metadata(md, topics)
    return _log_offsets(settings, partitions, "latest", settings.timeout_s)


def list_offsets(admin: Any, partitions: Iterable[TopicPartition], spec: Any,
                 timeout_s: float) -> dict[TopicPartition, int]:
    """The offset ``spec`` (a confluent-kafka ``OffsetSpec``) selects on each of
    ``partitions`` (ListOffsets through ``admin``); raises the client's error."""
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    futures = admin.list_offsets(
        {KafkaTopicPartition(tp.topic, tp.partition): spec for tp in partitions},
        request_timeout=timeout_s)
    return {TopicPartition(k.topic, k.partition): int(fut.result(timeout=timeout_s).offset)
            for k, fut in futures.items()}


def _log_offsets(settings: ClientSettings, partitions: Sequence[TopicPartition], which: str,
                 timeout_s: float) -> dict[TopicPartition, int]:
    """The ``earliest`` (log start) or ``latest`` (high watermark) offset of each of
    ``partitions`` (ListOffsets)."""
    from confluent_kafka.admin import OffsetSpec

    spec = (OffsetSpec.earliest if which == "earliest"
            else OffsetSpec.latest)()  # type: ignore[no-untyped-call]
    return list_offsets(admin_client(settings), partitions, spec, timeout_s)


def _of_metadata(md: Any, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` in the metadata ``md``."""
    return [TopicPartition(t, p) for t in topics for p in md.topics[t].partitions]


# -- the subscribed topics still exist ---------------------------------------------------------


def _missing(md: Any, topics: Sequence[str]) -> list[str]:
    """The ``topics`` the metadata ``md`` does not know (or knows as unknown)."""
    return [t for t in topics if t not in md.topics or
            (md.topics[t].error is not None and
             md.topics[t].error.name() in ("UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID"))]


def ensure_topics(settings: ClientSettings, topics: Sequence[str], md: Any = None) -> None:
    """Raise :class:`UnknownTopicError` if a subscribed topic no longer exists (read from the
    broker's metadata unless ``md`` is given). A failed metadata read raises nothing here:
    the caller's polls and lag reads report an unreachable broker."""
    if md is None:
        try:
            md = admin_client(settings).list_topics(timeout=min(settings.timeout_s,
                                                                _LAG_TIMEOUT_CAP_S))
        except Exception:  # noqa: BLE001 - unreachable: reported by the caller's own reads
            return
    gone = _missing(md, topics)
    if gone:
        names = settings.names
        raise UnknownTopicError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"option {names.topics!r} = {','.join(topics)!r}: topic {gone[0]!r} no longer "
            f"exists on {settings.bootstrap_servers} (deleted while reading it; its records "
            "and the share group's state for it are gone)",
            hint=f"Re-create the topic, or remove it from {names.topics!r}, then start again "
            "(a query restarts from its checkpoint and journal as they are)",
            from_broker=False)


@dataclass
class TopicWatch:
    """For a consumer's poll loop: polls of a deleted topic just come back empty (librdkafka
    reports no error), so once no record arrived for ``after_s`` the broker's metadata is
    checked, at most every ``every_s``; a deleted topic raises :class:`UnknownTopicError`."""

    settings: ClientSettings
    topics: Sequence[str]
    after_s: float = 1.0
    every_s: float = 2.0
    last_check: float = field(default=0.0)

    def check(self, idle_s: float) -> None:
        now = time.monotonic()
        if idle_s >= self.after_s and now - self.last_check >= self.every_s:
            self.last_check = now
            ensure_topics(self.settings, self.topics)


# -- the share group's progress (the protocol client, over the settings' security) ------------

_PROTOCOL_CLIENTS: dict[tuple[Any, ...], KafkaProtocolClient] = {}
_PROTOCOL_CLIENTS_LOCK = threading.Lock()


@contextmanager
def protocol_client(settings: ClientSettings) -> Iterator[KafkaProtocolClient]:
    """A protocol client kept open per process and connection settings (its connections are
    reused); dropped and closed after any error, so the next call reconnects."""
    connection = settings.connection
    if connection is None:
        raise LagUnavailableError("the protocol client cannot use these security settings")
    timeout = min(settings.timeout_s, _LAG_TIMEOUT_CAP_S)
    key = (settings.bootstrap_servers, timeout, settings.extra, settings.token_provider)
    with _PROTOCOL_CLIENTS_LOCK:  # the client is not thread-safe: one caller at a time
        client = _PROTOCOL_CLIENTS.pop(key, None) or \
            KafkaProtocolClient(settings.bootstrap_servers, timeout_s=timeout,
                                connection=connection)
        try:
            yield client
        except BaseException:
            client.close()
            raise
        _PROTOCOL_CLIENTS[key] = client


def _read_group_offsets(settings: ClientSettings) -> list[PartitionOffset]:
    """The group's start offsets and lags (:func:`group_offsets`); raises on any failure."""
    with protocol_client(settings) as client:
        return group_offsets(client, settings.group_id)


@dataclass(frozen=True)
class Backlog:
    """The share group's lag on the subscribed topics, as far as the broker reports it."""

    total: int | None  # None: unknown (no lag API, an error, or a partition without state)
    by_partition: dict[TopicPartition, int | None]

    @property
    def empty(self) -> bool:
        """Known to be empty: every subscribed partition has share state and lag 0."""
        return self.total == 0

    @property
    def lags(self) -> tuple[int, ...]:
        """The lag of every subscribed partition; empty when one is unknown."""
        known = tuple(n for n in self.by_partition.values() if n is not None)
        return known if len(known) == len(self.by_partition) else ()

    def _excess(self, ends: Mapping[TopicPartition, int],
                now: Mapping[TopicPartition, int]) -> list[int | None]:
        """Per partition of ``ends``: records waiting beyond those produced after ``ends``
        (``now``: current high watermarks); None where the lag or the watermark is unknown.
        The lag counts records not acknowledged for good, acquired ones too."""
        return [None if (lag := self.by_partition.get(tp)) is None or tp not in now
                else lag - max(0, now[tp] - end) for tp, end in ends.items()]

    def within(self, ends: Mapping[TopicPartition, int],
               now: Mapping[TopicPartition, int]) -> bool:
        """True when no partition has more records waiting than were produced after ``ends``
        (its high watermarks when a batch was planned): what a poll could still return
        belongs, as far as the lag tells, to a later batch."""
        return bool(ends) and all(e is not None and e <= 0 for e in self._excess(ends, now))

    def waiting_before(self, ends: Mapping[TopicPartition, int],
                       now: Mapping[TopicPartition, int]) -> bool:
        """True when some partition certainly still has records from below ``ends``: its lag
        exceeds what was produced after them. Partitions with an unknown lag or high
        watermark say nothing."""
        return any(e is not None and e > 0 for e in self._excess(ends, now))

UNKNOWN_BACKLOG = Backlog(None, {})


def read_backlog(settings: ClientSettings, topics: Sequence[str],
                 partitions: Sequence[TopicPartition] | None = None) -> Backlog:
    """Lag per subscribed partition (DescribeShareGroupOffsets).

    ``partitions``: every partition of ``topics``, when the caller knows them;
    read from the broker's metadata otherwise, and then a subscribed topic that no longer
    exists raises :class:`UnknownTopicError`. A partition without a known lag whose log is
    empty has nothing to share, and under ``earliest`` one never fetched has its whole log
    waiting (:func:`_unfetched_logs`). Any failure gives an *unknown* backlog,
    never an empty one: callers then go on polling, and polls surface real broker errors.
    """
    if partitions is None:
        partitions = _partitions(settings, topics)
        if partitions is None:
            return UNKNOWN_BACKLOG
    try:
        offsets = _read_group_offsets(settings)
    except Exception:  # noqa: BLE001 - unknown backlog: go on, polls report errors
        return UNKNOWN_BACKLOG
    lags: dict[TopicPartition, int | None] = dict.fromkeys(partitions)
    for o in offsets:
        if o.tp in lags:
            lags[o.tp] = o.lag
    unknown = [k for k, v in lags.items() if v is None]
    if unknown:
        lags.update(_unfetched_logs(settings, unknown))
    known = [v for v in lags.values() if v is not None]
    total = sum(known) if lags and len(known) == len(lags) else None
    return Backlog(total, lags)


def _partitions(settings: ClientSettings, topics: Sequence[str]) -> list[TopicPartition] | None:
    """Every partition of ``topics`` (None: the metadata could not be read);
    raises :class:`UnknownTopicError` for a topic that no longer exists."""
    try:
        md = admin_client(settings).list_topics(timeout=min(settings.timeout_s,
                                                            _LAG_TIMEOUT_CAP_S))
    except Exception:  # noqa: BLE001 - unknown backlog: go on, polls report errors
        return None
    ensure_topics(settings, topics, md)
    return _of_metadata(md, topics)


_RESET_TTL_S = 30.0
_RESETS: dict[tuple[str, str], tuple[float, str]] = {}


def _offset_reset(settings: ClientSettings, timeout_s: float) -> str:
    """The group's ``share.auto.offset.reset``, read at most every 30 s."""
    key = (settings.bootstrap_servers, settings.group_id)
    cached = _RESETS.get(key)
    if cached is not None and time.monotonic() - cached[0] < _RESET_TTL_S:
        return cached[1]
    configs = read_group_configs(admin_client(settings), settings.group_id, timeout_s)
    entry = configs.get("share.auto.offset.reset")
    value = str(entry.value) if entry is not None else "latest"
    _RESETS[key] = (time.monotonic(), value)
    return value


def _unfetched_logs(settings: ClientSettings,
                    partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
    """The lag of ``partitions`` (those without a known lag) when the group starts new
    partitions at ``earliest``: the whole log (high watermark - log start offset).

    The broker reports no lag for a partition until it has records and a member fetched
    them; before that, nothing of it was delivered, so under ``earliest`` the whole log is
    waiting (it can only over-count). Without this a topic never written to would read as
    unknown, and cost a micro-batch per trigger, for ever, and a new group's first batch
    would have no backlog to share out. With ``latest`` (the broker's default) they stay
    unknown: records that arrive while no member fetches would be skipped when the first one
    does, so batches keep members fetching.
    """
    timeout_s = min(settings.timeout_s, _LAG_TIMEOUT_CAP_S)
    try:
        if _offset_reset(settings, timeout_s) != "earliest":
            return {}
        start = _log_offsets(settings, partitions, "earliest", timeout_s)
        end = _log_offsets(settings, partitions, "latest", timeout_s)
    except Exception:  # noqa: BLE001 - stays unknown
        return {}
    return {tp: max(0, end[tp] - start[tp]) for tp in partitions if tp in start and tp in end}


def waiting_partitions(settings: ClientSettings, topics: Sequence[str]) -> str:
    """The subscribed partitions with records waiting and the group's start offset there, for
    an error message (``"orders-0 from offset 41"``); "" when they cannot be read."""
    try:
        offsets = _read_group_offsets(settings)
    except Exception:  # noqa: BLE001 - only decorates an error message
        return ""
    return ", ".join(f"{o.topic}-{o.partition}" + (
        f" from offset {o.start_offset}" if o.start_offset is not None else "")
        for o in offsets if o.topic in topics and o.lag)


def read_start_offsets(settings: ClientSettings) -> dict[TopicPartition, int] | None:
    """The group's share-partition start offsets, or None when they cannot be read
    (no share state yet, security settings the protocol client cannot use, any error)."""
    try:
        offsets = _read_group_offsets(settings)
    except Exception:  # noqa: BLE001 - unknown: keep entries until the time limit instead
        return None
    return {o.tp: o.start_offset for o in offsets if o.start_offset is not None}
