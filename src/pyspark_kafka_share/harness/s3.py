"""A local S3-compatible server for tests, the demo and benchmarks (moto, in its own process).

::

    from pyspark_kafka_share.harness import LocalS3

    with LocalS3() as s3:
        s3.create_bucket("journal")
        reader.option("journalPath", "s3://journal/orders")
        for key, value in s3.journal_options().items():  # endpoint and test credentials
            reader.option(key, value)

The server is moto's S3 (``pip install 'moto[server]'``, part of the ``dev`` extra) on a free
port of 127.0.0.1. It honours conditional writes (``If-None-Match: *`` on PutObject and
CompleteMultipartUpload), which the journal's exclusive create relies on. Moto checks the
condition and then stores the object in two steps; this harness serves one request at a time
(a lock around moto's WSGI application), so that check and store are atomic as on S3 itself.

Like :class:`~pyspark_kafka_share.harness.LocalKafka`, the server never outlives its owner:
:meth:`LocalS3.stop` (also run by the context manager, at interpreter exit and on SIGTERM)
terminates it, and on Linux the kernel kills it if the owning process dies
(``PR_SET_PDEATHSIG``). Objects live in the server's memory only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import _process

__all__ = ["LocalS3"]

# Credentials moto accepts (it does not check signatures unless told to).
_ACCESS_KEY = "testing"
_SECRET_KEY = "testing"


def _child_env() -> dict[str, str]:
    """The server's environment: this package importable even when it is not installed."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


@dataclass(eq=False)
class LocalS3(_process.Harness):
    """Moto's S3 server on a free loopback port, in a child process.

    Args:
        region: the region the server reports and clients sign for.
        start_timeout_s: how long :meth:`start` waits for the server to answer.
    """

    region: str = "us-east-1"
    start_timeout_s: float = 60.0

    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _endpoint: str | None = field(default=None, init=False, repr=False)
    _log: Path | None = field(default=None, init=False, repr=False)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running server."""
        return _process.started(self._endpoint, "the S3 server")

    @property
    def log_path(self) -> Path | None:
        """The server's log while it runs."""
        return self._log

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> LocalS3:
        """Start the server process and wait until it answers. Idempotent."""
        if self._endpoint is not None:
            return self
        try:
            import moto.server  # noqa: F401 - fail here, with the fix, not in the child
        except ImportError as exc:
            raise LocalKafkaError(
                "LocalS3 needs moto's server: pip install 'moto[server]>=5.2' (or "
                "pip install 'pyspark-kafka-share[dev]')") from exc
        fd, log_name = tempfile.mkstemp(prefix="locals3-", suffix=".log")
        os.close(fd)
        self._log = Path(log_name)
        port_file = Path(log_name + ".port")
        try:
            with open(self._log, "wb") as log:
                self._proc = _process.spawn(
                    [sys.executable, "-m", "pyspark_kafka_share.harness.s3",
                     str(port_file)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=_child_env(),
                )
            _process.track(self)
            port = self._wait_port(port_file, time.monotonic() + self.start_timeout_s)
            self._endpoint = f"http://127.0.0.1:{port}"
        except BaseException:
            self.stop()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                port_file.unlink()
        return self

    def _log_tail(self, chars: int = 3000) -> str:
        return _process.log_tail(self._log, chars, "(no log)")

    def _wait_port(self, port_file: Path, deadline: float) -> int:
        def answers() -> int:
            port = int(port_file.read_text())
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return port

        return _process.wait_ready(
            answers, deadline, interval_s=0.05, retry_on=(FileNotFoundError, ValueError),
            children=lambda: [] if self._proc is None else [("server", self._proc)],
            exited=lambda _, code: (f"the S3 server exited with code {code} while starting; "
                                    f"log tail:\n{self._log_tail()}"),
            timed_out=lambda _: (f"the S3 server did not start within "
                                 f"{self.start_timeout_s:.0f}s; log tail:\n{self._log_tail()}"),
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _process.end_process_groups([proc], graceful=True, timeout_s=10)
        _process.untrack(self)
        if self._log is not None:
            with contextlib.suppress(FileNotFoundError):
                self._log.unlink()
        self._log = None
        self._endpoint = None

    # -- helpers ---------------------------------------------------------------------------

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (no error if it exists); return the name."""
        import boto3  # type: ignore[import-untyped]  # installed with moto

        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                              aws_access_key_id=_ACCESS_KEY,
                              aws_secret_access_key=_SECRET_KEY)
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()
        return name

    def journal_options(self) -> dict[str, str]:
        """``journal.*`` options of the ``kafka-share`` source for a journal on this server."""
        return {
            "journal.aws_endpoint": self.endpoint_url,
            "journal.aws_access_key_id": _ACCESS_KEY,
            "journal.aws_secret_access_key": _SECRET_KEY,
            "journal.aws_region": self.region,
        }

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that point clients at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": _ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": _SECRET_KEY,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }


@contextlib.contextmanager
def local_s3(**kwargs: Any) -> Iterator[LocalS3]:
    """``with local_s3() as s3:`` -- same as ``with LocalS3(...)``."""
    with LocalS3(**kwargs) as server:
        yield server


# -- the server process ------------------------------------------------------------------------


def _serialised(app: Callable[..., Iterable[bytes]]) -> Callable[..., list[bytes]]:
    """Run ``app`` one request at a time, the response body included: moto's conditional
    create (check, then store) is then atomic, as on S3."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with lock:
            result = app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()

    return wrapped


def _serve(port_file: str) -> None:  # pragma: no cover - runs in the child process
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", 0, _serialised(app), threaded=True,
                         request_handler=MotoRequestHandler)

    def on_term(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    parent = os.getppid()

    def watch_parent() -> None:  # besides PR_SET_PDEATHSIG: also off Linux, or if the
        while os.getppid() == parent:  # spawning thread (not process) ended first
            time.sleep(1)
        server.shutdown()

    threading.Thread(target=watch_parent, daemon=True).start()
    tmp = f"{port_file}.tmp"
    Path(tmp).write_text(str(server.server_address[1]))
    os.replace(tmp, port_file)
    server.serve_forever()


if __name__ == "__main__":  # pragma: no cover
    _serve(sys.argv[1])
