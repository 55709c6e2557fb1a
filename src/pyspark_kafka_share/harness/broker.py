"""A real, single-node Apache Kafka broker for development, tests, the demo and benchmarks.

The broker is Apache Kafka's own server, run from the Maven Central jars in a JVM of its own::

    from pyspark_kafka_share.harness import LocalKafka

    with LocalKafka() as kafka:
        kafka.create_topic("orders", partitions=3)
        kafka.produce("orders", [b"a", b"b"])
        kafka.set_group_config("workers", "share.auto.offset.reset", "earliest")
        print(kafka.bootstrap_servers)

Jars are fetched once with Maven into :func:`~pyspark_kafka_share.harness.jars.cache_dir`
(``$PYSPARK_KAFKA_SHARE_CACHE``, default ``~/.cache/pyspark-kafka-share``; see
:mod:`pyspark_kafka_share.harness.jars`). With ``$PYSPARK_KAFKA_SHARE_BOOTSTRAP`` set, no
broker is started and that one is used instead.

The JVM never outlives its owner: :meth:`LocalKafka.stop` (also run by the context manager, at
interpreter exit and on SIGTERM) terminates it, and on Linux the kernel kills it if the owning
process dies without cleaning up (``PR_SET_PDEATHSIG``). :meth:`LocalKafka.kill` and
:meth:`LocalKafka.restart` rehearse a broker crash: the data and the ports survive them.
``LocalKafka(data_dir=...)`` keeps the data in a directory of the caller's that outlives the
broker: a later ``LocalKafka`` on it starts with the same topics, records and groups.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share._kafka.group import write_group_configs
from pyspark_kafka_share._kafka.logs import client_config
from pyspark_kafka_share._kafka.produce import produce
from pyspark_kafka_share.errors import LocalKafkaError, NotReady
from pyspark_kafka_share.harness import _process
from pyspark_kafka_share.harness.broker_files import (
    DATA_DIR_MARK,
    TOOL_CLASSES,
    ClusterNode,
    advertise_via,
    broker_log4j,
    cluster_id,
    node_properties,
    take_data_dir,
    tool_log4j,
)
from pyspark_kafka_share.harness.jars import (
    ENV_CACHE,
    KAFKA_VERSION,
    cache_dir,
    ensure_jars,
    kafka_version,
    require_tool,
)
from pyspark_kafka_share.harness.security import ADMIN, BrokerSecurity

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    from pyspark_kafka_share._kafka.connection import ConnectionConfig

__all__ = [
    "DATA_DIR_MARK",
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "KAFKA_VERSION",
    "LocalKafka",
    "ProducerRecord",
    "cache_dir",
    "ensure_jars",
]

ENV_BOOTSTRAP = "PYSPARK_KAFKA_SHARE_BOOTSTRAP"
"""Environment variable: use this existing broker instead of starting one."""

_WORKDIR_PREFIX = "localkafka-"


@dataclass(frozen=True)
class ProducerRecord:
    """One record for :meth:`LocalKafka.produce`."""

    value: bytes | str | None
    key: bytes | str | None = None
    headers: list[tuple[str, bytes | None]] | None = None
    partition: int | None = None
    timestamp_ms: int | None = None


@dataclass(eq=False)
class BrokerSettings:
    """The settings every broker JVM is started with: :class:`LocalKafka`'s first arguments
    (described there), which :class:`~pyspark_kafka_share.harness.LocalKafkaCluster` also
    takes and gives to each of its nodes (:meth:`broker_settings`)."""

    lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    heartbeat_interval_ms: int = 1_000
    session_timeout_ms: int = 10_000
    extra_config: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 90.0
    heap: str = "1g"
    version: str = field(default_factory=kafka_version)
    security: str = "plaintext"
    users: Mapping[str, str] = field(default_factory=dict, repr=False)  # passwords

    def broker_settings(self) -> dict[str, Any]:
        """These settings, as keyword arguments of :class:`LocalKafka`."""
        return {f.name: getattr(self, f.name) for f in fields(BrokerSettings)}


@dataclass(eq=False)
class LocalKafka(BrokerSettings, _process.Harness):
    """One combined broker+controller Kafka JVM on free loopback ports, for tests and development.

    Life cycle: :meth:`start` (fresh data, new ports), then any number of :meth:`kill` (a
    crash: SIGKILL, data kept) and :meth:`restart` (same data, same ports), then :meth:`stop`
    (data deleted, unless it is in ``data_dir``).

    Args:
        lock_duration_ms: broker default for ``share.record.lock.duration.ms`` (acquisition lock).
        delivery_count_limit: broker default for ``share.delivery.count.limit``.
        heartbeat_interval_ms: share-group heartbeat interval; small values make consumers join
            quickly (the broker default of 5 s makes every new group wait about 5 s).
        session_timeout_ms: share-group session timeout; how soon a dead member's records are
            released.
        extra_config: more ``server.properties`` entries, overriding the above.
        start_timeout_s: how long :meth:`start` and :meth:`restart` wait for the broker.
        heap: the JVM's ``-Xmx``.
        version: the Apache Kafka release run (jars from Maven Central, cached); by default
            ``$PYSPARK_KAFKA_SHARE_KAFKA_VERSION`` or :data:`KAFKA_VERSION`. ``restart(version=)``
            brings the same data back on another release (a rolling upgrade).
        port: the client listener's port on 127.0.0.1 (None: a free one).
        security: the client listener: ``"plaintext"`` (default), ``"ssl"`` (mutual TLS),
            ``"sasl_ssl"`` or ``"sasl_plaintext"`` (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER),
            with ACLs (see :mod:`pyspark_kafka_share.harness.security`).
        users: SASL users (name -> password) known from the start (PLAIN needs them here;
            SCRAM users can also be added later with :meth:`add_user`).
        data_dir: where the broker keeps its data, configuration and ``broker.log`` (None: a
            new temporary directory, which :meth:`stop` deletes). :meth:`stop` leaves this
            one, and a broker started on it later (any port) finds the topics, records and
            groups again. It must be new, empty, or one that a broker used before (marked by
            :data:`DATA_DIR_MARK`); a secured broker cannot use one (:class:`OptionError`).
    """

    port: int | None = None
    data_dir: str | Path | None = None

    _bootstrap: str | None = field(default=None, init=False, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log_from: int = field(default=0, init=False, repr=False)  # the last JVM's log: from here
    _workdir: Path | None = field(default=None, init=False, repr=False)
    _external: bool = field(default=False, init=False, repr=False)
    _security: BrokerSecurity | None = field(default=None, init=False, repr=False)
    # Set by LocalKafkaCluster before start(): this broker is one node of a cluster.
    _node: ClusterNode | None = field(default=None, init=False, repr=False)
    _shared_security: BrokerSecurity | None = field(default=None, init=False, repr=False)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the broker; the same after :meth:`kill` and :meth:`restart`. A
        cluster node's: every node's (the cluster's)."""
        bootstrap = _process.started(self._bootstrap, "the broker")
        return bootstrap if self._node is None else self._node.bootstrap

    @property
    def log_path(self) -> Path | None:
        """The broker's log file (``None`` for an external broker); restarts append to it."""
        return None if self._workdir is None else self._workdir / "broker.log"

    @property
    def is_external(self) -> bool:
        """True when ``$PYSPARK_KAFKA_SHARE_BOOTSTRAP`` named a broker and none was started."""
        return self._external

    @property
    def is_running(self) -> bool:
        """True while this broker's JVM runs (an external broker: while it is in use)."""
        if self._external:
            return True
        return self._proc is not None and self._proc.poll() is None

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
        if self._security is not None:
            props.update(self._security.server_properties(controller_port))
        if self._node is not None:
            props.update(node_properties(self._node, port, self._security is not None))
            if self._node.advertised_port is not None:
                advertise_via(props, port, self._node.advertised_port)
        props.update(self.extra_config)
        return props

    def start(self) -> LocalKafka:
        """Format storage, start the JVM and wait until the broker answers. Idempotent. A
        port picked here and taken by another process before the JVM bound it: started
        again on fresh ports (:func:`~pyspark_kafka_share.harness._process.start_on_free_ports`).

        Raises :class:`LocalKafkaError` after :meth:`kill`: use :meth:`restart` (same data)
        or :meth:`stop` and then start (fresh data).
        """
        if self._bootstrap is not None:
            if self._workdir is not None and not self.is_running:
                raise LocalKafkaError("the broker was killed; restart() it (its data and "
                                      "ports are kept) or stop() it before start()")
            return self
        external = os.environ.get(ENV_BOOTSTRAP)
        if external:
            self._bootstrap, self._external = external, True
            self._wait_ready(time.monotonic() + self.start_timeout_s)
            return self
        _process.start_on_free_ports(self._start_own, self._port_taken, self.stop,
                                     "the Kafka broker")
        return self

    def _start_own(self) -> None:
        self._prepare()
        self._launch()

    def _port_taken(self) -> str | None:
        """The address the JVM last started could not bind because another process took it
        after it was picked (from its log), or ``None``; not the caller's own ``port``
        (starting again would not free it)."""
        path = self.log_path
        if path is None or not path.exists():
            return None
        with path.open("rb") as log:
            log.seek(self._log_from)
            address = _process.port_taken(log.read().decode("utf-8", errors="replace"))
        mine = self.port is not None and self._node is None
        return None if mine and address == f"127.0.0.1:{self.port}" else address

    def _prepare(self) -> None:
        """Make the data directory, the certificates (secured) and ``server.properties``, and
        format the storage (unless a kept ``data_dir`` is formatted already)."""
        java = require_tool("java", "the broker runs in a Java 17+ JVM")
        libs = ensure_jars(self.version)
        formatted = False
        if self.data_dir is None:
            workdir = _process.make_workdir(_WORKDIR_PREFIX)
        else:
            workdir = Path(self.data_dir).absolute()
            formatted = take_data_dir(workdir, self.security)
        self._workdir = workdir
        node = self._node
        port = self.port or _process.free_port()
        controller_port = _process.free_port() if node is None else node.controller_port
        if self._shared_security is not None:
            self._security = self._shared_security.for_port(port)
        elif self.security.lower() != "plaintext":
            self._security = BrokerSecurity.create(self.security, workdir / "tls", port, self.users)
        props = self.server_properties(port, controller_port, workdir / "data")
        conf = workdir / "server.properties"
        conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        fmt = None if formatted else subprocess.run(
            [java, f"-Dlog4j2.configurationFile={broker_log4j(libs)}", "-cp", f"{libs}/*",
             "kafka.tools.StorageTool", "format", "-t",
             cluster_id() if node is None else node.cluster_id, "-c", str(conf),
             *(self._security.format_args() if self._security else ())],
            capture_output=True, text=True, check=False,
        )
        if fmt is not None and fmt.returncode != 0:
            raise LocalKafkaError(
                f"formatting KRaft storage failed:\n{(fmt.stdout + fmt.stderr)[-3000:]}"
            )
        self._bootstrap = f"127.0.0.1:{port}"

    def _launch(self) -> None:
        """Start the JVM on the formatted data dir and wait until it is ready."""
        self._spawn()
        self._wait_ready(time.monotonic() + self.start_timeout_s)

    def _spawn(self) -> None:
        """Start the JVM on the formatted data dir (not waiting)."""
        assert self._workdir is not None
        java = require_tool("java", "the broker runs in a Java 17+ JVM")
        libs = ensure_jars(self.version)
        _process.track(self)
        with open(self._workdir / "broker.log", "ab") as log:
            self._log_from = log.tell()
            if log.tell():
                log.write(f"\n===== localkafka: restarting the broker at "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n\n".encode())
                log.flush()
            self._proc = _process.spawn(
                [java, f"-Xmx{self.heap}", "-Xms256m", "-XX:+UseG1GC",
                 "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={broker_log4j(libs)}",
                 "-cp", f"{libs}/*", "kafka.Kafka", str(self._workdir / "server.properties")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )

    def kill(self) -> None:
        """SIGKILL the broker JVM, as a crash would: no controlled shutdown; the data is kept.

        Clients get connection errors until :meth:`restart`; :attr:`bootstrap_servers` stays
        valid. Idempotent. Raises :class:`LocalKafkaError` for an external broker or one not
        started.
        """
        self._check_own("kill")
        proc, self._proc = self._proc, None
        if proc is not None:
            _process.end_process_groups([proc], graceful=False)

    def restart(self, version: str | None = None) -> LocalKafka:
        """Start the broker again with the same data, cluster id and ports; wait until ready.

        ``version``: come back on that Apache Kafka release (its jars are fetched before the
        broker stops): a rolling upgrade, as an operator does it: the finalized feature levels
        (``metadata.version``, ``share.version``) stay until raised with Kafka's feature tool
        (``run_tool("FeatureCommand", ...)``).

        After :meth:`kill` this starts a new JVM, which recovers the logs as after a crash.
        While the broker runs, it is first stopped cleanly (SIGTERM, data kept): a rolling
        restart. Not after :meth:`stop`, which deletes the data (use :meth:`start`), and not
        for an external broker: both raise :class:`LocalKafkaError`. If the new JVM fails to
        become ready (for example another process took its port meanwhile), it is killed, the
        data is kept, and :class:`LocalKafkaError` says why; restart() may be called again.
        """
        self._check_own("restart")
        if version is not None:
            ensure_jars(version)
            self.version = version
        proc, self._proc = self._proc, None
        if proc is not None:
            _process.end_process_groups([proc], graceful=True)
        try:
            self._launch()
        except BaseException:
            self.kill()
            raise
        return self

    def _check_own(self, what: str) -> None:
        if self._external:
            raise LocalKafkaError(f"cannot {what} an external broker (${ENV_BOOTSTRAP} is set)")
        if self._workdir is None or self._bootstrap is None:
            raise LocalKafkaError(f"cannot {what} a broker that is not started (stop() deletes "
                                  "the data: start() a new one)")

    def _log_tail(self, chars: int = 4000) -> str:
        return _process.log_tail(self.log_path, chars, "(no broker log)")

    def _wait_ready(self, deadline: float) -> None:
        """Until the broker answers metadata requests and every partition has a leader."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0,
                             **self._harness_settings()})

        def answers() -> bool:
            md = admin.list_topics(timeout=2)
            leaderless = [f"{t}-{p.id}" for t, tm in md.topics.items()
                          for p in tm.partitions.values() if p.leader < 0]
            if self._node is not None and self._node.node_id not in md.brokers:
                raise NotReady(f"node {self._node.node_id} is not in the cluster's metadata "
                               f"(brokers: {sorted(md.brokers)})")
            if md.brokers and not leaderless:
                return True
            raise NotReady(f"partitions without a leader: {leaderless[:5]}")

        _process.wait_ready(
            answers, deadline, interval_s=0.2,
            children=lambda: [] if self._proc is None else [("broker", self._proc)],
            exited=lambda _, code: (f"the Kafka broker exited with code {code} while starting; "
                                    f"log tail:\n{self._log_tail()}"),
            timed_out=lambda last: (
                f"the Kafka broker at {self._bootstrap} did not answer within "
                f"{self.start_timeout_s:.0f}s (last error: {last}); log tail:\n{self._log_tail()}"),
        )

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL after 15 s) and delete its data (not the data
        in ``data_dir``). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _process.end_process_groups([proc], graceful=True)
        _process.untrack(self)
        workdir, self._workdir = self._workdir, None
        if workdir is not None and self.data_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        self._bootstrap = None
        self._external = False
        self._security = None

    # -- helpers for tests and development -----------------------------------------------

    def admin(self) -> AdminClient:
        """A confluent-kafka ``AdminClient`` for this broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient(client_config({"bootstrap.servers": self.bootstrap_servers,
                                          **self._harness_settings()}))

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
                     *, timeout_s: float = 30.0) -> str:
        """Create a topic and wait until its metadata shows every partition with a leader."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        replicas = 1 if self._node is None else self._node.replicas
        futures = admin.create_topics(
            [NewTopic(name, partitions, replicas, config=dict(config or {}))],
            request_timeout=timeout_s,
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
            "enable.idempotence": "true", **self._harness_settings(),
        }
        conf.update(producer_config or {})
        producer = Producer(client_config(conf))  # its log lines: the package's client logger
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        count = 0
        for item in records:
            rec = item if isinstance(item, ProducerRecord) else ProducerRecord(value=item)
            extra: dict[str, int] = {}
            part = rec.partition if rec.partition is not None else partition
            if part is not None:
                extra["partition"] = part
            if rec.timestamp_ms is not None:
                extra["timestamp"] = rec.timestamp_ms
            produce(producer, topic, rec.value, key=rec.key, headers=rec.headers,
                    on_delivery=on_delivery, timeout_s=60, **extra)
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
        # The client must outlive the futures: a collected client cancels them.
        write_group_configs(self.admin(), group, {key: value}, 30.0)

    def run_tool(self, main_class: str, *args: str, timeout_s: float = 180.0,
                 check: bool = True, log_level: str = "WARN") -> subprocess.CompletedProcess[str]:
        """Run a Kafka command-line tool class (e.g. ``"ShareGroupCommand"``) in a JVM.

        ``main_class`` is a fully qualified class name or one of the short names in
        ``TOOL_CLASSES``. Arguments are passed as given (add ``--bootstrap-server``
        yourself, it is :attr:`bootstrap_servers`). The tool's stdout is its output only; its
        log goes to stderr at ``log_level`` (``"INFO"`` shows the clients' configs and
        more). Raises :class:`LocalKafkaError` on a non-zero exit when ``check`` is true.
        """
        java = require_tool("java", "Kafka's tools run in a JVM")
        libs = ensure_jars(self.version)
        cls = TOOL_CLASSES.get(main_class, main_class)
        cmd = [java, "-Xmx512m", f"-Dlog4j2.configurationFile={tool_log4j(libs, log_level)}",
               "-cp", f"{libs}/*", cls, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise LocalKafkaError(
                f"{cls} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )
        return proc

    # -- secured brokers (LocalKafka(security=...)); see harness/security.py --------------

    def _harness_settings(self) -> dict[str, Any]:
        """The harness's own client settings: the super user's, on a secured broker."""
        if self._security is None:
            return {}
        return self._security.client_settings(ADMIN, "PLAIN")

    @property
    def secured(self) -> BrokerSecurity:
        """The secured broker's CA, certificates and users (raises for a plaintext broker)."""
        if self._security is None:
            raise LocalKafkaError("this broker is plaintext: start LocalKafka(security=...)")
        return self._security

    def client_config(self, user: str = ADMIN, *, mechanism: str | None = None,
                      listener: str | None = None, **extra: Any) -> dict[str, Any]:
        """librdkafka (confluent-kafka) settings to connect as ``user``: ``bootstrap.servers``,
        ``security.protocol``, the CA, the client certificate (``ssl``) or SASL credentials
        (``mechanism``, default SCRAM-SHA-512; OAUTHBEARER: an unsecured JWT), and ``extra``.
        ``listener``: one of the ``security`` modes (default: the first)."""
        if self._security is None:
            return {"bootstrap.servers": self.bootstrap_servers, **extra}
        return {"bootstrap.servers": self._security.bootstrap(listener),
                **self._security.client_settings(user, mechanism, listener), **extra}

    def connection_config(self, user: str = ADMIN, *, mechanism: str | None = None,
                          listener: str | None = None) -> ConnectionConfig:
        """The protocol client's :class:`ConnectionConfig` to connect as ``user``."""
        from pyspark_kafka_share._kafka.connection import PLAINTEXT

        if self._security is None:
            return PLAINTEXT
        return self._security.connection_config(user, mechanism, listener)

    def command_config_file(self, user: str = ADMIN, *, mechanism: str | None = None,
                            listener: str | None = None) -> Path:
        """A Java client properties file for ``user`` (``kafka-share-groups.sh
        --command-config``); truststore and keystore as PEM."""
        assert self._workdir is not None
        text = self._security.java_properties(user, mechanism, listener) \
            if self._security else ""
        name = f"client-{user}-{mechanism or 'default'}-{listener or 'main'}.properties"
        path = self._workdir / name.lower()
        path.write_text(text)
        path.chmod(0o600)
        return path

    def add_user(self, name: str, password: str) -> None:
        """SCRAM-SHA-256 and SCRAM-SHA-512 credentials for a new SASL user."""
        self.secured.add_user(self.admin(), name, password)

    def grant(self, principal: str, resource_type: str, name: str, operation: str, *,
              pattern: str = "LITERAL") -> None:
        """An ALLOW ACL, e.g. ``grant("alice", "GROUP", "workers", "READ")``."""
        self.secured.grant(self.admin(), principal, resource_type, name, operation,
                           pattern=pattern)

    acl = grant
