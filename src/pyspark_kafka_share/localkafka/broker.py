"""A real, single-node Apache Kafka broker for development, tests, the demo and benchmarks.

The broker is Apache Kafka's own server, run from the Maven Central jars in a JVM of its own::

    from pyspark_kafka_share.localkafka import LocalKafka

    with LocalKafka() as kafka:
        kafka.create_topic("orders", partitions=3)
        kafka.produce("orders", [b"a", b"b"])
        kafka.set_group_config("workers", "share.auto.offset.reset", "earliest")
        print(kafka.bootstrap_servers)

Jars are fetched once with Maven into :func:`cache_dir` (``$PYSPARK_KAFKA_SHARE_CACHE``, default
``~/.cache/pyspark-kafka-share``). With ``$PYSPARK_KAFKA_SHARE_BOOTSTRAP`` set, no broker is
started and that one is used instead.

The JVM never outlives its owner: :meth:`LocalKafka.stop` (also run by the context manager, at
interpreter exit and on SIGTERM) terminates it, and on Linux the kernel kills it if the owning
process dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from pyspark_kafka_share.errors import LocalKafkaError

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = [
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "KAFKA_VERSION",
    "LocalKafka",
    "ProducerRecord",
    "cache_dir",
    "ensure_jars",
]

KAFKA_VERSION = "4.3.1"
"""The Apache Kafka version the harness runs (share groups are GA from 4.2)."""

ENV_CACHE = "PYSPARK_KAFKA_SHARE_CACHE"
"""Environment variable: directory holding the downloaded broker jars."""

ENV_BOOTSTRAP = "PYSPARK_KAFKA_SHARE_BOOTSTRAP"
"""Environment variable: use this existing broker instead of starting one."""

_LOG4J_VERSION = "2.24.3"
_SLF4J_VERSION = "2.0.17"

_TOOL_CLASSES = {
    "ShareGroupCommand": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "ConsoleShareConsumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "ShareConsumerPerformance": "org.apache.kafka.tools.ShareConsumerPerformance",
    "ProducerPerformance": "org.apache.kafka.tools.ProducerPerformance",
    "ConsumerPerformance": "org.apache.kafka.tools.ConsumerPerformance",
    "ConfigCommand": "kafka.admin.ConfigCommand",
    "TopicCommand": "org.apache.kafka.tools.TopicCommand",
    "GetOffsetShell": "org.apache.kafka.tools.GetOffsetShell",
}

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pyspark-kafka-share</groupId>
  <artifactId>broker-jars</artifactId>
  <version>{kafka}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: {level}
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.coordinator
        level: WARN
      - name: org.apache.kafka.coordinator
        level: WARN
"""


def cache_dir() -> Path:
    """The directory holding downloaded broker jars (``$PYSPARK_KAFKA_SHARE_CACHE``)."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pyspark-kafka-share"


def _require_tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise LocalKafkaError(
            f"{name!r} was not found on PATH; {why}. Install it (Debian: "
            f"'apt-get install {'openjdk-17-jre-headless' if name == 'java' else 'maven'}') "
            f"or set {ENV_BOOTSTRAP} to use an existing broker."
        )
    return path


def ensure_jars(version: str = KAFKA_VERSION, *, quiet: bool = True) -> Path:
    """Fetch the broker and tools jars from Maven Central once; return the directory of jars.

    Safe to call concurrently from several processes (a file lock serialises the download).
    """
    root = cache_dir() / f"kafka-{version}"
    libs = root / "libs"
    done = root / ".complete"
    if done.exists():
        return libs
    root.mkdir(parents=True, exist_ok=True)
    mvn = _require_tool("mvn", "Maven fetches the Apache Kafka jars from Maven Central")
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return libs
        (root / "pom.xml").write_text(
            _POM.format(kafka=version, slf4j=_SLF4J_VERSION, log4j=_LOG4J_VERSION)
        )
        staging = root / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn, "-B", "-q", "-f", str(root / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
        ]
        if not quiet:
            print(f"fetching Apache Kafka {version} jars into {libs} ...", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise LocalKafkaError(
                f"Maven could not fetch Apache Kafka {version} jars (exit {proc.returncode}). "
                f"Check that Maven Central is reachable. Output:\n{tail}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        (root / "log4j2.yaml").write_text(_LOG4J2.format(level="INFO"))
        done.write_text(version)
    return libs


def _cluster_id() -> str:
    """A KRaft cluster id: URL-safe base64 of 16 random bytes, as Kafka's ``Uuid`` prints it.

    Like Kafka's ``Uuid.randomUuid``, never one starting with '-': the storage tool's argument
    parser would take it for an option (about 1 start in 64 failed before this).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_WORKDIR_PREFIX = "localkafka-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_orphaned_workdirs() -> None:
    """Delete broker data dirs left by owners that were killed (SIGKILL skips all cleanup)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*"):
        try:
            owner = int((path / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if not _pid_alive(owner):
            shutil.rmtree(path, ignore_errors=True)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the JVM's child process: ask the kernel to SIGKILL it when its parent dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class ProducerRecord:
    """One record for :meth:`LocalKafka.produce`."""

    value: bytes | str | None
    key: bytes | str | None = None
    headers: list[tuple[str, bytes | None]] | None = None
    partition: int | None = None
    timestamp_ms: int | None = None


# Every started broker, so that interpreter exit and SIGTERM stop them all.
_LIVE: weakref.WeakSet[LocalKafka] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_HOOKS_INSTALLED = False


def _stop_all() -> None:
    for kafka in list(_LIVE):
        with contextlib.suppress(Exception):
            kafka.stop()


def _install_exit_hooks() -> None:
    global _HOOKS_INSTALLED
    with _LIVE_LOCK:
        if _HOOKS_INSTALLED:
            return
        _HOOKS_INSTALLED = True
    atexit.register(_stop_all)
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: object) -> None:
            _stop_all()
            if callable(previous):
                previous(signum, frame)  # type: ignore[arg-type]
            else:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)


@dataclass(eq=False)
class LocalKafka:
    """One combined broker+controller Kafka JVM on free loopback ports, for tests and development.

    Args:
        lock_duration_ms: broker default for ``share.record.lock.duration.ms`` (acquisition lock).
        delivery_count_limit: broker default for ``share.delivery.count.limit``.
        heartbeat_interval_ms: share-group heartbeat interval; small values make consumers join
            quickly (the broker default of 5 s makes every new group wait about 5 s).
        session_timeout_ms: share-group session timeout; how soon a dead member's records are
            released.
        extra_config: more ``server.properties`` entries, overriding the above.
        start_timeout_s: how long :meth:`start` waits for the broker to answer.
        heap: the JVM's ``-Xmx``.
    """

    lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    heartbeat_interval_ms: int = 1_000
    session_timeout_ms: int = 10_000
    extra_config: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 90.0
    heap: str = "1g"
    version: str = KAFKA_VERSION

    _bootstrap: str | None = field(default=None, init=False, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _workdir: Path | None = field(default=None, init=False, repr=False)
    _external: bool = field(default=False, init=False, repr=False)

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalKafka:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the running broker."""
        if self._bootstrap is None:
            raise LocalKafkaError("the broker is not started; call start() or use 'with'")
        return self._bootstrap

    @property
    def log_path(self) -> Path | None:
        """The broker's log file (``None`` for an external broker)."""
        return None if self._workdir is None else self._workdir / "broker.log"

    @property
    def is_external(self) -> bool:
        """True when ``$PYSPARK_KAFKA_SHARE_BOOTSTRAP`` named a broker and none was started."""
        return self._external

    def server_properties(self, port: int, controller_port: int, log_dir: Path) -> dict[str, str]:
        """The ``server.properties`` the broker starts with."""
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0",
            "group.share.record.lock.duration.ms": str(self.lock_duration_ms),
            "group.share.min.record.lock.duration.ms": str(min(1_000, self.lock_duration_ms)),
            "group.share.delivery.count.limit": str(self.delivery_count_limit),
            "group.share.min.delivery.count.limit": str(min(2, self.delivery_count_limit)),
            "group.share.heartbeat.interval.ms": str(self.heartbeat_interval_ms),
            "group.share.min.heartbeat.interval.ms": str(min(500, self.heartbeat_interval_ms)),
            "group.share.session.timeout.ms": str(self.session_timeout_ms),
            "group.share.min.session.timeout.ms": str(min(5_000, self.session_timeout_ms)),
            "log.flush.interval.messages": "9223372036854775807",
        }
        props.update(self.extra_config)
        return props

    def start(self) -> LocalKafka:
        """Format storage, start the JVM and wait until the broker answers. Idempotent."""
        if self._bootstrap is not None:
            return self
        external = os.environ.get(ENV_BOOTSTRAP)
        if external:
            self._bootstrap, self._external = external, True
            self._wait_ready(time.monotonic() + self.start_timeout_s)
            return self
        java = _require_tool("java", "the broker runs in a Java 17+ JVM")
        libs = ensure_jars(self.version)
        _sweep_orphaned_workdirs()
        workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        (workdir / "owner.pid").write_text(str(os.getpid()))
        self._workdir = workdir
        try:
            port, controller_port = _free_port(), _free_port()
            props = self.server_properties(port, controller_port, workdir / "data")
            conf = workdir / "server.properties"
            conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            classpath = f"{libs}/*"
            log4j = f"-Dlog4j2.configurationFile={libs.parent / 'log4j2.yaml'}"
            fmt = subprocess.run(
                [java, log4j, "-cp", classpath, "kafka.tools.StorageTool", "format",
                 "-t", _cluster_id(), "-c", str(conf)],
                capture_output=True, text=True, check=False,
            )
            if fmt.returncode != 0:
                raise LocalKafkaError(
                    f"formatting KRaft storage failed:\n{(fmt.stdout + fmt.stderr)[-3000:]}"
                )
            log = open(workdir / "broker.log", "wb")  # noqa: SIM115 - owned by the child
            self._proc = subprocess.Popen(
                [java, f"-Xmx{self.heap}", "-Xms256m", "-XX:+UseG1GC",
                 "-Djava.awt.headless=true", log4j, "-cp", classpath, "kafka.Kafka", str(conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
            )
            log.close()
            _install_exit_hooks()
            _LIVE.add(self)
            self._bootstrap = f"127.0.0.1:{port}"
            self._wait_ready(time.monotonic() + self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self, chars: int = 4000) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no broker log)"
        data = path.read_bytes()[-chars:]
        return data.decode("utf-8", errors="replace")

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                code = self._proc.returncode
                raise LocalKafkaError(
                    f"the Kafka broker exited with code {code} while starting; "
                    f"log tail:\n{self._log_tail()}"
                )
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                last = exc
            time.sleep(0.2)
        raise LocalKafkaError(
            f"the Kafka broker at {self._bootstrap} did not answer within "
            f"{self.start_timeout_s:.0f}s (last error: {last}); log tail:\n{self._log_tail()}"
        )

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after 15 s) and delete its data. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        _LIVE.discard(self)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        self._bootstrap = None
        self._external = False

    # -- helpers for tests and development -----------------------------------------------

    def admin(self) -> AdminClient:
        """A confluent-kafka ``AdminClient`` for this broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
                     *, timeout_s: float = 30.0) -> str:
        """Create a topic and wait until its metadata shows every partition with a leader."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, partitions, 1, config=dict(config or {}))], request_timeout=timeout_s
        )
        futures[name].result(timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            md = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()
            ):
                return name
            time.sleep(0.1)
        raise LocalKafkaError(f"topic {name!r} has no leader for all partitions after {timeout_s}s")

    def produce(
        self,
        topic: str,
        records: Iterable[bytes | str | ProducerRecord | None],
        *,
        partition: int | None = None,
        producer_config: Mapping[str, str] | None = None,
    ) -> int:
        """Produce records (plain values or :class:`ProducerRecord`), flush, return the count.

        Raises :class:`LocalKafkaError` if any record fails to be delivered.
        """
        from confluent_kafka import Producer

        conf: dict[str, str | int] = {
            "bootstrap.servers": self.bootstrap_servers, "linger.ms": 5, "acks": "all",
            "enable.idempotence": "true",
        }
        conf.update(producer_config or {})
        producer = Producer(conf)
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        count = 0
        for item in records:
            rec = item if isinstance(item, ProducerRecord) else ProducerRecord(value=item)
            kwargs: dict[str, object] = {"value": rec.value, "key": rec.key,
                                         "on_delivery": on_delivery}
            part = rec.partition if rec.partition is not None else partition
            if part is not None:
                kwargs["partition"] = part
            if rec.headers is not None:
                kwargs["headers"] = rec.headers
            if rec.timestamp_ms is not None:
                kwargs["timestamp"] = rec.timestamp_ms
            while True:
                try:
                    producer.produce(topic, **kwargs)  # type: ignore[arg-type]
                    break
                except BufferError:
                    producer.poll(0.1)
            count += 1
            if count % 10_000 == 0:
                producer.poll(0)
        remaining = producer.flush(60)
        if remaining or errors:
            raise LocalKafkaError(
                f"producing to {topic!r} failed: {remaining} undelivered, errors: {errors[:5]}"
            )
        return count

    def set_group_config(self, group: str, key: str, value: str | int) -> None:
        """Set one dynamic config of a (share) group, e.g. ``share.auto.offset.reset``."""
        from confluent_kafka.admin import (
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        resource = ConfigResource(
            ResourceType.GROUP, group,
            incremental_configs=[ConfigEntry(key, str(value),
                                             incremental_operation=AlterConfigOpType.SET)],
        )
        admin = self.admin()  # must outlive the futures: a collected client cancels them
        for fut in admin.incremental_alter_configs([resource]).values():
            fut.result(timeout=30)

    def run_tool(self, main_class: str, *args: str, timeout_s: float = 180.0,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Kafka command-line tool class (e.g. ``"ShareGroupCommand"``) in a JVM.

        ``main_class`` is a fully qualified class name or one of the short names in
        ``_TOOL_CLASSES``. Arguments are passed as given (add ``--bootstrap-server``
        yourself, it is :attr:`bootstrap_servers`). Raises :class:`LocalKafkaError` on a
        non-zero exit when ``check`` is true.
        """
        java = _require_tool("java", "Kafka's tools run in a JVM")
        libs = ensure_jars(self.version)
        cls = _TOOL_CLASSES.get(main_class, main_class)
        cmd = [java, "-Xmx512m", f"-Dlog4j2.configurationFile={libs.parent / 'log4j2.yaml'}",
               "-Dlog4j2.level=WARN", "-cp", f"{libs}/*", cls, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise LocalKafkaError(
                f"{cls} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )
        return proc


@contextlib.contextmanager
def local_kafka(**kwargs: object) -> Iterator[LocalKafka]:
    """``with local_kafka(lock_duration_ms=5000) as kafka:`` -- same as ``with LocalKafka(...)``."""
    kafka = LocalKafka(**kwargs)  # type: ignore[arg-type]
    with kafka:
        yield kafka
