"""The Kafka clients' log lines, through Python ``logging``.

Every confluent-kafka client this package creates (share consumers, producers, admin clients)
is given a :class:`ClientLog` as its ``logger``: librdkafka's lines go to the logger
``pyspark_kafka_share.client`` instead of straight to the process's stderr.

- **Quiet by default.** The package's logger has a ``NullHandler``, so nothing is printed
  unless the application configures logging (``logging.basicConfig``, a handler on
  ``pyspark_kafka_share``), or ``PYSPARK_KAFKA_SHARE_CLIENT_LOG`` is set (below).
- The share consumer's notice that it is a "Preview" is logged at DEBUG.
- **Repeats are summarized.** An unreachable broker makes librdkafka report a failed connect
  about 20 times a second; a connection failure is logged at WARNING (the client retries it,
  and the error that matters is raised), and any line repeated within
  :data:`REPEAT_INTERVAL_S` is logged once, then once per interval with the count of the
  repeats not logged.
- ``PYSPARK_KAFKA_SHARE_CLIENT_LOG=<level>`` (``error``, ``warning``, ``info`` or ``debug``)
  writes the client lines of that level and above to the stderr of every process where it is
  set (the driver; executors through ``spark.executorEnv.PYSPARK_KAFKA_SHARE_CLIENT_LOG``).
  ``debug`` also turns on librdkafka's debug contexts :data:`DEBUG_CONTEXTS` (unless the
  client settings name their own ``debug``) and logs every line, unsummarized.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from pyspark_kafka_share.errors import OptionError

__all__ = [
    "DEBUG_CONTEXTS",
    "ENV_CLIENT_LOG",
    "LOGGER_NAME",
    "REPEAT_INTERVAL_S",
    "ClientLog",
    "RepeatFilter",
    "client_config",
    "env_level",
]

LOGGER_NAME = "pyspark_kafka_share.client"
ENV_CLIENT_LOG = "PYSPARK_KAFKA_SHARE_CLIENT_LOG"
REPEAT_INTERVAL_S = 30.0
DEBUG_CONTEXTS = "broker,protocol,metadata,cgrp,consumer,fetch,admin"
"""librdkafka debug contexts ``PYSPARK_KAFKA_SHARE_CLIENT_LOG=debug`` turns on."""

_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
           "debug": logging.DEBUG}
_LOGGER = logging.getLogger(LOGGER_NAME)
# A library does not print unless asked: without this, Python's last-resort handler would
# write the WARNING lines to stderr.
logging.getLogger("pyspark_kafka_share").addHandler(logging.NullHandler())

# What varies between repeats of one line: librdkafka's "(after 12ms in state CONNECT)" and,
# once it summarizes, "(after 0ms in state CONNECT, 1 identical error(s) suppressed)".
_VARYING = re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) "
                      r"suppressed)?\)|\d+ms")
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")  # librdkafka's "[thrd:main]: " before the text


class RepeatFilter:
    """Decides which repeats of a line to log: the first, then at most one per ``interval_s``
    that carries the number of repeats dropped in between. Thread-safe."""

    _MAX_KEYS = 1000

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._seen: dict[object, list[float]] = {}  # key -> [logged at, repeats dropped]
        self._lock = threading.Lock()

    def admit(self, key: object) -> tuple[int, float] | None:
        """None: drop this line; else log it, with the number of repeats dropped since it was
        last logged and the seconds since then (``(0, 0.0)`` for a first occurrence)."""
        with self._lock:
            now = self.clock()
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return None
            if entry is None and len(self._seen) >= self._MAX_KEYS:
                self._seen.clear()
            self._seen[key] = [now, 0]
            return (0, 0.0) if entry is None else (int(entry[1]), now - entry[0])


_REPEATS = RepeatFilter()


def _level(facility: str, text: str, level: int) -> int:
    if "Preview" in text and "not recommended for production" in text:
        return logging.DEBUG
    if facility == "FAIL":  # a failed connection: retried by the client, errors are raised
        return min(level, logging.WARNING)
    return level


class ClientLog:
    """The ``logger`` of one client: its lines go to :data:`LOGGER_NAME`, summarized
    (``summarize``); ``last_problem`` keeps the last WARNING-or-worse line, for error
    messages (what the hidden lines would have said)."""

    def __init__(self, *, summarize: bool = True,
                 repeats: RepeatFilter | None = None) -> None:
        self.summarize = summarize
        self.repeats = repeats or _REPEATS
        self.last_problem: str | None = None

    def log(self, level: int, msg: str, *args: Any) -> None:
        """What confluent-kafka calls: ``log(level, "%s [%s] %s", facility, client, text)``."""
        facility, client, text = (str(a) for a in args) if len(args) == 3 else \
            ("", "", msg % args if args else msg)
        level = _level(facility, text, level)
        said = _THREAD.sub("", text)
        if level >= logging.WARNING:
            self.last_problem = said
        if not _LOGGER.isEnabledFor(level):
            return
        if self.summarize and level > logging.DEBUG:
            admitted = self.repeats.admit((facility, _VARYING.sub("", said)))
            if admitted is None:
                return
            dropped, elapsed = admitted
            if dropped:
                text += f" [repeated {dropped} more times in the last {elapsed:.0f} s]"
        _LOGGER.log(level, "%s %s: %s", client, facility, text)


_STDERR_HANDLER: logging.Handler | None = None
_HANDLER_LOCK = threading.Lock()


def env_level() -> int | None:
    """The level ``PYSPARK_KAFKA_SHARE_CLIENT_LOG`` asks for (None: unset); on first use it
    installs the stderr handler. A value that is not a level raises :class:`OptionError`."""
    raw = os.environ.get(ENV_CLIENT_LOG, "").strip()
    if not raw:
        return None
    level = _LEVELS.get(raw.lower())
    if level is None:
        raise OptionError(ENV_CLIENT_LOG, raw, "set it to error, warning, info or debug (the "
                          "client log lines written to stderr), or unset it")
    global _STDERR_HANDLER
    with _HANDLER_LOCK:
        if _STDERR_HANDLER is None:
            _STDERR_HANDLER = logging.StreamHandler(sys.stderr)
            _STDERR_HANDLER.setFormatter(logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s"))
            _LOGGER.addHandler(_STDERR_HANDLER)
            _LOGGER.propagate = False  # not twice when the application logs too
        _STDERR_HANDLER.setLevel(level)
        _LOGGER.setLevel(level)
    return level


def client_config(conf: Mapping[str, Any], log: ClientLog | None = None) -> dict[str, Any]:
    """``conf`` with a :class:`ClientLog` as its ``logger`` (``log``, or a new one), and
    librdkafka's debug contexts when ``PYSPARK_KAFKA_SHARE_CLIENT_LOG=debug``."""
    debug = env_level() == logging.DEBUG
    out = {**conf, "logger": log if log is not None else ClientLog(summarize=not debug)}
    if debug:
        out.setdefault("debug", DEBUG_CONTEXTS)
    return out
