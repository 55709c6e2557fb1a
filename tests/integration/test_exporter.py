"""``kafka-share exporter`` against real brokers, scraped over HTTP as Prometheus would.

- the numbers match ``kafka-share groups lag`` / ``describe`` (and a source query's progress)
  while a share consumer holds records and while a ``kafka-share`` query runs;
- a broker killed between scrapes: every scrape still answers within 1 s, ``kafka_share_up``
  drops to 0 with the last values kept, and comes back after the restart (a broker of its own);
- the command itself on a SASL_SSL listener with ``--command-config`` (a broker of the
  module's own), stopped by SIGTERM with exit code 0; on the same listener, the CLI's errors
  naming the Java properties of ``--command-config`` (issue 41's first-hour nits).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType
from prometheus_client.parser import text_string_to_metric_families

import pyspark_kafka_share as ks
from pyspark_kafka_share import cli
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.exporter.collect import GroupReader
from pyspark_kafka_share.exporter.query import serve_query_metrics
from pyspark_kafka_share.exporter.serve import Exporter
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SCRAPE_WITHIN_S = 1.0


def scrape(url: str) -> Samples:
    """One scrape of ``url`` (``.../metrics``), which must answer within 1 s."""
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    took = time.monotonic() - started
    assert took < SCRAPE_WITHIN_S, f"the scrape took {took:.2f} s"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def partitions(samples: Samples, metric: str, group: str) -> dict[tuple[str, int], float]:
    """``{(topic, partition): value}`` of a per-partition metric of ``group``."""
    out = {}
    for (name, labels), value in samples.items():
        got = dict(labels)
        if name == metric and got.get("group") == group:
            out[(got["topic"], int(got["partition"]))] = value
    return out


@contextlib.contextmanager
def exporting(bootstrap: str, groups: list[str] | None,
              interval_s: float = 0.3, timeout_s: float = 20,
              dead_letter_topics: dict[str, str] | None = None) -> Iterator[str]:
    """An exporter in this process on a free port; yields its ``/metrics`` URL."""
    reader = GroupReader(lambda: ShareGroupAdmin(bootstrap, timeout_s=timeout_s), groups,
                         dead_letter_topics)
    exporter = Exporter(reader, interval_s=interval_s)
    server = exporter.serve("127.0.0.1", 0)
    exporter.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        exporter.stop(timeout_s=timeout_s + 5)
        reader.close()


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    cli.main(list(argv))
    return json.loads(capsys.readouterr().out)


def _accept(consumer: Any, want: int) -> int:
    """Poll and ACCEPT until ``want`` records are done; commit."""
    done = 0
    deadline = time.monotonic() + 60
    while done < want and time.monotonic() < deadline:
        for msg in consumer.poll(0.5):
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
            done += 1
        consumer.commit_sync()
    return done


def test_numbers_match_the_cli_while_a_consumer_holds_records(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    share_consumer: ShareConsumerFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory(2)
    kafka.produce(topic, [ProducerRecord(value=b"%d" % i, partition=i % 2) for i in range(20)])
    consumer = share_consumer(group, [topic])
    assert _accept(consumer, 20) == 20  # everything done once: lag 0 on both partitions
    kafka.produce(topic, [ProducerRecord(value=b"x", partition=0) for _ in range(7)])
    bootstrap = ["--bootstrap-server", kafka.bootstrap_servers]
    with exporting(kafka.bootstrap_servers, [group]) as url:
        lag = wait_for(lambda: cli_json(capsys, "groups", "lag", group, "--json", *bootstrap),
                       lambda d: d["total_lag"] == 7, what="lag 7 in the CLI")
        want = {(p["topic"], p["partition"]): p["lag"] for p in lag["partitions"]}
        samples = wait_for(lambda: scrape(url), lambda s: partitions(
            s, "kafka_share_partition_lag", group) == want, what=f"the CLI's lags {want}")
        assert samples[("kafka_share_up", ())] == 1
        assert samples[("kafka_share_group_lag", (("group", group),))] == lag["total_lag"] == 7
        assert partitions(samples, "kafka_share_partition_start_offset", group) == {
            (p["topic"], p["partition"]): p["start_offset"] for p in lag["partitions"]}
        described = cli_json(capsys, "groups", "describe", group, "--json", *bootstrap)
        assert samples[("kafka_share_group_members", (("group", group),))] == \
            len(described["members"]) == 1
        assert samples[("kafka_share_group_state", (("group", group),
                                                    ("state", described["state"])))] == 1
        assigned = described["members"][0]["assignment"][topic]
        assert partitions(samples, "kafka_share_partition_assigned_members", group) == {
            (topic, p): 1 for p in assigned}


def _rows(spark: Any, out: Path) -> int:
    if not any((out / "_spark_metadata").glob("[0-9]*")):
        return 0
    return int(spark.read.parquet(str(out)).count())


def test_numbers_match_the_cli_and_the_progress_while_a_source_job_runs(
    spark: Any, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory(2)
    kafka.produce(topic, [ProducerRecord(value=b"%d" % i, partition=i % 2) for i in range(300)])
    df = (spark.readStream.format("kafka-share")
          .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
          .option("kafka.group.id", group).option("subscribe", topic)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 100)
          .option("journalPath", str(tmp_path / "journal")).option("numPartitions", 2).load())
    out = tmp_path / "out"
    driver, listener = serve_query_metrics(spark, 0, "127.0.0.1")  # the driver's own /metrics
    driver_url = f"http://127.0.0.1:{driver.server_address[1]}/metrics"
    # The same from a poll of recentProgress (what a Spark Connect session uses).
    polling, poller = serve_query_metrics(spark, 0, "127.0.0.1", poll_interval_s=0.5)
    polling_url = f"http://127.0.0.1:{polling.server_address[1]}/metrics"
    with exporting(kafka.bootstrap_servers, [group]) as url:
        query = (df.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(tmp_path / "chk")).queryName("exported")
                 .trigger(processingTime="500 milliseconds").start())
        try:
            # The job drains the backlog; the exporter follows it while the query runs.
            seen = wait_for(lambda: scrape(url), lambda s: partitions(
                s, "kafka_share_partition_lag", group) == {(topic, 0): 0, (topic, 1): 0},
                timeout_s=180, what="lag 0 on both partitions in the exporter")
            lag = cli_json(capsys, "groups", "lag", group, "--json", "--bootstrap-server",
                           kafka.bootstrap_servers)
            assert seen[("kafka_share_group_lag", (("group", group),))] == lag["total_lag"] == 0
            assert partitions(seen, "kafka_share_partition_start_offset", group) == {
                (p["topic"], p["partition"]): p["start_offset"] for p in lag["partitions"]}
            progress = wait_for(lambda: ks.progress(query),
                                lambda p: p is not None and p.lag == 0, timeout_s=60,
                                what="the query's progress reads lag 0")
            assert progress is not None and progress.lag_by_partition == {
                f"{topic}:0": 0, f"{topic}:1": 0}
            assert query.isActive and query.exception() is None
            # The driver's listener: the query's progress, and each batch counted once.
            q = (("query", "exported"),)
            mine = wait_for(lambda: scrape(driver_url), lambda s: s.get(
                ("kafka_share_query_batch_records_total", q)) == 300, timeout_s=60,
                what="300 records counted from the query's batches")
            assert mine[("kafka_share_query_lag", q)] == progress.lag == 0
            assert mine[("kafka_share_query_input_rows_total", q)] == 300
            assert mine[("kafka_share_query_batch_accepted_total", q)] >= 300
            assert mine[("kafka_share_query_active", q)] == 1
            assert {labels: v for (name, labels), v in mine.items()
                    if name == "kafka_share_query_partition_lag"} == {
                (("partition", "0"), ("query", "exported"), ("topic", topic)): 0,
                (("partition", "1"), ("query", "exported"), ("topic", topic)): 0}
            polled = wait_for(lambda: scrape(polling_url), lambda s: s.get(
                ("kafka_share_query_batch_records_total", q)) == 300, timeout_s=60,
                what="300 records counted from the polled progress")
            mine = scrape(driver_url)
            for name in ("kafka_share_query_input_rows_total", "kafka_share_query_lag",
                         "kafka_share_query_batch_accepted_total", "kafka_share_query_active"):
                assert polled[(name, q)] == mine[(name, q)], name
        finally:
            query.stop()
    for url in (driver_url, polling_url):
        # Terminated: inactive, and the lag of its last report (from before its last batch)
        # no longer served.
        ended = wait_for(functools.partial(scrape, url),
                         lambda s: s[("kafka_share_query_active", q)] == 0,
                         what="the query reported terminated")
        assert ("kafka_share_query_lag", q) not in ended
        assert ended[("kafka_share_query_batch_records_total", q)] == 300
    for server in (driver, polling):
        server.shutdown()
        server.server_close()
    listener.close()
    poller.close()
    assert _rows(spark, out) == 300


def test_a_broker_killed_between_scrapes(topic_factory: TopicFactory) -> None:
    """Its own broker: killed, every scrape still answers at once with the last values and
    up 0; restarted, up 1 again."""
    with LocalKafka(heap="512m") as own:
        topic, group = "t-killed", "g-killed"
        own.create_topic(topic, 1)
        own.set_group_config(group, "share.auto.offset.reset", "earliest")
        own.produce(topic, [b"a", b"b", b"c"])
        ShareGroupAdmin(own.bootstrap_servers).reset(group, "earliest", topics=[topic])
        with exporting(own.bootstrap_servers, [group], timeout_s=3) as url:
            before = wait_for(lambda: scrape(url),
                              lambda s: s.get(("kafka_share_up", ())) == 1 and partitions(
                                  s, "kafka_share_partition_lag", group) == {(topic, 0): 3},
                              what="up 1, lag 3")
            own.kill()
            down = wait_for(lambda: scrape(url), lambda s: s[("kafka_share_up", ())] == 0,
                            what="up 0 after the kill")  # each scrape within 1 s
            assert partitions(down, "kafka_share_partition_lag", group) == {(topic, 0): 3}
            assert down[("kafka_share_last_success_timestamp_seconds", ())] <= \
                time.time() and down[("kafka_share_collect_errors_total", ())] >= 1
            assert before[("kafka_share_last_success_timestamp_seconds", ())] <= \
                down[("kafka_share_last_success_timestamp_seconds", ())]
            own.restart()
            wait_for(lambda: scrape(url), lambda s: s[("kafka_share_up", ())] == 1,
                     timeout_s=60, what="up 1 after the restart")


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalKafka]:
    """A broker of the module's own with a SASL_SSL listener (and ACLs; the super user)."""
    with LocalKafka(security="sasl_ssl", heap="512m") as broker:
        yield broker


def test_the_command_on_a_sasl_ssl_listener(secured: LocalKafka) -> None:
    """``kafka-share exporter GROUP --command-config FILE --port 0``: the URL on stdout,
    the group's numbers over SASL_SSL, SIGTERM ends it with exit code 0."""
    topic, group = "t-secured", "g-secured"
    secured.create_topic(topic, 1)
    secured.set_group_config(group, "share.auto.offset.reset", "earliest")
    secured.produce(topic, [b"a", b"b"])
    config = secured.command_config_file()
    with ShareGroupAdmin.from_properties_file(secured.bootstrap_servers, config) as admin:
        admin.reset(group, "earliest", topics=[topic])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_kafka_share.cli", "exporter", group,
         "--bootstrap-server", secured.bootstrap_servers, "--command-config", str(config),
         "--port", "0", "--address", "127.0.0.1", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
        samples = wait_for(lambda: scrape(url), lambda s: s[("kafka_share_up", ())] == 1,
                           what="up 1 over SASL_SSL")
        assert partitions(samples, "kafka_share_partition_lag", group) == {(topic, 0): 2}
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=5) as h:
            assert h.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_OK, err
    assert "Traceback" not in err


def test_cli_errors_name_the_java_properties_of_command_config(
    secured: LocalKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """With --command-config the errors name what the file says (ssl.truststore.location,
    sasl.jaas.config), not the librdkafka keys it was translated to."""
    good = secured.command_config_file().read_text()
    wrong_ca = tmp_path / "wrong-ca.properties"
    wrong_ca.write_text("".join(
        "ssl.truststore.location=/etc/ssl/certs/ca-certificates.crt\n"
        if line.startswith("ssl.truststore.location=") else line + "\n"
        for line in good.splitlines()))
    wrong_pw = tmp_path / "wrong-password.properties"
    wrong_pw.write_text(re.sub(r'password="[^"]*"', 'password="not-it"', good))
    for path, named in ((wrong_ca, "ssl.truststore.location"),
                        (wrong_pw, "sasl.jaas.config's password")):
        capsys.readouterr()
        code = cli.main(["groups", "list", "--bootstrap-server", secured.bootstrap_servers,
                         "--command-config", str(path), "--timeout", "10"])
        err = capsys.readouterr().err
        assert code == cli.EXIT_ERROR, err
        assert f"{named} (in {path})" in err, err
        assert not re.search(r"ssl\.ca\.location|sasl\.username|sasl\.password", err), err


def test_the_command_refuses_bad_usage_with_exit_code_2(tmp_path: Path) -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pyspark_kafka_share.cli", "exporter", *argv],
            check=False, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                 "KAFKA_SHARE_BOOTSTRAP_SERVERS": "", "PYSPARK_KAFKA_SHARE_BOOTSTRAP": ""})

    assert run("g").returncode == cli.EXIT_USAGE  # no broker
    done = run("g", "--bootstrap-server", "127.0.0.1:1", "--command-config",
               str(tmp_path / "missing.properties"))
    assert done.returncode == cli.EXIT_USAGE and "command-config" in done.stderr
    done = run("--bootstrap-server", "127.0.0.1:1")
    assert done.returncode == cli.EXIT_USAGE and "--all-groups" in done.stderr
