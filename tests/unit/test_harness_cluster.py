"""Pure unit tests of the three-broker cluster's configuration and the Toxiproxy client's
parsing: no JVM and no Toxiproxy server are started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyspark_kafka_share.errors import LocalKafkaError, SetupError
from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster, Toxiproxy
from pyspark_kafka_share.harness import toxiproxy as toxiproxy_module
from pyspark_kafka_share.harness.broker_files import ClusterNode
from pyspark_kafka_share.harness.security import BrokerSecurity


def _node_kafka(node: ClusterNode, security: BrokerSecurity | None = None) -> LocalKafka:
    kafka = LocalKafka(port=node.port)
    kafka._node = node
    kafka._security = security
    return kafka


def test_layout_gives_each_node_its_ports_and_one_quorum() -> None:
    nodes = LocalKafkaCluster().layout()
    assert [n.node_id for n in nodes] == [1, 2, 3]
    assert len({n.voters for n in nodes}) == 1 and len({n.cluster_id for n in nodes}) == 1
    voters = nodes[0].voters.split(",")
    assert voters == [f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes]
    ports = [p for n in nodes for p in (n.port, n.controller_port, n.internal_port)]
    assert len(set(ports)) == 9, "every listener of every node on a port of its own"
    assert nodes[0].bootstrap == ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    assert all(n.advertised_port is None and (n.replicas, n.min_insync) == (3, 2)
               for n in nodes)


def test_layout_with_toxiproxy_advertises_a_proxy_port_per_node() -> None:
    nodes = LocalKafkaCluster(toxiproxy=Toxiproxy()).layout()
    advertised = [n.advertised_port for n in nodes]
    assert None not in advertised and len(set(advertised)) == 3
    assert not set(advertised) & {n.port for n in nodes}
    assert nodes[0].bootstrap == ",".join(f"127.0.0.1:{p}" for p in advertised)


@pytest.mark.parametrize(("brokers", "isr"), [(0, 1), (3, 0), (3, 4)])
def test_layout_refuses_an_impossible_cluster(brokers: int, isr: int) -> None:
    with pytest.raises(LocalKafkaError, match="min_insync_replicas"):
        LocalKafkaCluster(brokers=brokers, min_insync_replicas=isr).layout()


def test_node_properties_replicate_and_keep_inter_broker_traffic_off_the_proxy() -> None:
    node = LocalKafkaCluster(toxiproxy=Toxiproxy()).layout()[1]
    props = _node_kafka(node).server_properties(node.port, node.controller_port, Path("/d"))
    assert props["node.id"] == "2" and props["controller.quorum.voters"] == node.voters
    assert props["process.roles"] == "broker,controller"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor",
                "share.coordinator.state.topic.replication.factor"):
        assert props[key] == "3", key
    for key in ("min.insync.replicas", "transaction.state.log.min.isr",
                "share.coordinator.state.topic.min.isr"):
        assert props[key] == "2", key
    assert props["inter.broker.listener.name"] == "INTERNAL"
    assert props["listeners"] == (f"PLAINTEXT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:"
                                  f"{node.internal_port},CONTROLLER://127.0.0.1:"
                                  f"{node.controller_port}")
    assert props["advertised.listeners"] == (f"PLAINTEXT://127.0.0.1:{node.advertised_port},"
                                             f"INTERNAL://127.0.0.1:{node.internal_port}")


def test_node_properties_without_a_proxy_advertise_the_listener() -> None:
    node = LocalKafkaCluster().layout()[0]
    props = _node_kafka(node).server_properties(node.port, node.controller_port, Path("/d"))
    assert props["advertised.listeners"].startswith(f"PLAINTEXT://127.0.0.1:{node.port},")


def test_secured_nodes_share_ca_and_users_on_their_own_ports(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    nodes = LocalKafkaCluster(toxiproxy=Toxiproxy()).layout()
    first = BrokerSecurity.create("sasl_ssl,ssl", tmp_path, nodes[0].port, {"alice": "pw"})
    second = first.for_port(nodes[1].port)
    assert second.ca is first.ca and second.users is first.users
    assert second.ports["sasl_ssl"] == nodes[1].port
    assert second.ports["ssl"] != first.ports["ssl"]
    assert second.internal_port != first.internal_port
    second.users["bob"] = "pw2"  # add_user on one node: every node's users
    assert "bob" in first.users
    props = _node_kafka(nodes[1], second).server_properties(
        nodes[1].port, nodes[1].controller_port, tmp_path)
    assert props["inter.broker.listener.name"] == "INTERNAL"
    advertised = props["advertised.listeners"].split(",")
    assert f"SASL_SSL://127.0.0.1:{nodes[1].advertised_port}" in advertised
    assert f"SSL://127.0.0.1:{second.ports['ssl']}" in advertised, "only the first is proxied"
    assert f"INTERNAL://127.0.0.1:{second.internal_port}" in advertised


def test_cluster_operations_need_a_started_cluster() -> None:
    cluster = LocalKafkaCluster()
    with pytest.raises(LocalKafkaError, match="not started"):
        cluster.kill(1)
    with pytest.raises(LocalKafkaError, match="no node of the cluster is running"):
        _ = cluster.bootstrap_servers
    assert not cluster.is_running


def test_toxiproxy_binary_missing_names_the_make_target(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(toxiproxy_module.ENV_TOXIPROXY, str(tmp_path / "nope"))
    with pytest.raises(SetupError, match="make toxiproxy"):
        toxiproxy_module.toxiproxy_binary()



def _metric(kind: str, direction: str, proxy: str, value: str) -> str:
    return (f'toxiproxy_proxy_{kind}_bytes_total{{direction="{direction}",'
            f'listener="127.0.0.1:1",proxy="{proxy}",upstream="127.0.0.1:2"}} {value}')


_METRICS = "\n".join([
    "# HELP toxiproxy_proxy_received_bytes_total The total bytes received",
    _metric("received", "upstream", "broker-1", "100"),
    _metric("received", "downstream", "broker-1", "2.5e+03"),
    _metric("sent", "downstream", "broker-1", "7"),
    _metric("received", "upstream", "broker-2", "5"),
])


def test_byte_counters_parse_the_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = Toxiproxy()

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        assert (method, path) == ("GET", "/metrics")
        return _METRICS

    monkeypatch.setattr(proxy, "_call", call)
    assert proxy.bytes_through("broker-1") == 2600
    assert proxy.bytes_through("broker-1", "upstream") == 100
    assert proxy.bytes_through("broker-2") == 5
    assert proxy.bytes_through("broker-3") == 0
    assert proxy.byte_counters()[("broker-1", "downstream", "sent")] == 7


def test_add_toxic_refuses_an_unknown_stream() -> None:
    with pytest.raises(LocalKafkaError, match="stream"):
        Toxiproxy().add_toxic("p", "latency", {"latency": 1}, stream="sideways")
