"""Source options: parsed once, case-insensitively, into one frozen, picklable object.

Conventions follow Spark's built-in ``kafka`` source: ``kafka.*`` options pass through to the
client (without the prefix); everything else is a source option. Every error names the option,
the value given and the fix, and is raised before a query starts.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from pyspark_kafka_share._kafka.clientconf import shown
from pyspark_kafka_share._kafka.connection_parse import parse_flag
from pyspark_kafka_share._kafka.consumers import ConsumerRecipe, ShareClient, check_client
from pyspark_kafka_share._kafka.settings import (
    CLIENT_OPTIONS_REJECTED,
    ClientSettings,
    check_bootstrap,
    check_client_config,
    check_group,
    check_topics,
    offset_reset,
)
from pyspark_kafka_share.errors import OptionError

if TYPE_CHECKING:
    from pyspark_kafka_share.source.journal import JournalLocation, JournalSettings

__all__ = ["DEFAULT_CLIENT", "SOURCE_OPTIONS", "SourceOptions", "parse_options"]

Delivery = Literal["exactly-once", "at-most-once"]

SOURCE_OPTIONS = (
    "kafka.bootstrap.servers", "kafka.group.id", "subscribe", "journalPath", "delivery",
    "numPartitions", "maxRecordsPerTrigger", "startingOffsets", "includeHeaders",
    "pollTimeoutMs", "joinTimeoutMs", "maxBatchDurationMs", "consumerIdleTimeoutMs",
    "lockSafetyFraction", "dedupRetentionMs", "brokerTimeoutMs", "journalFsync",
    "journalContent", "failOnDataLoss", "journalRetryTimeoutMs", "journalRetentionMs", "client",
)
# Options Spark may add on its own (e.g. for CREATE TABLE ... USING); ignored.
_SPARK_INJECTED = ("path", "paths", "provider")
DEFAULT_BATCH_DURATION_MS = 10_000
AVAILABLE_NOW_BATCH_DURATION_MS = 30_000
_TEST_OPTION = "_faultinjection"
DEFAULT_JOURNAL_RETENTION_MS = 600_000
DEFAULT_CLIENT: ShareClient = "native"
"""The source's share consumer unless ``client`` says otherwise: the package's own, since it
matched librdkafka in the source's failure suites, the cluster tier, the chaos run and two quiet
benches (issue 39; docs/design.md, "Which client is the default"). The workers keep
librdkafka (``workers.config.DEFAULT_CLIENT``)."""


@dataclass(frozen=True)
class SourceOptions:
    """Every option of a ``kafka-share`` source, validated."""

    bootstrap_servers: str
    group_id: str
    topics: tuple[str, ...]
    delivery: Delivery = "exactly-once"
    # journalPath, parsed once when the options are validated (None: no journal)
    journal_location: JournalLocation | None = None
    num_partitions: int | None = None
    max_records_per_trigger: int | None = None
    starting_offsets: str | None = None
    include_headers: bool = False
    journal_fsync: bool = True
    # What a journal slot holds: "offsets" (replayed from Kafka) or "records" (the records).
    journal_content: str = "offsets"
    # A replay that finds records gone from Kafka fails the query (True) or skips them.
    fail_on_data_loss: bool = True
    # How long an object-store journal's call rides out an outage (None: the journal's
    # default, stores.retry.DEFAULT_RETRY_TIMEOUT_MS).
    journal_retry_timeout_ms: int | None = None
    # How long a committed batch's slots stay in the journal; a task younger than half of it
    # skips the fence re-read after each slot (docs/design.md). 0: deleted at the commit.
    journal_retention_ms: int = DEFAULT_JOURNAL_RETENTION_MS
    poll_timeout_ms: int = 2_000
    join_timeout_ms: int = 6_000
    max_batch_duration_ms: int | None = None  # unset: see batch_duration_ms()
    consumer_idle_timeout_ms: int = 10_000
    lock_safety_fraction: float = 0.5
    dedup_retention_ms: int = 7 * 24 * 3600 * 1000
    broker_timeout_ms: int = 30_000
    client_config: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # secrets
    fault_injection: str | None = None
    # journal.<key> options of an object-store journal (without the prefix): credentials,
    # endpoints. Never logged nor shown (repr=False); see source/journal/stores/.
    journal_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # The share consumer: the package's own ("native", the default) or confluent-kafka's
    # ("librdkafka").
    share_client: ShareClient = DEFAULT_CLIENT

    def batch_duration_ms(self, available_now: bool) -> int:
        """How long a task may poll: ``maxBatchDurationMs``, or by default 10 s, and 30 s for
        a ``Trigger.AvailableNow`` drain (Spark 4.2+), where nobody waits for a batch's rows
        and each batch boundary costs every task a group join (1-3 s measured on the
        throughput benchmark's drain). 30 s bounds what the open batches add to each worker's
        duplicate index (8 bytes per record) while amortising the joins."""
        if self.max_batch_duration_ms is not None:
            return self.max_batch_duration_ms
        return AVAILABLE_NOW_BATCH_DURATION_MS if available_now else DEFAULT_BATCH_DURATION_MS

    @property
    def journal_path(self) -> str | None:
        """``journalPath`` as given (for messages); None without a journal."""
        return None if self.journal_location is None else self.journal_location.uri

    def journal_settings(self) -> JournalSettings | None:
        """The journal's settings; None without ``journalPath``."""
        if self.journal_location is None:
            return None
        from pyspark_kafka_share.source.journal import JournalSettings

        settings = JournalSettings(self.journal_location, fsync=self.journal_fsync,
                                   store_options=self.journal_options,
                                   content="records" if self.journal_content == "records"
                                   else "offsets",
                                   retention_ms=self.journal_retention_ms)
        if self.journal_retry_timeout_ms is None:
            return settings
        return replace(settings, retry_timeout_ms=self.journal_retry_timeout_ms)

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly-once"

    @property
    def client(self) -> ClientSettings:
        """How the source's clients reach the cluster (the ``kafka.*`` options)."""
        return ClientSettings(self.bootstrap_servers, self.group_id, self.client_config,
                              self.broker_timeout_ms / 1000)

    def consumer_recipe(self, max_poll_records: int | None = None) -> ConsumerRecipe:
        """A task's share consumer (``client``), polling at most ``max_poll_records``; the
        native client decodes its fetches straight into the source's Arrow schema
        (``arrow``), and acquires strictly that many (``record_limit``) when there is such a
        cap (``maxRecordsPerTrigger``, the plan's poll size), else whole producer batches until
        the task's budget is within two polls (``NativeConsumerConfig.strict``): a strict
        poll splits a producer batch, which costs the broker per-offset state, measured 2.5x
        slower drains (docs/design.md, "In the source")."""
        native = self.share_client == "native"
        return ConsumerRecipe(self.client, self.share_client, "pyspark-kafka-share",
                              max_poll_records,
                              record_limit=native and max_poll_records is not None,
                              arrow=self.include_headers if native else None)


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
    return parse_flag(name, opts.get(name.lower()), default, "must be true or false")


def _lowered(options: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """Options with lower-case keys, and whether they come from a table (CREATE TABLE ...
    USING), where Spark passes table properties (owner, provider, ...) beside the user's
    OPTIONS, which may also appear as "option.<key>"."""
    opts: dict[str, str] = {k.lower(): v for k, v in options.items()}
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
    return opts, from_table


def _pass_through(options: Mapping[str, str], opts: dict[str, str], from_table: bool) \
        -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The ``kafka.*`` client settings and the ``journal.*`` store settings; any other key
    must be a source option."""
    spelled = {k.lower().removeprefix("option."): k.removeprefix("option.") for k in options}
    known = {name.lower(): name for name in SOURCE_OPTIONS}
    client: list[tuple[str, str]] = []
    journal_opts: list[tuple[str, str]] = []
    for key, value in opts.items():
        if key.startswith("journal.") and len(key) > len("journal."):
            journal_opts.append((key[len("journal."):], str(value)))
        elif key.startswith("kafka."):
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
            raise OptionError(spelled.get(key, key), shown(key, value),
                              f"unknown option; {hint}known "
                              "options: "
                              f"{', '.join(SOURCE_OPTIONS)}, kafka.* client settings and "
                              "journal.* object-store settings")
    return tuple(sorted(client)), tuple(sorted(journal_opts))


def _delivery_and_journal(opts: Mapping[str, str], journal_opts: tuple[tuple[str, str], ...]) \
        -> tuple[Delivery, JournalLocation | None]:
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
            "location the driver and every executor share (an object store such as "
            "s3://bucket/path, HDFS, or a local path on one machine), used by this query "
            "only, like its checkpointLocation; or set delivery=at-most-once to acknowledge "
            "on poll and accept losing records on failure",
        )
    if journal is None:
        if journal_opts:
            raise OptionError(f"journal.{journal_opts[0][0]}", None,
                              "journal.* options configure an object-store journalPath; set "
                              "journalPath or remove them")
        return delivery, None
    # The one place journalPath is parsed; the location is probed (on an object store: its
    # conditional create, a few requests once per process) and kept in the options.
    from pyspark_kafka_share.source.journal.location import JournalLocation
    from pyspark_kafka_share.source.journal.probe import check_journal

    location = JournalLocation.parse(journal)
    check_journal(location, journal_opts)
    return delivery, location


def _journal_content(opts: Mapping[str, str]) -> str:
    raw = opts.get("journalcontent")
    if raw is None:
        return "offsets"
    value = str(raw).strip().lower()
    if value not in ("offsets", "records"):
        raise OptionError("journalContent", raw,
                          "use 'offsets' (default: the journal keeps offsets, a replay reads "
                          "the records back from Kafka) or 'records' (the journal keeps a copy "
                          "of every record: for topics whose records may be gone before a "
                          "replay, such as short retention, compaction or deleteRecords)")
    return value


_RETRY_TIMEOUT_MAX_MS = 300_000


def _journal_retry_timeout(opts: Mapping[str, str], journal: JournalLocation | None
                           ) -> int | None:
    """``journalRetryTimeoutMs``: only for a journal on an object store (a filesystem's
    client retries on its own terms: NFS's mount options, HDFS's client settings)."""
    raw = opts.get("journalretrytimeoutms")
    if raw is None:
        return None
    if journal is None or journal.kind != "object":
        where = "no journalPath is set" if journal is None \
            else f"journalPath {journal.uri!r} is not on an object store"
        raise OptionError("journalRetryTimeoutMs", raw,
                          f"it bounds the retries of an object-store journal (s3://, gs://, "
                          f"abfss://), but {where}; remove it")
    try:
        return _int(opts, "journalRetryTimeoutMs", None, minimum=1_000,
                    maximum=_RETRY_TIMEOUT_MAX_MS)
    except OptionError as exc:
        raise OptionError("journalRetryTimeoutMs", raw,
                          f"{exc.fix} (milliseconds: 1 s to 5 min; obstore retries a request "
                          "with the credentials it signed it with, which it advises to keep "
                          "under 5 minutes). Default 120000") from None


def _fraction(opts: Mapping[str, str]) -> float:
    raw = opts.get("locksafetyfraction")
    if raw is None:
        return 0.5
    try:
        value = float(raw)
    except ValueError:
        raise OptionError("lockSafetyFraction", raw,
                          "must be a number between 0.1 and 0.9") from None
    if not 0.1 <= value <= 0.9:
        raise OptionError("lockSafetyFraction", raw, "must be between 0.1 and 0.9")
    return value


def _required(opts: Mapping[str, str], name: str,
              check: Callable[[str | None, str], str]) -> str:
    """``check`` of option ``name``; when it is missing, an error that also names a given
    ``kafka.*`` key spelt like it (``kafka.group.idd`` passes through to the client as an
    unknown setting, and alone it would only show as ``kafka.group.id`` missing)."""
    try:
        return check(opts.get(name), name)
    except OptionError as exc:
        given = [k for k in opts if k.startswith("kafka.") and k != name]
        near = difflib.get_close_matches(name, given, n=1, cutoff=0.8)
        if not near:
            raise
        raise OptionError(name, exc.value, f"the options have {near[0]!r} = "
                          f"{shown(near[0], opts[near[0]])!r}: did you mean {name!r}? "
                          f"Otherwise {exc.fix}") from None


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
    opts, from_table = _lowered(options)
    client, journal_opts = _pass_through(options, opts, from_table)
    bootstrap = _required(opts, "kafka.bootstrap.servers", check_bootstrap)
    group = _required(opts, "kafka.group.id", check_group)
    check_client_config(ClientSettings(bootstrap, group, client))
    raw_topics = opts.get("subscribe")
    topics = check_topics("" if raw_topics is None else raw_topics, "subscribe")
    delivery, journal = _delivery_and_journal(opts, journal_opts)
    lock_fraction = _fraction(opts)
    share_client = check_client(opts.get("client", DEFAULT_CLIENT))
    # The native client refuses, by name, the kafka.* settings it would not honour.
    ConsumerRecipe(ClientSettings(bootstrap, group, client), share_client,
                   record_limit=share_client == "native").check()
    return SourceOptions(
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=topics,
        delivery=delivery,
        journal_location=journal,
        num_partitions=_int(opts, "numPartitions", None, minimum=1, maximum=10_000),
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger", None, minimum=1),
        starting_offsets=offset_reset(opts.get("startingoffsets"), "startingOffsets"),
        include_headers=_bool(opts, "includeHeaders", False),
        journal_fsync=_bool(opts, "journalFsync", True),
        journal_content=_journal_content(opts),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        journal_retry_timeout_ms=_journal_retry_timeout(opts, journal),
        journal_retention_ms=_int(opts, "journalRetentionMs", DEFAULT_JOURNAL_RETENTION_MS,
                                  minimum=0, maximum=7 * 24 * 3600 * 1000) or 0,
        poll_timeout_ms=_int(opts, "pollTimeoutMs", 2_000, minimum=10) or 2_000,
        join_timeout_ms=_int(opts, "joinTimeoutMs", 6_000, minimum=0) or 0,
        max_batch_duration_ms=_int(opts, "maxBatchDurationMs", None, minimum=100),
        consumer_idle_timeout_ms=_int(opts, "consumerIdleTimeoutMs", 10_000, minimum=0) or 0,
        lock_safety_fraction=lock_fraction,
        dedup_retention_ms=_int(opts, "dedupRetentionMs", 7 * 24 * 3600 * 1000,
                                minimum=0) or 0,
        broker_timeout_ms=_int(opts, "brokerTimeoutMs", 30_000, minimum=1_000) or 30_000,
        client_config=client,
        journal_options=journal_opts,
        fault_injection=opts.get(_TEST_OPTION),
        share_client=share_client,
    )
