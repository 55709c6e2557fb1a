"""Network faults between clients and a local broker (or any TCP server): a Toxiproxy server
(Shopify's, https://github.com/Shopify/toxiproxy) and a small typed client of its HTTP API.

The server is one Go binary, installed once by ``make toxiproxy`` from the Go module proxy
into :func:`toxiproxy_binary`'s directory under the harness's cache::

    from pyspark_kafka_share.harness import LocalKafkaCluster
    from pyspark_kafka_share.harness.toxiproxy import Toxiproxy

    with Toxiproxy() as toxiproxy, LocalKafkaCluster(toxiproxy=toxiproxy) as kafka:
        proxy = kafka.proxy_name(2)
        toxiproxy.blackhole(proxy)          # node 2 unreachable for clients, not for brokers
        ...
        toxiproxy.remove_toxics(proxy)
        assert toxiproxy.bytes_through(proxy) > 0

A proxy listens on one address and forwards to its upstream; toxics act on the bytes of one
direction (``downstream``: server to client, ``upstream``: client to server), on the open
connections and the new ones alike:

==================  ====================================================================
:meth:`latency`     every chunk delayed by ``ms`` +- ``jitter_ms``
:meth:`reset_peer`  connections reset (TCP RST) after ``after_ms``
:meth:`blackhole`   both directions stop (Toxiproxy's ``timeout`` toxic with timeout 0):
                    bytes are swallowed, connections stay open, until the toxic is removed
:meth:`slow_drip`   chunks sliced small and delayed (``slicer``), a bandwidth cap
==================  ====================================================================

:meth:`bytes_through` reads the server's byte counters (its Prometheus metrics), so that a
test shows its toxic met traffic.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark_kafka_share.errors import LocalKafkaError, NotReady, SetupError
from pyspark_kafka_share.harness import _process
from pyspark_kafka_share.harness.jars import cache_dir

__all__ = ["ENV_TOXIPROXY", "TOXIPROXY_VERSION", "Toxiproxy", "toxiproxy_binary"]

TOXIPROXY_VERSION = "v2.5.0"
"""The newest v2 release the Go module proxy serves for github.com/Shopify/toxiproxy/v2 (later
releases were published under another module path's case, which the proxy refuses)."""

ENV_TOXIPROXY = "PYSPARK_KAFKA_SHARE_TOXIPROXY"
"""Environment variable: the toxiproxy server binary to run instead of the cached one."""

_STREAMS = ("upstream", "downstream")
_METRIC = re.compile(r'^toxiproxy_proxy_(received|sent)_bytes_total\{([^}]*)\}\s+(\S+)$')


def toxiproxy_binary() -> Path:
    """The toxiproxy server: ``$PYSPARK_KAFKA_SHARE_TOXIPROXY``, else the one ``make
    toxiproxy`` installed under the cache; :class:`SetupError` if it is missing."""
    given = os.environ.get(ENV_TOXIPROXY)
    path = Path(given) if given else cache_dir() / f"toxiproxy-{TOXIPROXY_VERSION}" / "server"
    if not os.access(path, os.X_OK):
        raise SetupError(f"no toxiproxy server at {path}: run `make toxiproxy` (go install "
                         f"github.com/Shopify/toxiproxy/v2/cmd/server@{TOXIPROXY_VERSION} into "
                         f"that directory), or set ${ENV_TOXIPROXY}")
    return path


@dataclass(eq=False)
class Toxiproxy(_process.Harness):
    """A Toxiproxy server on a free loopback port, and its HTTP API.

    ``seed``: the server's random seed (which connections a toxic of ``toxicity`` < 1 hits,
    the jitter drawn): a run with the same seed and traffic is replayable.
    """

    start_timeout_s: float = 30.0
    seed: int = 1
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _port: int | None = field(default=None, init=False, repr=False)
    _workdir: Path | None = field(default=None, init=False, repr=False)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{_process.started(self._port, 'the toxiproxy server')}"

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Toxiproxy:
        """Start the server (with its byte counters) and wait until it answers. Idempotent."""
        if self._proc is not None:
            return self
        binary = toxiproxy_binary()
        self._workdir = _process.make_workdir("toxiproxy-")
        self._port = _process.free_port()
        _process.track(self)
        with open(self._workdir / "toxiproxy.log", "ab") as log:
            self._proc = _process.spawn(
                [str(binary), "-host", "127.0.0.1", "-port", str(self._port), "-proxy-metrics",
                 "-seed", str(self.seed)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = self._proc
        try:
            _process.wait_ready(
                lambda: self._call("GET", "/version"), time.monotonic() + self.start_timeout_s,
                interval_s=0.1, children=lambda: [("toxiproxy", proc)],
                exited=lambda _, code: f"toxiproxy exited with code {code}: {self._log_tail()}",
                timed_out=lambda last: f"toxiproxy did not answer ({last}): {self._log_tail()}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _process.end_process_groups([proc], graceful=True, timeout_s=5.0)
        _process.untrack(self)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)

    def _log_tail(self) -> str:
        path = None if self._workdir is None else self._workdir / "toxiproxy.log"
        return _process.log_tail(path, 2000, "(no log)")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise LocalKafkaError(f"toxiproxy {method} {path}: HTTP {exc.code} "
                                  f"{exc.read().decode(errors='replace')[:300]}") from None
        except OSError as exc:
            raise NotReady(f"toxiproxy {method} {path}: {exc}") from exc
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    # -- proxies -------------------------------------------------------------------------

    def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        """A proxy ``name`` listening on ``listen`` (``host:port``), forwarding to
        ``upstream``."""
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                        "enabled": True})

    def delete_proxy(self, name: str, *, missing_ok: bool = False) -> None:
        try:
            self._call("DELETE", f"/proxies/{name}")
        except LocalKafkaError:
            if not missing_ok:
                raise

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Disable (stop listening, close every connection: refused) or enable a proxy."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def proxies(self) -> dict[str, Any]:
        """Every proxy with its toxics, as the API describes them."""
        result: dict[str, Any] = self._call("GET", "/proxies")
        return result

    # -- toxics --------------------------------------------------------------------------

    def add_toxic(self, proxy: str, kind: str, attributes: dict[str, int], *,
                  stream: str = "downstream", toxicity: float = 1.0,
                  name: str | None = None) -> str:
        """Add a toxic of type ``kind`` (latency, reset_peer, timeout, slicer, bandwidth, ...)
        on one direction; returns its name (default ``<kind>_<stream>``)."""
        if stream not in _STREAMS:
            raise LocalKafkaError(f"stream={stream!r}: give one of {_STREAMS}")
        toxic = name or f"{kind}_{stream}"
        self._call("POST", f"/proxies/{proxy}/toxics",
                   {"name": toxic, "type": kind, "stream": stream, "toxicity": toxicity,
                    "attributes": attributes})
        return toxic

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def remove_toxics(self, proxy: str) -> None:
        """Remove every toxic of ``proxy`` (its connections carry bytes again)."""
        for toxic in self._call("GET", f"/proxies/{proxy}/toxics"):
            self.remove_toxic(proxy, toxic["name"])

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("POST", "/reset")

    def latency(self, proxy: str, ms: int, jitter_ms: int = 0, *,
                stream: str = "downstream") -> str:
        return self.add_toxic(proxy, "latency", {"latency": ms, "jitter": jitter_ms},
                              stream=stream)

    def reset_peer(self, proxy: str, after_ms: int = 0, *, stream: str = "downstream",
                   toxicity: float = 1.0) -> str:
        """Reset connections (TCP RST) ``after_ms`` after they carry data."""
        return self.add_toxic(proxy, "reset_peer", {"timeout": after_ms}, stream=stream,
                              toxicity=toxicity)

    def blackhole(self, proxy: str) -> list[str]:
        """Swallow every byte both ways, keeping connections open, until removed."""
        return [self.add_toxic(proxy, "timeout", {"timeout": 0}, stream=s) for s in _STREAMS]

    def slow_drip(self, proxy: str, *, chunk_bytes: int = 64, delay_us: int = 2_000,
                  rate_kb_s: int = 64, stream: str = "downstream") -> list[str]:
        """Slice the bytes into ``chunk_bytes`` chunks ``delay_us`` apart, capped at
        ``rate_kb_s``."""
        return [
            self.add_toxic(proxy, "slicer", {"average_size": chunk_bytes,
                                             "size_variation": chunk_bytes // 2,
                                             "delay": delay_us}, stream=stream),
            self.add_toxic(proxy, "bandwidth", {"rate": rate_kb_s}, stream=stream),
        ]

    # -- byte counters ---------------------------------------------------------------------

    def byte_counters(self) -> dict[tuple[str, str, str], float]:
        """``(proxy, direction, received|sent) -> bytes`` from the server's metrics."""
        text = self._call("GET", "/metrics")
        out: dict[tuple[str, str, str], float] = {}
        for line in str(text).splitlines():
            match = _METRIC.match(line.strip())
            if match is None:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            key = (labels.get("proxy", ""), labels.get("direction", ""), match.group(1))
            out[key] = out.get(key, 0.0) + float(match.group(3))
        return out

    def bytes_through(self, proxy: str, direction: str | None = None) -> int:
        """Bytes the proxy received (from either side, or ``direction``'s) so far."""
        return int(sum(v for (p, d, kind), v in self.byte_counters().items()
                       if p == proxy and kind == "received" and direction in (None, d)))
