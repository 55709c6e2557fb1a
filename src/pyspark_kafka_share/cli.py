"""The ``kafka-share`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from pyspark_kafka_share import __version__
from pyspark_kafka_share.errors import KafkaShareError

__all__ = ["main"]


def _cmd_broker(args: argparse.Namespace) -> int:
    from pyspark_kafka_share.localkafka import LocalKafka

    kafka = LocalKafka(lock_duration_ms=args.lock_duration_ms)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with kafka:
        print(kafka.bootstrap_servers, flush=True)
        if kafka.log_path is not None:
            print(f"# broker log: {kafka.log_path}; Ctrl-C stops the broker", file=sys.stderr)
        stop.wait()
    return 0


def _cmd_fetch_jars(args: argparse.Namespace) -> int:
    from pyspark_kafka_share.localkafka import ensure_jars

    print(ensure_jars(quiet=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-share", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    broker = sub.add_parser("broker", help="run a local Kafka broker in the foreground")
    broker.add_argument("--lock-duration-ms", type=int, default=30_000,
                        help="broker default acquisition lock (share.record.lock.duration.ms)")
    broker.set_defaults(func=_cmd_broker)
    jars = sub.add_parser("fetch-jars", help="download the broker jars into the cache (once)")
    jars.set_defaults(func=_cmd_fetch_jars)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KafkaShareError as exc:
        print(f"kafka-share: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
