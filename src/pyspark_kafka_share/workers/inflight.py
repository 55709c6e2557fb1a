"""Many calls of the user's function in flight in one worker (``concurrency``, issue 40).

:class:`InFlight` runs up to ``concurrency`` units at once, a unit being one record
(``batch_format="record"``) or one chunk of ``chunk_size`` records (``arrow``/``pandas``): an
``async def`` function as tasks on one event loop (a thread of its own), a plain function on
``concurrency`` threads. The worker loop (``loop``) starts units, takes their completions as
they come (:meth:`InFlight.done`) and hands them to its settler, whichever guarantee it gives,
then starts new units in their places: no unit waits for a slower one.

A unit still running at its poll's deadline is given up (:meth:`InFlight.abandon`): the loop
RELEASEs its records, an async task is cancelled, a thread cannot be (its side effects still
happen) and its late result is discarded when it comes back (counted ``late_discarded``). A
thread that runs a unit given up is replaced, so the slots stay ``concurrency``; it ends once
its unit returns. The threads are daemons: a hung call never holds the Python worker's exit.

How full the slots stayed while the worker had records to work on: ``slot_ms`` (the sum over
time of the units in flight) against ``slot_capacity_ms`` (``concurrency`` times that time).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pyspark_kafka_share.workers.config import WorkerConfig
from pyspark_kafka_share.workers.verdict import Verdict, call, call_async

__all__ = ["Done", "InFlight", "is_async"]


def is_async(fn: object) -> bool:
    """Whether ``fn`` is an ``async def`` function (or an object with an ``async`` call)."""
    call_method = vars(type(fn)).get("__call__")  # a class whose instances are called
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call_method)


@dataclass(frozen=True)
class Done:
    """A unit's completion: its records, their verdicts, when its call began and how long it
    took (monotonic seconds)."""

    unit: list[Any]
    verdicts: list[Verdict]
    began: float
    took_s: float


@dataclass
class _Running:
    unit: list[Any]
    began: float
    future: Future[Any] | None = None  # an async task's, to cancel it


_Completion = tuple[int, list[Verdict] | BaseException, float, float]  # token, result, t0, t1


class InFlight:
    """Up to ``slots`` units of ``fn`` running at once; see the module docstring."""

    def __init__(self, fn: Callable[[Any], Any], config: WorkerConfig, slots: int,
                 stats: Counter[str]) -> None:
        self.fn, self.config, self.slots, self.stats = fn, config, slots, stats
        self.asynchronous = is_async(fn)
        self._tokens = itertools.count()
        self._running: dict[int, _Running] = {}
        self._completions: queue.SimpleQueue[_Completion] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[int, list[Any]] | None] = queue.SimpleQueue()
        self._abandoned: set[int] = set()
        self._threads = 0  # pool threads alive (a given-up unit's one ends when it returns)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._window: float | None = None  # since when the slots are counted (a poll's work)
        self._slot_s = self._capacity_s = 0.0

    @property
    def busy(self) -> int:
        """Units running (not given up)."""
        return len(self._running)

    def records(self) -> list[Any]:
        """The records of the units running."""
        return [m for r in self._running.values() for m in r.unit]

    # ---- starting units and taking their completions ---------------------------------------

    def start(self, unit: list[Any]) -> None:
        """Run the function on ``unit`` (one record, or one chunk of a batch function)."""
        assert len(self._running) < self.slots, "every slot is taken"
        self._tick()
        token = next(self._tokens)
        running = _Running(unit, time.monotonic())
        self._running[token] = running
        if self.asynchronous:
            running.future = asyncio.run_coroutine_threadsafe(self._acall(token, unit),
                                                              self._event_loop())
            return
        with self._lock:
            spawn = self._threads < self.slots + len(self._abandoned)
            self._threads += spawn
        if spawn:
            threading.Thread(target=self._serve, daemon=True,
                             name=f"kafka-share-call-{token}").start()
        self._jobs.put((token, unit))

    def done(self, until: float) -> list[Done]:
        """The completions: waits for the first until ``until`` (monotonic), then takes every
        one that came meanwhile (nothing running: only the late results of units given up,
        counted and discarded; the loop calls it so while idle). A unit's exception that is not
        the record's (a configuration mistake, ``KeyboardInterrupt``) is raised here."""
        out: list[Done] = []
        while True:
            timeout = until - time.monotonic()
            wait = self._running and not out and timeout > 0
            try:
                token, result, t0, t1 = (self._completions.get(timeout=timeout) if wait
                                         else self._completions.get_nowait())
            except queue.Empty:
                break
            self._tick()
            running = self._running.pop(token, None)
            if running is None:  # given up at its deadline: its records are back in the group
                self._abandoned.discard(token)
                self.stats["late_discarded"] += 1
                continue
            if isinstance(result, BaseException):
                raise result
            out.append(Done(running.unit, result, t0, t1 - t0))
        return out

    def abandon(self, keep: Callable[[list[Any]], bool] = lambda unit: False) -> list[Any]:
        """Give up the units running but those ``keep`` holds: async tasks are cancelled, a
        thread's late result is discarded (and its thread replaced). Their records."""
        self._tick()
        given_up: list[Any] = []
        for token, running in list(self._running.items()):
            if keep(running.unit):
                continue
            del self._running[token]
            given_up.extend(running.unit)
            if running.future is not None:
                running.future.cancel()
            else:
                self._abandoned.add(token)
        return given_up

    # ---- how full the slots stay ------------------------------------------------------------

    def begin(self) -> None:
        """A poll's records are being worked on: the slots are counted from now."""
        self._window = time.monotonic()

    def end(self) -> None:
        """The poll is done: the slots' time is added to the counters."""
        self._tick()
        self._window = None
        self.stats["slot_ms"] = int(self._slot_s * 1000)
        self.stats["slot_capacity_ms"] = int(self._capacity_s * 1000)

    def _tick(self) -> None:
        """Count the slots' time up to now."""
        now = time.monotonic()
        if self._window is not None:
            dt = now - self._window
            self._slot_s += dt * len(self._running)
            self._capacity_s += dt * self.slots
            self._window = now

    # ---- the threads and the event loop ----------------------------------------------------

    def _serve(self) -> None:
        """A pool thread: runs units until told to stop, or until the unit it ran was given
        up (a replacement took its place meanwhile)."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            token, unit = job
            t0 = time.monotonic()
            try:
                result: list[Verdict] | BaseException = call(self.fn, unit, self.config)
            except BaseException as exc:  # noqa: BLE001 - handed to the worker's thread
                result = exc
            given_up = token in self._abandoned  # read before the worker may forget it
            self._completions.put((token, result, t0, time.monotonic()))
            if given_up:
                with self._lock:
                    self._threads -= 1
                return

    async def _acall(self, token: int, unit: list[Any]) -> None:
        t0 = time.monotonic()
        try:
            result: list[Verdict] | BaseException = await call_async(self.fn, unit, self.config)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the worker's thread
            result = exc
        self._completions.put((token, result, t0, time.monotonic()))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True,
                             name="kafka-share-event-loop").start()
        return self._loop

    def close(self) -> None:
        """Give up what still runs; stop the threads and the event loop."""
        self.abandon()
        for _ in range(self._threads):
            self._jobs.put(None)
        if self._loop is not None:
            loop = self._loop
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
