"""Share consumers pooled per Python worker process, reused across tasks and batches.

Joining a share group costs about one heartbeat interval, so a task that created its consumer
every time would spend most of a short batch joining. Spark reuses Python workers, and this
module lives in the installed package, so the pool survives between the tasks a worker runs.

Between tasks a pooled consumer holds no unacknowledged record: the reader acknowledges every
record of every poll before it returns the consumer. librdkafka, however, keeps a fetch running
after a poll that timed out, and that fetch can *acquire* records while nobody polls. Those
records would sit locked in an idle consumer, so an idle consumer is closed (which releases
them) after ``consumerIdleTimeoutMs`` by a daemon thread, and a consumer's records are given a
lock deadline counted from the start of its previous poll (see ``_kafka.share``). The native
client (``client="native"``) fetches only inside a poll, so its idle consumers hold nothing;
they are pooled the same way (the key tells the clients apart, ``_kafka.consumers``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pyspark_kafka_share._kafka.consumers import ConsumerRecipe, PolledSession

__all__ = ["PooledConsumer", "acquire", "close_all", "discard", "release"]


@dataclass(eq=False)
class PooledConsumer:
    session: PolledSession
    key: tuple[tuple[str, str], ...]
    topics: tuple[str, ...]
    idle_timeout_s: float = 10.0
    uses: int = 0


_LOCK = threading.Lock()
_IDLE: dict[tuple[tuple[str, str], ...], list[PooledConsumer]] = {}
_REAPER: threading.Thread | None = None


def _close_in_background(pc: PooledConsumer) -> None:
    # close() can block for the socket timeout when the broker is gone
    threading.Thread(target=pc.session.close, daemon=True).start()


def _reap_forever() -> None:  # pragma: no cover - timing; exercised by integration tests
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        doomed: list[PooledConsumer] = []
        with _LOCK:
            for key, idle in list(_IDLE.items()):
                keep = [pc for pc in idle if now - pc.session.last_poll < pc.idle_timeout_s]
                doomed.extend(pc for pc in idle if pc not in keep)
                if keep:
                    _IDLE[key] = keep
                else:
                    del _IDLE[key]
        for pc in doomed:
            pc.session.close()


def _ensure_reaper() -> None:
    global _REAPER
    with _LOCK:
        if _REAPER is None or not _REAPER.is_alive():
            _REAPER = threading.Thread(target=_reap_forever, name="kafka-share-pool-reaper",
                                       daemon=True)
            _REAPER.start()


def acquire(recipe: ConsumerRecipe, topics: tuple[str, ...], idle_timeout_s: float,
            timeout_s: float) -> PooledConsumer:
    """An idle pooled consumer of ``recipe``/``topics``, or a new subscribed one."""
    key = recipe.key()
    with _LOCK:
        idle = _IDLE.get(key)
        while idle:
            pc = idle.pop()
            limit = min(idle_timeout_s, pc.idle_timeout_s)
            if pc.topics == topics and time.monotonic() - pc.session.last_poll < limit:
                pc.uses += 1
                pc.session.take_errors()
                pc.idle_timeout_s = idle_timeout_s
                return pc
            _close_in_background(pc)
    session = recipe.open(topics, timeout_s)
    return PooledConsumer(session, key, topics, idle_timeout_s=idle_timeout_s, uses=1)


def release(pc: PooledConsumer, *, healthy: bool) -> None:
    """Return ``pc`` to the pool, or close it if it is broken or pooling is off."""
    if not healthy:
        _close_in_background(pc)
        return
    if pc.idle_timeout_s <= 0:
        pc.session.close()
        return
    _ensure_reaper()
    with _LOCK:
        _IDLE.setdefault(pc.key, []).append(pc)


def discard(pc: PooledConsumer) -> None:
    """Close ``pc`` (in the background) instead of pooling it: it leaves the group."""
    _close_in_background(pc)


def close_all() -> None:
    """Close every idle consumer (tests; the reaper does this over time)."""
    with _LOCK:
        doomed = [pc for idle in _IDLE.values() for pc in idle]
        _IDLE.clear()
    for pc in doomed:
        pc.session.close()
