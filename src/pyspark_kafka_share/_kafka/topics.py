"""A share group's own topics: named from the group and a purpose, created or checked here.

The workers keep two topics per share group, beside the user's: the **control topic**
(``kafka-share-control.<group>``, :data:`CONTROL`; drivers the tasks cannot reach) and the
**marker topic** (``kafka-share-markers.<group>``, :data:`MARKERS`; exactly-once outputs).
Both are named by :func:`group_topic_name` and made ready by :func:`ensure_group_topic`:
listed, created when missing (another creator winning the race is fine), waited for until
every partition has a leader, their configs judged (the marker topic must be compacted).
A missing ACL is one :class:`AuthorizationError` (:func:`topic_denied`) naming the topic, the
operation, the user's option and the grant that fixes it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.access import authorization_error
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    OptionError,
    from_client_error,
    is_already_exists,
    is_denied,
    is_unknown_topic,
)

__all__ = ["CONTROL", "MARKERS", "GroupTopic", "ensure_group_topic", "group_topic_name",
           "topic_denied", "topic_prefix"]

_log = logging.getLogger(__name__)

_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")
_MAX_PLAIN = 200  # a group name longer than this is cut and hashed (topic names: <= 249)
_KEPT = 180  # characters of the name kept before the hash
_DIGEST = 12  # hex digits of SHA-256 of the group's name


def topic_prefix(purpose: str) -> str:
    """What every group's topic of ``purpose`` starts with: ``kafka-share-<purpose>.``."""
    return f"kafka-share-{purpose}."


def group_topic_name(group: str, purpose: str) -> str:
    """``kafka-share-<purpose>.<group>``; a group name with characters a topic name cannot
    hold, or longer than 200 characters, becomes its first 180 characters (those characters
    replaced by ``_``), ``-`` and 12 hex digits of its SHA-256 (the marker topic's names since
    exactly-once outputs exist: a running job's markers stay where they are)."""
    slug = _ILLEGAL.sub("_", group)
    if slug != group or len(slug) > _MAX_PLAIN:
        slug = f"{slug[:_KEPT]}-{hashlib.sha256(group.encode()).hexdigest()[:_DIGEST]}"
    return topic_prefix(purpose) + slug


@dataclass(frozen=True)
class GroupTopic:
    """One kind of a group's own topic: how it is named, created and judged."""

    purpose: str
    """The name's part after ``kafka-share-`` (:func:`group_topic_name`)."""
    what: str
    """What errors call it (``the workers' control topic``)."""
    option: str
    """The user's option that asks for it (named in errors)."""
    partitions: int
    config: Mapping[str, str]
    uses: tuple[str, ...]
    """The operations its users need (named when the listing shows it denied)."""
    beforehand: str
    """How to create it by hand (the fix of a denied CREATE)."""
    fix: str = ""
    """The fix of any other failure to create or describe it."""
    check: Callable[[str, str, Mapping[str, Any]], None] | None = field(default=None)
    """Judges the topic's configs (``topic, option, configs``); raises :class:`OptionError`."""


def _compacted(topic: str, option: str, configs: Mapping[str, Any]) -> None:
    policy = str(configs["cleanup.policy"].value) if "cleanup.policy" in configs else ""
    if "compact" not in policy or "delete" in policy:
        raise OptionError(option, True, f"the marker topic {topic!r} has cleanup.policy="
                          f"{policy!r}: markers would be deleted by retention while records "
                          "they cover can still be redelivered. Set cleanup.policy=compact on "
                          "it (or delete it: the workers create it)")


CONTROL = GroupTopic(
    "control", "the workers' control topic", "control_topic", 2,
    # Control messages matter for seconds.
    {"cleanup.policy": "delete", "retention.ms": "3600000", "segment.ms": "600000"},
    ("Read", "Write"), "2 partitions and retention.ms=3600000",
    fix="Create it beforehand (2 partitions), or name another with control_topic")
"""The workers' control channel over Kafka (``workers.control_kafka``)."""

MARKERS = GroupTopic(
    "markers", "the workers' marker topic", "exactly_once_outputs", 1,
    {"cleanup.policy": "compact",
     # Compaction only cleans closed segments: roll them often, so that markers and their
     # tombstones do not pile up for the broker default of 7 days.
     "segment.ms": "600000", "delete.retention.ms": "3600000",
     "min.cleanable.dirty.ratio": "0.1"},
    ("Read", "Write"), "compacted, one partition",
    fix="Grant the workers' principal CREATE (or create the topic, compacted) and "
    "DESCRIBE_CONFIGS on it; see docs/workers.md, exactly-once outputs",
    check=_compacted)
"""The workers' exactly-once markers (``workers.exactly_once``)."""


def topic_denied(settings: ClientSettings, topic: str, operations: tuple[str, ...],
                 what: str, option: str) -> AuthorizationError:
    """The one error for a denied operation on a group's own topic."""
    return authorization_error(settings, "topic", topic, operations, f"{what} ({option})",
                               code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)


def ensure_group_topic(settings: ClientSettings, kind: GroupTopic, topic: str | None = None,
                       option: str | None = None) -> int:
    """Make ``topic`` (default: the group's topic of ``kind``) ready: create it when missing,
    wait until every partition has a leader, judge its configs; its partition count.

    Raises :class:`AuthorizationError` (:func:`topic_denied`) for a missing ACL,
    :class:`OptionError` naming ``option`` (default ``kind.option``) for a topic that is not
    fit or has no leaders within ``settings.timeout_s``, :class:`BrokerError` otherwise."""
    from pyspark_kafka_share._kafka.group import admin_client

    topic = topic or group_topic_name(settings.group_id, kind.purpose)
    option = option or kind.option
    admin = admin_client(settings)
    partitions = _await_leaders(admin, settings, kind, topic, option)
    if kind.check is not None:
        kind.check(topic, option, _configs(admin, settings, kind, topic, option))
    return partitions


def _await_leaders(admin: Any, settings: ClientSettings, kind: GroupTopic, topic: str,
                   option: str) -> int:
    """List the topic until every partition has a leader, creating it once when missing."""
    timeout = settings.timeout_s
    deadline = time.monotonic() + timeout
    tried: str | None = None  # what creating it answered: "created" or "exists"
    tried_at = 0.0
    while True:
        try:
            md = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:
            raise from_client_error(exc, f"cannot list the topics on {settings.bootstrap_servers}"
                                    f" to find {kind.what} {topic!r}") from exc
        found = md.topics.get(topic)
        if found is not None and found.error is None and found.partitions and \
                all(p.leader >= 0 for p in found.partitions.values()):
            return len(found.partitions)
        if (found is not None and is_denied(found.error)) or \
                (found is None and tried == "exists" and time.monotonic() - tried_at > 3):
            # A topic this principal may not DESCRIBE is left out of the listing.
            raise topic_denied(settings, topic, kind.uses, kind.what, option)
        if time.monotonic() > deadline:
            raise OptionError(option, topic, f"{kind.what} has no leader for all its "
                              f"partitions after {timeout:.0f}s; check the brokers")
        if found is None and tried is None:
            tried, tried_at = _create(admin, settings, kind, topic, option), time.monotonic()
        time.sleep(0.2)


def _create(admin: Any, settings: ClientSettings, kind: GroupTopic, topic: str,
            option: str) -> str:
    """Create the topic: "created", or "exists" when someone else has."""
    from confluent_kafka.admin import NewTopic

    future = admin.create_topics([NewTopic(topic, num_partitions=kind.partitions,
                                           replication_factor=-1, config=dict(kind.config))],
                                 request_timeout=settings.timeout_s)[topic]
    try:
        future.result(timeout=settings.timeout_s + 5)
    except Exception as exc:
        if is_already_exists(exc):
            return "exists"
        if is_denied(exc):
            raise topic_denied(settings, topic, ("Create",), f"creating {kind.what}",
                               f"{option}; or create it beforehand: {kind.beforehand}") from None
        raise from_client_error(exc, f"cannot create {kind.what} {topic!r}", kind.fix) from exc
    _log.info("kafka-share: created %s %r", kind.what, topic)
    return "created"


def _configs(admin: Any, settings: ClientSettings, kind: GroupTopic, topic: str,
             option: str) -> dict[str, Any]:
    """The topic's configs; a topic just created is unknown to the broker for a moment."""
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    timeout = settings.timeout_s
    deadline = time.monotonic() + timeout
    while True:
        try:
            configs: dict[str, Any] = admin.describe_configs(
                [resource], request_timeout=timeout)[resource].result(timeout)
            return configs
        except Exception as exc:
            if is_denied(exc):
                raise topic_denied(settings, topic, ("DescribeConfigs",),
                                   f"checking the configs of {kind.what}", option) from None
            if not is_unknown_topic(exc) or time.monotonic() > deadline:
                raise _undescribed(exc, kind, topic) from exc
            time.sleep(0.2)


def _undescribed(exc: BaseException, kind: GroupTopic, topic: str) -> BrokerError:
    return from_client_error(exc, f"{kind.what} {topic!r} could not be described", kind.fix)
