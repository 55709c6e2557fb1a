"""Secrets stay secret (issue 13, item 5).

The ``kafka-share`` source and the queue workers are given passwords and store credentials
with distinctive marker values: ``kafka.sasl.password`` and ``kafka.ssl.key.password`` (the
workers: ``consumer_config`` / ``producer_config``), and, for a journal on ``s3://``,
``journal.aws_secret_access_key`` and ``journal.aws_session_token``. They run where those
settings are unused (a PLAINTEXT listener; LocalS3 checks no signature), where they fail (a
SASL_PLAINTEXT client against the PLAINTEXT broker; a missing bucket) and where a task fails.
No marker may appear anywhere a user or an operator can see it:

- Python logging of this process (``caplog``: the package's loggers at DEBUG, the rest at
  INFO; py4j logs every command it sends, option values included, at DEBUG: not ours);
- this process's stdout and stderr (``capfd``: warnings, anything printed);
- Spark's driver log at INFO (a log4j appender added for the test: plans, task failures with
  the executors' Python tracebacks);
- errors: ``str`` and ``repr`` of the raised exception and of every chained cause;
- the query's ``lastProgress``, ``recentProgress``, ``exception()`` and plan;
- the repr of the parsed options, their client settings, the journal and its store, the
  workers' config;
- the workers' progress snapshots (and the stderr line each makes) and summary.

Spark's own plans show options whose names its redaction pattern misses (last test).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from pyspark_kafka_share.harness import LocalKafka, LocalS3
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.workers import Record, WorkerProgress, run_workers, start_workers
from pyspark_kafka_share.workers.config import WorkerConfig
from tests.fixtures.journal import JournalAt, journal_at
from tests.fixtures.kafka import TopicFactory
from tests.helpers import DRIVER_LOG_SENTINEL, driver_log, share_stream, stop_when_drained

# The worker function runs in Spark's Python workers, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

# Distinctive values: found only if something printed a secret.
SASL_PASSWORD = "SASLPW-q7Zx3marker"
SSL_KEY_PASSWORD = "SSLKEYPW-k9Wv2marker"
PRODUCER_PASSWORD = "PRODPW-m4Tt8marker"
AWS_SECRET = "AWSSECRET-r5Yb1marker"
AWS_TOKEN = "AWSTOKEN-p2Nc6marker"
MARKERS = (SASL_PASSWORD, SSL_KEY_PASSWORD, PRODUCER_PASSWORD, AWS_SECRET, AWS_TOKEN)

KAFKA_SECRETS = {"kafka.sasl.password": SASL_PASSWORD, "kafka.ssl.key.password": SSL_KEY_PASSWORD}
# A SASL client: the PLAINTEXT test broker cannot authenticate it.
SASL_CLIENT = {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
               "kafka.sasl.username": "alice", **KAFKA_SECRETS, "brokerTimeoutMs": "5000"}


class Seen:
    """Everything visible, by where it was seen. :meth:`check` (at the end of each test) adds
    the logs and the output, and fails naming each place a marker was seen."""

    def __init__(self, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
                 driver_log: Callable[[], str]) -> None:
        self.texts: dict[str, str] = {}
        self._caplog = caplog
        self._capfd = capfd
        self._driver_log = driver_log

    def add(self, where: str, text: object) -> None:
        self.texts[where] = self.texts.get(where, "") + "\n" + str(text)

    def error(self, where: str, exc: BaseException) -> None:
        """``str`` and ``repr`` of ``exc`` and of every exception chained to it."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            self.add(f"{where}: {type(current).__name__}", f"{current}\n{current!r}")
            current = current.__cause__ or current.__context__

    def check(self) -> None:
        time.sleep(0.5)  # let late log lines arrive
        self.add("Spark driver log", self._driver_log())
        self.add("Python logging", "\n".join(f"{r.name} {r.levelname} {r.getMessage()}"
                                             for r in self._caplog.records))
        out, err = self._capfd.readouterr()
        self.add("stdout", out)
        self.add("stderr", err)
        assert DRIVER_LOG_SENTINEL in self.texts["Spark driver log"], \
            "Spark's driver log was not captured: the check would prove less than it says"
        leaks = [f"{marker} in {where}" for where, text in self.texts.items()
                 for marker in MARKERS if marker in text]
        assert not leaks, "secrets shown: " + "; ".join(leaks)


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
         spark: SparkSession) -> Iterator[Seen]:
    """What the test saw; the test ends with ``seen.check()``."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="pyspark_kafka_share")
    with driver_log(spark) as read_log:
        yield Seen(caplog, capfd, read_log)






def _secret_journal(s3: LocalS3, tmp_path: Path) -> JournalAt:
    """A journal on LocalS3 whose secret key and session token are markers (moto checks no
    signature, so it works)."""
    where = journal_at("s3", tmp_path, s3)
    return JournalAt("s3", where.url, {**where.options,
                                       "journal.aws_secret_access_key": AWS_SECRET,
                                       "journal.aws_session_token": AWS_TOKEN})


def _reader(spark: SparkSession, kafka: LocalKafka, topic: str, group: str,
            **options: str) -> DataFrame:
    return share_stream(spark, kafka, topic, group, None, **{"pollTimeoutMs": "1000", **options})


def _progress(p: Any) -> str:
    """A progress report as Spark's JSON (``.json``) and as Python shows it."""
    return f"{getattr(p, 'json', '')}\n{p!s}\n{p!r}"


def _query_state(seen: Seen, query: StreamingQuery) -> None:
    seen.add("query.lastProgress", _progress(query.lastProgress))
    seen.add("query.recentProgress", "\n".join(_progress(p) for p in query.recentProgress))
    seen.add("query.status", query.status)
    seen.add("query plan", query._jsq.explainInternal(True))
    failure = query.exception()
    if failure is not None:
        seen.error("query.exception()", failure)


# -- the source ----------------------------------------------------------------------------------


def test_the_source_shows_no_secret_while_it_runs_and_when_a_task_fails(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, s3: LocalS3, tmp_path: Path,
    seen: Seen,
) -> None:
    kafka.produce(topic, [b"a", b"b", b"c"])
    where = _secret_journal(s3, tmp_path)
    options = {**KAFKA_SECRETS, **where.source_options}
    parsed = parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                            "kafka.group.id": group, "subscribe": topic, **options})
    settings = parsed.journal_settings()
    assert settings is not None
    journal = Journal.of(settings)
    for name, obj in [("SourceOptions", parsed), ("ClientSettings", parsed.client),
                      ("Journal", journal), ("journal store", journal.store)]:
        seen.add(f"repr({name})", repr(obj))
    df = _reader(spark, kafka, topic, group, **options)
    seen.add("DataFrame plan", df._jdf.queryExecution().toString())
    q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    rows = spark.read.parquet(str(tmp_path / "out")).count()
    assert rows == 3, "the secrets were unused: the query must have read everything"
    _query_state(seen, q)
    # A task that fails on every attempt: the query fails with the executors' tracebacks.
    kafka.produce(topic, [b"d"])
    other = _secret_journal(s3, tmp_path)
    failing = _reader(spark, kafka, topic, group, **KAFKA_SECRETS, **other.source_options,
                      _faultInjection="fail-before-end:seq=1:part=0")
    q = (failing.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c2"))
         .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="injected failure") as info:
        q.awaitTermination(180)
    seen.error("awaitTermination", info.value)
    _query_state(seen, q)
    assert q.exception() is not None
    seen.check()


def test_a_sasl_client_refused_by_the_broker_shows_no_secret_at_load(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path, seen: Seen,
) -> None:
    started = time.monotonic()
    with pytest.raises(Exception) as info:  # whatever fails, nothing may leak
        _reader(spark, kafka, topic, group, journalPath=str(tmp_path / "j"), **SASL_CLIENT)
    # Only a guard against a hang (a refused client retried for ever), not a promise of speed:
    # generous enough for a loaded 2-core machine.
    assert time.monotonic() - started < 120
    seen.error("load()", info.value)
    assert not spark.streams.active
    seen.check()


def test_an_unusable_s3_journal_shows_no_secret_at_load(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, s3: LocalS3, tmp_path: Path,
    seen: Seen,
) -> None:
    where = _secret_journal(s3, tmp_path)
    missing_bucket = where.url.replace("s3://journals/", "s3://no-such-bucket/")
    with pytest.raises(Exception, match="journalPath") as info:
        _reader(spark, kafka, topic, group, **{**where.options, "journalPath": missing_bucket})
    seen.error("load()", info.value)
    with pytest.raises(Exception, match=r"journal\.aws_no_such_key") as info:
        _reader(spark, kafka, topic, group, **where.source_options,
                **{"journal.aws_no_such_key": AWS_SECRET})
    seen.error("load() with an unknown journal.* key", info.value)
    seen.check()


# A secret given without its "kafka." prefix (sasl.password) is an unknown option: the error
# names it without its value.
def test_a_secret_given_without_its_kafka_prefix_is_not_echoed_at_load(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path, seen: Seen,
) -> None:
    with pytest.raises(Exception, match="unknown option") as info:
        _reader(spark, kafka, topic, group, journalPath=str(tmp_path / "j"),
                **{"sasl.password": SASL_PASSWORD})
    seen.error("load()", info.value)
    seen.check()


# -- the queue workers ---------------------------------------------------------------------------


def _echo(record: Record) -> bytes:
    return record.value or b""


def test_the_workers_show_no_secret_in_progress_summary_or_config(
    spark: SparkSession, kafka: LocalKafka, topic: str, topic_factory: TopicFactory, group: str,
    seen: Seen,
) -> None:
    out = topic_factory(1)
    kafka.produce(topic, [b"x%d" % i for i in range(20)])
    secrets = {"sasl.password": SASL_PASSWORD, "ssl.key.password": SSL_KEY_PASSWORD}
    common: dict[str, Any] = {
        "topics": topic, "group": group, "bootstrap_servers": kafka.bootstrap_servers,
        "consumer_config": secrets, "producer_config": {"sasl.password": PRODUCER_PASSWORD},
        "output_topic": out}
    config = WorkerConfig.create(**common)
    seen.add("repr(WorkerConfig)", repr(config))
    seen.add("repr(ClientSettings)", repr(config.client))
    snapshots: list[WorkerProgress] = []
    job = start_workers(spark, _echo, **common, workers=1, progress_interval_s=0.5,
                        on_progress=snapshots.append)
    # Done once all 20 are acknowledged and counted, not on a 4 s idle timeout (a slow task
    # start outlasts it on a loaded machine).
    summary = stop_when_drained(job, kafka, group,
                                settled=lambda: job.progress().totals["accepted"] >= 20)
    assert summary.totals["accepted"] == 20, str(summary)
    assert snapshots, "no progress was reported"
    for p in snapshots:
        seen.add("WorkerProgress", f"{p}\n{p!r}\n{p.line()}")
    seen.add("WorkerSummary", f"{summary}\n{summary!r}")
    seen.check()


def test_workers_refused_by_the_broker_show_no_secret(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, seen: Seen,
) -> None:
    conf = {k.removeprefix("kafka."): v for k, v in SASL_CLIENT.items() if k.startswith("kafka.")}
    started = time.monotonic()
    with pytest.raises(Exception) as info:  # whatever fails, nothing may leak
        run_workers(spark, _echo, topics=topic, group=group,
                    bootstrap_servers=kafka.bootstrap_servers, consumer_config=conf,
                    producer_config={"sasl.password": PRODUCER_PASSWORD},
                    output_topic=topic, broker_timeout_s=5, idle_timeout_s=5)
    # Only a guard against a hang (a refused client retried for ever), not a promise of speed:
    # generous enough for a loaded 2-core machine (a Spark job's start).
    assert time.monotonic() - started < 120
    seen.error("run_workers", info.value)
    seen.check()


# A misspelled consumer_config with a password in it: the error names the argument and
# suggests the right one without showing the value.
def test_a_misspelled_consumer_config_is_not_echoed(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, seen: Seen,
) -> None:
    # A keyword run_workers does not have: built at run time, as a caller's typo would be.
    misspelled: dict[str, Any] = {"consumer_confg": {"sasl.password": SASL_PASSWORD}}
    with pytest.raises(Exception, match="did you mean 'consumer_config'") as info:
        run_workers(spark, _echo, topics=topic, group=group,
                    bootstrap_servers=kafka.bootstrap_servers, **misspelled)
    seen.error("run_workers", info.value)
    seen.check()


# -- what Spark itself shows -----------------------------------------------------------------------

PEM_MARKER = "-----BEGIN PRIVATE KEY-----PEMKEY-h8Jd4marker"


def test_spark_plans_redact_options_by_name_and_the_redaction_regex_covers_the_rest(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
) -> None:
    # Spark prints a source's options in its plans (explain(), the UI's SQL tab, event logs),
    # hiding the values of options whose name (or value) matches spark.redaction.regex
    # (default: secret|password|token|access.key|credential) or
    # spark.sql.redaction.options.regex (default: url). A secret option named otherwise, such
    # as kafka.ssl.key.pem, journal.azure_storage_account_key or
    # journal.google_service_account_key, is shown unless the session's regex names it.
    # Spark does this before the source sees the options: the source cannot hide them
    # (docs/operations.md, "The journal on an object store").
    def plan(**options: str) -> str:
        # Spark reads the redaction pattern from the thread's active session (SQLConf.get):
        # after other tests' streaming queries that can be a query's clone of this session.
        jvm = spark._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        df = _reader(spark, kafka, topic, group, journalPath=str(tmp_path / "j"), **options)
        return str(df._jdf.queryExecution().toString())

    assert SASL_PASSWORD not in plan(**KAFKA_SECRETS), "Spark no longer redacts passwords"
    # kafka.ssl.key.pem is librdkafka's (the native client, the default, refuses it at load())
    pem = {"kafka.ssl.key.pem": PEM_MARKER, "client": "librdkafka"}
    assert PEM_MARKER in plan(**pem), "Spark now redacts kafka.ssl.key.pem by itself"
    key = "spark.sql.redaction.options.regex"
    before = spark.conf.get(key)
    assert before is not None
    spark.conf.set(key, f"{before}|(?i)pem|account_key|_key_base64")
    try:
        assert PEM_MARKER not in plan(**pem)
    finally:
        spark.conf.set(key, before)
