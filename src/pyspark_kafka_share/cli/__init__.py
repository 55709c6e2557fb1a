"""The ``kafka-share`` command line: its parser and :func:`main`.

The commands live by responsibility: :mod:`~pyspark_kafka_share.cli.groups` (share-group
administration), :mod:`~pyspark_kafka_share.cli.dlq` (the workers' dead letters sent back),
:mod:`~pyspark_kafka_share.cli.exporter` (Prometheus metrics of share
groups), :mod:`~pyspark_kafka_share.cli.broker` (a local broker for development);
:mod:`~pyspark_kafka_share.cli.codes` holds the exit codes and environment variables.
``python -m pyspark_kafka_share.cli`` runs :func:`main` too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pyspark_kafka_share import __version__
from pyspark_kafka_share.cli import broker, codes, dlq, exporter, groups
from pyspark_kafka_share.cli.codes import *  # noqa: F403  (re-exported: codes.__all__)
from pyspark_kafka_share.cli.codes import EXIT_ERROR, exit_code
from pyspark_kafka_share.errors import KafkaShareError, OptionError

__all__ = ["build_parser", "main"]
__all__ += codes.__all__  # the exit codes and environment variables, listed once in codes

DESCRIPTION = """\
kafka-share: watch and manage Kafka share groups (queues), send the queue workers' dead
letters back, serve their metrics to Prometheus, and run a local Kafka broker for
development. Each command has its own --help."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-share", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    broker.add_parsers(sub)
    groups.add_parser(sub)
    dlq.add_parser(sub)
    exporter.add_parser(sub)
    return parser


# Where the library's names for a value differ from the command line's flags.
_CLI_NAMES = {"topics": "--topic", "to": "--to", "bootstrap_servers": "--bootstrap-server",
              "timeout_s": "--timeout", "group": "group", "data_dir": "--data-dir",
              "key": "--set"}


def _cli_message(exc: KafkaShareError) -> str:
    """The error as the command line says it: options named by their flags."""
    if isinstance(exc, OptionError) and exc.option in _CLI_NAMES:
        return str(OptionError(_CLI_NAMES[exc.option], exc.value, exc.fix))
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kafka-share``; the exit code (``EXIT_*``; argparse exits with 2 on bad usage)."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except KafkaShareError as exc:
        print(f"kafka-share: error: {_cli_message(exc)}", file=sys.stderr)
        return exit_code(exc)
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader of stdout went away (``--json | head``): no traceback, exit code 1; stdout
    is pointed at /dev/null so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (captured): nothing left to flush
        pass
    return EXIT_ERROR
