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

Both keep the same :class:`ControlState` on the driver (every attempt's latest report, the
leases, the stop flag), so progress, stops and leases mean the same on either. The TCP
transport:

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

# A worker that reached the driver and then fails to for this long stops.
_LOST_AFTER_S = 15.0
# The holder of a worker index's lease that has not reported for this long has lost it (its
# executor died): a retried or speculative attempt takes over.
LEASE_EXPIRY_S = 10.0


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


class ControlState:
    """The driver's side, whatever the transport: keeps every attempt's latest report, grants
    leases and carries the stop flag. Thread-safe; the transports call :meth:`answer`."""

    def __init__(self, on_report: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._reports: dict[tuple[int, int], dict[str, Any]] = {}
        self._seen: dict[tuple[int, int], float] = {}
        self._holders: dict[int, int] = {}  # worker index -> attempt holding its lease
        self._stop_reason: str | None = None
        self._on_report = on_report
        self.refusals = 0

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def request_stop(self, reason: str) -> None:
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason

    def answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The reply to one authenticated message (a report or a lease request)."""
        lease = msg.get("lease")
        if isinstance(lease, dict):
            granted, done = self.lease(int(lease.get("worker", -1)),
                                       int(lease.get("attempt", 0)))
            return {"granted": granted, "done": done, "stop": self.stopping}
        report = msg.get("report")
        if isinstance(report, dict):
            self.update(report)
        return {"stop": self.stopping}

    def lease(self, worker: int, attempt: int) -> tuple[bool, bool]:
        """(granted, done) for ``attempt`` of worker ``worker``.

        One attempt per worker index runs a consumer. The lease goes to the first attempt that
        asks, and passes to another only when its holder has not reported for
        :data:`LEASE_EXPIRY_S` (its executor died; Spark retries the task). ``done``: the
        holder finished, or the driver asked every worker to stop: the asking attempt should
        end at once (a speculative copy of a finished worker).
        """
        now = time.monotonic()
        with self._lock:
            if self._stop_reason is not None:
                return False, True
            holder = self._holders.get(worker)
            if holder is None or holder == attempt or \
                    now - self._seen.get((worker, holder), 0.0) > LEASE_EXPIRY_S:
                if holder is None or holder != attempt:
                    self._holders[worker] = attempt
                    self._seen[(worker, attempt)] = now
                    # Shown (and summed) even if the attempt dies before its first report.
                    self._reports.setdefault((worker, attempt), {
                        "worker": worker, "attempt": attempt, "state": "starting"})
                return True, False
            finished = self._reports.get((worker, holder), {}).get("state") == "stopped"
            return False, finished

    def update(self, report: dict[str, Any]) -> None:
        key = (int(report.get("worker", -1)), int(report.get("attempt", 0)))
        with self._lock:
            self._reports[key] = report
            self._seen[key] = time.monotonic()
        if self._on_report is not None:
            self._on_report(report)

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]:
        """Every attempt's latest report, by (worker, attempt)."""
        with self._lock:
            return {k: dict(v) for k, v in self._reports.items()}

    def latest(self) -> dict[int, dict[str, Any]]:
        """Each worker's newest attempt's latest report, by worker."""
        out: dict[int, dict[str, Any]] = {}
        for (worker, _attempt), report in sorted(self.reports().items()):
            out[worker] = report
        return out


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



def start_reporter(closed: threading.Event, interval_s: float,
                   snapshot: Callable[[], dict[str, Any]],
                   report: Callable[[dict[str, Any]], object]) -> threading.Thread:
    """A daemon thread that sends ``report(snapshot())`` every ``interval_s`` until ``closed``
    is set (both transports' workers report this way)."""

    def loop() -> None:
        while not closed.wait(interval_s):
            try:
                current = snapshot()
            except RuntimeError:  # a counter changed size while copied: next time
                continue
            report(current)

    thread = threading.Thread(target=loop, name="kafka-share-worker-report", daemon=True)
    thread.start()
    return thread

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
        self._thread = start_reporter(self._closed, self.interval_s, snapshot, self.report)

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
            time.sleep(min(1.0, LEASE_EXPIRY_S / 4))
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
        if self.ever_connected and time.monotonic() - self._last_ok > _LOST_AFTER_S:
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
