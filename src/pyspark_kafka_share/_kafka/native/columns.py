"""A partition's acquired records straight into Arrow (the source's ``client="native"``).

The per-record path (``consumer.NativeShareConsumer._acquired``) makes a ``ShareRecord`` per
record, which the source then read back as messages into Arrow. Here the fetch's record
batches are decoded by the same parse loop (``protocol.records``) into columns, the acquired
offsets picked with numpy, and the batch built from the columns (``_kafka.arrow.
columns_to_batch``): no object per record but the keys' and values' bytes. The consumer holds
the offsets only (``session.Held.hold_offsets``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pyspark_kafka_share._kafka.arrow import columns_to_batch
from pyspark_kafka_share._kafka.native.session import Held
from pyspark_kafka_share._kafka.protocol.consume import AcquiredRange, TopicPartitionId
from pyspark_kafka_share._kafka.protocol.records import Columns, decode_batches

__all__ = ["acquired_batch"]


def acquired_batch(records: bytes, acquired: Sequence[AcquiredRange], topic: str,
                   tp: TopicPartitionId, held: Held, *, check_crc: bool,
                   include_headers: bool, codecs: Counter[str]) -> pa.RecordBatch:
    """The records of ``records`` (a ShareFetch partition's) within the ``acquired`` ranges,
    as one batch of the source's schema, in offset order; each is held by offset, and an
    acquired offset without a record (a control record, a compacted one) acknowledged as
    GAP."""
    cols = Columns()
    batches = decode_batches(records, check_crc=check_crc, columns=cols)
    codecs.update(b.codec for b in batches)
    offsets = np.frombuffer(cols.offsets, dtype=np.int64)
    usable = np.ones(len(cols), dtype=bool)
    log_append = np.zeros(len(cols), dtype=bool)
    for b in batches:
        if b.control:
            usable[b.start:b.stop] = False
        elif b.log_append_time:
            log_append[b.start:b.stop] = True
    counts = np.zeros(len(cols), dtype=np.int32)  # 0: not acquired
    ordered = bool(np.all(offsets[1:] > offsets[:-1])) if len(offsets) > 1 else True
    for a in acquired:
        if ordered:  # a fetch's batches come in offset order: a slice per range
            lo = int(np.searchsorted(offsets, a.first_offset, "left"))
            hi = int(np.searchsorted(offsets, a.last_offset, "right"))
            rows = lo + np.flatnonzero(usable[lo:hi])
        else:
            rows = np.flatnonzero(usable & (offsets >= a.first_offset) &
                                  (offsets <= a.last_offset))
        counts[rows] = a.delivery_count
        found = offsets[rows]
        held.hold_offsets(tp, found.tolist())
        if len(found) < a.last_offset - a.first_offset + 1:
            wanted = np.arange(a.first_offset, a.last_offset + 1, dtype=np.int64)
            for offset in np.setdiff1d(wanted, found).tolist():
                held.gap(tp, offset)
    rows = np.flatnonzero(counts)
    return columns_to_batch(cols, rows, topic, tp[1], log_append=log_append, counts=counts,
                            include_headers=include_headers)
