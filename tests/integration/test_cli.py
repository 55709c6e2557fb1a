"""``kafka-share groups ...`` against the real broker: safety flags, exit codes, selections.

Every test checks what the command did to the broker (through :class:`ShareGroupAdmin` or
confluent-kafka), not only what it printed. The CLI runs in-process (``cli.main``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import AcknowledgeType, Consumer, ConsumerGroupTopicPartitions

from pyspark_kafka_share import cli
from pyspark_kafka_share.admin import PartitionOffset, ShareGroupAdmin
from pyspark_kafka_share.cli import groups as cli_groups
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import wait_for

# Every test here is in the Kafka subset (make test-kafka-versions, test-versions).
pytestmark = pytest.mark.kafka_subset

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def admin(kafka: LocalKafka) -> Iterator[ShareGroupAdmin]:
    with ShareGroupAdmin(kafka.bootstrap_servers, timeout_s=20) as a:
        yield a


@pytest.fixture
def run(kafka: LocalKafka, capsys: pytest.CaptureFixture[str]) -> Run:
    """``run("groups", "lag", g)``: (exit code, stdout, stderr) of the CLI, in-process."""

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main([*args, "--bootstrap-server", kafka.bootstrap_servers, "--timeout", "20"])
        out, err = capsys.readouterr()
        return code, out, err

    return call


def _produce(kafka: LocalKafka, topic: str, per_partition: dict[int, int]) -> None:
    kafka.produce(topic, [ProducerRecord(value=b"%d-%d" % (p, i), partition=p)
                          for p, n in per_partition.items() for i in range(n)])


def _positions(admin: ShareGroupAdmin, group: str) -> dict[int, tuple[int | None, int | None]]:
    """``{partition: (start offset, lag)}`` of a one-topic group."""
    return {o.partition: (o.start_offset, o.lag) for o in admin.offsets(group)}


# -- reset: --execute / --dry-run ----------------------------------------------------------------


def test_reset_needs_execute_or_dry_run_and_only_execute_changes_offsets(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str, run: Run,
) -> None:
    _produce(kafka, topic, {0: 7})
    admin.reset(group, "latest", topics=[topic])  # share state at the end: nothing to deliver
    assert _positions(admin, group) == {0: (7, 0)}

    code, out, err = run("groups", "reset", group, "--to", "earliest")
    assert code == cli.EXIT_USAGE
    assert [line.split() for line in out.splitlines()[:2]] == \
        [["TOPIC", "PARTITION", "NEW-START-OFFSET"], [topic, "0", "0"]]
    assert "--execute" in err and "--dry-run" in err and "nothing was changed" in err
    assert _positions(admin, group) == {0: (7, 0)}, "reset without --execute changed offsets"

    code, out, err = run("groups", "reset", group, "--to", "earliest", "--dry-run", "--json")
    assert code == cli.EXIT_OK, err
    plan = json.loads(out)
    assert (plan["dry_run"], plan["executed"]) == (True, False)
    assert plan["offsets"] == [{"topic": topic, "partition": 0, "start_offset": 0}]
    assert _positions(admin, group) == {0: (7, 0)}, "--dry-run changed offsets"

    code, out, err = run("groups", "reset", group, "--to", "earliest", "--execute")
    assert code == cli.EXIT_OK, err
    assert "reset to earliest" in out
    assert _positions(admin, group) == {0: (0, 7)}


def test_reset_and_dry_run_both_refused(group: str, run: Run) -> None:
    with pytest.raises(SystemExit) as exc:
        run("groups", "reset", group, "--to", "earliest", "--execute", "--dry-run")
    assert exc.value.code == cli.EXIT_USAGE


def test_reset_selected_partitions_only(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic_factory: TopicFactory, group: str,
    run: Run,
) -> None:
    topic = topic_factory(3)
    _produce(kafka, topic, {0: 4, 1: 5, 2: 6})
    admin.reset(group, "latest", topics=[topic])
    assert _positions(admin, group) == {0: (4, 0), 1: (5, 0), 2: (6, 0)}

    code, out, err = run("groups", "reset", group, "--to", "earliest", "--topic", f"{topic}:0,1",
                         "--dry-run", "--json")
    assert code == cli.EXIT_OK, err
    assert [(o["partition"], o["start_offset"]) for o in json.loads(out)["offsets"]] == \
        [(0, 0), (1, 0)]
    # Kafka's form: TOPIC:P,P; repeated --topic values merge.
    code, _, err = run("groups", "reset", group, "--to", "earliest", "--topic", f"{topic}:0",
                       "--topic", f"{topic}:2", "--execute")
    assert code == cli.EXIT_OK, err
    assert _positions(admin, group) == {0: (0, 4), 1: (5, 0), 2: (0, 6)}

    code, _, err = run("groups", "reset", group, "--to", "latest", "--topic", f"{topic}:1,7",
                       "--execute")
    assert code == cli.EXIT_ERROR
    assert f"topic {topic!r} has no partition 7" in err and "0..2" in err
    assert _positions(admin, group) == {0: (0, 4), 1: (5, 0), 2: (0, 6)}

    with pytest.raises(SystemExit) as exc:
        run("groups", "reset", group, "--to", "latest", "--topic", f"{topic}:x")
    assert exc.value.code == cli.EXIT_USAGE
    # Kafka deletes share-group offsets per topic: a partition list is refused, nothing deleted.
    code, _, err = run("groups", "delete", group, "--topic", f"{topic}:0", "--execute")
    assert code == cli.EXIT_USAGE and "without ':PARTITIONS'" in err
    assert len(admin.offsets(group)) == 3


# -- delete: --execute / --dry-run ---------------------------------------------------------------


def test_delete_needs_execute_or_dry_run(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic_factory: TopicFactory, group: str,
    run: Run,
) -> None:
    keep, drop = topic_factory(1), topic_factory(1)
    _produce(kafka, keep, {0: 2})
    _produce(kafka, drop, {0: 3})
    admin.reset(group, "earliest", topics=[keep, drop])

    code, out, err = run("groups", "delete", group, "--topic", drop)
    assert code == cli.EXIT_USAGE and "--execute" in err
    assert f"would delete the offsets of share group {group!r} for {drop}" in out
    assert {o.topic for o in admin.offsets(group)} == {keep, drop}
    code, out, err = run("groups", "delete", group, "--topic", drop, "--dry-run", "--json")
    assert code == cli.EXIT_OK, err
    assert [(o["topic"], o["lag"]) for o in json.loads(out)["offsets"]] == [(drop, 3)]
    assert {o.topic for o in admin.offsets(group)} == {keep, drop}
    code, _, err = run("groups", "delete", group, "--topic", drop, "--execute")
    assert code == cli.EXIT_OK, err
    assert admin.offsets(group) == [PartitionOffset(keep, 0, 0, 2)]

    code, out, err = run("groups", "delete", group)
    assert code == cli.EXIT_USAGE and f"share group {group!r} and its offsets" in out
    code, _, err = run("groups", "delete", group, "--dry-run")
    assert code == cli.EXIT_OK, err
    assert group in admin.list_groups()
    code, out, err = run("groups", "delete", group, "--execute")
    assert code == cli.EXIT_OK and f"deleted share group {group!r}" in out, err
    assert group not in admin.list_groups()


# -- exit codes ----------------------------------------------------------------------------------


def test_unknown_group_exit_code(admin: ShareGroupAdmin, group: str, run: Run) -> None:
    assert admin.group_type(group) is None  # the fixture only set a config: no group yet
    for command in ("lag", "describe"):
        code, out, err = run("groups", command, group)
        assert code == cli.EXIT_GROUP_NOT_FOUND, (command, out, err)
        assert "GROUP_ID_NOT_FOUND" in err and group in err and out == ""
    code, _, err = run("groups", "delete", group, "--dry-run")
    assert code == cli.EXIT_GROUP_NOT_FOUND and group in err
    assert admin.group_type(group) is None


@pytest.fixture
def classic_group(kafka: LocalKafka, topic: str) -> str:
    """A classic consumer group that consumed and committed ``topic``'s 3 records."""
    name = f"classic-{uuid.uuid4().hex[:8]}"
    _produce(kafka, topic, {0: 3})
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": "false"})
    try:
        consumer.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got += 1
        assert got == 3
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return name


def _committed(kafka: LocalKafka, group: str, topic: str) -> int:
    from confluent_kafka import TopicPartition

    client = kafka.admin()
    futures = client.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])])
    result = next(iter(futures.values())).result(timeout=30)
    return int(result.topic_partitions[0].offset)


def test_classic_consumer_group_exit_code_and_left_alone(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, classic_group: str, run: Run,
) -> None:
    assert admin.group_type(classic_group) == "classic"
    assert _committed(kafka, classic_group, topic) == 3
    for command in ("lag", "describe"):
        code, out, err = run("groups", command, classic_group)
        assert code == cli.EXIT_NOT_A_SHARE_GROUP, (command, out, err)
        assert "not a share group" in err and "kafka-consumer-groups.sh" in err
    code, _, err = run("groups", "reset", classic_group, "--to", "earliest", "--topic", topic,
                       "--execute")
    assert code == cli.EXIT_NOT_A_SHARE_GROUP, err
    # DeleteGroups deletes a group of any type: the CLI must refuse before sending it.
    code, _, err = run("groups", "delete", classic_group, "--execute")
    assert code == cli.EXIT_NOT_A_SHARE_GROUP, err
    assert admin.group_type(classic_group) == "classic"
    assert _committed(kafka, classic_group, topic) == 3


def test_unknown_lag_exit_code(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic_factory: TopicFactory, group: str,
    share_consumer: ShareConsumerFactory, run: Run,
) -> None:
    topic = topic_factory(2)
    _produce(kafka, topic, {0: 4})  # partition 1 stays empty: never fetched from
    consumer = share_consumer(group, [topic])

    def positions() -> dict[int, tuple[int | None, int | None]]:
        for msg in consumer.poll(0.3):
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
        consumer.commit_sync()
        return _positions(admin, group)

    wait_for(positions, lambda p: p.get(0, (None, None))[1] == 0 and 1 in p,
              what="partition 0 drained, partition 1 listed")
    assert _positions(admin, group)[1] == (None, None), "the broker reports no lag for p1"

    code, out, err = run("groups", "lag", group)
    assert code == cli.EXIT_LAG_UNKNOWN, (out, err)
    rows = [line.split() for line in out.splitlines()]
    assert [topic, "1", "-", "-"] in rows and rows[-1] == ["TOTAL-LAG", "0"]
    assert f"{group!r} on {topic}-1" in err and "unknown" in err
    code, out, err = run("groups", "lag", group, "--json")
    assert code == cli.EXIT_LAG_UNKNOWN
    assert [p["lag"] for p in json.loads(out)["partitions"]] == [0, None]
    code, _, err = run("groups", "describe", group)  # describing is a real answer
    assert code == cli.EXIT_OK, err


def test_lag_of_a_group_without_share_state_is_unknown(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str, run: Run,
) -> None:
    _produce(kafka, topic, {0: 5})
    admin.reset(group, "earliest", topics=[topic])
    assert run("groups", "lag", group)[0] == cli.EXIT_OK
    admin.delete_offsets(group, [topic])
    assert admin.offsets(group) == [] and admin.group_type(group) == "share"
    code, _, err = run("groups", "lag", group)
    assert code == cli.EXIT_LAG_UNKNOWN and "no share state on any partition" in err


# -- --all-groups --------------------------------------------------------------------------------


def test_all_groups(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str, run: Run,
) -> None:
    _produce(kafka, topic, {0: 5})
    other = f"{group}-b"
    admin.reset(group, "earliest", topics=[topic])   # lag 5
    admin.reset(other, "latest", topics=[topic])     # lag 0

    code, out, err = run("groups", "lag", "--all-groups", "--json")
    lags = {g["group"]: g for g in json.loads(out)}
    assert set(admin.list_groups()) <= set(lags)  # every share group (others' tests' too)
    assert (lags[group]["total_lag"], lags[other]["total_lag"]) == (5, 0)
    assert lags[group]["partitions"] == [{"topic": topic, "partition": 0, "start_offset": 0,
                                          "lag": 5}]
    # Other groups on this broker may have partitions with unknown lag: the code says so.
    unknown = any(not g["partitions"] or any(p["lag"] is None for p in g["partitions"])
                  for g in lags.values())
    assert code == (cli.EXIT_LAG_UNKNOWN if unknown else cli.EXIT_OK), err

    code, out, _ = run("groups", "lag", "--all-groups")
    rows = [line.split() for line in out.splitlines()]
    assert [group, topic, "0", "0", "5"] in rows and [group, "5"] in rows
    assert [other, "0"] in rows

    code, out, err = run("groups", "describe", "--all-groups", "--json")
    assert code == cli.EXIT_OK, err
    described = {g["group"]: g for g in json.loads(out)}
    assert described[group]["state"] == described[other]["state"] == "Empty"

    code, _, err = run("groups", "lag", group, "--all-groups")
    assert code == cli.EXIT_USAGE and "--all-groups" in err
    code, _, err = run("groups", "describe")
    assert code == cli.EXIT_USAGE and "--all-groups" in err


# -- without a broker ----------------------------------------------------------------------------


def test_topic_partition_syntax() -> None:
    assert cli_groups._topic_arg("orders") == ("orders", None)
    assert cli_groups._topic_arg("orders:0,2") == ("orders", (0, 2))
    for bad in ("orders:", "orders:a", "orders:-1", ":0", "orders:0,,1"):
        with pytest.raises(argparse.ArgumentTypeError, match="TOPIC:PARTITIONS"):
            cli_groups._topic_arg(bad)
    merged = cli_groups._topic_selection([("a", (2,)), ("a", (0, 2)), ("b", None), ("b", (1,)),
                                   ("c", (1,)), ("c", None)])
    assert merged == {"a": [0, 2], "b": None, "c": None}
    assert cli_groups._topic_selection(None) is None


def test_exit_codes_are_distinct_and_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    codes = [cli.EXIT_OK, cli.EXIT_ERROR, cli.EXIT_USAGE, cli.EXIT_GROUP_NOT_FOUND,
             cli.EXIT_NOT_A_SHARE_GROUP, cli.EXIT_LAG_UNKNOWN]
    assert len(set(codes)) == len(codes)
    with pytest.raises(SystemExit):
        cli.main(["groups", "--help"])
    help_text = capsys.readouterr().out
    listed = [int(line.split()[0]) for line in help_text.split("exit codes:")[1].splitlines()
              if line.strip()[:1].isdigit() and line.startswith("  ") and
              not line.startswith("     ")]
    assert listed == codes


# -- config: show, --set with --execute / --dry-run, the broker's line -------------------------


def test_config_set_needs_execute_or_dry_run_and_only_execute_changes_it(
    admin: ShareGroupAdmin, group: str, run: Run,
) -> None:
    lock = "share.record.lock.duration.ms"
    code, out, err = run("groups", "config", group, "--json")
    assert code == cli.EXIT_OK, err
    shown = json.loads(out)["configs"]
    assert shown == admin.get_config(group) and lock in shown
    before = shown[lock]
    assert before != "45000"

    code, out, err = run("groups", "config", group, "--set", f"{lock}=45000")
    assert code == cli.EXIT_USAGE and "--execute" in err and "nothing was changed" in err
    assert out.split()[3:6] == [lock, before, "45000"]
    code, out, err = run("groups", "config", group, "--set", f"{lock}=45000", "--dry-run")
    assert code == cli.EXIT_OK, err
    assert admin.get_config(group)[lock] == before, "config without --execute changed it"
    code, _, err = run("groups", "config", group, "--set", f"{lock}=-1", "--dry-run")
    assert code == cli.EXIT_ERROR and lock in err, "--dry-run did not ask the broker"

    code, out, err = run("groups", "config", group, "--set", f"{lock}=45000", "--execute",
                         "--json")
    assert code == cli.EXIT_OK, err
    assert json.loads(out)["changes"] == [{"name": lock, "current": before, "new": "45000"}]
    assert admin.get_config(group)[lock] == "45000"


def test_config_refuses_a_setting_of_a_later_kafka_line(
    kafka: LocalKafka, admin: ShareGroupAdmin, group: str, run: Run,
) -> None:
    """On 4.2 (the version tiers) a 4.3 group config is refused before the broker is asked,
    naming the line that added it; from 4.3 on it is set."""
    key = "share.delivery.count.limit"
    major, minor = (int(v) for v in kafka.version.split(".")[:2])
    code, out, err = run("groups", "config", group, "--set", f"{key}=4", "--execute")
    if (major, minor) >= (4, 3):
        assert code == cli.EXIT_OK, err
        assert admin.get_config(group)[key] == "4"
    else:
        assert code == cli.EXIT_USAGE and out == ""
        assert f"'--set' = {key!r}" in err and "Apache Kafka 4.3 on (KIP-1240)" in err
        assert key not in admin.get_config(group)
    code, _, err = run("groups", "config", group, "--set", "share.no.such.config=1",
                       "--dry-run")
    assert code == cli.EXIT_USAGE and "not a share-group config of any" in err
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        run("groups", "config", group, "--set", "nokey")
    assert exited.value.code == cli.EXIT_USAGE


# -- the first hour: a starting group, a closed pipe ---------------------------------------------


def test_lag_wait_answers_once_a_starting_group_has_fetched(
    kafka: LocalKafka, admin: ShareGroupAdmin, topic: str, group: str,
    share_consumer: ShareConsumerFactory, run: Run,
) -> None:
    """Without --wait a group that is not there yet is exit code 3; with it, the command asks
    again until the group exists and every lag is known."""
    assert run("groups", "lag", group)[0] == cli.EXIT_GROUP_NOT_FOUND
    started = time.monotonic()
    assert run("groups", "lag", group, "--wait", "2")[0] == cli.EXIT_GROUP_NOT_FOUND
    assert time.monotonic() - started >= 2, "--wait gave up early"
    _produce(kafka, topic, {0: 6})
    answer: list[tuple[int, str, str]] = []
    waiter = threading.Thread(target=lambda: answer.append(
        run("groups", "lag", group, "--wait", "60", "--json")))
    waiter.start()
    consumer = share_consumer(group, [topic])
    while waiter.is_alive():  # the group starts while the command waits
        for msg in consumer.poll(0.3):
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
        consumer.commit_sync()
        waiter.join(0.2)
    code, out, err = answer[0]
    assert code == cli.EXIT_OK, (out, err)
    assert json.loads(out)["partitions"][0]["lag"] is not None


def test_a_closed_pipe_exits_without_a_traceback(kafka: LocalKafka, group: str) -> None:
    """``kafka-share groups ... --json | head``: the reader is gone before the first line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_kafka_share.cli", "groups", "config", group, "--json",
         "--bootstrap-server", kafka.bootstrap_servers], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    proc.stdout.close()  # before the command prints anything: its first write fails
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (cli.EXIT_ERROR, "")
