"""``kafka-share broker`` and ``kafka-share fetch-jars``: a local Kafka broker for
development (the harness's :class:`~pyspark_kafka_share.harness.LocalKafka`), its topics and
its client settings files."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share.cli.codes import EXIT_OK
from pyspark_kafka_share.errors import OptionError

if TYPE_CHECKING:
    from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster

__all__ = ["add_parsers"]


def _cmd_broker(args: argparse.Namespace) -> int:
    from pyspark_kafka_share.harness import ENV_BOOTSTRAP, ensure_jars

    if not os.environ.get(ENV_BOOTSTRAP) or args.brokers > 1:
        ensure_jars(quiet=False)  # a first run downloads for a minute or two: show progress
    kafka = _broker_or_cluster(args)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with kafka:
        kept = {name: len(t.partitions)
                for name, t in kafka.admin().list_topics(timeout=30).topics.items()} \
            if args.data_dir is not None else {}
        for name, partitions in _new_topics(args.topic):
            if name in kept:
                _check_kept_topic(name, partitions, kept[name])
                print(f"# topic {name}: {partitions} partition(s), kept in the data dir",
                      file=sys.stderr)
                continue
            kafka.create_topic(name, partitions)
            print(f"# topic {name}: {partitions} partition(s)", file=sys.stderr)
        print(kafka.client_config()["bootstrap.servers"], flush=True)
        if args.security != "plaintext":
            _print_client_files(kafka)
        if args.data_dir is not None:
            print(f"# data: {args.data_dir} (kept when the broker stops)", file=sys.stderr)
        for where in _logs(kafka):
            print(f"# {where}", file=sys.stderr)
        stop.wait()
    return EXIT_OK


def _broker_or_cluster(args: argparse.Namespace) -> LocalKafka | LocalKafkaCluster:
    """``broker``'s LocalKafka, or with ``--brokers N`` (N > 1) a LocalKafkaCluster."""
    from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster

    if args.brokers < 1:
        raise OptionError("--brokers", args.brokers, "give 1 or more")
    if args.brokers == 1:
        return LocalKafka(lock_duration_ms=args.lock_duration_ms, security=args.security,
                          port=args.port, data_dir=args.data_dir)
    for flag, value in (("--port", args.port), ("--data-dir", args.data_dir)):
        if value is not None:
            raise OptionError(flag, value, f"a cluster (--brokers {args.brokers}) picks a free "
                              "port per node and keeps no data: leave it out, or run one broker")
    return LocalKafkaCluster(brokers=args.brokers, lock_duration_ms=args.lock_duration_ms,
                             security=args.security,
                             min_insync_replicas=min(2, args.brokers))


def _logs(kafka: LocalKafka | LocalKafkaCluster) -> list[str]:
    """Where the broker's log (a cluster: each node's) is, and how to stop."""
    from pyspark_kafka_share.harness import LocalKafka

    if isinstance(kafka, LocalKafka):
        return [] if kafka.log_path is None else \
            [f"broker log: {kafka.log_path}; Ctrl-C stops the broker"]
    return [*(f"node {i} log: {path}" for i, path in kafka.log_paths().items()),
            f"{kafka.brokers} nodes (ids {kafka.node_ids}), replication factor "
            f"{kafka.brokers}, min.insync.replicas {kafka.min_insync_replicas}; "
            "Ctrl-C stops the cluster"]


def _check_kept_topic(name: str, partitions: int, kept: int) -> None:
    """``broker --topic name:partitions`` where ``--data-dir`` already holds ``name``."""
    if kept != partitions:
        raise OptionError("--topic", f"{name}:{partitions}",
                          f"topic {name!r} is in the data dir already, with {kept} "
                          f"partition(s): give {name}:{kept}, or another name")


def _print_client_files(kafka: LocalKafka | LocalKafkaCluster) -> None:
    """Where a secured local broker's client settings are: a properties file for
    ``--command-config`` and the same as librdkafka keys (for the source and the workers)."""
    path = kafka.command_config_file()
    settings = {k: v for k, v in kafka.client_config().items() if k != "bootstrap.servers"}
    rd = path.with_suffix(".librdkafka.json")
    rd.write_text(json.dumps(settings, indent=2) + "\n")
    rd.chmod(0o600)
    print(f"# {kafka.security} listener, as the super user 'admin' (a secret: both files are "
          f"readable by you only)\n# kafka-share groups ... --command-config {path}\n"
          f"# librdkafka settings (kafka.* source options, consumer_config): {rd}",
          file=sys.stderr)


def _new_topic_arg(text: str) -> tuple[str, int]:
    """``NAME`` (one partition) or ``NAME:PARTITIONS``, for ``broker --topic``."""
    name, sep, count = text.rpartition(":")
    if not sep:
        name, count = text, "1"
    if not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME or NAME:PARTITIONS with a partition count of 1 or more, "
            "e.g. orders:3")
    return name, int(count)


def _new_topics(given: Sequence[tuple[str, int]] | None) -> list[tuple[str, int]]:
    """Repeated ``broker --topic`` values; a name given twice must agree on its count."""
    out: dict[str, int] = {}
    for name, partitions in given or ():
        if out.setdefault(name, partitions) != partitions:
            raise OptionError("--topic", f"{name}:{partitions}",
                              f"topic {name!r} is given twice, with {out[name]} and "
                              f"{partitions} partitions: give it once")
    return list(out.items())


def _cmd_fetch_jars(args: argparse.Namespace) -> int:
    from pyspark_kafka_share.harness import ensure_jars

    print(ensure_jars(quiet=False))
    return EXIT_OK


BROKER_HELP = """\
Run a local Kafka broker (one JVM, share groups enabled) in the foreground until Ctrl-C.
It prints its address (HOST:PORT) as the first line on stdout: pass it as --bootstrap-server
or as the source's kafka.bootstrap.servers. It keeps its data in a temporary directory,
deleted when it stops, or with --data-dir in a directory that stays: started again on it, the
broker has the same topics, records and share groups. The broker's log path is printed on
stderr. Java 17+ is needed; the first run downloads the Kafka jars (see fetch-jars). With
--brokers 3 it runs a three-node cluster (about 1 GB of memory per node) instead."""


def _add_broker_parser(sub: Any) -> None:
    broker = sub.add_parser("broker", help="run a local Kafka broker and print its address",
                            description=BROKER_HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="example: kafka-share broker --topic orders:3 --port 9092")
    broker.add_argument("--topic", action="append", type=_new_topic_arg,
                        metavar="NAME[:PARTITIONS]",
                        help="create this topic once the broker is up, with PARTITIONS "
                             "partitions (default 1); repeatable")
    broker.add_argument("--brokers", type=int, default=1, metavar="N",
                        help="run N brokers (a KRaft cluster of combined controller+broker "
                             "nodes; replication factor N, min.insync.replicas 2) to try "
                             "failover; prints every node's address (default: 1)")
    broker.add_argument("--port", type=int, default=None, metavar="PORT",
                        help="the port to listen on, on 127.0.0.1 (default: a free port)")
    broker.add_argument("--data-dir", default=None, metavar="DIR",
                        help="keep the broker's data (and its log) in DIR, which stays when the "
                             "broker stops; start again with the same DIR to have it back. DIR "
                             "must be new, empty or an earlier broker's (default: a temporary "
                             "directory, deleted on exit; plaintext listener only)")
    broker.add_argument("--lock-duration-ms", type=int, default=30_000, metavar="MS",
                        help="how long a share consumer holds a record before the broker "
                             "hands it out again (share.record.lock.duration.ms; "
                             "default: 30000)")
    broker.add_argument("--security", default="plaintext",
                        choices=("plaintext", "sasl_ssl", "ssl", "sasl_plaintext"),
                        help="the client listener: TLS and SASL (SCRAM, PLAIN) with ACLs, "
                        "mutual TLS, or SASL without TLS; writes a client properties file "
                        "and says where (needs pip install 'pyspark-kafka-share[local]')")
    broker.set_defaults(func=_cmd_broker)



def add_parsers(sub: Any) -> None:
    """The ``broker`` and ``fetch-jars`` commands, on the top-level subparsers ``sub``."""
    _add_broker_parser(sub)
    jars = sub.add_parser("fetch-jars", help="download the broker's jars into the cache (once)",
                          description="Download the Kafka broker's jars into the cache, so "
                          "that the first `kafka-share broker` starts at once.")
    jars.set_defaults(func=_cmd_fetch_jars)
