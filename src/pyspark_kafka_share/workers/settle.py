"""Settling a worker's results: producing, dead letters, acknowledgements.

The worker loop (``loop``) polls and runs the user's function; what it decided is handed to a
:class:`Settler`, which owns the producing and the acknowledgements of the guarantee asked for:

- :class:`AtLeastOnceSettler` (here): per chunk, outputs then dead letters produced and
  flushed, then the records acknowledged; a record is ACCEPTed or REJECTed only after the
  broker acknowledged what it produced, and one whose produce failed is RELEASEd instead.
- :class:`~pyspark_kafka_share.workers.exactly_once.settler.TransactionalSettler`
  (``exactly_once_outputs``): outputs, dead letters and a marker in one transaction.

Both use :class:`Poll` (one poll's records until acknowledged, and its lock deadline),
:func:`produce_all` and the record builders :func:`output_items`/:func:`dead_letter_items`.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark_kafka_share._kafka import redrive
from pyspark_kafka_share._kafka.produce import Refusal, produce, refusal
from pyspark_kafka_share._kafka.share import SETTLE_COUNTERS, ConsumerSession, Settled
from pyspark_kafka_share.errors import BrokerError, is_record_own, kafka_error
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.outcome import Outcome
from pyspark_kafka_share.workers.verdict import Final, Verdict, resolve

__all__ = ["DLQ_HEADERS", "AtLeastOnceSettler", "Item", "Out", "Poll", "ProduceFailures",
           "Settler", "dead_letter_items", "output_failed", "output_items", "produce_all",
           "produce_items"]

# Header names written on dead-letter records (and the origin ones on output records): named
# once, in the kernel, where the redrive (``kafka-share dlq replay``) reads them back.
DLQ_HEADERS = redrive.DLQ_HEADERS
_PRODUCE_FAILURE_LIMIT = 3  # chunks in a row with a failed produce: the worker fails


@dataclass(eq=False)
class Poll:
    """One poll's records until they are acknowledged, and its lock deadline (monotonic: the
    records' locks are provably held until then): the one place the deadline lives (a
    renewal, ``workers/consumer.py``, moves it)."""

    session: ConsumerSession
    stats: Counter[str]
    deadline: float
    unacked: list[Any] = field(default_factory=list)

    def ends_past(self, seconds: float) -> bool:
        """Whether ``seconds`` from now is past the deadline."""
        return time.monotonic() + seconds > self.deadline

    def ack(self, acks: Sequence[tuple[Any, Outcome]]) -> Settled:
        """Acknowledge ``acks`` and ``commit_sync``; counted per outcome, or as a failure."""
        if not acks:
            return Settled(frozenset(), {})
        by_kind: dict[Outcome, list[Any]] = {o: [] for o in Outcome}
        for m, outcome in acks:
            by_kind[outcome].append(m)
        settled = self.session.settle(by_kind[Outcome.ACCEPT], by_kind[Outcome.RELEASE],
                                      by_kind[Outcome.REJECT])
        done = {id(m) for m, _ in acks}
        self.unacked = [m for m in self.unacked if id(m) not in done]
        for m, outcome in acks:
            if settled.confirms(m):
                self.stats[SETTLE_COUNTERS[outcome.value]] += 1
            else:
                self.stats["ack_failures"] += 1
        return settled

    def release(self, msgs: Sequence[Any]) -> None:
        self.ack([(m, Outcome.RELEASE) for m in msgs])


def eased(average_s: float, margin_of: float, left_s: float) -> float:
    """A time average (of settling, of commits) after a poll was refused for the margin it
    asks alone (``margin_of`` times the average): halved, and at most so that the margin is
    half the ``left_s`` the poll had. The average is refreshed only by what it refuses: one
    slow settling or commit (a transaction coordinator's failover) would otherwise refuse
    every later poll until the broker archived its records at their last delivery."""
    return min(average_s / 2, left_s / (2 * margin_of))


class Settler(Protocol):
    """What the worker loop hands its results to (one per worker, for its guarantee)."""

    settle_s: float
    """Moving average of the time one settling takes (the loop's lock-deadline margin)."""
    stop_reason: str | None
    """Set when the worker must stop (a fenced producer)."""

    def admit(self, msgs: list[Any], poll: Poll) -> list[Any]:
        """The records of a new poll to work on (the others are acknowledged here)."""

    def undecided(self, chunk: list[Any], poll: Poll) -> list[Any]:
        """The records of ``chunk`` to run the function on (the others are acknowledged)."""

    def pending(self) -> list[Any]:
        """Records processed but not yet settled (held for a transaction)."""

    def settle(self, final: list[Final], poll: Poll, *, poll_ends: bool, began: float) -> None:
        """Settle (or hold) a processed chunk; ``poll_ends``: the poll's last chunk;
        ``began``: when its processing began (monotonic)."""

    def flush(self, poll: Poll) -> None:
        """Settle what is held now (before the rest of the poll is released)."""

    def drop(self) -> list[Any]:
        """Forget what is held unsettled (the job stops on a mistake: nothing of it is
        produced); its records, for the loop to RELEASE."""

    def idle(self) -> bool:
        """Between polls: the housekeeping due; False: no poll now (the loop asks again)."""

    def close(self) -> None:
        """At the end: what is due, then the producer."""


@dataclass(frozen=True)
class Out:
    """A record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Item:
    """The output or dead letter of the record at ``index`` of a list of :data:`Final`."""

    index: int
    out: Out


def produce_all(producer: Any, outs: Sequence[Out], timeout_s: float) -> list[Refusal | None]:
    """Produce ``outs`` and flush; the error of each, in order (None: delivered), a
    :class:`~pyspark_kafka_share._kafka.produce.Refusal` (transient, or the record's own).

    The producer's ``message.timeout.ms`` is below the flush timeout, so a record not
    reported delivered when flush returns has failed for good (no late duplicate).
    """
    if not outs:
        return []
    assert producer is not None
    reports: list[list[Any]] = []
    from confluent_kafka import KafkaException

    for out in outs:
        reports.append([])
        try:
            produce(producer, out.topic, out.value, key=out.key, headers=out.headers,
                    on_delivery=_reporter(reports[-1]), timeout_s=timeout_s)
        except KafkaException as exc:  # refused before it was queued: larger than
            if not is_record_own(exc):  # the producer's message.max.bytes
                raise
            reports[-1].append(kafka_error(exc) or exc)  # never None: None is "delivered"
    producer.flush(timeout_s + 5)
    return [None if errs and errs[0] is None else refusal(errs[0]) if errs
            else Refusal("not delivered within the broker timeout", transient=True)
            for errs in reports]


def produce_items(producer: Any, items: Sequence[Item],
                  timeout_s: float) -> dict[int, Refusal | None]:
    """:func:`produce_all` of records' items: the error by the record's index."""
    errs = produce_all(producer, [it.out for it in items], timeout_s)
    return {it.index: err for it, err in zip(items, errs, strict=True)}


def _reporter(errs: list[Any]) -> Callable[[Any, Any], None]:
    """A delivery callback that appends the record's error (None: delivered) to ``errs``."""

    def on_delivery(err: Any, _msg: Any) -> None:
        errs.append(err)

    return on_delivery


def output_items(final: Sequence[Final], config: WorkerConfig) -> list[Item]:
    """The outputs of the ACCEPTed records that returned one."""
    topic = config.output_topic
    if topic is None:
        return []
    return [Item(i, Out(topic, v.key if v.key is not None else m.key(), v.value,
                        _origin_headers(m, config.group)))
            for i, (m, outcome, v) in enumerate(final)
            if outcome is Outcome.ACCEPT and v.value is not None]


def dead_letter_items(final: Sequence[Final], config: WorkerConfig,
                      todo: Sequence[int] | None = None) -> list[Item]:
    """Dead letters of the REJECTed records (of ``todo``, by index, if given)."""
    dlq, group = config.dead_letter_topic, config.group
    if dlq is None:
        return []
    wanted = todo if todo is not None else [
        i for i, (_m, outcome, _v) in enumerate(final) if outcome is Outcome.REJECT]
    return [Item(i, Out(dlq, m.key(), m.value(),
                        [*(m.headers() or ()), *_dlq_headers(m, group, v)]))
            for i in wanted for m, _, v in (final[i],)]


def output_failed(final: list[Final], i: int, err: Refusal, spec: WorkerSpec,
                  stats: Counter[str]) -> None:
    """Record ``i``'s output was refused: a retry, or poison on its last attempt. A transient
    refusal (:class:`~pyspark_kafka_share._kafka.produce.Refusal`: a broker fault, not the
    record's) spends none of ``max_attempts``: poison only on the broker's last delivery,
    where a RELEASE would archive the record."""
    m = final[i][0]
    retry = Verdict(Outcome.RELEASE, error=f"output not delivered: {err}",
                    error_type="OutputNotDelivered")
    allowed = spec.delivery_limit if err.transient else spec.attempts_allowed
    final[i] = (m, resolve(m, retry, allowed, stats), retry)


def _origin_headers(m: Any, group: str) -> list[tuple[str, bytes | None]]:
    values = (m.topic(), str(m.partition()), str(m.offset()), group)
    return [(name, value.encode())
            for name, value in zip(redrive.ORIGIN_HEADERS, values, strict=True)]


def _dlq_headers(m: Any, group: str, v: Verdict) -> list[tuple[str, bytes | None]]:
    return [(redrive.ERROR, (v.error or "rejected").encode()),
            (redrive.ERROR_TYPE, (v.error_type or "Reject").encode()),
            (redrive.ATTEMPTS, str(m.delivery_count()).encode()),
            *_origin_headers(m, group)]


@dataclass
class ProduceFailures:
    """Repeated produce failures fail the worker rather than burn every record's deliveries."""

    config: WorkerConfig
    streak: int = 0

    def count(self, failed_any: bool, final: Sequence[Final]) -> None:
        self.streak = self.streak + 1 if failed_any else 0
        if self.streak >= _PRODUCE_FAILURE_LIMIT:
            config = self.config
            raise BrokerError(
                f"producing to {config.output_topic or config.dead_letter_topic!r} failed in "
                f"{self.streak} chunks in a row (last: "
                f"{next((v.error for _, _, v in final if v.error), 'see the worker log')}); "
                "stopping rather than spend every record's deliveries. Check the topic, the "
                "producer_config and the brokers")


class AtLeastOnceSettler:
    """Per chunk: outputs, then dead letters, each waited for, then the acknowledgements."""

    def __init__(self, spec: WorkerSpec, stats: Counter[str], producer: Any = None) -> None:
        """``producer``: injected by tests; built from the config when it produces at all."""
        config = spec.config
        self.spec, self.config, self.stats = spec, config, stats
        self.settle_s = 0.0
        self.stop_reason: str | None = None
        self.failures = ProduceFailures(config)
        self._timed = False
        if producer is None and (config.output_topic or config.dead_letter_topic):
            from confluent_kafka import Producer

            producer = Producer(config.producer_settings())
        self.producer: Any = producer

    def admit(self, msgs: list[Any], poll: Poll) -> list[Any]:
        return msgs

    def undecided(self, chunk: list[Any], poll: Poll) -> list[Any]:
        return chunk

    def pending(self) -> list[Any]:
        return []

    def settle(self, final: list[Final], poll: Poll, *, poll_ends: bool, began: float) -> None:
        if not final:
            return
        t0 = time.monotonic()
        failed_any = self._produce_outputs(final)
        failed_any = self._produce_dead_letters(final, poll) or failed_any
        poll.ack([(m, outcome) for m, outcome, _ in final])
        self.failures.count(failed_any, final)
        took = time.monotonic() - t0
        self.settle_s = 0.7 * self.settle_s + 0.3 * took if self._timed else took
        self._timed = True

    def flush(self, poll: Poll) -> None:
        pass

    def drop(self) -> list[Any]:
        return []

    def idle(self) -> bool:
        return True

    def close(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(Exception):
                self.producer.flush(self.config.broker_timeout_s)

    def _produce_outputs(self, final: list[Final]) -> bool:
        """Produce the ACCEPTed records' outputs; True if any failed. An output the broker did
        not acknowledge turns its record into a retry (RELEASE), or poison on its last
        attempt."""
        sent = produce_items(self.producer, output_items(final, self.config),
                             self.config.broker_timeout_s)
        for i, err in sent.items():
            if err is None:
                self.stats["outputs"] += 1
                continue
            self.stats["produce_failures"] += 1
            output_failed(final, i, err, self.spec, self.stats)
        return any(err is not None for err in sent.values())

    def _produce_dead_letters(self, final: list[Final], poll: Poll) -> bool:
        """Produce the REJECTed records to the dead-letter topic; True if any failed. A dead
        letter the broker did not acknowledge turns its record into a RELEASE, except on the
        record's last delivery (a RELEASE would archive it): that one is retried until the
        lock deadline, then the worker fails."""
        dlq = self.config.dead_letter_topic
        todo = [i for i, (_m, outcome, _v) in enumerate(final)
                if outcome is Outcome.REJECT and dlq is not None]
        failed_any = False
        while todo and dlq is not None:
            sent = produce_items(self.producer, dead_letter_items(final, self.config, todo),
                                 self.config.broker_timeout_s)
            todo = []
            for i, err in sent.items():
                m, _, v = final[i]
                if err is None:
                    self.stats["dead_lettered"] += 1
                    continue
                failed_any = True
                self.stats["produce_failures"] += 1
                if m.delivery_count() < self.spec.delivery_limit:
                    final[i] = (m, Outcome.RELEASE, v)
                elif not poll.ends_past(0):
                    todo.append(i)  # the last delivery: a RELEASE would lose it
                    time.sleep(0.5)
                else:
                    raise BrokerError(
                        f"the dead-letter topic {dlq!r} did not take record "
                        f"{m.topic()}-{m.partition()}@{m.offset()} on its last delivery "
                        f"({m.delivery_count()}, the group's share.delivery.count.limit) "
                        f"before its lock deadline: {err}. The broker archives the record")
        return failed_any
