"""The local broker's files and names: its log4j configurations (the broker's, the tools'),
a new KRaft cluster id, the mark of a kept data directory, Kafka's tool classes, and what a
node of a :class:`~pyspark_kafka_share.harness.cluster.LocalKafkaCluster` changes in its
``server.properties`` (:class:`ClusterNode`).

What :class:`~pyspark_kafka_share.harness.broker.LocalKafka` writes before its JVM starts;
the process's life cycle and the client helpers stay in :mod:`.broker`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from pyspark_kafka_share.errors import LocalKafkaError, OptionError

__all__ = [
    "DATA_DIR_MARK",
    "TOOL_CLASSES",
    "ClusterNode",
    "advertise_via",
    "broker_log4j",
    "cluster_id",
    "node_properties",
    "take_data_dir",
    "tool_log4j",
]

TOOL_CLASSES = {
    "ShareGroupCommand": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "ConsoleShareConsumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "ShareConsumerPerformance": "org.apache.kafka.tools.ShareConsumerPerformance",
    "ProducerPerformance": "org.apache.kafka.tools.ProducerPerformance",
    "ConsumerPerformance": "org.apache.kafka.tools.ConsumerPerformance",
    "ConfigCommand": "kafka.admin.ConfigCommand",
    "TopicCommand": "org.apache.kafka.tools.TopicCommand",
    "GetOffsetShell": "org.apache.kafka.tools.GetOffsetShell",
    "FeatureCommand": "org.apache.kafka.tools.FeatureCommand",
}

# The broker logs to stdout (its broker.log); Kafka's coordinators are chatty at INFO.
_BROKER_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.coordinator
        level: WARN
      - name: org.apache.kafka.coordinator
        level: WARN
"""

# The tools log to stderr, so that stdout is only their output. A configuration file beats
# -Dlog4j2.level (which only sets the level of log4j's default configuration), hence one file
# per level.
_TOOL_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDERR
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: {level}
      AppenderRef:
        - ref: STDERR
"""

_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")


def _config_file(directory: Path, name: str, text: str) -> Path:
    """``directory/name`` holding ``text``: written (atomically) only if missing or different."""
    path = directory / name
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)
    return path


def broker_log4j(libs: Path) -> Path:
    return _config_file(libs.parent, "log4j2.yaml", _BROKER_LOG4J2)


def tool_log4j(libs: Path, level: str) -> Path:
    if level.upper() not in _LOG_LEVELS:
        raise LocalKafkaError(f"unknown log4j level {level!r}; one of {', '.join(_LOG_LEVELS)}")
    return _config_file(libs.parent, f"log4j2-tools-{level.lower()}.yaml",
                        _TOOL_LOG4J2.format(level=level.upper()))


def cluster_id() -> str:
    """A KRaft cluster id: URL-safe base64 of 16 random bytes, as Kafka's ``Uuid`` prints it.

    Like Kafka's ``Uuid.randomUuid``, never one starting with '-': the storage tool's argument
    parser would take it for an option (about 1 start in 64 failed before this).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid


DATA_DIR_MARK = "localkafka-data-dir"
"""The file that marks a ``data_dir`` as a :class:`LocalKafka`'s own (written when it is first
taken): only such a directory, or an empty one, is used."""


def take_data_dir(path: Path, security: str) -> bool:
    """Make ``path`` a broker's data directory, or check that it is one already: whether its
    storage is formatted (a broker ran on it before). Raises :class:`OptionError`
    (``data_dir``) for a directory that is neither empty nor a broker's, or a secured broker."""
    if security.lower() != "plaintext":
        raise OptionError("data_dir", str(path),
                          "a secured broker makes new certificates and passwords at each start, "
                          "so it cannot start on kept data: leave the data directory out, or "
                          "use the plaintext listener")
    if path.exists() and not path.is_dir():
        raise OptionError("data_dir", str(path), "it is a file, not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / DATA_DIR_MARK).is_file():
        raise OptionError("data_dir", str(path),
                          f"the directory is not empty and holds no earlier broker's data (no "
                          f"{DATA_DIR_MARK} file in it): give a new or empty directory, or one "
                          "an earlier broker kept its data in")
    path.mkdir(parents=True, exist_ok=True)
    (path / DATA_DIR_MARK).write_text(
        "The data of a local Kafka broker (pyspark-kafka-share's LocalKafka, `kafka-share "
        "broker --data-dir`): a broker started on this directory again finds it.\n")
    return (path / "data" / "meta.properties").is_file()


@dataclass(frozen=True)
class ClusterNode:
    """One node of a multi-broker KRaft cluster: what it shares with the others (the cluster
    id, the controller quorum, the replication) and its own ports.

    ``port``: its client listener's. ``advertised_port``: the port clients are told to use
    for it (a fault proxy in front of ``port``), or ``None`` for ``port`` itself.
    ``bootstrap``: every node's client address, comma-separated (the cluster's
    ``bootstrap.servers``).
    """

    node_id: int
    voters: str  # controller.quorum.voters: "1@127.0.0.1:p1,2@127.0.0.1:p2,..."
    controller_port: int
    internal_port: int  # the plaintext inter-broker listener (a secured node has its own)
    cluster_id: str
    bootstrap: str
    replicas: int
    min_insync: int
    advertised_port: int | None
    port: int


def node_properties(node: ClusterNode, port: int, secured: bool) -> dict[str, str]:
    """The ``server.properties`` entries by which a cluster node differs from a single
    broker: its id and quorum, replicated internal topics, and (plaintext) an ``INTERNAL``
    listener for the inter-broker traffic, which therefore never passes a client-side proxy.
    A secured node's listeners come from its :class:`BrokerSecurity` (with ``INTERNAL``)."""
    rf, isr = str(node.replicas), str(node.min_insync)
    props = {
        "node.id": str(node.node_id),
        "controller.quorum.voters": node.voters,
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
    }
    if not secured:
        listeners = f"PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{node.internal_port}"
        props.update({
            "listeners": f"{listeners},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": listeners,
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        })
    return props


def advertise_via(props: dict[str, str], port: int, advertised_port: int) -> None:
    """Advertise the client listener on ``port`` as ``advertised_port`` (a proxy's)."""
    props["advertised.listeners"] = ",".join(
        item.replace(f"//127.0.0.1:{port}", f"//127.0.0.1:{advertised_port}")
        if item.endswith(f"//127.0.0.1:{port}") else item
        for item in props["advertised.listeners"].split(","))
