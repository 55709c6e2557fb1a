"""Source options: parsed once, case-insensitively, into one frozen, picklable object.

Conventions follow Spark's built-in ``kafka`` source: ``kafka.*`` options pass through to the
client (without the prefix); everything else is a source option. Every error names the option,
the value given and the fix, and is raised before a query starts.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pyspark_kafka_share.errors import OptionError

__all__ = ["CLIENT_OPTIONS_REJECTED", "SOURCE_OPTIONS", "SourceOptions", "parse_options"]

Delivery = Literal["exactly-once", "at-most-once"]

# Client settings that would break the source's guarantees or that share consumers reject,
# mapped to what to use instead.
CLIENT_OPTIONS_REJECTED: dict[str, str] = {
    "enable.auto.commit": "the source acknowledges each record itself; remove the option",
    "auto.offset.reset": "use the source option 'startingOffsets' (earliest, latest or an "
    "ISO-8601 duration such as PT1H); it sets the share group's share.auto.offset.reset",
    "share.acknowledgement.mode": "the source always acknowledges explicitly; choose "
    "the guarantee with the source option 'delivery' (exactly-once or at-most-once)",
    "isolation.level": "share groups take it as the group config share.isolation.level; set it "
    "with `kafka-share groups` or an admin client, not as a client option",
    "group.instance.id": "share groups have no static membership; remove the option",
    "group.id": "use the source option 'kafka.group.id' (the share group name)",
    "group.protocol": "share consumers always use the share protocol; remove the option",
    "session.timeout.ms": "share groups set it on the broker/group (share.session.timeout.ms)",
    "heartbeat.interval.ms": "share groups set it on the broker/group "
    "(share.heartbeat.interval.ms)",
    "partition.assignment.strategy": "the broker assigns share-group partitions; remove it",
    "enable.partition.eof": "not applicable to share consumers; remove the option",
    "key.deserializer": "the source returns key and value as binary; cast or decode in Spark",
    "value.deserializer": "the source returns key and value as binary; cast or decode in Spark",
    "bootstrap.servers": "use the source option 'kafka.bootstrap.servers'",
}

DEFAULT_MAX_POLL_RECORDS = 2000

SOURCE_OPTIONS = (
    "kafka.bootstrap.servers", "kafka.group.id", "subscribe", "journalPath", "delivery",
    "numPartitions", "maxRecordsPerTrigger", "startingOffsets", "includeHeaders",
    "pollTimeoutMs", "joinTimeoutMs", "maxBatchDurationMs", "consumerIdleTimeoutMs",
    "lockSafetyFraction", "dedupRetentionMs", "brokerTimeoutMs", "journalFsync",
)
# Options Spark may add on its own (e.g. for CREATE TABLE ... USING); ignored.
_SPARK_INJECTED = ("path", "paths", "provider")
_TEST_OPTION = "_faultinjection"

_DURATION = re.compile(r"^P(?!$)(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class SourceOptions:
    """Every option of a ``kafka-share`` source, validated."""

    bootstrap_servers: str
    group_id: str
    topics: tuple[str, ...]
    delivery: Delivery = "exactly-once"
    journal_path: str | None = None
    num_partitions: int | None = None
    max_records_per_trigger: int | None = None
    starting_offsets: str | None = None
    include_headers: bool = False
    journal_fsync: bool = True
    poll_timeout_ms: int = 2_000
    join_timeout_ms: int = 6_000
    max_batch_duration_ms: int = 10_000
    consumer_idle_timeout_ms: int = 10_000
    lock_safety_fraction: float = 0.5
    dedup_retention_ms: int = 7 * 24 * 3600 * 1000
    broker_timeout_ms: int = 30_000
    client_config: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    fault_injection: str | None = None

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly-once"

    def consumer_config(self) -> dict[str, str]:
        """The confluent-kafka ``ShareConsumer`` configuration."""
        conf = dict(self.client_config)
        conf.update({
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "share.acknowledgement.mode": "explicit",
        })
        conf.setdefault("client.id", "pyspark-kafka-share")
        # librdkafka's default (500) costs half the throughput: each poll is a broker round
        # trip, a journal slot and a commit. 2000 is the broker's default lock limit per
        # share partition (group.share.partition.max.record.locks); see docs/benchmarks.
        conf.setdefault("max.poll.records", str(DEFAULT_MAX_POLL_RECORDS))
        return conf

    def admin_config(self) -> dict[str, str]:
        """Client settings for an ``AdminClient`` (security settings etc. pass through)."""
        skip = {"max.poll.records", "fetch.max.bytes", "fetch.min.bytes", "fetch.wait.max.ms",
                "max.poll.interval.ms", "client.id"}
        conf = {k: v for k, v in self.client_config if k not in skip}
        conf["bootstrap.servers"] = self.bootstrap_servers
        return conf


def _int(opts: Mapping[str, str], name: str, default: int | None, *, minimum: int = 0,
         maximum: int | None = None) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(name, raw, "must be a whole number") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise OptionError(name, raw, f"must be at least {minimum}{upper}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(name, raw, "must be true or false")


def _starting_offsets(raw: str | None) -> str | None:
    """Map ``startingOffsets`` to a ``share.auto.offset.reset`` value."""
    if raw is None:
        return None
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    if _DURATION.match(text.upper()):
        return f"by_duration:{text.upper()}"
    raise OptionError(
        "startingOffsets", raw,
        "use 'earliest', 'latest' or an ISO-8601 duration such as 'PT1H' or 'P1D' (start at "
        "records no older than that). Share groups take no per-partition JSON offsets",
    )


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate ``options`` (keys case-insensitive) into :class:`SourceOptions`."""
    if not options:
        raise OptionError(
            "kafka.bootstrap.servers", None,
            "no options reached the source at all. PySpark 4.3 does not pass a table's "
            "OPTIONS to a Python streaming source read from the catalog (SELECT * FROM STREAM "
            "t, spark.readStream.table(t)). Use spark.readStream.format('kafka-share')"
            ".options(...).load(); for SQL, register that DataFrame with "
            "createOrReplaceTempView and query the view",
        )
    opts: dict[str, str] = {k.lower(): v for k, v in options.items()}
    # A table (CREATE TABLE ... USING): Spark passes table properties (owner, provider, ...)
    # beside the user's OPTIONS, which may also appear as "option.<key>".
    from_table = any(k.startswith("option.") for k in opts) or "provider" in opts
    if from_table:
        merged = {k: v for k, v in opts.items() if not k.startswith("option.")}
        merged.update({k[len("option."):]: v for k, v in opts.items()
                       if k.startswith("option.")})
        opts = merged
    if "subscribepattern" in opts or "assign" in opts:
        name = "subscribePattern" if "subscribepattern" in opts else "assign"
        raise OptionError(name, opts.get(name.lower()),
                          "share groups take topic names only; use 'subscribe'")
    spelled = {k.lower().removeprefix("option."): k.removeprefix("option.") for k in options}
    known = {name.lower(): name for name in SOURCE_OPTIONS}
    client: list[tuple[str, str]] = []
    for key, value in opts.items():
        if key.startswith("kafka."):
            client_key = key[len("kafka."):]
            if client_key in ("bootstrap.servers", "group.id"):
                continue
            if client_key in CLIENT_OPTIONS_REJECTED:
                raise OptionError(f"kafka.{client_key}", value,
                                  CLIENT_OPTIONS_REJECTED[client_key])
            client.append((client_key, str(value)))
        elif key in CLIENT_OPTIONS_REJECTED and key not in known:
            raise OptionError(key, value, CLIENT_OPTIONS_REJECTED[key])
        elif key not in known and key not in _SPARK_INJECTED and key != _TEST_OPTION \
                and not from_table:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {known[close[0]]!r}? " if close else ""
            raise OptionError(spelled.get(key, key), value, f"unknown option; {hint}known "
                              "options: "
                              f"{', '.join(SOURCE_OPTIONS)} and kafka.* client settings")

    bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise OptionError("kafka.bootstrap.servers", opts.get("kafka.bootstrap.servers"),
                          "set it to the broker list, e.g. 'host1:9092,host2:9092'")
    group = opts.get("kafka.group.id", "").strip()
    if not group:
        raise OptionError("kafka.group.id", opts.get("kafka.group.id"),
                          "set it to the share group's name; every query and worker with "
                          "the same name shares the records")
    raw_topics = opts.get("subscribe")
    topics = tuple(t.strip() for t in (raw_topics or "").split(",") if t.strip())
    if not topics:
        raise OptionError("subscribe", raw_topics,
                          "set it to one or more comma-separated topic names")
    bad = [t for t in topics if not _TOPIC.match(t)]
    if bad:
        raise OptionError("subscribe", raw_topics, f"{bad[0]!r} is not a valid topic name")
    if len(set(topics)) != len(topics):
        raise OptionError("subscribe", raw_topics, "a topic is named twice")

    delivery_raw = opts.get("delivery", "exactly-once").strip().lower()
    if delivery_raw not in ("exactly-once", "at-most-once"):
        raise OptionError("delivery", opts.get("delivery"),
                          "use 'exactly-once' (default, needs journalPath) or 'at-most-once'")
    delivery: Delivery = "exactly-once" if delivery_raw == "exactly-once" else "at-most-once"
    journal = (opts.get("journalpath") or "").strip() or None
    if delivery == "exactly-once" and journal is None:
        raise OptionError(
            "journalPath", None,
            "delivery=exactly-once needs a durable journal: records are written there before "
            "they are acknowledged, so a re-run micro-batch replays them exactly. Set it to a "
            "directory on a shared filesystem (local path on one machine, HDFS on a cluster) "
            "used by this query only, like its checkpointLocation; or set "
            "delivery=at-most-once to acknowledge on poll and accept losing records on failure",
        )
    if journal is not None:
        from pyspark_kafka_share.source.journal.journal import check_journal_uri

        check_journal_uri(journal)

    lock_fraction_raw = opts.get("locksafetyfraction")
    lock_fraction = 0.5
    if lock_fraction_raw is not None:
        try:
            lock_fraction = float(lock_fraction_raw)
        except ValueError:
            raise OptionError("lockSafetyFraction", lock_fraction_raw,
                              "must be a number between 0.1 and 0.9") from None
        if not 0.1 <= lock_fraction <= 0.9:
            raise OptionError("lockSafetyFraction", lock_fraction_raw,
                              "must be between 0.1 and 0.9")

    return SourceOptions(
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=topics,
        delivery=delivery,
        journal_path=journal,
        num_partitions=_int(opts, "numPartitions", None, minimum=1, maximum=10_000),
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger", None, minimum=1),
        starting_offsets=_starting_offsets(opts.get("startingoffsets")),
        include_headers=_bool(opts, "includeHeaders", False),
        journal_fsync=_bool(opts, "journalFsync", True),
        poll_timeout_ms=_int(opts, "pollTimeoutMs", 2_000, minimum=10) or 2_000,
        join_timeout_ms=_int(opts, "joinTimeoutMs", 6_000, minimum=0) or 0,
        max_batch_duration_ms=_int(opts, "maxBatchDurationMs", 10_000, minimum=100) or 10_000,
        consumer_idle_timeout_ms=_int(opts, "consumerIdleTimeoutMs", 10_000, minimum=0) or 0,
        lock_safety_fraction=lock_fraction,
        dedup_retention_ms=_int(opts, "dedupRetentionMs", 7 * 24 * 3600 * 1000,
                                minimum=0) or 0,
        broker_timeout_ms=_int(opts, "brokerTimeoutMs", 30_000, minimum=1_000) or 30_000,
        client_config=tuple(sorted(client)),
        fault_injection=opts.get(_TEST_OPTION),
    )
