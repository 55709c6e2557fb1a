"""``kafka-share dlq replay``: the queue workers' dead letters sent back to their origin topics
(the redrive, :mod:`pyspark_kafka_share._kafka.redrive`), filtered by error and time, planned
(``--dry-run``) or done (``--execute``)."""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from typing import Any

from pyspark_kafka_share._kafka import redrive
from pyspark_kafka_share.cli.codes import EXIT_CODES_HELP, EXIT_OK
from pyspark_kafka_share.cli.groups import (
    NeedsBroker,
    add_execute_or_dry_run,
    admin_from_args,
    common_options,
    not_executed,
    time_arg,
)
from pyspark_kafka_share.errors import OptionError

__all__ = ["add_parser"]


def _moment(text: str) -> int:
    """An ISO-8601 time (no zone: this machine's local time) in epoch milliseconds."""
    when = time_arg(text)
    if not isinstance(when, datetime):
        raise argparse.ArgumentTypeError(f"{text!r}: give an ISO-8601 time such as "
                                         "2025-01-31T12:00:00+00:00")
    return int(when.timestamp() * 1000)


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {exc}") \
            from None


def _offsets(text: str) -> dict[int, int]:
    """``P:OFFSET[,P:OFFSET...]``, as a replay prints them for the next run."""
    try:
        pairs = [part.split(":") for part in text.split(",")]
        out = {int(p): int(o) for p, o in pairs}
    except ValueError:
        out = {-1: -1}
    if any(p < 0 or o < 0 for p, o in out.items()):
        raise argparse.ArgumentTypeError(f"{text!r}: give PARTITION:OFFSET pairs separated by "
                                         "commas, e.g. 0:120,1:98")
    return out


def _cmd_replay(args: argparse.Namespace) -> int:
    _check_window(args.since, args.until)
    filt = redrive.ReplayFilter(args.error, args.since, args.until, args.origin)
    with admin_from_args(args) as admin:
        ends = admin.end_offsets([args.topic])[args.topic]
        plan = redrive.read_dead_letters(admin.settings, args.topic, ends, filt,
                                         args.from_offsets)
        sent = redrive.send(admin.settings, plan) if args.execute else 0
    nexts = ",".join(f"{p}:{o}" for p, o in sorted(plan.next_offsets.items()))
    if args.json:
        _print_json(args, plan, sent, nexts)
    else:
        _print_plan(args, plan, sent, nexts)
    not_executed(args, f"send the {len(plan.selected)} dead letter(s) back")
    return EXIT_OK


def _print_json(args: argparse.Namespace, plan: redrive.ReplayPlan, sent: int,
                nexts: str) -> None:
    import json

    out: dict[str, Any] = {
        "topic": plan.topic, "read": plan.read, "foreign": plan.foreign,
        "selected": len(plan.selected), "sent": sent, "executed": args.execute,
        "counts": [{"origin": o, "error_type": e, "count": n} for o, e, n in plan.counts()],
        "next_offsets": nexts}
    print(json.dumps(out, indent=2, sort_keys=True))


def _print_plan(args: argparse.Namespace, plan: redrive.ReplayPlan, sent: int,
                nexts: str) -> None:
    rows = [("ORIGIN-TOPIC", "ERROR-TYPE", "DEAD-LETTERS"),
            *((o, e, str(n)) for o, e, n in plan.counts())]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for d in plan.selected[:args.show]:
        print(f"  {plan.topic}/{d.partition}/{d.offset} -> {d.origin_topic}: {d.error[:160]}")
    skipped = plan.read - len(plan.selected) - plan.foreign
    print(f"# read {plan.read} record(s) of {plan.topic!r}: {len(plan.selected)} selected, "
          f"{skipped} filtered out, {plan.foreign} without the origin headers (left alone)")
    if args.execute:
        print(f"# sent {sent} dead letter(s) back to their origin topics")
    else:
        print(f"# plan only: nothing was sent; --execute sends the {len(plan.selected)}")
    print(f"# a replay is not remembered: to go on after these next time, add "
          f"--from-offsets {nexts}" if nexts else "# the topic has no partitions")


def add_parser(sub: Any) -> None:
    """The ``dlq`` command and its ``replay`` subcommand, on the top-level subparsers."""
    dlq = sub.add_parser("dlq", help="send the queue workers' dead letters back (redrive)",
                         description="The queue workers' dead-letter topics.",
                         epilog=EXIT_CODES_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, parser_class=NeedsBroker)
    text = ("send the dead letters of a workers' dead_letter_topic back to the topics they "
            "came from (their kafka-share.origin.topic header), selected by error and time; "
            "the key, value and the record's own headers as they were, plus "
            f"{redrive.REPLAYED_FROM}. A replay is not remembered: run twice, it sends twice "
            "(--from-offsets goes on from where the last one ended)")
    cmd = dsub.add_parser("replay", parents=[common_options()], help=text, description=text,
                          epilog=EXIT_CODES_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.set_defaults(func=_cmd_replay)
    cmd.add_argument("topic", help="the dead-letter topic")
    cmd.add_argument("--error", type=_regex, metavar="REGEX",
                     help="only dead letters whose error text or type this matches (searched)")
    cmd.add_argument("--since", type=_moment, metavar="TIME",
                     help="only dead letters written at or after this ISO-8601 time")
    cmd.add_argument("--until", type=_moment, metavar="TIME",
                     help="only dead letters written before this ISO-8601 time")
    cmd.add_argument("--origin", metavar="TOPIC", help="only dead letters from this topic")
    cmd.add_argument("--from-offsets", type=_offsets, metavar="P:OFFSET[,P:OFFSET...]",
                     help="start each listed partition there (default: every partition from "
                          "its start), as the last replay printed")
    cmd.add_argument("--show", type=int, default=10, metavar="N",
                     help="list the first N selected dead letters with their errors "
                          "(default: 10)")
    add_execute_or_dry_run(cmd, "send them")


def _check_window(since: int | None, until: int | None) -> None:
    """``--since`` must come before ``--until``."""
    if since is not None and until is not None and since >= until:
        raise OptionError("--until", until, "must be after --since")
