"""Exactly-once outputs for the queue workers (``exactly_once_outputs=True``).

Each worker produces the outputs and dead letters of the chunks of a poll it processed within
``transaction_interval_s`` and one **marker** (their origins: topic, partition, offset runs and
the outcome decided for them) in one Kafka transaction, and acknowledges the records only
after the commit. The markers go to a compacted topic of the
workers' own, :func:`marker_topic` of the group. Before it runs the function on a poll's
records a worker reads that topic with ``isolation.level=read_committed`` up to the offset it
ended at when the poll returned, waiting for transactions still open there
(:meth:`MarkerLog.catch_up`): a record a committed marker covers is acknowledged as that
marker decided (ACCEPT or REJECT), without running the function or producing anything. The
delivery count plays no part (after a broker crash a redelivered record can come back with
``deliveryCount=1``).

A marker is tombstoned once the acknowledgement of every record it covers is confirmed (by
its own worker), or once the group's share-partition start offsets passed all of them (for the
markers of workers that died); the live set stays the size of the in-flight work.

- ``markers``: :class:`MarkerSet` (the committed markers, by key and by partition; pure),
  :class:`MarkerLog` (the read_committed reader of the marker topic and its barrier),
  :func:`ensure_marker_topic` (creates the topic, or checks that it is compacted; driver).
- ``transactions``: :class:`Transactions` (the worker slot's transactional producer,
  ``transactional.id`` per worker index, so a newer attempt of the same slot fences the older
  one at the broker) and :class:`ExactlyOnce` (one worker's markers, producer and tombstones).
- ``settler``: :class:`~.settler.TransactionalSettler`, what the worker loop hands its
  results to: the transactions, the refused-produce bisection, their fault points.

The argument (failure table, the window the released client leaves open):
``docs/design.md``, "Queue workers: exactly-once outputs".
"""

from __future__ import annotations

from pyspark_kafka_share.workers.exactly_once.markers import (
    MarkerLog,
    MarkerSet,
    Origin,
    decode_marker,
    encode_marker,
    ensure_marker_topic,
    marker_topic,
    origins_of,
    runs,
)
from pyspark_kafka_share.workers.exactly_once.transactions import (
    ExactlyOnce,
    Transactions,
    transactional_id,
)

__all__ = [
    "ExactlyOnce",
    "MarkerLog",
    "MarkerSet",
    "Origin",
    "Transactions",
    "decode_marker",
    "encode_marker",
    "ensure_marker_topic",
    "marker_topic",
    "origins_of",
    "runs",
    "transactional_id",
]
