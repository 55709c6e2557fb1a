"""The share-consumer kernel both front-ends use.

A :class:`ShareSession` is one subscribed, explicit-mode ``ShareConsumer`` with what the source
task and the queue workers both need around it:

- :meth:`ShareSession.poll`: one poll, the time its records' acquisition locks may have started
  (:data:`ACQUIRE_MARGIN_S` before the poll, or before the *previous* poll when that one came
  back empty: librdkafka keeps a fetch in flight after an empty poll, and that fetch acquires
  records nobody polls), and a :class:`BrokerError` for an error record;
- :meth:`ShareSession.settle`: acknowledge (ACCEPT / RELEASE / REJECT) and ``commit_sync``;
  which partitions the broker confirmed;
- :func:`raise_client_errors`: errors librdkafka reports only through ``error_cb`` (polls just
  come back empty) become a :class:`BrokerError`, never "no data"; a fetch response larger
  than ``receive.message.max.bytes`` becomes one that names the settings to raise;
- :class:`BrokerWatch`: the same for a poll loop, which rides out "all brokers down" (a broker
  restart) up to a time limit;
- :func:`split_last_delivery`: records on their last delivery, which a RELEASE would make the
  broker archive unprocessed.

Explicit mode: every record of a poll must be acknowledged before the next poll. The
consumer's log lines go through Python logging (``_kafka.logs``).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark_kafka_share._kafka.access import share_consumer_denial
from pyspark_kafka_share._kafka.group import admin_client, waiting_partitions
from pyspark_kafka_share._kafka.logs import client_config
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.settings import SOURCE_NAMES, ClientSettings
from pyspark_kafka_share.errors import (
    BrokerError,
    ErrorCode,
    denied_resource,
    error_code,
    from_client_error,
    is_all_brokers_down,
    is_denied,
    kafka_error,
)

__all__ = [
    "ACQUIRE_MARGIN_S",
    "SETTLE_COUNTERS",
    "BrokerWatch",
    "ConsumerSession",
    "Settled",
    "ShareSession",
    "lock_budget_s",
    "raise_client_errors",
    "split_last_delivery",
]

ACQUIRE_MARGIN_S = 0.5
"""A response's records were acquired at most this long before librdkafka queued them."""

# librdkafka errors (reported through error_cb only) after which polls would just come back
# empty: the caller fails instead of reading "no data". _TRANSPORT alone is retried inside.
# Denials (errors.is_denied) fail them too.
_FAILING_ERRORS = frozenset({
    "_ALL_BROKERS_DOWN", "_AUTHENTICATION", "_SSL", "_RESOLVE", "_FATAL",
    "SASL_AUTHENTICATION_FAILED", "UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID",
})

SETTLE_COUNTERS = {"accept": "accepted", "release": "released", "reject": "rejected"}
"""Counter names of the outcomes, as both front-ends report them."""


# librdkafka's words for a response larger than receive.message.max.bytes (it then drops the
# connection, and reports the broker down).
_OVERSIZE = re.compile(r"Invalid response size (\d+) \(0\.\.(\d+)\)")


def raise_client_errors(errors: Sequence[Any], settings: ClientSettings | None = None,
                        topics: Sequence[str] = ()) -> None:
    """Raise :class:`BrokerError` if librdkafka reported an error polls would hide.

    A response larger than ``receive.message.max.bytes`` comes first: every later fetch of
    the same records fails the same way. ``settings``/``topics``: to name the user's
    settings and the partitions with records waiting. Otherwise the first failing error is
    raised, with the last other error before it (e.g. why the brokers are down).
    """
    for e in errors:
        size = _OVERSIZE.search(str(e.str()))
        if size:
            raise _too_large(int(size[1]), int(size[2]), settings, topics)
    bad = [e for e in errors if e.fatal() or e.name() in _FAILING_ERRORS or is_denied(e)]
    if bad and settings is not None and denied_resource(bad[0]) in _CONSUMER_DENIALS:
        raise _denial(bad[0], settings, topics)
    if bad:
        others = [e for e in errors if all(e is not b for b in bad)]
        cause = f"; before that it reported {others[-1].name()}: {others[-1].str()}" \
            if others else ""
        raise BrokerError(f"the share consumer reported {bad[0].name()}: {bad[0].str()}"
                          f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}{cause}")


_CONSUMER_DENIALS = ("group", "topic")  # what a share consumer is refused (READ on either)


def _denial(error: Any, settings: ClientSettings, topics: Sequence[str]) -> BrokerError:
    """A share consumer's authorization failure, naming the ACL (READ) that fixes it."""
    return share_consumer_denial(
        settings, topics, group=denied_resource(error) == "group",
        detail=f"{error.name()}: {error.str()}",
        code=error_code(error) or ErrorCode.GROUP_AUTHORIZATION_FAILED)


def _too_large(size: int, limit: int, settings: ClientSettings | None,
               topics: Sequence[str]) -> BrokerError:
    names = settings.names if settings is not None else SOURCE_NAMES
    waiting = waiting_partitions(settings, topics) if settings is not None else ""
    where = f" (records waiting: {waiting})" if waiting else ""
    return BrokerError(
        f"a share fetch response of {size} bytes exceeds the consumer's "
        f"receive.message.max.bytes of {limit}: a record batch of topic(s) "
        f"{', '.join(topics) or '?'}{where} is larger than the consumer accepts, so every "
        "fetch fails (librdkafka then reports all brokers down). Raise "
        f"{names.of('receive.message.max.bytes')!r} above the largest record batch (at most "
        f"the topic's max.message.bytes), with {names.of('fetch.max.bytes')!r} at least 512 "
        "below it. Each failed fetch costs the records it held one delivery: after the "
        "group's share.delivery.count.limit the broker archives them")


@dataclass(eq=False)
class BrokerWatch:
    """Checks a poll loop's client errors; rides out a broker restart for up to ``limit_s``.

    Any failing error but "all brokers down" raises at once (:func:`raise_client_errors`).
    "All brokers down" raises only if the outage lasts ``limit_s``: librdkafka reconnects by
    itself but reports only the outage, never the recovery, so while :attr:`down` the
    cluster's metadata is asked for every ``every_s``; an answer, or a record, ends it. A
    loop must not read "no data" into the empty polls of an outage.
    """

    settings: ClientSettings
    topics: Sequence[str]
    limit_s: float
    every_s: float = 1.0
    down_since: float | None = None
    cause: str = ""
    last_check: float = 0.0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def observe(self, errors: Sequence[Any], got_records: bool) -> None:
        """Judge the errors ``take_errors`` returned after a poll."""
        outage = [e for e in errors if not e.fatal() and is_all_brokers_down(e)]
        raise_client_errors([e for e in errors if all(e is not o for o in outage)],
                            self.settings, self.topics)
        now = time.monotonic()
        if got_records:
            self.down_since = None
        elif outage and self.down_since is None:
            self.down_since, self.last_check = now, now
            others = [e for e in errors if not is_all_brokers_down(e)]
            self.cause = f"{outage[0].name()}: {outage[0].str()}" + (
                f"; before that the client reported {others[-1].name()}: {others[-1].str()}"
                if others else "")
        if self.down_since is None or now - self.last_check < self.every_s:
            return
        self.last_check = now
        if self._cluster_answers():
            self.down_since = None
        elif now - self.down_since > self.limit_s:
            raise BrokerError(f"all brokers down for more than {self.limit_s:.0f}s (the share "
                              f"consumer reported {self.cause})")

    def _cluster_answers(self) -> bool:
        try:
            admin_client(self.settings).list_topics(timeout=min(self.every_s, self.limit_s))
        except Exception:  # noqa: BLE001 - any failure: still down
            return False
        return True


def lock_budget_s(lock_ms: int, safety_fraction: float) -> float:
    """How long after acquisition a record may still be worked on: the fraction of the group's
    ``share.record.lock.duration.ms`` the user allows (``lockSafetyFraction``)."""
    return lock_ms * safety_fraction / 1000


def split_last_delivery(msgs: Iterable[Any], delivery_limit: int) -> tuple[list[Any], list[Any]]:
    """(records on their last delivery, the others).

    A RELEASE makes the broker archive a record on its last delivery (``deliveryCount`` has
    reached ``share.delivery.count.limit``) instead of redelivering it, so callers giving
    records back keep those and finish them.
    """
    last: list[Any] = []
    others: list[Any] = []
    for m in msgs:
        (last if m.delivery_count() >= delivery_limit else others).append(m)
    return last, others


def _partition(m: Any) -> TopicPartition:
    return TopicPartition(m.topic(), m.partition())


@dataclass(frozen=True)
class Settled:
    """What the broker confirmed of one :meth:`ShareSession.settle`."""

    confirmed: frozenset[TopicPartition]
    failed: dict[TopicPartition, str]
    """The error per partition whose acknowledgement is unconfirmed."""

    @property
    def ok(self) -> bool:
        return not self.failed

    def confirms(self, m: Any) -> bool:
        return _partition(m) in self.confirmed


class ConsumerSession(Protocol):
    """The seam between a share consumer and the code above it: :class:`ShareSession`
    (confluent-kafka) and ``_kafka.native.adapter.NativeSession`` (the native client) both
    fill it, with records read as confluent-kafka ``Message`` objects."""

    def take_errors(self) -> list[Any]:
        """The client errors reported since the last call (for :class:`BrokerWatch`)."""

    def acquisitions_lost(self) -> int:
        """A count, only growing, of events that may have released records the consumer
        acquired (a lost share session, a moved leader, a fenced member): what a caller that
        holds records across polls compares."""

    def poll(self, wait_s: float, max_records: int | None = None, *,
             soft_cap: int | None = None) -> tuple[Sequence[Any], float]:
        """One poll: its records and the earliest time their locks may have started.
        ``max_records``: this poll's cap, strict where the client can (the native client with
        ``record_limit``, or near it); ``soft_cap``: a further cap whole producer batches may
        pass. librdkafka cannot change ``max.poll.records`` after creation and ignores both."""

    def settle(self, accept: Sequence[Any] = (), release: Sequence[Any] = (),
               reject: Sequence[Any] = (), *,
               partitions: set[TopicPartition] | None = None) -> Settled:
        """Acknowledge and ``commit_sync``: which partitions the broker confirmed."""

    def close(self) -> None:
        """Close the consumer, RELEASEing what it holds; errors are not raised."""


@dataclass(eq=False)
class ShareSession:
    """One subscribed explicit-mode ``ShareConsumer``; see the module docstring."""

    consumer: Any
    timeout_s: float
    errors: list[Any] = field(default_factory=list)  # KafkaErrors from librdkafka's error_cb
    created: float = field(default_factory=time.monotonic)
    last_poll: float = field(default_factory=time.monotonic)  # when the last poll returned
    last_poll_start: float | None = None
    fetch_pending: bool = False  # the last poll came back empty: a fetch may still be running

    @classmethod
    def open(cls, config: dict[str, Any], topics: Sequence[str], timeout_s: float) \
            -> ShareSession:
        """A new consumer subscribed to ``topics``."""
        from confluent_kafka import ShareConsumer

        errors: list[Any] = []
        consumer = ShareConsumer(client_config({**config, "error_cb": errors.append}))
        session = cls(consumer, timeout_s, errors)
        try:
            consumer.subscribe(list(topics))
        except BaseException:
            session.close()
            raise
        return session

    def take_errors(self) -> list[Any]:
        """The client errors reported since the last call."""
        errors, self.errors[:] = list(self.errors), []
        return errors

    def acquisitions_lost(self) -> int:
        """Always 0: librdkafka does not say, and it wants every poll acknowledged before
        the next, so nobody holds its records across polls."""
        return 0

    def poll(self, wait_s: float, max_records: int | None = None, *,
             soft_cap: int | None = None) -> tuple[list[Any], float]:
        """One poll: its records and the earliest time their locks may have started
        (``max_records``, ``soft_cap``: ignored, see :meth:`ConsumerSession.poll`).

        A record with an error raises :class:`BrokerError`, after the poll's other records
        were RELEASEd (best effort: they come back when their locks expire otherwise).
        """
        from confluent_kafka import KafkaException

        start = time.monotonic()
        acquired = (self.last_poll_start if self.fetch_pending and
                    self.last_poll_start is not None else start) - ACQUIRE_MARGIN_S
        try:
            msgs = list(self.consumer.poll(wait_s))
        except KafkaException as exc:
            if denied_resource(exc) not in _CONSUMER_DENIALS:
                raise from_client_error(exc, "share consumer poll failed") from exc
            self.errors.append(kafka_error(exc))  # the caller's BrokerWatch names the ACL
            msgs = []
        self.last_poll_start, self.last_poll = start, time.monotonic()
        self.fetch_pending = not msgs
        bad = [m for m in msgs if m.error() is not None]
        if bad:
            with contextlib.suppress(Exception):
                self.settle(release=[m for m in msgs if m.error() is None])
            raise BrokerError(f"share consumer poll failed: {bad[0].error()}")
        return msgs, acquired

    def settle(self, accept: Sequence[Any] = (), release: Sequence[Any] = (),
               reject: Sequence[Any] = (), *,
               partitions: set[TopicPartition] | None = None) -> Settled:
        """Acknowledge ``accept``/``release``/``reject`` and ``commit_sync``.

        ``partitions``: the partitions of the records when the caller knows them
        already (from an Arrow batch); worked out per record otherwise.
        """
        from confluent_kafka import AcknowledgeType

        ack = self.consumer.acknowledge
        for kind, msgs in ((AcknowledgeType.ACCEPT, accept), (AcknowledgeType.RELEASE, release),
                           (AcknowledgeType.REJECT, reject)):
            for m in msgs:
                ack(m, kind)
        if not (accept or release or reject):
            return Settled(frozenset(), {})
        results = self.consumer.commit_sync(self.timeout_s)
        outcomes = {TopicPartition(k.topic, k.partition): err for k, err in results.items()}
        failed = {tp: str(err) for tp, err in outcomes.items() if err is not None}
        confirmed = frozenset(tp for tp, err in outcomes.items() if err is None)
        if partitions is None:
            partitions = {_partition(m) for m in (*accept, *release, *reject)}
        for tp in partitions - confirmed:
            failed.setdefault(tp, "no result")
        return Settled(confirmed, failed)

    def close(self) -> None:
        """Close the consumer; it RELEASEs what a background fetch acquired after the last poll.
        Errors are ignored (the broker may be gone)."""
        with contextlib.suppress(Exception):
            self.consumer.close()
