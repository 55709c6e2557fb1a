"""The queue workers' arguments: one typed :class:`WorkerConfig`, validated once.

:func:`run_workers` and :func:`start_workers` take these as keyword arguments (typed for IDEs
by :class:`WorkerOptions`); defaults and validation live here only. What needs Spark or the
broker (task slots, topics, the group's delivery limit) is checked by ``preflight.py`` before
any task starts. The executor side gets a :class:`WorkerSpec`: the config plus what the driver
learned from the broker.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypedDict

from pyspark_kafka_share._kafka.clientconf import shown
from pyspark_kafka_share._kafka.connection import ConnectionConfig, TokenProvider
from pyspark_kafka_share._kafka.consumers import CLIENTS, ConsumerRecipe, ShareClient
from pyspark_kafka_share._kafka.settings import (
    CLIENT_OPTIONS_REJECTED,
    DEFAULT_MAX_POLL_RECORDS,
    WORKER_NAMES,
    ClientSettings,
    check_bootstrap,
    check_client_config,
    check_group,
    check_topics,
    offset_reset,
)
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers.breaker import DEFAULT_THRESHOLD, DEFAULT_WINDOW, check_breaker
from pyspark_kafka_share.workers.control import Endpoint
from pyspark_kafka_share.workers.control_kafka import KafkaEndpoint
from pyspark_kafka_share.workers.decode import Deserializer, check_deserializer
from pyspark_kafka_share.workers.outcome import Recoverer
from pyspark_kafka_share.workers.retry import Backoff, check_backoff, check_rate_limit

__all__ = ["CLIENTS", "DEFAULT_CLIENT", "BatchFormat", "ShareClient", "WorkerConfig",
           "WorkerOptions", "WorkerSpec"]

BatchFormat = Literal["record", "arrow", "pandas"]
# CLIENTS, ShareClient: the share consumers a worker may use (the argument ``client``), the
# kernel's, which the source shares (``_kafka.consumers``).

DEFAULT_CLIENT: ShareClient = "librdkafka"
"""The workers' share consumer unless ``client`` says otherwise: confluent-kafka's. The source's
default became the native client (``source.options.DEFAULT_CLIENT``); issue 39, which made
that switch, is the source's and left the workers' default as it was."""

# Producer settings the workers fix, and why.
_PRODUCER_FIXED = {
    "acks": "is always 'all': a record is ACCEPTed only once its output is durable",
    "enable.idempotence": "is always on (no duplicates from producer retries)",
    "bootstrap.servers": "comes from bootstrap_servers",
    "transactional.id": "is set per worker slot with exactly_once_outputs=True",
    "transaction.timeout.ms": "is the lock budget with exactly_once_outputs=True",
}


class _Required(TypedDict):
    topics: str | Iterable[str]
    group: str
    bootstrap_servers: str


class WorkerOptions(_Required, total=False):
    """The keyword arguments of :func:`run_workers` / :func:`start_workers`; see
    :class:`WorkerConfig` for what each means and its default."""

    workers: int
    client: ShareClient
    batch_format: BatchFormat
    chunk_size: int
    concurrency: int
    output_topic: str | None
    dead_letter_topic: str | None
    max_attempts: int
    retry_on: tuple[type[BaseException], ...]
    time_budget_s: float | None
    idle_timeout_s: float | None
    max_records: int | None
    starting_offsets: str | None
    consumer_config: Mapping[str, str] | None
    connection: ConnectionConfig | None
    producer_config: Mapping[str, str] | None
    lock_safety_fraction: float
    progress_interval_s: float
    broker_timeout_s: float
    control_port: int
    control_topic: str | None
    exactly_once_outputs: bool
    transaction_interval_s: float
    on_progress: Callable[[Any], None] | bool | None
    circuit_breaker: float | None
    circuit_breaker_window: int
    retry_backoff: Backoff | None
    rate_limit: float | None
    recoverer: Recoverer | None
    key_deserializer: Deserializer | None
    value_deserializer: Deserializer | None


@dataclass(frozen=True)
class WorkerConfig:
    """Every setting of a worker job, validated (build it with :meth:`create`)."""

    topics: tuple[str, ...]
    group: str
    bootstrap_servers: str
    workers: int = 1
    """Spark tasks, each a long-lived share consumer (may exceed the topics' partitions)."""
    share_client: ShareClient = DEFAULT_CLIENT
    """The argument ``client``: the workers' share consumer, confluent-kafka's
    (``"librdkafka"``) or the package's own (``"native"``: strict ``record_limit`` polls of
    at most ``chunk_size`` records, RENEW for work longer than the lock;
    ``workers/consumer.py``)."""
    batch_format: BatchFormat = "record"
    chunk_size: int = 100
    """Records per call of a batch function, and per poll (``max.poll.records``; with
    ``concurrency`` above 1, see :attr:`poll_records`)."""
    concurrency: int = 1
    """Calls of the function in flight in one worker (issue 40, ``workers/inflight.py``): an
    ``async def`` function runs as tasks on one event loop, a plain one on this many threads;
    each record (``arrow``/``pandas``: each chunk) is settled as it completes and another
    starts in its place. 1: one call at a time, as before (an ``async def`` function too, on
    the event loop)."""
    output_topic: str | None = None
    dead_letter_topic: str | None = None
    max_attempts: int = 3
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    time_budget_s: float | None = None
    idle_timeout_s: float | None = None
    max_records: int | None = None
    starting_offsets: str | None = None
    """As ``share.auto.offset.reset`` (the user's ``earliest``/``latest``/duration)."""
    consumer_config: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    producer_config: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    lock_safety_fraction: float = 0.5
    progress_interval_s: float = 10.0
    broker_timeout_s: float = 30.0
    control_port: int = 0
    """The driver port workers report to: 0 picks a free one; else this port or one of the
    next ``spark.port.maxRetries`` (like ``spark.driver.port``), for firewalled clusters."""
    control_topic: str | None = None
    """The Kafka topic of the control channel (``workers/control_kafka.py``): always used over
    Spark Connect (default ``kafka-share-control.<group>``); setting it on a classic session
    uses it instead of the driver port."""
    exactly_once_outputs: bool = False
    """Outputs, dead letters and a marker of the chunks' origins in Kafka transactions; records
    a committed marker covers are acknowledged without running the function
    (``workers/exactly_once/``; consumers read with ``isolation.level=read_committed``)."""
    transaction_interval_s: float = 0.1
    """With ``exactly_once_outputs``: how long one transaction keeps taking the chunks of a
    poll before it is committed (as Kafka Streams' ``commit.interval.ms``); 0: one transaction
    per chunk. Longer: fewer transactions (throughput), later visible outputs (latency). A
    transaction never spans two polls and is committed before the poll's lock deadline."""
    # -- issue 35: the circuit breaker (workers/breaker.py) --
    circuit_breaker: float | None = DEFAULT_THRESHOLD
    """Stop the job when more than this share of the last ``circuit_breaker_window`` records were
    rejected/dead-lettered or failed with the same exception type; None: never."""
    circuit_breaker_window: int = DEFAULT_WINDOW
    # -- end issue 35 --
    # -- issue 40: retries that wait, a rate limit, a recoverer, decoding (retry.py, decode.py)
    retry_backoff: Backoff | None = None
    """Wait before calling the function again on a record that asked for a retry, in the
    worker while the record's lock allows, then RELEASE; None: RELEASE at once."""
    rate_limit: float | None = None
    """Records per second for the whole job (each worker: ``rate_limit / workers``)."""
    recoverer: Recoverer | None = field(default=None, compare=False)
    """``(exception, record) -> Outcome | Result``: what the function's exceptions mean;
    None: ``retry_on``'s rule."""
    key_deserializer: Deserializer | None = field(default=None, compare=False)
    value_deserializer: Deserializer | None = field(default=None, compare=False)
    """Decode the record's key / value for the function (``Record.decoded_key`` /
    ``decoded_value``); a record that fails to decode is poison."""
    # -- end issue 40 --
    token_provider: TokenProvider | None = field(default=None, repr=False, compare=False)
    """``consumer_config['oauth_cb']``: the OAUTHBEARER token callback, kept as it is."""
    _fault_injection: str | None = field(default=None, repr=False)
    """Test only: failure points (``_kafka/faults.py``; ``seq`` = the transaction number)."""

    @classmethod
    def create(cls, **options: Any) -> WorkerConfig:
        """Validate the keyword arguments of :func:`run_workers` into a config."""
        connection = options.pop("connection", None)  # its settings join consumer_config's
        if "client" in options:  # the field's name: ``client`` is the ClientSettings
            options["share_client"] = options.pop("client")
        # token_provider: consumer_config's; share_client: the argument client's
        names = {f.name for f in fields(cls)} - {"token_provider"}
        for key, value in options.items():
            if key not in names:
                close = difflib.get_close_matches(
                    key, sorted({"client", *(n for n in names if not n.startswith("_")
                                             and n != "share_client")}), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                # Only a plain string is shown (never a secret-like one): a misspelled
                # consumer_config or producer_config may hold passwords.
                safe = shown(key, value) if isinstance(value, str) else "<not shown>"
                raise OptionError(key, safe, f"unknown argument; {hint}see run_workers")
        consumer = _with_connection(connection, dict(options.get("consumer_config") or {}))
        token_provider = consumer.pop("oauth_cb", None)  # a callable: kept, not stringified
        topics = options.get("topics")
        listed = topics if topics is None or isinstance(topics, str) else ",".join(topics)
        values = {**options,
                  "topics": check_topics(listed, "topics"),
                  "group": check_group(options.get("group"), "group"),
                  "bootstrap_servers": check_bootstrap(options.get("bootstrap_servers"),
                                                       "bootstrap_servers"),
                  "starting_offsets": offset_reset(options.get("starting_offsets"),
                                                   "starting_offsets"),
                  "consumer_config": _settings(consumer),
                  "token_provider": token_provider,
                  "producer_config": _settings(options.get("producer_config"))}
        config = cls(**values)
        config._check()
        return config

    def _check(self) -> None:
        _whole(self.workers, "workers")
        _whole(self.chunk_size, "chunk_size")
        self._check_concurrency()
        _whole(self.max_attempts, "max_attempts")
        if self.share_client not in CLIENTS:
            raise OptionError("client", self.share_client,
                              "use 'librdkafka' (confluent-kafka's share consumer, the "
                              "default) or 'native' (the package's own: RENEW for long work)")
        if self.batch_format not in ("record", "arrow", "pandas"):
            raise OptionError("batch_format", self.batch_format,
                              "use 'record', 'arrow' or 'pandas'")
        for name in ("time_budget_s", "idle_timeout_s", "max_records"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise OptionError(name, value, "must be > 0, or None for no limit")
        for name in ("progress_interval_s", "broker_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise OptionError(name, value, "must be a number of seconds > 0")
        if not isinstance(self.control_port, int) or isinstance(self.control_port, bool) or \
                not (self.control_port == 0 or 1024 <= self.control_port <= 65535):
            raise OptionError("control_port", self.control_port,
                              "use 0 (a free port) or a port from 1024 to 65535")
        if not isinstance(self.exactly_once_outputs, bool):
            raise OptionError("exactly_once_outputs", self.exactly_once_outputs,
                              "use True or False")
        interval = self.transaction_interval_s
        if not isinstance(interval, int | float) or isinstance(interval, bool) or \
                not 0 <= interval <= _MAX_TRANSACTION_INTERVAL_S:
            raise OptionError("transaction_interval_s", interval,
                              f"must be a number of seconds from 0 (one transaction per chunk) "
                              f"to {_MAX_TRANSACTION_INTERVAL_S:g}, e.g. 0.1 (the default); "
                              "the poll's lock deadline ends a transaction sooner anyway")
        if not 0.1 <= self.lock_safety_fraction <= 0.9:
            raise OptionError("lock_safety_fraction", self.lock_safety_fraction,
                              "must be between 0.1 and 0.9")
        retry_on = self.retry_on
        if not (isinstance(retry_on, tuple) and all(
                isinstance(t, type) and issubclass(t, Exception) for t in retry_on)):
            raise OptionError("retry_on", retry_on, "must be a tuple of Exception subclasses, "
                              "e.g. (TimeoutError,), or () to treat every exception as poison")
        check_breaker(self.circuit_breaker, self.circuit_breaker_window)  # issue 35
        self._check_issue_40()
        self._check_topics()
        self._check_client_settings()

    def _check_concurrency(self) -> None:
        """At most a poll's worth: the slots are refilled from the current poll, which holds
        at most ``DEFAULT_MAX_POLL_RECORDS`` records."""
        _whole(self.concurrency, "concurrency")
        if self.batch_format == "record" and self.concurrency > DEFAULT_MAX_POLL_RECORDS:
            raise OptionError("concurrency", self.concurrency,
                              f"a poll holds at most {DEFAULT_MAX_POLL_RECORDS} records, the "
                              "most that can be in flight; lower concurrency (or run more "
                              "workers)")
        if self.batch_format != "record" and \
                self.concurrency * self.chunk_size > DEFAULT_MAX_POLL_RECORDS:
            raise OptionError(
                "concurrency", self.concurrency,
                f"with batch_format={self.batch_format!r} it counts chunks of chunk_size "
                f"({self.chunk_size}) records, and {self.concurrency} chunks do not fit in one "
                f"poll (at most {DEFAULT_MAX_POLL_RECORDS} records): lower concurrency or "
                "chunk_size so that concurrency * chunk_size <= "
                f"{DEFAULT_MAX_POLL_RECORDS}, or use batch_format='record' for many calls of "
                "a record each")

    @property
    def poll_records(self) -> int:
        """The worker's ``max.poll.records``: ``chunk_size``; with ``concurrency`` above 1 at
        least 4 units per slot (records, or chunks for a batch function), so that the slots
        are refilled from the current poll, at most ``DEFAULT_MAX_POLL_RECORDS``."""
        if self.concurrency == 1:
            return self.chunk_size
        unit = 1 if self.batch_format == "record" else self.chunk_size
        return min(DEFAULT_MAX_POLL_RECORDS, max(self.chunk_size, 4 * self.concurrency * unit))

    def _check_issue_40(self) -> None:
        check_backoff(self.retry_backoff)
        check_rate_limit(self.rate_limit)
        if self.recoverer is not None and not callable(self.recoverer):
            raise OptionError("recoverer", type(self.recoverer).__name__,
                              "give a function (exception, record) -> Outcome or Result")
        if self.recoverer is not None and self.retry_on != (Exception,):
            raise OptionError("retry_on", self.retry_on, "the recoverer decides which "
                              "exceptions are retried: give recoverer or retry_on, not both")
        check_deserializer("key_deserializer", self.key_deserializer, self.batch_format)
        check_deserializer("value_deserializer", self.value_deserializer, self.batch_format)

    def _check_topics(self) -> None:
        if self.control_topic is not None and \
                check_topics(self.control_topic, "control_topic") != (self.control_topic,):
            raise OptionError("control_topic", self.control_topic, "must be one topic name")
        for name in ("output_topic", "dead_letter_topic", "control_topic"):
            topic = getattr(self, name)
            if topic is not None and topic in self.topics:
                raise OptionError(name, topic, "must differ from the input topics (the "
                                  "workers would feed themselves)")

    def _check_client_settings(self) -> None:
        for key, value in self.producer_config:
            if key.lower() in _PRODUCER_FIXED:
                raise OptionError(f"producer_config[{key!r}]", value,
                                  _PRODUCER_FIXED[key.lower()])
        for key, value in self.consumer_config:
            if key.lower() in CLIENT_OPTIONS_REJECTED or key.lower() == "max.poll.records":
                raise OptionError(f"consumer_config[{key!r}]", value,
                                  "is set by run_workers (use chunk_size for max.poll.records, "
                                  "group/bootstrap_servers/topics for the rest); remove it")
        # librdkafka judges the rest now (typos, values), before any task starts.
        producing = self.producer_config or self.output_topic or self.dead_letter_topic or \
            self.exactly_once_outputs
        check_client_config(self.client, dict(self.producer_config) if producing else None)
        if self.share_client == "native":  # refuses by name what it would not honour
            ConsumerRecipe(self.client, "native", "pyspark-kafka-share-check", self.chunk_size,
                           record_limit=True).check()

    @property
    def client(self) -> ClientSettings:
        """How the workers' clients reach the cluster (``consumer_config`` carries security
        settings to the producer too)."""
        return ClientSettings(self.bootstrap_servers, self.group, self.consumer_config,
                              self.broker_timeout_s, WORKER_NAMES, self.token_provider)

    def producer_settings(self) -> dict[str, Any]:
        """The output / dead-letter producer's configuration."""
        return self.client.producer(dict(self.producer_config))


# Above the default lock budget (15 s); a longer interval is almost surely a unit mistake.
_MAX_TRANSACTION_INTERVAL_S = 60.0


def _whole(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OptionError(name, value, "must be a whole number >= 1")


def _with_connection(connection: object, consumer: dict[str, Any]) -> dict[str, Any]:
    """``consumer_config`` with the librdkafka settings of ``connection`` (the consumer's
    security settings reach the producers too); a setting given both ways is an error."""
    if connection is None:
        return consumer
    if not isinstance(connection, ConnectionConfig):
        raise OptionError("connection", type(connection).__name__,
                          "give a ConnectionConfig (or librdkafka's security settings in "
                          "consumer_config)")
    settings = connection.client_settings()
    both = sorted(k for k in settings if k in consumer)
    if both:
        raise OptionError("connection", connection,
                          f"consumer_config sets {', '.join(both)} too: give the connection "
                          "settings once, in connection or in consumer_config")
    return {**consumer, **settings}


def _settings(raw: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in (raw or {}).items()))


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker task needs, pickled from the driver: the config and the broker's facts."""

    config: WorkerConfig
    lock_ms: int
    delivery_limit: int
    job_id: str = ""
    control: Endpoint | KafkaEndpoint | None = None  # the driver's control channel
    report_interval_s: float = 1.0
    broker_dead_letter_topic: str | None = None  # the broker dead-letters REJECTs (KIP-1191)

    @property
    def attempts_allowed(self) -> int:
        """Deliveries a record gets: the broker archives it after ``delivery_limit``."""
        return min(self.config.max_attempts, self.delivery_limit)
