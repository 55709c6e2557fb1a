"""The native share consumer behind the seam confluent-kafka's fills (``_kafka/share.py``).

:class:`NativeSession` polls, settles and closes as :class:`~pyspark_kafka_share._kafka.share.
ShareSession` does (both are a :class:`~pyspark_kafka_share._kafka.share.ConsumerSession`),
and renews locks (RENEW, :meth:`NativeSession.renew`). Its records are
:class:`NativeMessage` objects, read like confluent-kafka's ``Message`` (``topic()``,
``value()``, ``delivery_count()``, ...), so that the code above the seam is one for both
clients. The consumer is not thread-safe: every call on it here holds one lock, so that a
renewing thread may settle while the owner's thread runs the user's function.

With ``arrow`` set (the source's), a poll is an :class:`ArrowPoll`: the fetch decoded straight
into the source's Arrow schema (``columns.py``), acknowledged by offset; its messages are
made only if something reads it record by record.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import pyarrow as pa

from pyspark_kafka_share._kafka.access import share_consumer_denial
from pyspark_kafka_share._kafka.arrow import ColumnarPoll, arrow_schema, offsets_of
from pyspark_kafka_share._kafka.native.consumer import (
    NativeConsumerConfig,
    NativeShareConsumer,
    ShareRecord,
)
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.share import Settled
from pyspark_kafka_share.errors import AuthorizationError, ErrorCode, error_name

if TYPE_CHECKING:
    from pyspark_kafka_share._kafka.settings import ClientSettings

__all__ = ["ArrowPoll", "NativeMessage", "NativeSession"]

# What a share consumer is refused: READ on a topic or on the group (librdkafka's:
# share._CONSUMER_DENIALS).
_READ_REFUSALS = frozenset({ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            ErrorCode.GROUP_AUTHORIZATION_FAILED})

# confluent-kafka's timestamp types: TIMESTAMP_NOT_AVAILABLE, _CREATE_TIME, _LOG_APPEND_TIME
_NO_TIME, _CREATE_TIME, _LOG_APPEND_TIME = 0, 1, 2


class NativeMessage:
    """A :class:`ShareRecord` read as a confluent-kafka ``Message``."""

    __slots__ = ("record",)

    def __init__(self, record: ShareRecord) -> None:
        self.record = record

    def topic(self) -> str:
        return self.record.topic

    def partition(self) -> int:
        return self.record.partition

    def offset(self) -> int:
        return self.record.offset

    def key(self) -> bytes | None:
        return self.record.key

    def value(self) -> bytes | None:
        return self.record.value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """As confluent-kafka: None when the record has none."""
        return list(self.record.headers) or None

    def timestamp(self) -> tuple[int, int]:
        """``(type, milliseconds)`` as confluent-kafka's: ``(0, -1)`` for none."""
        r = self.record
        if r.timestamp_ms < 0:
            return _NO_TIME, -1
        return (_LOG_APPEND_TIME if r.log_append_time else _CREATE_TIME), r.timestamp_ms

    def delivery_count(self) -> int:
        return self.record.delivery_count

    def error(self) -> None:
        """Never set: the native consumer raises a partition's error from ``poll()``."""
        return None

    def __repr__(self) -> str:
        r = self.record
        return f"NativeMessage({r.topic}-{r.partition}@{r.offset}, delivery {r.delivery_count})"


class ArrowPoll(ColumnarPoll):
    """One poll of :meth:`NativeShareConsumer.poll_arrow`: its batches as one, and the
    offsets of each partition (for the acknowledgements). Read as a sequence, its
    :class:`NativeMessage`s are made on first use; their ``ShareRecord.deadline`` is
    ``started``, the poll's start: no later than their locks began, so an early bound on when
    they end (the source keeps its own deadline per poll)."""

    def __init__(self, batches: Sequence[pa.RecordBatch], include_headers: bool,
                 started: float) -> None:
        schema = arrow_schema(include_headers)
        if len(batches) == 1:
            self.arrow_batch = batches[0]
        else:  # none, or several partitions: one batch (a journal slot per poll)
            self.arrow_batch = pa.Table.from_batches(list(batches), schema=schema) \
                .combine_chunks().to_batches(max_chunksize=None)[0] if batches else \
                pa.RecordBatch.from_pylist([], schema=schema)
        self.started = started
        self.parts = offsets_of(  # one batch per partition fetched
            (TopicPartition(b.column("topic")[0].as_py(), b.column("partition")[0].as_py()),
             b.column("offset").to_numpy()) for b in batches)
        self._messages: list[NativeMessage] | None = None

    @overload
    def __getitem__(self, i: int) -> NativeMessage: ...

    @overload
    def __getitem__(self, i: slice) -> list[NativeMessage]: ...

    def __getitem__(self, i: int | slice) -> NativeMessage | list[NativeMessage]:
        return self.messages()[i]

    def messages(self) -> list[NativeMessage]:
        """The poll's records as messages (made once)."""
        if self._messages is None:
            self._messages = [NativeMessage(r) for r in self._records()]
        return self._messages

    def _records(self) -> list[ShareRecord]:
        b = self.arrow_batch.to_pydict()
        stamps = self.arrow_batch.column("timestamp").cast(pa.int64()).to_pylist()
        heads = b.get("headers") or [None] * len(b["offset"])
        return [ShareRecord(t, p, o, -1 if ts is None else ts // 1000, k, v,
                            tuple((h["key"], h["value"]) for h in hs or ()), dc,
                            self.started, tt == 1)
                for t, p, o, ts, k, v, hs, dc, tt in zip(
                    b["topic"], b["partition"], b["offset"], stamps, b["key"], b["value"],
                    heads, b["deliveryCount"], b["timestampType"], strict=True)]


@dataclass(eq=False)
class NativeSession:
    """One subscribed :class:`NativeShareConsumer`; see the module docstring."""

    consumer: NativeShareConsumer
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: float = field(default_factory=time.monotonic)
    last_poll: float = field(default_factory=time.monotonic)  # when the last poll returned
    fetch_pending: bool = False  # never: the native consumer fetches only inside poll()
    arrow: bool | None = None
    """None: polls of :class:`NativeMessage`; else :class:`ArrowPoll`s (with headers if
    True)."""
    settings: ClientSettings | None = None
    """The front-end's settings: a poll refused TOPIC_ or GROUP_AUTHORIZATION_FAILED raises the
    error naming the READ grant (``access.share_consumer_denial``); None: the broker's."""
    topics: tuple[str, ...] = ()

    @classmethod
    def open(cls, config: NativeConsumerConfig, topics: Sequence[str], *,
             arrow: bool | None = None, settings: ClientSettings | None = None) -> NativeSession:
        """A new consumer subscribed to ``topics`` (it joins in the background)."""
        return cls(NativeShareConsumer(config, topics), arrow=arrow, settings=settings,
                   topics=tuple(topics))

    def acquisitions_lost(self) -> int:
        """The consumer's count of events that may have released its acquisitions
        (``NativeShareConsumer.acquisitions_lost``)."""
        return self.consumer.acquisitions_lost()

    def take_errors(self) -> list[Any]:
        """The connection failures reported since the last call (``_TRANSPORT``,
        ``_ALL_BROKERS_DOWN``, as librdkafka's ``error_cb``: for ``BrokerWatch``); its other
        errors the native consumer raises from ``poll()``."""
        return list(self.consumer.take_errors())

    def poll(self, wait_s: float, max_records: int | None = None, *,
             soft_cap: int | None = None) -> tuple[Sequence[NativeMessage], float]:
        """One poll: its records and when their locks may have started. The native consumer
        fetches only inside ``poll()``, so that is the poll's start (no margin).
        ``max_records``: this poll's cap below ``max.poll.records`` (strict with
        ``record_limit``)."""
        start = time.monotonic()
        with self._refusals():
            if self.arrow is not None:
                with self.lock:
                    batches = self.consumer.poll_arrow(wait_s, max_records,
                                                       include_headers=self.arrow,
                                                       soft_cap=soft_cap)
                self.last_poll = time.monotonic()
                return ArrowPoll(batches, self.arrow, started=start), start
            with self.lock:
                records = self.consumer.poll(wait_s, max_records, soft_cap=soft_cap)
        self.last_poll = time.monotonic()
        return [NativeMessage(r) for r in records], start

    @contextlib.contextmanager
    def _refusals(self) -> Iterator[None]:
        """A topic's or the group's READ refused: the error naming the grant, as librdkafka's
        (``share.raise_client_errors``)."""
        try:
            yield
        except AuthorizationError as e:
            if self.settings is None or e.code not in _READ_REFUSALS:
                raise
            raise share_consumer_denial(
                self.settings, self.topics, group=e.code == ErrorCode.GROUP_AUTHORIZATION_FAILED,
                detail=str(e), code=e.code) from e

    def settle(self, accept: Sequence[Any] = (), release: Sequence[Any] = (),
               reject: Sequence[Any] = (), *,
               partitions: set[TopicPartition] | None = None) -> Settled:
        """Acknowledge ``accept``/``release``/``reject`` (:class:`NativeMessage`) and
        ``commit_sync``; which partitions the broker confirmed."""
        return self._acknowledge((("ACCEPT", accept), ("RELEASE", release),
                                  ("REJECT", reject)), partitions)

    def renew(self, msgs: Sequence[Any]) -> Settled:
        """RENEW the locks of ``msgs`` (they stay held) and ``commit_sync``."""
        return self._acknowledge((("RENEW", msgs),), None)

    def close(self) -> None:
        """RELEASE what is held, close the share sessions, leave the group. Errors are
        ignored (the broker may be gone), as :class:`ShareSession`'s."""
        with self.lock, contextlib.suppress(Exception):
            self.consumer.close()

    def _acknowledge(self, kinds: Sequence[tuple[str, Sequence[Any]]],
                     partitions: set[TopicPartition] | None) -> Settled:
        if not any(ms for _, ms in kinds):
            return Settled(frozenset(), {})
        sent: set[TopicPartition] = set()
        with self.lock:
            for kind, ms in kinds:
                if isinstance(ms, ColumnarPoll):  # by offset: no message objects
                    for tp, offsets in ms.offsets_by_partition().items():
                        # once per offset: a slot's joined polls that hold a record twice (a
                        # redelivery after a lost session) settle its one acquisition
                        self.consumer.acknowledge_offsets(tp.topic, tp.partition,
                                                          np.unique(offsets).tolist(), kind)
                        sent.add(tp)
                    continue
                for m in ms:
                    self.consumer.acknowledge(m.record, kind)
                    sent.add(TopicPartition(m.topic(), m.partition()))
            results = self.consumer.commit_sync()
        outcomes = {TopicPartition(t, p): code for (t, p), code in results.items()}
        confirmed = frozenset(tp for tp, code in outcomes.items() if code == 0)
        failed = {tp: error_name(code) for tp, code in outcomes.items() if code != 0}
        wanted = partitions if partitions is not None else sent
        for tp in wanted - confirmed:
            failed.setdefault(tp, "no result")
        return Settled(confirmed, failed)
