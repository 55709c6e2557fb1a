"""A local three-broker Apache Kafka cluster (KRaft), for failover tests and development.

Each node is a :class:`~pyspark_kafka_share.harness.broker.LocalKafka` (the same JVM, files and
security code) that is told it is one node of several (:class:`ClusterNode`)::

    from pyspark_kafka_share.harness import LocalKafkaCluster

    with LocalKafkaCluster() as kafka:                 # 3 nodes, replication factor 3
        kafka.create_topic("orders", partitions=3)     # min.insync.replicas=2
        leader = kafka.leader("orders", 0)
        kafka.kill(leader)                             # the others elect a new leader
        kafka.wait_for_leader("orders", 0, not_on={leader})
        kafka.restart(leader)

Every node is a combined controller and broker (``process.roles=broker,controller``): three
JVMs form the controller quorum and hold the replicas, the fewest JVMs for a quorum that
survives a node (a separate quorum is three JVMs more, or one that is a single point of
failure). Three nodes started in 30-47 s on the loaded 2-core machine (4.2.2 secured, 4.3.1,
4.4.0; the separate layouts were not measured). The internal
topics (consumer offsets, transaction state, the share coordinator's state) are replicated to
every node with ``min.insync.replicas=2``, so one node may be down at any time.

With ``toxiproxy=`` a :class:`~pyspark_kafka_share.harness.toxiproxy.Toxiproxy`, each node's
client listener is reached through a proxy of its own (``broker-<id>``), which the node
advertises: clients' data traffic passes it, not only their bootstrap, while the nodes talk to
each other on a listener of their own (``INTERNAL``), never through a proxy.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import _process
from pyspark_kafka_share.harness.broker import BrokerSettings, LocalKafka, ProducerRecord
from pyspark_kafka_share.harness.broker_files import ClusterNode, cluster_id
from pyspark_kafka_share.harness.jars import ensure_jars
from pyspark_kafka_share.harness.security import ADMIN, BrokerSecurity

if TYPE_CHECKING:
    import subprocess

    from confluent_kafka.admin import AdminClient

    from pyspark_kafka_share._kafka.connection import ConnectionConfig
    from pyspark_kafka_share.harness.toxiproxy import Toxiproxy

__all__ = ["ClusterNode", "LocalKafkaCluster"]


@dataclass(eq=False)
class LocalKafkaCluster(BrokerSettings, _process.Harness):
    """``brokers`` combined controller+broker Kafka JVMs on free loopback ports.

    Node ids are 1 to ``brokers``. :meth:`kill` and :meth:`restart` act on one node by id;
    the others keep serving. The arguments not described here are :class:`LocalKafka`'s
    (its :class:`BrokerSettings`, which come first: give them all by keyword), given to every
    node; a cluster's defaults for ``heap`` and ``start_timeout_s`` are 768m and 180 s.

    Args:
        brokers: how many nodes (3 or more for a quorum that survives one loss).
        min_insync_replicas: ``min.insync.replicas`` of every topic and of the transaction
            and share-state topics (the replication factor is ``brokers``).
        toxiproxy: a started or unstarted :class:`Toxiproxy`; clients reach each node through
            a proxy of it (:meth:`proxy_name`). The cluster starts it if needed, and deletes
            its proxies when it stops (not the Toxiproxy server: its owner stops it).
    """

    start_timeout_s: float = 180.0  # BrokerSettings' field, a cluster's default
    heap: str = "768m"  # BrokerSettings' field, a cluster's default
    brokers: int = 3
    min_insync_replicas: int = 2
    toxiproxy: Toxiproxy | None = None

    _nodes: dict[int, LocalKafka] = field(default_factory=dict, init=False, repr=False)

    # -- life cycle ----------------------------------------------------------------------

    def layout(self) -> list[ClusterNode]:
        """Each node's ids and ports (free ones, picked now): the quorum, the inter-broker
        listener, and the address clients are given (a proxy's with ``toxiproxy``)."""
        if self.brokers < 1 or not 1 <= self.min_insync_replicas <= self.brokers:
            raise LocalKafkaError(f"brokers={self.brokers}, min_insync_replicas="
                                  f"{self.min_insync_replicas}: give 1 <= min_insync_replicas "
                                  "<= brokers")
        ids = range(1, self.brokers + 1)
        controllers = {i: _process.free_port() for i in ids}
        advertised = {i: _process.free_port() if self.toxiproxy else None for i in ids}
        ports = {i: _process.free_port() for i in ids}
        voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in controllers.items())
        bootstrap = ",".join(f"127.0.0.1:{advertised[i] or ports[i]}" for i in ids)
        cid = cluster_id()
        return [ClusterNode(i, voters, controllers[i], _process.free_port(), cid, bootstrap,
                            self.brokers, self.min_insync_replicas, advertised[i], ports[i])
                for i in ids]

    def start(self) -> LocalKafkaCluster:
        """Format every node, start all JVMs together and wait until each is in the cluster's
        metadata (all again on fresh ports if a node lost one of its ports to another process
        before it bound it). Idempotent."""
        if self._nodes:
            return self
        ensure_jars(self.version)
        _process.start_on_free_ports(self._start_nodes, self._port_taken, self.stop,
                                     "the Kafka cluster")
        _process.track(self)
        return self

    def _start_nodes(self) -> None:
        """Lay the nodes out on free ports, prepare each, start them all, wait for each."""
        shared: BrokerSecurity | None = None
        for node in self.layout():
            kafka = LocalKafka(**self.broker_settings(), port=node.port)
            kafka._node, kafka._shared_security = node, shared
            self._nodes[node.node_id] = kafka
            kafka._prepare()
            shared = kafka._security
            if self.toxiproxy is not None and node.advertised_port is not None:
                self.toxiproxy.start().create_proxy(
                    self.proxy_name(node.node_id), f"127.0.0.1:{node.advertised_port}",
                    f"127.0.0.1:{node.port}")
        for kafka in self._nodes.values():
            kafka._spawn()
        deadline = time.monotonic() + self.start_timeout_s
        for kafka in self._nodes.values():
            kafka._wait_ready(deadline)

    def _port_taken(self) -> str | None:
        """A port a node could not bind because another process took it after the layout
        picked it (the quorum's ports are in every node's configuration: all start again on
        a new layout), or ``None``."""
        return next((a for a in (n._port_taken() for n in self._nodes.values()) if a), None)

    def stop(self) -> None:
        """Stop every node (data deleted) and delete the cluster's proxies. Idempotent."""
        nodes, self._nodes = list(self._nodes.values()), {}
        procs = [p for p in (n._proc for n in nodes) if p is not None]
        _process.end_process_groups(procs, graceful=True)  # all at once, not one by one
        for kafka in nodes:
            kafka.stop()
            if self.toxiproxy is not None and self.toxiproxy.is_running and kafka._node:
                self.toxiproxy.delete_proxy(self.proxy_name(kafka._node.node_id), missing_ok=True)
        _process.untrack(self)

    def node(self, node_id: int) -> LocalKafka:
        """The node ``node_id`` (1 to ``brokers``) of the started cluster."""
        if not self._nodes:
            raise LocalKafkaError("the cluster is not started; call start() or use 'with'")
        if node_id not in self._nodes:
            raise LocalKafkaError(f"no node {node_id}: the nodes are {sorted(self._nodes)}")
        return self._nodes[node_id]

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node's JVM (a crash; its data and ports are kept)."""
        self.node(node_id).kill()

    def restart(self, node_id: int, version: str | None = None) -> LocalKafka:
        """Start one node again on its data (stopping it cleanly first if it runs: a rolling
        restart); ``version``: on another Kafka release. Waits until it is back in the
        cluster's metadata."""
        return self.node(node_id).restart(version)

    def proxy_name(self, node_id: int) -> str:
        """The Toxiproxy proxy in front of node ``node_id``'s client listener."""
        return f"broker-{node_id}"

    @property
    def bootstrap_servers(self) -> str:
        """Every node's client address (through its proxy with ``toxiproxy``)."""
        return self._running().bootstrap_servers

    @property
    def is_running(self) -> bool:
        """True while every node's JVM runs."""
        return bool(self._nodes) and all(n.is_running for n in self._nodes.values())

    def log_paths(self) -> dict[int, Path]:
        return {i: n.log_path for i, n in self._nodes.items() if n.log_path is not None}

    def processes(self) -> dict[int, subprocess.Popen[bytes]]:
        """The running nodes' JVM processes, by node id."""
        return {i: n._proc for i, n in self._nodes.items() if n._proc is not None}

    def _running(self) -> LocalKafka:
        for kafka in (self._nodes[i] for i in self.node_ids):
            if kafka.is_running:
                return kafka
        raise LocalKafkaError("no node of the cluster is running (start() or restart() one)")

    # -- who leads what ----------------------------------------------------------------------

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node id leading ``topic``'s ``partition`` now (-1: none), from the metadata."""
        md = self.admin().list_topics(topic=topic, timeout=10).topics[topic]
        if md.error is not None or partition not in md.partitions:
            raise LocalKafkaError(f"no partition {topic}-{partition}: {md.error}")
        return int(md.partitions[partition].leader)

    def wait_for_leader(self, topic: str, partition: int = 0, *, not_on: Iterable[int] = (),
                        timeout_s: float = 60.0) -> int:
        """Wait until a node outside ``not_on`` leads the partition; return its id."""
        avoid, last = set(not_on), -1
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                last = self.leader(topic, partition)
            except Exception:  # noqa: BLE001 - a node going down: ask again
                last = -1
            if last >= 0 and last not in avoid:
                return last
            time.sleep(0.2)
        raise LocalKafkaError(f"{topic}-{partition}: no leader outside {sorted(avoid)} after "
                              f"{timeout_s:.0f}s (last: {last})")

    def group_coordinator(self, group: str, timeout_s: float = 30.0) -> int:
        """The node id coordinating ``group`` (FindCoordinator), e.g. a share group's."""
        from pyspark_kafka_share._kafka.protocol.client import KafkaProtocolClient

        with KafkaProtocolClient(self.bootstrap_servers, timeout_s=timeout_s,
                                 connection=self.connection_config()) as client:
            return client.find_coordinator(group).node_id

    # -- the single broker's helpers, on a running node -----------------------------------

    def admin(self) -> AdminClient:
        return self._running().admin()

    def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
                     *, timeout_s: float = 30.0) -> str:
        """A topic replicated to every node (``min.insync.replicas`` applies)."""
        return self._running().create_topic(name, partitions, config, timeout_s=timeout_s)

    def produce(self, topic: str, records: Iterable[bytes | str | ProducerRecord | None], *,
                partition: int | None = None,
                producer_config: Mapping[str, str] | None = None) -> int:
        return self._running().produce(topic, records, partition=partition,
                                       producer_config=producer_config)

    def set_group_config(self, group: str, key: str, value: str | int) -> None:
        self._running().set_group_config(group, key, value)

    def run_tool(self, main_class: str, *args: str, timeout_s: float = 180.0,
                 check: bool = True, log_level: str = "WARN") -> subprocess.CompletedProcess[str]:
        return self._running().run_tool(main_class, *args, timeout_s=timeout_s, check=check,
                                        log_level=log_level)

    def client_config(self, user: str = ADMIN, *, mechanism: str | None = None,
                      listener: str | None = None, **extra: Any) -> dict[str, Any]:
        """As :meth:`LocalKafka.client_config`, with every node in ``bootstrap.servers``."""
        conf = self._running().client_config(user, mechanism=mechanism, listener=listener,
                                             **extra)
        primary = self._running()._security
        if primary is None or listener is None or listener.lower() == primary.mode:
            conf["bootstrap.servers"] = self.bootstrap_servers
        else:
            conf["bootstrap.servers"] = ",".join(
                n.secured.bootstrap(listener) for n in self._nodes.values())
        return conf

    def connection_config(self, user: str = ADMIN, *, mechanism: str | None = None,
                          listener: str | None = None) -> ConnectionConfig:
        return self._running().connection_config(user, mechanism=mechanism, listener=listener)

    def command_config_file(self, user: str = ADMIN, *, mechanism: str | None = None,
                            listener: str | None = None) -> Path:
        return self._running().command_config_file(user, mechanism=mechanism,
                                                   listener=listener)

    @property
    def secured(self) -> BrokerSecurity:
        return self._running().secured

    def add_user(self, name: str, password: str) -> None:
        """SCRAM credentials for a new SASL user (the nodes share their users)."""
        self._running().add_user(name, password)

    def grant(self, principal: str, resource_type: str, name: str, operation: str, *,
              pattern: str = "LITERAL") -> None:
        self._running().grant(principal, resource_type, name, operation, pattern=pattern)
