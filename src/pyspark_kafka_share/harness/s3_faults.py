"""An object-store fault proxy: an HTTP reverse proxy in front of a
:class:`~pyspark_kafka_share.harness.s3.LocalS3` (or any S3 endpoint) that answers some
requests as an overloaded or failing S3 does::

    from pyspark_kafka_share.harness import LocalS3
    from pyspark_kafka_share.harness.s3_faults import S3FaultProxy, S3Faults

    with LocalS3() as s3, S3FaultProxy(s3.endpoint_url, S3Faults(slow_down=0.2)) as proxy:
        options = {**s3.journal_options(), "journal.aws_endpoint": proxy.endpoint_url}
        ...
        assert proxy.counts["slow_down"] > 0

Each request draws (from a seeded generator, so that a run is replayable for the same
sequence of requests) one outcome of :class:`S3Faults`:

- ``slow_down``: ``503 SlowDown``, not forwarded (S3's throttling answer);
- ``internal_error``: ``500 InternalError``, not forwarded;
- ``applied_then_500``: a conditional PUT (``If-None-Match`` or ``If-Match``) is forwarded and
  applied, and its answer replaced by ``500 InternalError``: the client cannot know that its
  write happened, and its retry meets its own object (412);
- ``stall``: forwarded after ``stall_s`` seconds;
- otherwise forwarded as is. ``down=True`` answers every request ``503 SlowDown`` (the store
  unreachable), until set back.

The proxy is a thread of this process (a threading HTTP server), so a test changes its faults
(:attr:`S3FaultProxy.faults`) and reads :attr:`S3FaultProxy.counts` while clients in other
processes (Spark's Python workers) go through it.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import _process

__all__ = ["S3FaultProxy", "S3Faults"]

_ERROR = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
          "<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


@dataclass
class S3Faults:
    """Shares (0 to 1) of the requests that get each fault; see the module's description."""

    slow_down: float = 0.0
    internal_error: float = 0.0
    applied_then_500: float = 0.0
    stall: float = 0.0
    stall_s: float = 5.0
    down: bool = False

    def draw(self, rng: random.Random, conditional_put: bool) -> str:
        """One request's outcome: a fault's name or ``"forwarded"``."""
        if self.down:
            return "down"
        roll = rng.random()
        for name, share in (("slow_down", self.slow_down),
                            ("internal_error", self.internal_error),
                            ("applied_then_500", self.applied_then_500 if conditional_put else 0),
                            ("stall", self.stall)):
            if roll < share:
                return name
            roll -= share
        return "forwarded"


@dataclass(eq=False)
class S3FaultProxy(_process.Harness):
    """The fault proxy on a free loopback port, forwarding to ``upstream``
    (``http://host:port``)."""

    upstream: str
    faults: S3Faults = field(default_factory=S3Faults)
    seed: int = 1
    counts: Counter[str] = field(default_factory=Counter, init=False)

    _server: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _rng: random.Random = field(default_factory=random.Random, init=False, repr=False)

    @property
    def endpoint_url(self) -> str:
        server = _process.started(self._server, "the S3 fault proxy")
        return f"http://127.0.0.1:{server.server_address[1]}"

    def start(self) -> S3FaultProxy:
        if self._server is not None:
            return self
        target = urlsplit(self.upstream)
        if target.scheme != "http" or target.hostname is None:
            raise LocalKafkaError(f"upstream={self.upstream!r}: give http://host:port")
        self._rng.seed(self.seed)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy",
                         daemon=True).start()
        _process.track(self)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        _process.untrack(self)

    def outcome(self, method: str, headers: Any) -> str:
        """Draw and count one request's outcome."""
        conditional = method == "PUT" and bool(headers.get("If-None-Match")
                                               or headers.get("If-Match"))
        with self._lock:
            result = self.faults.draw(self._rng, conditional)
            self.counts[result] += 1
            self.counts["requests"] += 1
            self.counts[f"{method}{' conditional' if conditional else ''}"] += 1
        return result


def _handler(proxy: S3FaultProxy) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _error(self, status: int, code: str, message: str) -> None:
            body = _ERROR.format(code=code, message=message).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port,
                                              timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in _HOP_BY_HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.reason, resp.getheaders(), resp.read()
            finally:
                conn.close()

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            outcome = proxy.outcome(self.command, self.headers)
            if outcome in ("down", "slow_down"):
                return self._error(503, "SlowDown", "Please reduce your request rate.")
            if outcome == "internal_error":
                return self._error(500, "InternalError", "We encountered an internal error.")
            if outcome == "stall":
                time.sleep(proxy.faults.stall_s)
            status, reason, headers, data = self._forward(body)
            if outcome == "applied_then_500":
                proxy.counts[f"applied_then_500:{status}"] += 1
                return self._error(500, "InternalError", "We encountered an internal error.")
            self.send_response(status, reason)
            for key, value in headers:
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return None

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler
