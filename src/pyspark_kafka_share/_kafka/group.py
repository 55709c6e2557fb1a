"""The share group and its topics, as the broker sees them: checks done before a query or a
worker job starts, the group's configs, its backlog (lag) and start offsets.

Clients are cached per process: the driver asks on every trigger, and a new client costs a
connection and a metadata round trip (~60 ms measured), a cached one ~1 ms. Every call is
bounded by the settings' timeout; every failure is a :class:`BrokerError`, never "no data".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark_kafka_share._kafka.protocol import api_versions
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import BrokerError, from_client_error

__all__ = [
    "Backlog",
    "BrokerFacts",
    "admin_client",
    "inspect_broker",
    "latest_offsets",
    "read_backlog",
    "read_group_configs",
    "read_start_offsets",
    "write_group_configs",
]

_SHARE_GROUP_HEARTBEAT = 76
_SHARE_FETCH = 78
_LAG_TIMEOUT_CAP_S = 5.0  # a lag read is an optimisation: never wait long for it


@dataclass(frozen=True)
class BrokerFacts:
    partitions: dict[str, int]
    lock_ms: int
    delivery_limit: int


_ADMINS: dict[tuple[tuple[str, str], ...], Any] = {}
_ADMINS_LOCK = threading.Lock()


def admin_client(settings: ClientSettings) -> Any:
    """A confluent-kafka ``AdminClient`` for ``settings``, shared within the process."""
    from confluent_kafka.admin import AdminClient

    conf = settings.admin()
    key = tuple(sorted(conf.items()))
    with _ADMINS_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            admin = _ADMINS[key] = AdminClient(dict(conf))
        return admin


def read_group_configs(admin: Any, group: str, timeout_s: float) -> dict[str, Any]:
    """The group's configs, ``{name: ConfigEntry}`` (defaults included)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.GROUP, group)
    future = next(iter(admin.describe_configs([resource],
                                              request_timeout=timeout_s).values()))
    return dict(future.result(timeout=timeout_s))


def write_group_configs(admin: Any, group: str, configs: Mapping[str, str | int],
                        timeout_s: float) -> None:
    """Set group configs (``incrementalAlterConfigs`` SET); raises the client's error."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(key, str(value), incremental_operation=AlterConfigOpType.SET)
        for key, value in configs.items()])
    for fut in admin.incremental_alter_configs([resource], request_timeout=timeout_s).values():
        fut.result(timeout=timeout_s)


def inspect_broker(settings: ClientSettings, topics: Sequence[str], *,
                   bootstrap_name: str = "kafka.bootstrap.servers",
                   topics_name: str = "subscribe") -> BrokerFacts:
    """Check reachability, topics and share-group support; read the group's lock settings.

    ``bootstrap_name``/``topics_name``: what errors call those settings (option or argument).
    """
    timeout = settings.timeout_s
    admin = admin_client(settings)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception as exc:
        raise from_client_error(
            exc, f"option {bootstrap_name!r} = {settings.bootstrap_servers!r}: no broker "
            f"answered within {timeout:.0f}s",
            "Check the address, the network and the security settings") from exc
    missing = [t for t in topics if t not in md.topics or md.topics[t].error is not None]
    if missing:
        raise BrokerError(
            f"option {topics_name!r} = {','.join(topics)!r}: topic(s) {missing} do not exist "
            f"on {settings.bootstrap_servers}. Create them first (share consumers do not "
            "create topics)"
        )
    _check_share_support(settings, md, timeout)
    try:
        configs = read_group_configs(admin, settings.group_id, timeout)
    except Exception as exc:
        raise from_client_error(
            exc, f"cannot read the configs of share group {settings.group_id!r}",
            "share groups need Apache Kafka 4.2 or newer") from exc
    if "share.record.lock.duration.ms" not in configs:
        raise BrokerError(
            f"the broker at {settings.bootstrap_servers} has no share-group configs: share "
            "groups need Apache Kafka 4.2 or newer (or share.version=1 enabled on 4.0/4.1)"
        )
    limit_entry = configs.get("share.delivery.count.limit")
    return BrokerFacts(
        partitions={t: len(md.topics[t].partitions) for t in topics},
        lock_ms=int(configs["share.record.lock.duration.ms"].value),
        delivery_limit=int(limit_entry.value) if limit_entry is not None else 5,
    )


def _check_share_support(settings: ClientSettings, md: Any, timeout: float) -> None:
    if not settings.plaintext:
        return  # the raw ApiVersions probe speaks plaintext only; the config check follows
    broker = next(iter(md.brokers.values()))
    try:
        versions = api_versions(broker.host, broker.port, timeout)
    except (OSError, BrokerError):
        return  # reachability was proven above; the group-config check decides
    if _SHARE_FETCH not in versions or _SHARE_GROUP_HEARTBEAT not in versions \
            or versions[_SHARE_FETCH][1] < 1:
        raise BrokerError(
            f"the broker at {broker.host}:{broker.port} does not support share groups "
            "(no ShareFetch v1 / ShareGroupHeartbeat API): Apache Kafka 4.2 or newer is needed"
        )


def set_group_configs(settings: ClientSettings, configs: Mapping[str, str], *,
                      option: str) -> None:
    """Set the group's configs on behalf of ``option`` (named in the error)."""
    try:
        write_group_configs(admin_client(settings), settings.group_id, configs,
                            settings.timeout_s)
    except Exception as exc:
        shown = ", ".join(f"{k}={v}" for k, v in configs.items())
        raise from_client_error(
            exc, f"option {option!r}: could not set {shown} on group "
            f"{settings.group_id!r}") from exc


def latest_offsets(settings: ClientSettings, topics: Sequence[str]) -> dict[str, int]:
    """High watermarks, as {"topic:partition": offset}."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = admin_client(settings)
    md = admin.list_topics(timeout=settings.timeout_s)
    request = {TopicPartition(t, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
               for t in topics for p in md.topics[t].partitions}
    return {f"{tp.topic}:{tp.partition}": fut.result(timeout=settings.timeout_s).offset
            for tp, fut in admin.list_offsets(request).items()}


# -- the share group's progress (the protocol client; plaintext listeners only) ---------------

_GROUP_ADMINS: dict[tuple[str, float], Any] = {}
_GROUP_ADMINS_LOCK = threading.Lock()


@contextmanager
def _group_admin(settings: ClientSettings) -> Iterator[Any]:
    """A ``ShareGroupAdmin`` kept open per process (its connections are reused); dropped and
    closed after any error, so the next call reconnects."""
    from pyspark_kafka_share.admin import ShareGroupAdmin

    key = (settings.bootstrap_servers, min(settings.timeout_s, _LAG_TIMEOUT_CAP_S))
    with _GROUP_ADMINS_LOCK:  # the client is not thread-safe: one caller at a time
        admin = _GROUP_ADMINS.pop(key, None) or ShareGroupAdmin(key[0], timeout_s=key[1])
        try:
            yield admin
        except BaseException:
            admin.close()
            raise
        _GROUP_ADMINS[key] = admin


@dataclass(frozen=True)
class Backlog:
    """The share group's lag on the subscribed topics, as far as the broker reports it."""

    total: int | None  # None: unknown (no lag API, an error, or a partition without state)
    by_partition: dict[str, int | None]

    @property
    def empty(self) -> bool:
        """Known to be empty: every subscribed partition has share state and lag 0."""
        return self.total == 0


UNKNOWN_BACKLOG = Backlog(None, {})


def read_backlog(settings: ClientSettings, topics: Sequence[str],
                 partitions: Sequence[str] | None = None) -> Backlog:
    """Lag per subscribed partition (DescribeShareGroupOffsets).

    ``partitions``: every ``"topic:partition"`` of ``topics``, when the caller knows them;
    read from the broker's metadata otherwise. Any failure gives an *unknown* backlog, never
    an empty one: callers then go on polling, and polls surface real broker errors.
    """
    if not settings.plaintext:
        return UNKNOWN_BACKLOG
    try:
        with _group_admin(settings) as admin:
            offsets = admin.offsets(settings.group_id)
        if partitions is None:
            md = admin_client(settings).list_topics(timeout=settings.timeout_s)
            partitions = [f"{t}:{p}" for t in topics
                          for p in (md.topics[t].partitions if t in md.topics else {})]
    except Exception:  # noqa: BLE001 - unknown backlog: go on, polls report errors
        return UNKNOWN_BACKLOG
    lags: dict[str, int | None] = dict.fromkeys(partitions)
    for o in offsets:
        key = f"{o.topic}:{o.partition}"
        if key in lags:
            lags[key] = o.lag
    known = [v for v in lags.values() if v is not None]
    total = sum(known) if lags and len(known) == len(lags) else None
    return Backlog(total, lags)


def read_start_offsets(settings: ClientSettings) -> dict[str, int] | None:
    """The group's share-partition start offsets {"topic:partition": offset}, or None when
    they cannot be read (non-plaintext listener, no share state yet, any error)."""
    if not settings.plaintext:
        return None
    try:
        with _group_admin(settings) as admin:
            offsets = admin.offsets(settings.group_id)
    except Exception:  # noqa: BLE001 - unknown: keep entries until the time limit instead
        return None
    return {f"{o.topic}:{o.partition}": o.start_offset for o in offsets
            if o.start_offset is not None}
