"""What :func:`~pyspark_kafka_share.workers.start_workers` checks before any task starts:
the Spark session (classic or Connect) and its task slots, that ``fn`` pickles, that Spark's
Python can import the package, and the broker, topics, ACLs and group; then the group's
``share.auto.offset.reset``. A job's failure over Spark Connect is explained here too."""

from __future__ import annotations

import contextlib
import logging
import re
import types
import uuid
import warnings
from collections.abc import Callable
from typing import Any

from pyspark_kafka_share._kafka.dlq import check_one_dead_letter_topic
from pyspark_kafka_share._kafka.group import (
    RENEW_CONFIG,
    BrokerFacts,
    inspect_broker,
    set_group_configs,
)
from pyspark_kafka_share._spark import check_spark_python
from pyspark_kafka_share.errors import OptionError, SetupError, from_client_error
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.eos_access import check_exactly_once_access

__all__ = [
    "allow_renew",
    "check_callables",
    "check_environment",
    "check_function",
    "check_python",
    "check_session",
    "explained",
    "is_connect",
    "master",
]

_log = logging.getLogger(__name__)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session: PySpark's Connect class, or a session
    with no SparkContext on this side that can tag and interrupt its jobs."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return True
    try:
        spark.sparkContext  # noqa: B018 - Spark Connect raises here
    except Exception:  # noqa: BLE001
        return all(hasattr(spark, name) for name in ("addTag", "interruptTag", "range"))
    return False


def check_session(spark: Any) -> None:
    if is_connect(spark):
        return
    try:
        spark.sparkContext  # noqa: B018
    except Exception as exc:  # noqa: BLE001
        raise OptionError("spark", type(spark).__name__, "pass a SparkSession, classic or "
                          f"Spark Connect (SparkSession.builder.remote(...)) ({exc})") from None


def master(spark: Any) -> str:
    """The session's master URL (over Connect: the server's ``spark.master``; "" unknown)."""
    with contextlib.suppress(Exception):
        return str(spark.sparkContext.master)
    with contextlib.suppress(Exception):
        return str(spark.conf.get("spark.master", None) or "")
    return ""


def check_python(spark: Any) -> None:
    """The Python Spark starts for its workers can import the package: checked where those
    run on this machine. Over Spark Connect only when the Connect server runs in this process
    (``remote("local[...]")``); a remote server's Python is checked when the job starts
    (:func:`explained`)."""
    if not is_connect(spark):
        check_spark_python(spark)
        return
    from pyspark import SparkContext

    local = SparkContext._active_spark_context
    if local is not None and str(local.master) == master(spark):
        check_spark_python(types.SimpleNamespace(sparkContext=local))


def explained(exc: BaseException) -> BaseException:
    """A Connect job's error, as a :class:`SetupError` when the server's Python workers lack
    the package (the client cannot check a remote server's Python beforehand)."""
    text = str(exc)
    if "No module named 'pyspark_kafka_share'" in text or \
            "No module named \"pyspark_kafka_share\"" in text:
        error = SetupError(
            "the Spark Connect server's Python workers cannot import pyspark_kafka_share: "
            "install it on the server and its executors (pip install pyspark-kafka-share; "
            "docs/deployment.md)")
        error.__cause__ = exc
        return error
    return exc


def check_function(fn: object, retry_on: tuple[type[BaseException], ...]) -> None:
    """``fn`` and ``retry_on``: checked before anything is changed."""
    if not callable(fn):
        raise OptionError("fn", fn, "pass a function of one record (or one batch)")
    from pyspark import cloudpickle

    dumps: Callable[[object], bytes] = cloudpickle.dumps  # vendored, without annotations
    try:
        dumps((fn, retry_on))
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the same user error
        raise OptionError(
            "fn", fn, f"cannot be pickled to the executors ({type(exc).__name__}: {exc}); "
            "create clients such as model sessions or HTTP pools inside the function (e.g. "
            "cached in a module-level variable), not in the enclosing scope") from None


def check_callables(config: WorkerConfig) -> None:
    """The job's other functions (``recoverer``, the deserializers) travel to the executors
    too: each must pickle (a Schema Registry deserializer holding its client does not)."""
    from pyspark import cloudpickle

    dumps: Callable[[object], bytes] = cloudpickle.dumps  # vendored, without annotations
    for name in ("recoverer", "key_deserializer", "value_deserializer"):
        value = getattr(config, name)
        if value is None:
            continue
        try:
            dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the same user error
            hint = (" A Schema Registry deserializer holds a registry client, which cannot: "
                    "give SchemaRegistryDeserializer(kind, {'url': ...}) instead, built in "
                    "each worker" if name.endswith("deserializer") else "")
            raise OptionError(name, type(value).__name__, f"cannot be pickled to the "
                              f"executors ({type(exc).__name__}: {exc}).{hint}") from None


def check_environment(spark: Any, config: WorkerConfig) -> WorkerSpec:
    """Task slots, the broker, the topics and the group: checked before any task starts;
    then the group's ``share.auto.offset.reset`` is set from ``starting_offsets``."""
    slots = _task_slots(spark)
    if slots is not None and config.workers > slots:
        why = (f"Spark has {slots} task slots, and every worker is a task that runs until it "
               "stops: the extra workers would only start when others end")
        if master(spark).startswith("local"):
            raise OptionError("workers", config.workers, f"{why}. Lower workers, or give Spark "
                              f"more slots (master local[{config.workers}])")
        # On a cluster defaultParallelism may be stale (executors still registering).
        warnings.warn(f"workers={config.workers}: {why} (if defaultParallelism is current)",
                      stacklevel=4)
    facts = inspect_broker(config.client, config.topics, bootstrap_name="bootstrap_servers",
                           topics_name="topics")
    if config.max_attempts > facts.delivery_limit:
        raise OptionError(
            "max_attempts", config.max_attempts,
            f"the broker archives a record after {facts.delivery_limit} deliveries (group "
            f"config share.delivery.count.limit of {config.group!r}), so it would never reach "
            f"attempt {config.max_attempts}. Lower max_attempts or raise the group's limit")
    _check_out_topics(config)
    if config.exactly_once_outputs:  # every ACL it needs, used once
        check_exactly_once_access(config.client, config.producer_settings(),
                                  [t for t in (config.output_topic, config.dead_letter_topic)
                                   if t is not None])
    broker_dlq = check_one_dead_letter_topic(config.client, "dead_letter_topic",
                                             config.dead_letter_topic)
    if config.share_client == "native":  # first: a refusal leaves the group untouched
        allow_renew(config, facts)
    if config.starting_offsets is not None:
        set_group_configs(config.client, {"share.auto.offset.reset": config.starting_offsets},
                          option="starting_offsets")
    return WorkerSpec(config=config, lock_ms=facts.lock_ms, delivery_limit=facts.delivery_limit,
                      job_id=uuid.uuid4().hex[:12],
                      broker_dead_letter_topic=broker_dlq.topic if broker_dlq.active else None)


def allow_renew(config: WorkerConfig, facts: BrokerFacts) -> None:
    """The native client renews long work's locks (RENEW): a group of Kafka 4.3+ whose
    ``share.renew.acknowledge.enable`` is false (KIP-1240; default true) gets it set to true,
    or the start fails naming the setting and the grant it needs (ALTER_CONFIGS on the
    group). A 4.2 broker has no such config and honours RENEW."""
    if facts.renew_enabled is not False:
        return
    set_group_configs(config.client, {RENEW_CONFIG: "true"}, option="client")
    _log.warning("kafka-share workers: set %s=true on share group %r (it was false): "
                 "client='native' renews the locks of records its function is still working "
                 "on", RENEW_CONFIG, config.group)


def _task_slots(spark: Any) -> int | None:
    """Spark's task slots (``defaultParallelism / spark.task.cpus``). Over Spark Connect: of
    the server in this process (``remote("local[...]")``), else of a ``local[N]`` master only
    (a Connect client cannot read ``defaultParallelism``); None when not known."""
    from pyspark import SparkContext

    try:
        return _slots_of(spark.sparkContext)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: see below
        pass
    url = master(spark)
    local = SparkContext._active_spark_context
    if local is not None and str(local.master) == url:
        return _slots_of(local)
    match = re.fullmatch(r"local(?:\[\s*(\d+)\s*(?:,\s*\d+\s*)?\])?", url)
    if match is None:
        return None
    try:
        cpus = int(spark.conf.get("spark.task.cpus", None) or 1)
    except Exception:  # noqa: BLE001
        cpus = 1
    return int(match.group(1) or 1) // max(cpus, 1)


def _slots_of(sc: Any) -> int:
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    return int(sc.defaultParallelism) // max(cpus, 1)


def _check_out_topics(config: WorkerConfig) -> None:
    """The output and dead-letter topics exist, seen by a producer with the workers' settings
    (so security settings are checked too)."""
    wanted = {"output_topic": config.output_topic,
              "dead_letter_topic": config.dead_letter_topic}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    if not wanted:
        return
    from confluent_kafka import Producer

    try:
        md = Producer(config.producer_settings()).list_topics(timeout=config.broker_timeout_s)
    except Exception as exc:
        raise from_client_error(
            exc, f"a producer with the workers' settings cannot reach {config.bootstrap_servers}",
            "Check consumer_config/producer_config") from exc
    for name, t in wanted.items():
        if t not in md.topics or md.topics[t].error is not None:
            raise OptionError(name, t, f"topic does not exist on {config.bootstrap_servers}; "
                              "create it first")
