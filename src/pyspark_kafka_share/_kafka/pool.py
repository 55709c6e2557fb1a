"""Share consumers pooled per Python worker process, reused across tasks and batches.

Joining a share group costs about one heartbeat interval, so a task that created its consumer
every time would spend most of a short batch joining. Spark reuses Python workers, and this
module lives in the installed package, so the pool survives between the tasks a worker runs.

Between tasks a pooled consumer holds no unacknowledged record: the reader acknowledges every
record of every poll before it returns the consumer. librdkafka, however, keeps a fetch running
after a poll that timed out, and that fetch can *acquire* records while nobody polls. Those
records would sit locked in an idle consumer, so an idle consumer is closed (which releases
them) after ``consumerIdleTimeoutMs`` by a daemon thread, and a consumer's records are given a
lock deadline counted from the end of its previous poll (see ``_reader``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PooledConsumer", "acquire", "close_all", "release", "stats"]


@dataclass(eq=False)
class PooledConsumer:
    consumer: Any
    key: tuple[tuple[str, str], ...]
    topics: tuple[str, ...]
    created: float = field(default_factory=time.monotonic)
    last_poll: float = field(default_factory=time.monotonic)
    idle_timeout_s: float = 10.0
    uses: int = 0
    fetch_pending: bool = False  # the last poll came back empty: a fetch may still be running
    errors: list[Any] = field(default_factory=list)  # KafkaErrors from librdkafka's error_cb


_LOCK = threading.Lock()
_IDLE: dict[tuple[tuple[str, str], ...], list[PooledConsumer]] = {}
_REAPER: threading.Thread | None = None
_STATS = {"created": 0, "reused": 0, "closed_idle": 0, "closed_broken": 0}


def stats() -> dict[str, int]:
    with _LOCK:
        return dict(_STATS)


def _close(pc: PooledConsumer) -> None:
    with contextlib.suppress(Exception):
        pc.consumer.close()


def _reap_forever() -> None:  # pragma: no cover - timing; exercised by integration tests
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        doomed: list[PooledConsumer] = []
        with _LOCK:
            for key, idle in list(_IDLE.items()):
                keep = [pc for pc in idle if now - pc.last_poll < pc.idle_timeout_s]
                doomed.extend(pc for pc in idle if pc not in keep)
                if keep:
                    _IDLE[key] = keep
                else:
                    del _IDLE[key]
            _STATS["closed_idle"] += len(doomed)
        for pc in doomed:
            _close(pc)


def _ensure_reaper() -> None:
    global _REAPER
    with _LOCK:
        if _REAPER is None or not _REAPER.is_alive():
            _REAPER = threading.Thread(target=_reap_forever, name="kafka-share-pool-reaper",
                                       daemon=True)
            _REAPER.start()


def acquire(config: dict[str, str], topics: tuple[str, ...],
            idle_timeout_s: float) -> PooledConsumer:
    """An idle pooled consumer for ``config``/``topics``, or a new subscribed one."""
    from confluent_kafka import ShareConsumer

    key = tuple(sorted(config.items()))
    with _LOCK:
        idle = _IDLE.get(key)
        while idle:
            pc = idle.pop()
            limit = min(idle_timeout_s, pc.idle_timeout_s)
            if pc.topics == topics and time.monotonic() - pc.last_poll < limit:
                _STATS["reused"] += 1
                pc.uses += 1
                pc.errors.clear()
                pc.idle_timeout_s = idle_timeout_s
                return pc
            _STATS["closed_idle"] += 1
            threading.Thread(target=_close, args=(pc,), daemon=True).start()
        _STATS["created"] += 1
    # Errors such as "all brokers down" reach only error_cb; polls just come back empty.
    errors: list[Any] = []
    consumer = ShareConsumer({**config, "error_cb": errors.append})
    pc = PooledConsumer(consumer, key, topics, idle_timeout_s=idle_timeout_s, uses=1,
                        errors=errors)
    try:
        consumer.subscribe(list(topics))
    except BaseException:
        _close(pc)
        raise
    return pc


def release(pc: PooledConsumer, *, healthy: bool) -> None:
    """Return ``pc`` to the pool, or close it if it is broken or pooling is off."""
    if not healthy or pc.idle_timeout_s <= 0:
        with _LOCK:
            _STATS["closed_broken" if not healthy else "closed_idle"] += 1
        if healthy:
            _close(pc)
        else:  # close() can block for the socket timeout when the broker is gone
            threading.Thread(target=_close, args=(pc,), daemon=True).start()
        return
    _ensure_reaper()
    with _LOCK:
        _IDLE.setdefault(pc.key, []).append(pc)


def close_all() -> None:
    """Close every idle consumer (tests; the reaper does this over time)."""
    with _LOCK:
        doomed = [pc for idle in _IDLE.values() for pc in idle]
        _IDLE.clear()
    for pc in doomed:
        _close(pc)
