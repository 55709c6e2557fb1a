"""Test-only failure injection: the source's option ``_faultInjection``, the workers'
``_fault_injection`` argument.

``name[:key=value...]`` items separated by ``;``, e.g. ``kill-after-publish:part=0:attempt=0``.
Both front-ends use it: the source with ``seq`` = batch and ``part`` = partition, the workers
with ``seq`` = the worker's transaction number and ``part`` = its worker index. Points:
``kill-*`` (the Python worker dies at once, ``os._exit``: no finally, no acknowledgement),
``sleep-*`` (``ms=``), ``fail-*`` (raise), and ``timeout-commit`` (:meth:`Faults.commit`).
Conditions: ``seq``, ``part``, ``attempt``. The workers' ``kill-in-open-transaction:chunks=N``
fires once N chunks wait in the open transaction (``seq``: its number), before its Kafka
transaction begins; ``sleep-before-produce`` delays a transaction's begin and produce (its
marker written late), ``ignore-deadline`` waives its commit check's deadline (an acquisition
lost with nobody told; the check's marker read then has ``broker_timeout_s``).
See tests/integration/test_source.py and test_workers_eos.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Faults"]


class Faults:
    """Test-only failure injection; see the module docstring."""

    def __init__(self, raw: str | None, *, seq: int, part: int, attempt_number: int) -> None:
        self.points: dict[str, dict[str, str]] = {}
        if not raw:
            return
        for item in raw.split(";"):
            name, *conds = item.strip().split(":")
            kv = dict(c.split("=", 1) for c in conds if "=" in c)
            if kv.get("seq", str(seq)) != str(seq):
                continue
            if kv.get("part", str(part)) != str(part):
                continue
            if kv.get("attempt", str(attempt_number)) != str(attempt_number):
                continue
            self.points[name] = kv

    def hit(self, name: str) -> None:
        kv = self.points.get(name)
        if kv is None:
            return
        if name.startswith("kill"):
            os._exit(137)  # the Python worker dies: no finally, no acknowledgement
        if name.startswith("sleep"):
            time.sleep(int(kv.get("ms", "1000")) / 1000)
            return
        raise RuntimeError(f"injected failure: {name}")

    def commit(self) -> Callable[[Any, float], None] | None:
        """With ``timeout-commit``: a ``commit_transaction(producer, timeout)`` whose outcome
        the caller cannot know, as when the coordinator's reply is lost: it raises the
        retriable timeout librdkafka gives, after committing (``committed=1``, the default)
        or without (``committed=0``: the transaction stays open). None otherwise."""
        kv = self.points.get("timeout-commit")
        if kv is None:
            return None

        def commit(producer: Any, timeout_s: float) -> None:
            from confluent_kafka import KafkaError, KafkaException

            if kv.get("committed", "1") == "1":
                producer.commit_transaction(timeout_s)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: timeout-commit",
                                            retriable=True))

        return commit
