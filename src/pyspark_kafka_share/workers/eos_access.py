"""The driver's check, before any task starts, that ``exactly_once_outputs=True`` can work with
the workers' principal: a missing ACL fails ``start_workers`` in seconds with an
:class:`AuthorizationError` naming the resource, the operation and the ``kafka-acls.sh`` grant.
Without it, a missing grant failed every task (the transactional id), or aborted every
transaction until the records' deliveries ran out (WRITE on the marker, output or dead-letter
topic: librdkafka then purges the transaction's records and reports no cause), or held every
marker read until the poll's deadline (READ on the marker topic).

1. the marker topic: created (CREATE, unless it exists) and checked compacted
   (DESCRIBE_CONFIGS): :func:`~pyspark_kafka_share.workers.exactly_once.ensure_marker_topic`;
2. the operations the broker says the principal may do (Metadata with the topics' authorized
   operations, KIP-430): READ and WRITE on the marker topic, WRITE on the output and
   dead-letter topics; nothing is written;
3. ``init_transactions`` as ``kafka-share-workers.<group>.check`` (TRANSACTIONAL_ID WRITE on
   the workers' prefix; no transaction is begun).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark_kafka_share._kafka.access import authorization_error
from pyspark_kafka_share._kafka.group import admin_client
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    error_code,
    from_client_error,
)
from pyspark_kafka_share.workers.exactly_once import (
    Transactions,
    ensure_marker_topic,
    transactional_id,
)

__all__ = ["check_exactly_once_access"]


def check_exactly_once_access(settings: ClientSettings, producer_conf: dict[str, Any],
                              write_topics: Sequence[str] = ()) -> str:
    """Check every grant ``exactly_once_outputs`` needs; the marker topic's name."""
    topic = ensure_marker_topic(settings)
    wanted = {topic: ("READ", "WRITE"), **{t: ("WRITE",) for t in write_topics}}
    allowed = _authorized_operations(settings, list(wanted))
    for name, operations in wanted.items():
        ops = allowed.get(name)
        missing = () if ops is None else tuple(op for op in operations if op not in ops)
        if missing:
            what = "the workers' marker topic" if name == topic else \
                "a transactional write to the output or dead-letter topic"
            raise _denied_topic(settings, name, tuple(op.capitalize() for op in missing), what)
    _start(settings, producer_conf, topic).close()
    return topic


def _authorized_operations(settings: ClientSettings,
                           topics: list[str]) -> dict[str, set[str] | None]:
    """The operations the broker says this principal may do on each topic (none: not even
    DESCRIBE; None: the broker did not say)."""
    from confluent_kafka import TopicCollection

    admin = admin_client(settings)
    futures = admin.describe_topics(TopicCollection(topics), include_authorized_operations=True,
                                    request_timeout=settings.timeout_s)
    out: dict[str, set[str] | None] = {}
    for name, future in futures.items():
        try:
            ops = future.result(settings.timeout_s).authorized_operations
        except Exception as exc:
            if error_code(exc) != ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                raise from_client_error(exc, f"describing topic {name!r} for "
                                        "exactly_once_outputs") from exc
            ops = []
        out[name] = None if ops is None else {op.name for op in ops}
    return out


def _start(settings: ClientSettings, producer_conf: dict[str, Any], topic: str) -> Transactions:
    prefix = transactional_id(settings.group_id, 0)[:-1]
    try:
        return Transactions.start(producer_conf, f"{prefix}check", topic, 10.0,
                                  settings.timeout_s)
    except BrokerError as exc:
        if error_code(exc.__cause__) != ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise
        raise authorization_error(
            settings, "transactional-id", prefix, ("Write",),
            "starting the workers' transactional producers (exactly_once_outputs; each worker "
            f"uses {prefix}<worker index>)",
            code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, prefixed=True) from None


def _denied_topic(settings: ClientSettings, topic: str, operations: tuple[str, ...],
                  what: str) -> AuthorizationError:
    return authorization_error(settings, "topic", topic, operations,
                               f"{what} (exactly_once_outputs)",
                               code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
