"""``kafka-share exporter``: serve Prometheus metrics of share groups until stopped
(:mod:`pyspark_kafka_share.exporter`)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from pyspark_kafka_share.cli.codes import ENV_BOOTSTRAP_SERVERS, EXIT_ERROR, EXIT_OK, EXIT_USAGE
from pyspark_kafka_share.cli.groups import admin_from_args, connection_options
from pyspark_kafka_share.errors import OptionError, SetupError

__all__ = ["add_parser"]

DEFAULT_PORT = 9464
"""The exporter's default port (9464: the port OpenTelemetry's Prometheus exporter uses)."""

HELP = """\
Serve Prometheus metrics of share groups (GROUP... or every share group) until SIGTERM or
Ctrl-C: per partition lag, start offset and assigned members; per group state, members and
total lag; the end offsets of the group's dead-letter topic (the broker's dead-letter queue
on Kafka 4.4+, or --dead-letter-topic). A background loop collects every --interval seconds;
a scrape of /metrics answers at once with the last values, kafka_share_up (0 when the last
collection failed) and kafka_share_last_success_timestamp_seconds; /healthz answers 200 while
the collector runs. The URL is the first line on stdout. In-flight record counts are not in
Kafka's admin API and are not exported. Needs pip install 'pyspark-kafka-share[exporter]'."""

EPILOG = f"""\
exit codes:
  {EXIT_OK}  stopped by SIGTERM or SIGINT (Ctrl-C)
  {EXIT_ERROR}  the collector or the server stopped on an error, or prometheus_client is missing
  {EXIT_USAGE}  bad arguments (no broker given, an unreadable --command-config, a port in use)

example: kafka-share exporter orders-workers --bootstrap-server broker:9092 --port 9464"""


def _dead_letter_arg(text: str) -> tuple[str, str]:
    group, sep, topic = text.partition("=")
    if not sep or not group or not topic:
        raise argparse.ArgumentTypeError(f"{text!r}: give GROUP=TOPIC, e.g. "
                                         "orders-workers=orders.dlq")
    return group, topic


def _cmd_exporter(args: argparse.Namespace) -> int:
    if not args.bootstrap_server:
        raise OptionError("--bootstrap-server", None, "give the broker's HOST:PORT, or set "
                          f"the environment variable {ENV_BOOTSTRAP_SERVERS}")
    if args.all_groups == bool(args.group):
        raise OptionError("group", args.group or None,
                          "give the share groups to watch, or --all-groups, not both")
    try:
        from pyspark_kafka_share.exporter.collect import GroupReader
        from pyspark_kafka_share.exporter.serve import Exporter
    except ImportError as exc:
        raise SetupError(f"kafka-share exporter needs prometheus_client ({exc}): pip install "
                         "'pyspark-kafka-share[exporter]'") from None
    admin_from_args(args).close()  # an unreadable --command-config fails now, with exit 2
    reader = GroupReader(lambda: admin_from_args(args), None if args.all_groups else args.group,
                         dict(args.dead_letter_topic or ()))
    exporter = Exporter(reader, interval_s=args.interval)
    try:
        server = exporter.serve(args.address, args.port)
    except OSError as exc:
        raise OptionError("--port", args.port, f"cannot listen on {args.address}:{args.port} "
                          f"({exc.strerror or exc})") from None
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    exporter.start()
    host, port = server.server_address[:2]
    print(f"http://{host!s}:{port}/metrics", flush=True)
    print(f"kafka-share exporter: collecting from {args.bootstrap_server} every "
          f"{args.interval:g} s; /healthz for liveness; stop with Ctrl-C or SIGTERM",
          file=sys.stderr, flush=True)
    try:
        while not stop.wait(1.0):
            if not exporter.alive:
                return EXIT_ERROR
    finally:
        server.shutdown()
        exporter.stop(timeout_s=args.timeout)
        reader.close()
    return EXIT_OK


def add_parser(sub: Any) -> None:
    """The ``exporter`` command, on the top-level subparsers ``sub``."""
    cmd = sub.add_parser("exporter", parents=[connection_options()],
                         help="serve Prometheus metrics of share groups", description=HELP,
                         epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("group", nargs="*", help="the share groups to watch (or --all-groups)")
    cmd.add_argument("--all-groups", action="store_true",
                     help="every share group, as listed at each collection")
    cmd.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="PORT",
                     help=f"the port to serve on (default: {DEFAULT_PORT}; 0: a free one)")
    cmd.add_argument("--address", default="0.0.0.0", metavar="ADDRESS",
                     help="the address to serve on (default: 0.0.0.0, every interface)")
    cmd.add_argument("--interval", type=float, default=15.0, metavar="SECONDS",
                     help="collect every SECONDS (default: 15)")
    cmd.add_argument("--dead-letter-topic", action="append", type=_dead_letter_arg,
                     metavar="GROUP=TOPIC",
                     help="the dead-letter topic of a group's queue workers "
                          "(dead_letter_topic); repeatable. Without it, the broker's "
                          "dead-letter queue of the group (Kafka 4.4+) when it is on")
    cmd.set_defaults(func=_cmd_exporter)
