"""A worker's share consumer: the client ``client`` chooses, behind one seam, and with the
native client the renewal of long work's locks.

:func:`open_consumer` is the one place the worker loop gets its consumer from (through the
kernel's seam, ``_kafka.consumers.ConsumerRecipe``, which the source shares): a
:class:`~pyspark_kafka_share._kafka.share.ShareSession` (confluent-kafka, ``"librdkafka"``)
or a :class:`~pyspark_kafka_share._kafka.native.adapter.NativeSession` (``"native"``: the
strict ``record_limit`` acquire mode with ``max.poll.records`` = ``poll_records``: one chunk,
or with ``concurrency`` enough to refill its slots), both a
:class:`~pyspark_kafka_share._kafka.share.ConsumerSession`.

:class:`LockRenewer` (native only): while the user's function runs, a thread RENEWs the
locks of every record the worker holds unacknowledged (the chunk, and with exactly-once
outputs those waiting for their transaction), so that work longer than the lock is not
redelivered. It renews when half the lock budget (``share.record.lock.duration.ms`` x
``lock_safety_fraction``) is left of the poll's deadline, at most every half budget; a
renewal every partition confirmed moves the deadline to its start + the budget.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from pyspark_kafka_share._kafka.consumers import ConsumerRecipe
from pyspark_kafka_share._kafka.native.adapter import NativeSession
from pyspark_kafka_share._kafka.share import (
    ConsumerSession,
    Settled,
    lock_budget_s,
)
from pyspark_kafka_share.errors import KafkaShareError
from pyspark_kafka_share.workers.config import WorkerSpec
from pyspark_kafka_share.workers.settle import Poll

__all__ = ["LockRenewer", "Renewing", "open_consumer"]

_log = logging.getLogger(__name__)


@runtime_checkable
class Renewing(Protocol):
    """A consumer that can RENEW its records' locks (the native client's session)."""

    def renew(self, msgs: Sequence[Any]) -> Settled:
        """RENEW ``msgs`` and ``commit_sync``: which partitions the broker confirmed."""


def open_consumer(spec: WorkerSpec, index: int) -> tuple[ConsumerSession, LockRenewer | None]:
    """Worker ``index``'s consumer, subscribed, and its lock renewer (native client only)."""
    config = spec.config
    native = config.share_client == "native"
    session = ConsumerRecipe(config.client, config.share_client, f"kafka-share-worker-{index}",
                             config.poll_records, record_limit=native) \
        .open(config.topics, config.broker_timeout_s)
    if isinstance(session, NativeSession):
        budget_s = lock_budget_s(spec.lock_ms, config.lock_safety_fraction)
        return session, LockRenewer(session, budget_s)
    return session, None


class LockRenewer:
    """RENEWs the locks of a poll's unacknowledged records while the worker's function runs
    (:meth:`covering`); counted in the poll's stats as ``renewed`` and ``renew_failures``."""

    def __init__(self, session: Renewing, budget_s: float) -> None:
        self.session, self.budget_s = session, budget_s
        self.interval_s = budget_s / 2

    @contextlib.contextmanager
    def covering(self, poll: Poll) -> Iterator[None]:
        """Renew ``poll.unacked`` on a thread of its own until the block ends."""
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(poll, stop), daemon=True,
                                  name="kafka-share-renew")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def due_in(self, poll: Poll, last: float) -> float:
        """Seconds until the next renewal: when half the budget is left of the deadline, at
        most half a budget after the ``last`` one (or the block's start)."""
        return max(0.0, min(last + self.interval_s, poll.deadline - self.interval_s)
                   - time.monotonic())

    def _run(self, poll: Poll, stop: threading.Event) -> None:
        last = time.monotonic()
        while not stop.wait(self.due_in(poll, last)):
            last = time.monotonic()
            self.renew(poll)

    def renew(self, poll: Poll) -> None:
        """One renewal of what ``poll`` holds; the deadline moves if every partition
        confirmed it. A failure is counted and logged; the worker goes on (its
        acknowledgements then report what the broker did)."""
        held = list(poll.unacked)
        if not held:
            return
        start = time.monotonic()
        try:
            settled = self.session.renew(held)
        except Exception as exc:  # noqa: BLE001 - the thread must live on; the worker is told
            poll.stats["renew_failures"] += len(held)
            _log.warning("kafka-share worker: renewing the locks of %d record(s) failed: %s",
                         len(held), exc, exc_info=not isinstance(exc, KafkaShareError))
            return
        confirmed = sum(1 for m in held if settled.confirms(m))
        poll.stats["renewed"] += confirmed
        if confirmed < len(held):
            poll.stats["renew_failures"] += len(held) - confirmed
            _log.warning("kafka-share worker: the broker did not renew the locks of %d "
                         "record(s) (%s)", len(held) - confirmed,
                         ", ".join(f"{tp.topic}-{tp.partition}: {why}"
                                   for tp, why in sorted(settled.failed.items())))
            return
        poll.deadline = max(poll.deadline, start + self.budget_s)
