"""Administer Kafka share groups (KIP-932): list, describe, lag, reset, delete, configs.

confluent-kafka's ``AdminClient`` has no share-group APIs, so the group operations speak the
Kafka protocol directly (:mod:`pyspark_kafka_share._kafka.protocol`); group configs and the
offset look-ups of :meth:`ShareGroupAdmin.reset` use confluent-kafka. Both connect with the
same security settings (librdkafka's keys, or a Kafka ``--command-config`` properties file)::

    from pyspark_kafka_share import ConnectionConfig
    from pyspark_kafka_share.admin import ShareGroupAdmin

    with ShareGroupAdmin("localhost:9092") as admin:
        print(admin.list_groups())
        print(admin.describe("workers"))
        print(admin.total_lag("workers"))
        admin.reset("workers", "earliest")          # the group must have no members

    secured = ShareGroupAdmin("broker:9093", connection=ConnectionConfig(
        security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        username="alice", password="...", ca_file="ca.pem"))
    same = ShareGroupAdmin("broker:9093", connection={         # librdkafka's keys
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": "...", "ssl.ca.location": "ca.pem"})
    also = ShareGroupAdmin.from_properties_file("broker:9093", "client.properties")

Errors are :class:`~pyspark_kafka_share.errors.BrokerError` subclasses, from
:mod:`pyspark_kafka_share.errors`; :class:`~pyspark_kafka_share.errors.GroupNotEmptyError` is
raised when an operation needs an empty group.

A façade: what it does with Kafka is the kernel's (:mod:`pyspark_kafka_share._kafka`): the
protocol client, the group offsets and lag (``_kafka.progress``), the group configs and offset
look-ups (``_kafka.group``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal

from pyspark_kafka_share._kafka.access import probe_broker
from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.dlq import (
    DLQ_COPY_RECORD,
    DLQ_TOPIC,
    BrokerDeadLetterQueue,
    broker_dead_letter_queue,
)
from pyspark_kafka_share._kafka.group import (
    admin_client,
    list_offsets,
    read_group_configs,
    write_group_configs,
)
from pyspark_kafka_share._kafka.lines import group_config_since
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.progress import PartitionOffset, group_offsets, total_lag
from pyspark_kafka_share._kafka.protocol import KafkaProtocolClient
from pyspark_kafka_share._kafka.settings import ClientSettings, OptionNames
from pyspark_kafka_share.errors import (
    BrokerError,
    ErrorCode,
    GroupNotEmptyError,
    GroupNotFoundError,
    NotAShareGroupError,
    OptionError,
    UnknownTopicError,
    error_for,
    from_client_error,
)

__all__ = [
    "SHARE_GROUP_CONFIGS",
    "ConnectionConfig",
    "GroupDescription",
    "Member",
    "PartitionOffset",
    "ShareGroupAdmin",
]

SHARE_GROUP_CONFIGS = (
    "share.auto.offset.reset",
    "share.record.lock.duration.ms",
    "share.delivery.count.limit",
)
"""The per-group configs that shape a share group's queue behaviour (see docs/operations.md)."""

ADMIN_NAMES = OptionNames("{}", "{}", "bootstrap_servers", "group", "topics", "connection")
"""What the admin's errors call its settings: librdkafka's keys, as given in ``connection``."""

ResetTarget = Literal["earliest", "latest"] | datetime
Topics = Sequence[str] | Mapping[str, Sequence[int] | None]
"""Topic names (every partition), or ``{topic: partitions}`` (``None``: every partition)."""


@dataclass(frozen=True)
class Member:
    """One consumer of a share group and the partitions the broker assigned to it."""

    member_id: str
    client_id: str
    host: str  # as the broker reports it, e.g. "/127.0.0.1"
    assignment: dict[str, list[int]] = field(default_factory=dict)  # {topic: [partitions]}


@dataclass(frozen=True)
class GroupDescription:
    """A share group's state (``Empty``, ``Stable``, ``Dead``, ...) and live members."""

    group: str
    state: str
    members: list[Member]


class ShareGroupAdmin:
    """Share-group administration for one cluster, over any listener; not thread-safe.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        connection: how to connect and authenticate: a :class:`ConnectionConfig`, or a dict
            of librdkafka-style client settings (``security.protocol``, ``sasl.*`` with
            ``oauth_cb`` for OAUTHBEARER tokens, ``ssl.*`` with PEM files, and any other
            client setting such as ``client.id``). ``None``: plaintext. Used by the protocol
            client and the confluent-kafka ``AdminClient`` alike; secrets are never shown.
        timeout_s: bound on each operation (coordinator moves are retried within it).

    The first operation probes the bootstrap servers: a wrong password or certificate, the
    wrong security protocol, a refused connection or an unknown host fail within seconds.
    """

    option_names: ClassVar[OptionNames] = ADMIN_NAMES
    """What errors call the settings: the arguments' names (the CLI's subclass: its flags)."""

    def __init__(self, bootstrap_servers: str, *,
                 connection: ConnectionConfig | Mapping[str, Any] | None = None,
                 timeout_s: float = 30.0) -> None:
        if isinstance(connection, ConnectionConfig):
            settings = connection.client_settings()
        elif isinstance(connection, Mapping) or connection is None:
            settings = dict(connection or {})
        else:
            raise OptionError("connection", type(connection).__name__,
                              "give a ConnectionConfig, or a dict of librdkafka client settings "
                              "(security.protocol, sasl.*, ssl.*)")
        token = settings.pop("oauth_cb", None)
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self._settings = ClientSettings(
            bootstrap_servers, group_id="", timeout_s=timeout_s, token_provider=token,
            extra=tuple(sorted((str(k), str(v)) for k, v in settings.items())),
            names=self.option_names)
        self.connection = connection if isinstance(connection, ConnectionConfig) else \
            ConnectionConfig.from_client_settings({**settings, "oauth_cb": token})
        self._protocol = KafkaProtocolClient(bootstrap_servers, timeout_s=timeout_s,
                                             connection=self.connection)
        self._probed = False

    @property
    def settings(self) -> ClientSettings:
        """How this admin's clients reach the cluster (for the other clients of a command:
        ``kafka-share dlq replay`` reads and produces with the same security settings)."""
        return self._settings

    @classmethod
    def from_properties_file(cls, bootstrap_servers: str, path: str | os.PathLike[str], *,
                             timeout_s: float = 30.0) -> ShareGroupAdmin:
        """An admin configured by a Kafka client properties file, as Kafka's
        ``kafka-share-groups.sh --command-config`` takes it (``sasl.jaas.config`` for PLAIN
        and SCRAM is translated; Java-only settings raise an :class:`OptionError` naming the
        librdkafka equivalent)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise OptionError("command-config", str(path),
                              f"cannot read it ({exc.strerror or exc}): give the path of a "
                              "Java properties file of client settings") from None
        _connection, settings = ConnectionConfig.from_properties(text)
        return cls(bootstrap_servers, connection=settings, timeout_s=timeout_s)

    @property
    def _client(self) -> KafkaProtocolClient:
        """The protocol client, after one probe of the bootstrap servers (errors in seconds)."""
        if not self._probed:
            probe_broker(self._settings)
            self._probed = True
        return self._protocol

    def __enter__(self) -> ShareGroupAdmin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the protocol sockets (the confluent-kafka client is shared per process)."""
        self._protocol.close()

    # -- watching ----------------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        """The ids of every share group in the cluster, sorted (ListGroups v5, type "share")."""
        return [g.group_id for g in self._client.list_groups(types=("share",))]

    def group_type(self, group: str) -> str | None:
        """The type of the group named ``group`` (``share``, ``classic``, ``consumer``,
        ``streams``), or ``None`` if there is no group of that name (ListGroups v5)."""
        for listed in self._client.list_groups(types=()):
            if listed.group_id == group:
                return listed.group_type or None
        return None

    def describe(self, group: str) -> GroupDescription:
        """The group's state and its members with their assignments (ShareGroupDescribe).

        Raises :class:`GroupNotFoundError` if no share group of that name exists, and its
        subclass :class:`NotAShareGroupError` if the name is taken by a group of another type.
        """
        try:
            described = self._client.describe_share_group(group)
        except GroupNotFoundError as exc:
            self._raise_if_other_type(exc, group)
            raise
        members = []
        for m in described.members:
            assignment: dict[str, list[int]] = {}
            for a in m.assignment:
                assignment.setdefault(a.topic, []).extend(a.partitions)
            members.append(Member(m.member_id, m.client_id, m.client_host,
                                  {t: sorted(p) for t, p in sorted(assignment.items())}))
        members.sort(key=lambda m: m.member_id)
        return GroupDescription(described.group_id, described.state, members)

    def offsets(self, group: str) -> list[PartitionOffset]:
        """Start offset and lag of every partition the group has share state for.

        Sorted by topic and partition. An unknown group has none (an empty list).
        """
        return group_offsets(self._client, group)

    def total_lag(self, group: str, offsets: list[PartitionOffset] | None = None) -> int:
        """The sum of :meth:`offsets` lags: records of the group not yet acknowledged for good.

        Pass ``offsets`` already fetched to save a request. Partitions without share state
        yet (lag ``None``) are not counted. Raises :class:`LagUnavailableError` if the broker
        does not report lag at all.
        """
        return total_lag(self._client, self.offsets(group) if offsets is None else offsets)

    def end_offsets(self, topics: Sequence[str]) -> dict[str, dict[int, int]]:
        """The end offset of every partition of ``topics``, ``{topic: {partition: offset}}``
        (ListOffsets latest); an unknown topic raises :class:`UnknownTopicError`."""
        return self._resolve(self._topic_partitions(_topic_selection(topics)), "latest")

    # -- changing ----------------------------------------------------------------------------

    def plan_reset(self, group: str, to: ResetTarget,
                   topics: Topics | None = None) -> dict[str, dict[int, int]]:
        """The start offsets :meth:`reset` would set, ``{topic: {partition: offset}}``.

        ``topics=None`` means every partition the group has share state for; naming topics
        resets all of their partitions, and ``{topic: [partitions]}`` only those (``None`` for
        all of a topic's). Nothing is changed.
        """
        target = _check_target(to)
        if topics is None:
            partitions = [o.tp for o in self.offsets(group)]
            if not partitions:
                raise OptionError("topics", None, f"share group {group!r} has no offsets yet; "
                                  "name the topics to reset")
        else:
            partitions = self._topic_partitions(_topic_selection(topics))
        return self._resolve(partitions, target)

    def reset(self, group: str, to: ResetTarget,
              topics: Topics | None = None) -> dict[str, dict[int, int]]:
        """Move the group's start offsets to ``"earliest"``, ``"latest"`` or a time.

        A timezone-aware ``datetime`` selects, per partition, the first record at or after
        it (the end of the partition if there is none). ``topics`` as for :meth:`plan_reset`.
        The group must have no members: otherwise :class:`GroupNotEmptyError`. A group that
        does not exist yet is created; a group of another type raises
        :class:`NotAShareGroupError`. Returns the offsets set, ``{topic: {partition: offset}}``.
        """
        plan = self.plan_reset(group, to, topics)
        what = _describe_target(to)
        try:
            result = self._client.alter_share_group_offsets(group, plan)
        except GroupNotEmptyError as exc:
            raise self._not_empty(exc, group, f"cannot reset share group {group!r} to "
                                  f"{what}") from exc
        except GroupNotFoundError as exc:
            self._raise_if_other_type(exc, group)
            raise
        failed = [(t.topic, p) for t in result.topics for p in t.partitions if p.error_code]
        if failed:
            topic, p = failed[0]
            more = f" (and {len(failed) - 1} more partitions)" if len(failed) > 1 else ""
            raise error_for(p.error_code, f"resetting share group {group!r} on "
                            f"{topic}-{p.partition} to {what}{more}", p.error_message)
        return plan

    def delete_offsets(self, group: str, topics: Sequence[str]) -> None:
        """Forget the group's share state for ``topics`` (DeleteShareGroupOffsets).

        The group must have no members (:class:`GroupNotEmptyError`). Consumption of those
        topics later starts again from ``share.auto.offset.reset``.
        """
        if isinstance(topics, str) or not topics:
            raise OptionError("topics", topics, "give a non-empty list of topic names")
        try:
            result = self._client.delete_share_group_offsets(group, list(topics))
        except GroupNotEmptyError as exc:
            raise self._not_empty(exc, group, f"cannot delete the offsets of share group "
                                  f"{group!r}") from exc
        except GroupNotFoundError as exc:
            self._raise_if_other_type(exc, group)
            raise
        failed = [t for t in result.topics if t.error_code]
        if failed:
            t = failed[0]
            raise error_for(t.error_code, f"deleting the offsets of share group {group!r} "
                            f"for topic {t.topic!r}", t.error_message)

    def delete_group(self, group: str) -> None:
        """Delete the share group and its state (DeleteGroups); it must have no members.

        DeleteGroups deletes groups of any type, so the group is first described as a share
        group: a consumer group of that name raises :class:`NotAShareGroupError` and is left
        alone; an unknown group raises :class:`GroupNotFoundError`.
        """
        self.describe(group)
        try:
            self._client.delete_group(group)
        except GroupNotEmptyError as exc:
            raise self._not_empty(exc, group, f"cannot delete share group {group!r}") from exc

    def _not_empty(self, exc: GroupNotEmptyError, group: str, context: str) -> GroupNotEmptyError:
        """The broker's NON_EMPTY_GROUP, restated with the number of live members if known."""
        try:
            count = len(self._client.describe_share_group(group).members)
            context += f": the group is not empty, it has {count} member(s)"
        except BrokerError:
            context += ": the group is not empty"
        return GroupNotEmptyError(exc.code, context, exc.broker_message)

    def _raise_if_other_type(self, exc: GroupNotFoundError, group: str) -> None:
        """Raise :class:`NotAShareGroupError` for ``exc`` if ``group`` is a group of another
        type (the broker answers GROUP_ID_NOT_FOUND for both); return if it does not exist."""
        if isinstance(exc, NotAShareGroupError):
            raise exc
        try:
            kind = self.group_type(group)
        except BrokerError:
            return  # the original error stands
        if kind is not None and kind != "share":
            raise NotAShareGroupError(
                exc.code, f"{group!r} is a {kind} group, not a share group",
                exc.broker_message) from exc

    # -- configs -----------------------------------------------------------------------------

    def get_config(self, group: str) -> dict[str, str]:
        """The group's ``share.*`` configs (defaults included), ``{name: value}``."""
        return {name: str(entry.value) for name, entry in sorted(self._configs(group).items())
                if name.startswith("share.") and entry.value is not None}

    def plan_config(self, group: str,
                    changes: Mapping[str, str | int]) -> dict[str, tuple[str | None, str]]:
        """``{key: (current value, new value)}`` for :meth:`set_configs`; nothing is changed.

        Each key must be a ``share.*`` group config this broker knows (it describes every
        one, defaults included): a key of a later Apache Kafka line (e.g.
        ``share.delivery.count.limit`` on 4.2) raises an :class:`OptionError` saying which
        line added it (:mod:`pyspark_kafka_share._kafka.lines`).
        """
        known = self._configs(group)
        plan: dict[str, tuple[str | None, str]] = {}
        for key, value in changes.items():
            if not key.startswith("share."):
                raise OptionError("key", key, "give a share-group config (share.*); the "
                                  "dead-letter queue's have their own command (groups dlq, "
                                  "set_dead_letter_queue)")
            if key not in known:
                shown = ", ".join(k for k in sorted(known) if k.startswith("share."))
                raise OptionError("key", key, f"the broker at {self.bootstrap_servers} does "
                                  f"not know this group config: {group_config_since(key)}; "
                                  f"it knows {shown}")
            current = known[key].value
            plan[key] = (None if current is None else str(current), str(value))
        return plan

    def set_config(self, group: str, key: str, value: str | int) -> None:
        """Set one group config, e.g. ``share.record.lock.duration.ms`` (used for later deliveries).

        The broker rejects unknown keys and out-of-range values (a :class:`BrokerError`).
        """
        if not key:
            raise OptionError("key", key, "give a config name such as share.auto.offset.reset")
        self.set_configs(group, {key: value})

    def set_configs(self, group: str, changes: Mapping[str, str | int], *,
                    validate_only: bool = False) -> None:
        """Set group configs in one request; ``validate_only``: the broker checks the keys,
        the values and the permission (ALTER_CONFIGS on the group) and changes nothing."""
        what = ", ".join(f"{k}={v}" for k, v in changes.items())
        try:
            write_group_configs(self._admin_client(), group, changes, self.timeout_s,
                                validate_only=validate_only)
        except Exception as exc:
            raise from_client_error(exc, f"cannot set {what} on group {group!r}") from exc

    def _configs(self, group: str) -> dict[str, Any]:
        """The group's configs as the broker describes them, ``{name: ConfigEntry}``."""
        try:
            return read_group_configs(self._admin_client(), group, self.timeout_s)
        except Exception as exc:
            raise from_client_error(exc, f"cannot read the configs of group {group!r}") from exc

    # -- the broker's dead-letter queue (KIP-1191, Kafka 4.4+; docs/compatibility.md) ------

    def dead_letter_queue(self, group: str) -> BrokerDeadLetterQueue:
        """Whether and where the broker dead-letters ``group``'s REJECTed records."""
        return broker_dead_letter_queue(self._configs(group), self._client.finalized_features())

    def set_dead_letter_queue(self, group: str, topic: str | None, *,
                              copy_record: bool | None = None) -> BrokerDeadLetterQueue:
        """Point the broker's dead-letter queue of ``group`` at ``topic`` (``None``: off);
        ``copy_record``: copy the records too, not only the context headers. The topic needs
        ``errors.deadletterqueue.group.enable=true`` (and, by default, a name ``dlq.*``)."""
        current = self.dead_letter_queue(group)
        if not current.supported:
            raise OptionError("topic", topic, f"the broker's dead-letter queue is "
                              f"{current.describe()}")
        configs: dict[str, str] = {DLQ_TOPIC: topic or ""}
        if copy_record is not None:
            configs[DLQ_COPY_RECORD] = "true" if copy_record else "false"
        try:
            write_group_configs(self._admin_client(), group, configs, self.timeout_s)
        except Exception as exc:
            raise from_client_error(
                exc, f"cannot set the dead-letter queue of group {group!r} to {topic!r}") from exc
        return self.dead_letter_queue(group)

    # -- helpers -----------------------------------------------------------------------------

    def _admin_client(self) -> Any:
        self._client  # noqa: B018 - probes once: errors in seconds, not the timeout
        return admin_client(self._settings)

    def _topic_partitions(self, topics: dict[str, list[int] | None]) -> list[TopicPartition]:
        """The partitions of the selection; unknown topics and partitions raise
        :class:`UnknownTopicError`."""
        try:
            md = self._admin_client().list_topics(timeout=self.timeout_s)
        except Exception as exc:
            raise from_client_error(
                exc, f"cannot read topic metadata from {self.bootstrap_servers}") from exc
        out: list[TopicPartition] = []
        for topic, wanted in topics.items():
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None:
                raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r}",
                                None if meta is None else str(meta.error))
            have = sorted(meta.partitions)
            missing = sorted(set(wanted or ()) - set(have))
            if missing:
                raise UnknownTopicError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has no partition {', '.join(map(str, missing))} (its "
                    f"partitions are {have[0]}..{have[-1]})", from_broker=False)
            out.extend(TopicPartition(topic, p)
                       for p in (have if wanted is None else sorted(set(wanted))))
        return out

    def _resolve(self, partitions: list[TopicPartition],
                 target: Literal["earliest", "latest"] | int) -> dict[str, dict[int, int]]:
        """Offsets for ``target`` (a spec name or a timestamp in ms) via ListOffsets."""
        from confluent_kafka.admin import OffsetSpec

        if target == "earliest":
            spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        elif target == "latest":
            spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        else:
            spec = OffsetSpec.for_timestamp(target)
        found = self._list_offsets(partitions, spec)
        beyond = [tp for tp, offset in found.items() if offset < 0]
        if beyond:  # no record at or after the timestamp: the end of the partition
            latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
            found.update(self._list_offsets(beyond, latest))
        out: dict[str, dict[int, int]] = {}
        for (topic, partition), offset in sorted(found.items()):
            out.setdefault(topic, {})[partition] = offset
        return out

    def _list_offsets(self, partitions: list[TopicPartition],
                      spec: Any) -> dict[TopicPartition, int]:
        try:
            return list_offsets(self._admin_client(), partitions, spec, self.timeout_s)
        except Exception as exc:
            raise from_client_error(
                exc, f"cannot look up offsets on {self.bootstrap_servers}") from exc


def _topic_selection(topics: Topics) -> dict[str, list[int] | None]:
    """``topics`` as ``{topic: sorted partitions, or None for all}``; raises OptionError."""
    if isinstance(topics, str) or not topics:
        raise OptionError("topics", topics, "give a non-empty list of topic names or a "
                          "{topic: [partitions]} mapping")
    if not isinstance(topics, Mapping):
        return dict.fromkeys(topics)
    out: dict[str, list[int] | None] = {}
    for topic, parts in topics.items():
        if parts is not None and (isinstance(parts, str) or not parts or any(
                not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in parts)):
            raise OptionError("topics", dict(topics), f"the partitions of {topic!r} must be a "
                              "non-empty list of partition numbers (>= 0), or None for all")
        out[topic] = None if parts is None else sorted(set(parts))
    return out


def _check_target(to: object) -> Literal["earliest", "latest"] | int:
    if to in ("earliest", "latest"):
        return "earliest" if to == "earliest" else "latest"
    if isinstance(to, datetime):
        if to.tzinfo is None or to.utcoffset() is None:
            raise OptionError("to", to, "give a timezone-aware datetime (e.g. with "
                              "tzinfo=timezone.utc), 'earliest' or 'latest'")
        return int(to.timestamp() * 1000)
    raise OptionError("to", to, "give 'earliest', 'latest' or a timezone-aware datetime")


def _describe_target(to: ResetTarget) -> str:
    return to.isoformat() if isinstance(to, datetime) else to

