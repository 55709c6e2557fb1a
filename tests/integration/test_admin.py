"""ShareGroupAdmin against the real broker, cross-checked with Kafka's own ShareGroupCommand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import AcknowledgeType, Message, ShareConsumer

from pyspark_kafka_share.admin import GroupDescription, PartitionOffset, ShareGroupAdmin
from pyspark_kafka_share.errors import (
    BrokerError,
    GroupNotEmptyError,
    GroupNotFoundError,
    NotAShareGroupError,
    OptionError,
    UnknownTopicError,
)
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import poll_share, record_value, wait_for

# Every test here is in the Kafka subset (make test-kafka-versions, test-versions).
pytestmark = pytest.mark.kafka_subset


@pytest.fixture
def admin(kafka: LocalKafka) -> Iterator[ShareGroupAdmin]:
    with ShareGroupAdmin(kafka.bootstrap_servers, timeout_s=20) as a:
        yield a


def _consume(consumer: ShareConsumer, accept: int, timeout_s: float = 30.0) -> list[Message]:
    """Poll until ``accept`` records were ACCEPTed; release anything beyond; commit each batch."""
    accepted: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(accepted) < accept and time.monotonic() < deadline:
        batch = consumer.poll(0.5)
        for msg in batch:
            assert msg.error() is None, msg.error()
            if len(accepted) < accept:
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                accepted.append(msg)
            else:
                consumer.acknowledge(msg, AcknowledgeType.RELEASE)
        if len(batch):
            assert all(err is None for err in consumer.commit_sync().values())
    assert len(accepted) == accept, f"accepted {len(accepted)} of {accept} within {timeout_s}s"
    return accepted


def _drain(consumer: ShareConsumer, want: int, timeout_s: float = 30.0) -> list[Message]:
    """ACCEPT everything; return the messages once ``want`` were seen (or the timeout hit)."""
    return poll_share(consumer, until=lambda got: len(got) >= want, timeout_s=timeout_s,
                      check_commits=True)


def _drain_values(consumer: ShareConsumer, want: int, timeout_s: float = 30.0) -> list[bytes]:
    return [record_value(msg) for msg in _drain(consumer, want, timeout_s)]


def _tool_table(kafka: LocalKafka, group: str, *flags: str) -> list[list[str]]:
    """Rows of ``ShareGroupCommand --describe --group G <flags>`` (log lines skipped)."""
    out = kafka.run_tool("ShareGroupCommand", "--bootstrap-server", kafka.bootstrap_servers,
                         "--describe", "--group", group, *flags).stdout
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["GROUP"])
    rows = []
    for line in lines[header + 1:]:
        cells = line.split()
        if not cells or cells[0] != group:
            break
        rows.append(cells)
    return rows


def _tool_offsets(kafka: LocalKafka, group: str) -> list[PartitionOffset]:
    # GROUP  TOPIC  PARTITION  START-OFFSET  LAG   ('-' where there is no share state)
    def num(cell: str) -> int | None:
        return None if cell == "-" else int(cell)

    return sorted((PartitionOffset(topic, int(part), num(start), num(lag))
                   for _g, topic, part, start, lag in _tool_table(kafka, group, "--offsets")),
                  key=lambda o: (o.topic, o.partition))


def _empty(admin: ShareGroupAdmin, group: str) -> None:
    wait_for(lambda: admin.describe(group).members, lambda m: not m, what="an empty group")


def test_describe_shows_two_live_members_and_their_assignments(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic_factory: TopicFactory, group: str,
    share_consumer: ShareConsumerFactory,
) -> None:
    topic = topic_factory(3)
    a, b = share_consumer(group, [topic]), share_consumer(group, [topic])

    def described() -> GroupDescription | None:
        a.poll(0.1)
        b.poll(0.1)
        try:
            return admin.describe(group)
        except GroupNotFoundError:
            return None  # until the first member's heartbeat creates the group

    desc = wait_for(described, lambda d: d is not None and len(d.members) == 2
                     and all(m.assignment.get(topic) for m in d.members),
                     what="two members with assignments")
    assert desc is not None
    assert desc.group == group
    assert desc.state == "Stable"
    assert {m.client_id for m in desc.members} == {"rdkafka"}
    assert all(m.host for m in desc.members)
    assigned = {p for m in desc.members for p in m.assignment[topic]}
    assert assigned == {0, 1, 2}
    assert group in admin.list_groups()

    rows = _tool_table(kafka, group, "--members")
    # GROUP  CONSUMER-ID  HOST  CLIENT-ID  #PARTITIONS  ASSIGNMENT ("topic:0,2")
    tool = {r[1]: (r[2], r[3], sorted(int(x) for x in r[5].split(":", 1)[1].split(",")))
            for r in rows}
    ours = {m.member_id: (m.host, m.client_id, m.assignment[topic]) for m in desc.members}
    assert tool == ours


def test_lag_after_accepting_some_matches_kafka_tool(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str,
    share_consumer: ShareConsumerFactory,
) -> None:
    total, accept = 50, 20
    kafka.produce(topic, [b"%d" % i for i in range(total)])
    assert admin.offsets(group) == []  # no share state before anyone consumed
    consumer = share_consumer(group, [topic])
    _consume(consumer, accept)
    offsets = wait_for(lambda: admin.offsets(group),
                        lambda o: [x.lag for x in o] == [total - accept], what="lag settled")
    assert [(o.topic, o.partition) for o in offsets] == [(topic, 0)]
    assert offsets[0].start_offset is not None and 0 <= offsets[0].start_offset <= accept
    assert admin.total_lag(group) == total - accept
    assert admin.describe(group).state == "Stable"  # the consumer is still a member
    assert _tool_offsets(kafka, group) == admin.offsets(group)

    consumer.close()
    _empty(admin, group)
    assert admin.total_lag(group) == total - accept, "lag is persisted share state"
    assert _tool_offsets(kafka, group) == admin.offsets(group)


def test_reset_to_earliest_on_an_empty_group_rereads_everything(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str,
    share_consumer: ShareConsumerFactory,
) -> None:
    values = [b"%d" % i for i in range(30)]
    kafka.produce(topic, values)
    first = share_consumer(group, [topic])
    assert sorted(_drain_values(first, len(values))) == sorted(values)
    wait_for(lambda: admin.total_lag(group), lambda lag: lag == 0, what="lag 0")
    first.close()
    _empty(admin, group)
    assert admin.describe(group).state == "Empty"

    assert admin.plan_reset(group, "earliest") == {topic: {0: 0}}
    assert admin.reset(group, "earliest") == {topic: {0: 0}}
    assert admin.offsets(group) == [PartitionOffset(topic, 0, 0, len(values))]
    assert _tool_offsets(kafka, group) == admin.offsets(group)

    again = share_consumer(group, [topic])
    reread = _drain(again, len(values))
    assert sorted(record_value(m) for m in reread) == sorted(values)
    assert {m.delivery_count() for m in reread} == {1}, "a reset starts delivery counts afresh"


def test_reset_to_a_time_and_to_latest(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str,
    share_consumer: ShareConsumerFactory,
) -> None:
    base = datetime.now(timezone.utc) - timedelta(hours=2)
    base_ms = int(base.timestamp() * 1000)
    kafka.produce(topic, [ProducerRecord(value=b"old%d" % i, timestamp_ms=base_ms + i)
                          for i in range(5)]
                  + [ProducerRecord(value=b"new%d" % i, timestamp_ms=base_ms + 3_600_000 + i)
                     for i in range(5)])
    with pytest.raises(OptionError, match="name the topics"):
        admin.reset(group, "earliest")  # the group has no share state to pick partitions from
    # A group that does not exist yet is created by the reset.
    assert admin.reset(group, base + timedelta(minutes=30), topics=[topic]) == {topic: {0: 5}}
    assert admin.describe(group).state == "Empty"
    assert admin.offsets(group) == [PartitionOffset(topic, 0, 5, 5)]
    beyond = datetime.now(timezone.utc) + timedelta(days=1)
    assert admin.plan_reset(group, beyond, topics=[topic]) == {topic: {0: 10}}
    assert admin.plan_reset(group, "earliest", topics={topic: [0]}) == {topic: {0: 0}}
    with pytest.raises(OptionError, match="partition numbers"):
        admin.plan_reset(group, "earliest", topics={topic: []})
    with pytest.raises(UnknownTopicError, match="has no partition 3"):
        admin.plan_reset(group, "earliest", topics={topic: [0, 3]})

    consumer = share_consumer(group, [topic])
    assert sorted(_drain_values(consumer, 5)) == [b"new%d" % i for i in range(5)]
    consumer.close()
    _empty(admin, group)
    assert admin.reset(group, "latest") == {topic: {0: 10}}
    assert admin.offsets(group) == [PartitionOffset(topic, 0, 10, 0)]
    with pytest.raises(BrokerError, match="nope"):
        admin.reset(group, "latest", topics=["nope"])


def test_changes_to_a_non_empty_group_raise_a_clear_error(
    admin: ShareGroupAdmin, topic: str, group: str, share_consumer: ShareConsumerFactory,
) -> None:
    consumer = share_consumer(group, [topic])

    def members() -> int:
        consumer.poll(0.1)
        try:
            return len(admin.describe(group).members)
        except GroupNotFoundError:
            return 0

    wait_for(members, lambda n: n == 1, what="one member")
    with pytest.raises(GroupNotEmptyError) as err:
        admin.reset(group, "earliest", topics=[topic])
    text = str(err.value)
    assert text.startswith(f"cannot reset share group {group!r} to earliest: the group is "
                           "not empty, it has 1 member(s)"), text
    assert "NON_EMPTY_GROUP" in text and "stop all of its consumers" in text
    assert isinstance(err.value, BrokerError)
    with pytest.raises(GroupNotEmptyError, match="cannot delete the offsets"):
        admin.delete_offsets(group, [topic])
    with pytest.raises(GroupNotEmptyError, match="cannot delete share group"):
        admin.delete_group(group)
    assert len(admin.describe(group).members) == 1


def test_delete_offsets_then_the_group(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str,
    share_consumer: ShareConsumerFactory,
) -> None:
    kafka.produce(topic, [b"a", b"b", b"c"])
    consumer = share_consumer(group, [topic])
    _consume(consumer, 2)
    consumer.close()
    _empty(admin, group)
    assert [o.topic for o in admin.offsets(group)] == [topic]

    admin.delete_offsets(group, [topic])
    assert admin.offsets(group) == []
    assert group in admin.list_groups()
    # Without share state the group starts over from share.auto.offset.reset (earliest).
    again = share_consumer(group, [topic])
    assert sorted(_drain_values(again, 3)) == [b"a", b"b", b"c"]
    again.close()
    _empty(admin, group)

    admin.delete_group(group)
    assert group not in admin.list_groups()
    assert admin.get_config(group)["share.auto.offset.reset"] == "earliest", \
        "group configs outlive the group"
    with pytest.raises(GroupNotFoundError):
        admin.describe(group)
    with pytest.raises(GroupNotFoundError):
        admin.delete_group(group)


def test_list_groups_has_share_groups_only(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str,
) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    classic = f"{group}-classic"
    client = kafka.admin()  # must outlive its futures
    futures = client.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(classic, [TopicPartition(topic, 0, 0)])])
    for fut in futures.values():
        fut.result(timeout=30)
    admin.reset(group, "earliest", topics=[topic])
    groups = admin.list_groups()
    assert group in groups
    assert classic not in groups
    assert groups == sorted(groups)
    assert admin.group_type(classic) == "classic"
    assert admin.group_type(group) == "share"
    assert admin.group_type(f"{group}-missing") is None
    with pytest.raises(NotAShareGroupError, match="not a share group"):
        admin.describe(classic)
    with pytest.raises(NotAShareGroupError, match=f"{classic!r} is a classic group"):
        admin.reset(classic, "earliest", topics=[topic])
    # DeleteGroups deletes a group of any type: delete_group must not touch a consumer group.
    with pytest.raises(NotAShareGroupError):
        admin.delete_group(classic)
    assert admin.group_type(classic) == "classic"
    with pytest.raises(GroupNotFoundError):
        admin.describe(f"{group}-missing")
    assert admin.offsets(f"{group}-missing") == []


@pytest.mark.needs_kafka_4_3
def test_group_configs_read_and_set(admin: ShareGroupAdmin, group: str) -> None:
    config = admin.get_config(group)
    assert config["share.auto.offset.reset"] == "earliest"  # set by the fixture
    assert {"share.record.lock.duration.ms", "share.delivery.count.limit"} <= set(config)
    assert all(k.startswith("share.") for k in config)

    admin.set_config(group, "share.record.lock.duration.ms", 15_000)
    admin.set_config(group, "share.delivery.count.limit", "3")
    config = admin.get_config(group)
    assert config["share.record.lock.duration.ms"] == "15000"
    assert config["share.delivery.count.limit"] == "3"
    with pytest.raises(BrokerError, match=r"share\.auto\.offset\.reset"):
        admin.set_config(group, "share.auto.offset.reset", "sideways")


def test_cli_groups_commands(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from pyspark_kafka_share import cli

    bootstrap = ["--bootstrap-server", kafka.bootstrap_servers]

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main([*args, *bootstrap])
        out, err = capsys.readouterr()
        return code, out, err

    kafka.produce(topic, [b"%d" % i for i in range(10)])
    consumer = share_consumer(group, [topic])
    _consume(consumer, 4)
    code, out, _ = run("groups", "list", "--json")
    assert code == 0 and group in json.loads(out)
    code, out, _ = run("groups", "describe", group, "--json")
    described = json.loads(out)
    assert (code, described["state"], len(described["members"])) == (0, "Stable", 1)
    lag = wait_for(lambda: json.loads(run("groups", "lag", group, "--json")[1]),
                    lambda d: d["total_lag"] == 6, what="lag 6")
    assert lag["partitions"] == [{"topic": topic, "partition": 0,
                                  "start_offset": lag["partitions"][0]["start_offset"],
                                  "lag": 6}]
    code, _, err = run("groups", "reset", group, "--to", "earliest", "--dry-run")
    assert code == cli.EXIT_OK and "1 member(s): --execute fails" in err
    code, _, err = run("groups", "reset", group, "--to", "earliest", "--execute")
    assert code == cli.EXIT_ERROR and "not empty" in err
    consumer.close()
    with ShareGroupAdmin(kafka.bootstrap_servers) as admin:
        _empty(admin, group)
    code, out, _ = run("groups", "reset", group, "--to", "latest", "--dry-run", "--json")
    assert json.loads(out)["offsets"] == [{"topic": topic, "partition": 0, "start_offset": 10}]
    code, out, _ = run("groups", "reset", group, "--to", "earliest", "--execute")
    assert code == 0 and topic in out
    code, out, _ = run("groups", "lag", group)
    assert code == 0 and out.splitlines()[-1] == "TOTAL-LAG 10"
    assert run("groups", "delete", group, "--topic", topic, "--execute")[0] == 0
    assert run("groups", "delete", group, "--execute")[0] == 0
    code, _, err = run("groups", "describe", group)
    assert code == cli.EXIT_GROUP_NOT_FOUND and "GROUP_ID_NOT_FOUND" in err
