"""Driver-side broker checks and look-ups, bounded in time, done before a query starts."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pyspark_kafka_share._kafka.protocol import api_versions
from pyspark_kafka_share.errors import BrokerError
from pyspark_kafka_share.source.options import SourceOptions

__all__ = ["BrokerFacts", "api_versions", "inspect_broker", "latest_offsets"]

_SHARE_GROUP_HEARTBEAT = 76
_SHARE_FETCH = 78


@dataclass(frozen=True)
class BrokerFacts:
    partitions: dict[str, int]
    lock_ms: int
    delivery_limit: int


_ADMINS: dict[tuple[tuple[str, str], ...], Any] = {}
_ADMINS_LOCK = threading.Lock()


def _admin(opts: SourceOptions) -> Any:
    """An AdminClient for ``opts``, shared within the process.

    The driver-side source process is long-lived and asks the broker on every trigger; a new
    client costs a connection and a metadata round trip (~60 ms measured), a cached one ~1 ms.
    """
    from confluent_kafka.admin import AdminClient

    conf: dict[str, str] = dict(opts.admin_config())
    conf.setdefault("socket.timeout.ms", str(opts.broker_timeout_ms))
    key = tuple(sorted(conf.items()))
    with _ADMINS_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            admin = _ADMINS[key] = AdminClient(dict(conf))
        return admin


def inspect_broker(opts: SourceOptions, *, bootstrap_name: str = "kafka.bootstrap.servers",
                   topics_name: str = "subscribe") -> BrokerFacts:
    """Check reachability, topics and share-group support; read the group's lock settings.

    ``bootstrap_name``/``topics_name``: what errors call those settings (option or argument).
    """
    from confluent_kafka.admin import ConfigResource, ResourceType

    timeout = opts.broker_timeout_ms / 1000
    admin = _admin(opts)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception as exc:
        raise BrokerError(
            f"option {bootstrap_name!r} = {opts.bootstrap_servers!r}: no broker answered "
            f"within brokerTimeoutMs={opts.broker_timeout_ms} ({exc}). Check the address, the "
            "network and the kafka.security.* settings"
        ) from exc
    missing = [t for t in opts.topics if t not in md.topics or md.topics[t].error is not None]
    if missing:
        raise BrokerError(
            f"option {topics_name!r} = {','.join(opts.topics)!r}: topic(s) {missing} do not exist "
            f"on {opts.bootstrap_servers}. Create them first (share consumers do not create "
            "topics)"
        )
    _check_share_support(opts, md, timeout)
    resource = ConfigResource(ResourceType.GROUP, opts.group_id)
    try:
        configs = next(iter(admin.describe_configs([resource]).values())).result(timeout=timeout)
    except Exception as exc:
        raise BrokerError(
            f"cannot read the configs of share group {opts.group_id!r} ({exc}); share groups "
            "need Apache Kafka 4.2 or newer"
        ) from exc
    if "share.record.lock.duration.ms" not in configs:
        raise BrokerError(
            f"the broker at {opts.bootstrap_servers} has no share-group configs: share groups "
            "need Apache Kafka 4.2 or newer (or share.version=1 enabled on 4.0/4.1)"
        )
    lock_ms = int(configs["share.record.lock.duration.ms"].value)
    limit_entry = configs.get("share.delivery.count.limit")
    delivery_limit = int(limit_entry.value) if limit_entry is not None else 5
    return BrokerFacts(
        partitions={t: len(md.topics[t].partitions) for t in opts.topics},
        lock_ms=lock_ms, delivery_limit=delivery_limit,
    )


def _check_share_support(opts: SourceOptions, md: Any, timeout: float) -> None:
    conf = dict(opts.client_config)
    if conf.get("security.protocol", "PLAINTEXT").upper() != "PLAINTEXT":
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


def set_starting_offsets(opts: SourceOptions) -> None:
    """Set the group's ``share.auto.offset.reset`` from ``startingOffsets``."""
    if opts.starting_offsets is None:
        return
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = _admin(opts)
    resource = ConfigResource(ResourceType.GROUP, opts.group_id, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", opts.starting_offsets,
                    incremental_operation=AlterConfigOpType.SET)])
    try:
        for fut in admin.incremental_alter_configs([resource]).values():
            fut.result(timeout=opts.broker_timeout_ms / 1000)
    except Exception as exc:
        raise BrokerError(
            f"option 'startingOffsets': could not set share.auto.offset.reset="
            f"{opts.starting_offsets} on group {opts.group_id!r}: {exc}"
        ) from exc


def latest_offsets(opts: SourceOptions) -> dict[str, int]:
    """High watermarks, as {"topic:partition": offset}."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(opts)
    md = admin.list_topics(timeout=opts.broker_timeout_ms / 1000)
    request = {TopicPartition(t, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
               for t in opts.topics for p in md.topics[t].partitions}
    out: dict[str, int] = {}
    for tp, fut in admin.list_offsets(request).items():
        out[f"{tp.topic}:{tp.partition}"] = fut.result(
            timeout=opts.broker_timeout_ms / 1000).offset
    return out


@dataclass(frozen=True)
class Backlog:
    """The share group's lag on the subscribed topics, as far as the broker reports it."""

    total: int | None  # None: unknown (no lag API, an error, or a partition without state)
    by_partition: dict[str, int | None]

    @property
    def empty(self) -> bool:
        """Known to be empty: every subscribed partition has share state and lag 0."""
        return self.total == 0


def read_backlog(opts: SourceOptions) -> Backlog:
    """Lag per subscribed partition via DescribeShareGroupOffsets (bounded by brokerTimeoutMs).

    Any failure gives an *unknown* backlog, never an empty one: the source then plans a
    batch, whose tasks surface a real broker error.
    """
    from pyspark_kafka_share.admin import ShareGroupAdmin

    conf = dict(opts.client_config)
    if conf.get("security.protocol", "PLAINTEXT").upper() != "PLAINTEXT":
        return Backlog(None, {})
    try:
        with ShareGroupAdmin(opts.bootstrap_servers,
                             timeout_s=min(opts.broker_timeout_ms / 1000, 10.0)) as admin:
            offsets = admin.offsets(opts.group_id)
            metadata = _admin(opts).list_topics(timeout=opts.broker_timeout_ms / 1000)
    except Exception:  # noqa: BLE001 - unknown backlog: plan a batch, tasks report errors
        return Backlog(None, {})
    lags: dict[str, int | None] = {
        f"{t}:{p}": None for t in opts.topics
        for p in (metadata.topics[t].partitions if t in metadata.topics else {})}
    for o in offsets:
        key = f"{o.topic}:{o.partition}"
        if key in lags:
            lags[key] = o.lag
    known = [v for v in lags.values() if v is not None]
    total = sum(known) if lags and len(known) == len(lags) else None
    return Backlog(total, lags)


def read_start_offsets(opts: SourceOptions) -> dict[str, int] | None:
    """The group's share-partition start offsets {"topic:partition": offset}, or None when
    they cannot be read (non-plaintext listener, no share state yet, any error)."""
    from pyspark_kafka_share.admin import ShareGroupAdmin

    conf = dict(opts.client_config)
    if conf.get("security.protocol", "PLAINTEXT").upper() != "PLAINTEXT":
        return None
    try:
        with ShareGroupAdmin(opts.bootstrap_servers,
                             timeout_s=min(opts.broker_timeout_ms / 1000, 10.0)) as admin:
            offsets = admin.offsets(opts.group_id)
    except Exception:  # noqa: BLE001 - unknown: keep entries until the time limit instead
        return None
    return {f"{o.topic}:{o.partition}": o.start_offset for o in offsets
            if o.start_offset is not None}
