"""The control channel between the driver and queue workers running as Spark tasks.

Spark offers no live channel from a running task to the driver (accumulators arrive when a task
ends). The channel is an interface with two transports; the worker loop sees only
:class:`WorkerChannel` (made by :func:`open_worker_channel` from the task spec's endpoint) and
the driver's :class:`~pyspark_kafka_share.workers.api.WorkerJob` only :class:`DriverChannel`:

- **TCP** (this module; classic sessions): the driver listens on a port, as Spark's own
  executors reach the driver.
- **Kafka** (:mod:`.control_kafka`; Spark Connect sessions, or ``control_topic``): a small
  control topic on the cluster both sides already reach, for clients with no port the tasks
  can reach.

Both keep the same :class:`~.control_state.ControlState` on the driver (every attempt's
latest report, the leases, the stop flag), so progress, stops and leases mean the same on
either. The TCP transport:

- **Where:** the server binds the driver's bind address (``spark.driver.bindAddress``, else
  ``spark.driver.host``) and advertises ``spark.driver.host``; the port is random, or pinned
  with ``control_port`` and retried upwards ``spark.port.maxRetries`` times, like
  ``spark.driver.port``.
- **Who:** every connection starts with a challenge: the server sends a nonce, the worker
  answers ``HMAC-SHA256(job secret, nonce)``. The per-job secret travels only inside the task
  spec, never on the wire, in a log line, an error or progress. A peer without it is refused,
  counted and logged (with its address only).
- **What:** a worker sends its counters as one JSON line every ``interval`` seconds and reads
  back ``{"stop": true}`` once the driver wants the workers to stop (time budget, idle timeout,
  record count, :meth:`WorkerJob.stop`, Ctrl-C). Before it opens its share consumer, a worker
  asks for the **lease** of its worker index, so that a speculative (or late) copy of the same
  task waits instead of running a second consumer (see :meth:`ControlState.lease`).

The import goes one way: this module opens the Kafka transport for a task spec that names
it; both transports take the driver's state from :mod:`.control_state`.

Either channel is best effort for progress and required for nothing else: a worker that cannot
reach the driver at start runs on its local stop conditions; a worker that *loses* the driver
after reaching it stops (the driver is gone or the job is being torn down).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pyspark_kafka_share.workers import control_state as _state
from pyspark_kafka_share.workers.control_state import LEASE_EXPIRY_S, ControlState

if TYPE_CHECKING:
    from pyspark_kafka_share.workers.control_kafka import KafkaEndpoint

__all__ = [
    "LEASE_EXPIRY_S",
    "ControlClient",
    "ControlServer",
    "ControlState",
    "DriverChannel",
    "Endpoint",
    "WorkerChannel",
    "open_worker_channel",
]

_log = logging.getLogger("pyspark_kafka_share.workers")



@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    secret: str = field(repr=False)


class WorkerChannel(Protocol):
    """The worker's side of the channel, whichever transport: never raises.

    ``stop``: the driver wants the workers to stop (or was lost); ``lost``: the driver was
    reached and then went silent; ``ever_connected``: the driver was reached at least once (a
    worker that never reached it judges idleness locally)."""

    stop: bool
    lost: bool
    ever_connected: bool

    def start(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Report ``snapshot()`` every interval from a daemon thread until :meth:`close`."""

    def acquire_lease(self, worker: int, attempt: int, *,
                      should_quit: Callable[[], bool] = ...) -> bool:
        """Wait for the lease of ``worker``; False: this attempt must not run."""

    def report(self, report: dict[str, Any]) -> bool:
        """Send ``report`` now; True = stop."""

    def close(self) -> None:
        """Stop reporting; what was sent is delivered first. May be called again."""


class DriverChannel(Protocol):
    """The driver's side of the channel, whichever transport (see :class:`ControlState`)."""

    @property
    def endpoint(self) -> Endpoint | KafkaEndpoint:
        """What the tasks need to reach this channel (pickled into the task spec)."""

    @property
    def stop_reason(self) -> str | None: ...

    def request_stop(self, reason: str) -> None: ...

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]: ...

    def latest(self) -> dict[int, dict[str, Any]]: ...

    def close(self) -> None: ...


def open_worker_channel(endpoint: Endpoint | KafkaEndpoint | None,
                        interval_s: float) -> WorkerChannel:
    """The worker's channel to the driver for the endpoint in its task spec (None: no driver;
    the worker runs on its local stop conditions)."""
    if endpoint is None or isinstance(endpoint, Endpoint):
        return ControlClient(endpoint, interval_s)
    from pyspark_kafka_share.workers.control_kafka import KafkaControlClient

    return KafkaControlClient(endpoint, interval_s)


def _proof(secret: str, nonce: str) -> str:
    return hmac.new(secret.encode(), nonce.encode(), hashlib.sha256).hexdigest()


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        owner = self.server.owner
        if not self._authenticate(owner):
            return
        with owner._lock:
            owner._conns.add(self.request)
        for raw in self.rfile:
            try:
                msg = json.loads(raw)
            except ValueError:
                return
            if not isinstance(msg, dict):
                return
            reply = owner.answer(msg)
            try:
                self.wfile.write(json.dumps(reply).encode() + b"\n")
                self.wfile.flush()
            except OSError:
                return

    def _authenticate(self, owner: ControlServer) -> bool:
        nonce = secrets.token_hex(16)
        try:
            self.request.settimeout(5)
            self.wfile.write(json.dumps({"nonce": nonce}).encode() + b"\n")
            self.wfile.flush()
            answer = json.loads(self.rfile.readline(4096) or b"{}")
            self.request.settimeout(None)
        except (OSError, ValueError):
            answer = {}
        proof = answer.get("auth") if isinstance(answer, dict) else None
        if isinstance(proof, str) and hmac.compare_digest(
                proof, _proof(owner.endpoint.secret, nonce)):
            return True
        owner.refused(self.client_address)
        return False


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = False  # a pinned port taken by someone else must be seen as taken
    owner: ControlServer


class ControlServer(ControlState):
    """The TCP transport's driver side: authenticates workers and answers their lines from
    the shared :class:`ControlState`."""

    def __init__(self, advertised_host: str, *, bind_host: str | None = None, port: int = 0,
                 max_retries: int = 16,
                 on_report: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(on_report)
        self._server = _bind(bind_host or advertised_host, port, max_retries)
        self._server.owner = self
        self.endpoint = Endpoint(advertised_host, self._server.server_address[1],
                                 secrets.token_hex(32))
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="kafka-share-workers-control", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.endpoint.port

    def refused(self, peer: Any) -> None:
        with self._lock:
            self.refusals += 1
        _log.warning("kafka-share workers: refused a control connection from %s: it did not "
                     "prove the job's secret", peer[0] if isinstance(peer, tuple) else peer)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:  # workers still connected see the driver go
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()


def _bind(host: str, port: int, max_retries: int) -> _Server:
    """A server on ``host``: a random port, or ``port`` and up to ``max_retries`` after it."""
    candidates = [0] if port == 0 else [port + i for i in range(max_retries + 1)]
    last: OSError | None = None
    for candidate in candidates:
        try:
            return _Server((host, candidate), _Handler)
        except OSError as exc:
            last = exc
    from pyspark_kafka_share.errors import OptionError

    raise OptionError("control_port", port, f"no free port in {port}-{candidates[-1]} on "
                      f"{host} ({last}); pick another, raise spark.port.maxRetries, or use 0 "
                      "for a random port")



class ControlClient:
    """The TCP transport's worker side (a :class:`WorkerChannel`): proves the secret, asks
    for the lease, sends reports, learns whether to stop. Never raises.

    :meth:`start` reports from a daemon thread, so a slow or silent driver never delays the
    worker's processing loop; the loop only reads :attr:`stop`.
    """

    def __init__(self, endpoint: Endpoint | None, interval_s: float) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._io = threading.Lock()  # the report thread and the worker share one connection
        self.ever_connected = False
        self._last_ok = time.monotonic()
        self.stop = False
        self.lost = False
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def start(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Report ``snapshot()`` every ``interval_s`` from a daemon thread until :meth:`close`."""
        if self.endpoint is None:
            return
        self._thread = _state.start_reporter(self._closed, self.interval_s, snapshot, self.report)

    def acquire_lease(self, worker: int, attempt: int, *,
                      should_quit: Callable[[], bool] = lambda: False) -> bool:
        """Wait for the lease of ``worker``; False: this attempt must not run (the holder
        finished, or the driver stops the job). Without a driver: True at once."""
        while not should_quit():
            reply = self._send({"lease": {"worker": worker, "attempt": attempt}})
            if reply is None:
                if not self.ever_connected or self.lost:
                    return not self.lost  # no driver to ask: run on local conditions
                time.sleep(0.5)
                continue
            if reply.get("granted"):
                return True
            if reply.get("done"):
                return False
            time.sleep(min(1.0, _state.LEASE_EXPIRY_S / 4))
        return False

    def _connect(self) -> bool:
        assert self.endpoint is not None
        try:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=2)
        except OSError:
            return False
        sock.settimeout(5)
        reader = sock.makefile("rb")
        try:
            challenge = json.loads(reader.readline(4096) or b"{}")
            proof = _proof(self.endpoint.secret, str(challenge.get("nonce", "")))
            sock.sendall(json.dumps({"auth": proof}).encode() + b"\n")
        except (OSError, ValueError, AttributeError):
            with contextlib.suppress(OSError):
                reader.close()
                sock.close()
            return False
        self._sock, self._reader = sock, reader
        self.ever_connected = True
        return True

    def _drop(self) -> None:
        with contextlib.suppress(OSError):
            if self._reader is not None:
                self._reader.close()
            if self._sock is not None:
                self._sock.close()
        self._sock = None
        self._reader = None

    def _send(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """One line out, one back (reconnecting once); None if the driver did not answer."""
        if self.endpoint is None or self.lost:
            return None
        line = json.dumps(msg).encode() + b"\n"
        with self._io:
            for _ in range(2):
                if self._sock is None and not self._connect():
                    break
                assert self._sock is not None
                try:
                    self._sock.sendall(line)
                    raw = self._reader.readline()
                    reply = json.loads(raw) if raw else None
                except (OSError, ValueError):
                    reply = None
                if not isinstance(reply, dict):
                    self._drop()
                    continue
                self._last_ok = time.monotonic()
                self.stop = self.stop or bool(reply.get("stop"))
                return reply
        if self.ever_connected and time.monotonic() - self._last_ok > _state.LOST_AFTER_S:
            self.lost = True
            self.stop = True
        return None

    def report(self, report: dict[str, Any]) -> bool:
        """Send ``report`` now; True = stop. The background thread calls it every
        ``interval_s``; the worker once more with its final counters."""
        self._send({"report": report})
        return self.stop

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self._drop()
