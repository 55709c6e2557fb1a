"""The ``kafka-share`` command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share import __version__
from pyspark_kafka_share.errors import KafkaShareError

if TYPE_CHECKING:
    from pyspark_kafka_share.admin import PartitionOffset, ShareGroupAdmin

__all__ = ["main"]


def _cmd_broker(args: argparse.Namespace) -> int:
    from pyspark_kafka_share.localkafka import ENV_BOOTSTRAP, LocalKafka, ensure_jars

    if not os.environ.get(ENV_BOOTSTRAP):
        ensure_jars(quiet=False)  # a first run downloads for a minute or two: show progress
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


# -- kafka-share groups ... ------------------------------------------------------------------


def _group_admin(args: argparse.Namespace) -> ShareGroupAdmin:
    from pyspark_kafka_share.admin import ShareGroupAdmin

    return ShareGroupAdmin(args.bootstrap_server, timeout_s=args.timeout)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _offset_rows(offsets: Sequence[PartitionOffset]) -> list[list[object]]:
    return [[o.topic, o.partition, o.start_offset, o.lag] for o in offsets]


def _offset_dicts(offsets: Sequence[PartitionOffset]) -> list[dict[str, Any]]:
    return [{"topic": o.topic, "partition": o.partition, "start_offset": o.start_offset,
             "lag": o.lag} for o in offsets]


def _reset_target(text: str) -> str | datetime:
    """``earliest``, ``latest`` or an ISO-8601 time (no zone = this machine's local time)."""
    if text in ("earliest", "latest"):
        return text
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give earliest, latest or an ISO-8601 time such as "
            "2025-01-31T12:00:00+00:00") from None
    return when if when.tzinfo is not None else when.astimezone()


def _cmd_groups_list(args: argparse.Namespace) -> int:
    with _group_admin(args) as admin:
        groups = admin.list_groups()
    if args.json:
        _print_json(groups)
    else:
        for group in groups:
            print(group)
    return 0


def _cmd_groups_describe(args: argparse.Namespace) -> int:
    with _group_admin(args) as admin:
        desc = admin.describe(args.group)
        offsets = admin.offsets(args.group)
    if args.json:
        _print_json({
            "group": desc.group, "state": desc.state,
            "members": [{"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                         "assignment": m.assignment} for m in desc.members],
            "offsets": _offset_dicts(offsets),
        })
        return 0
    print(f"GROUP {desc.group}  STATE {desc.state}  MEMBERS {len(desc.members)}")
    if desc.members:
        print()
        _print_table(["MEMBER-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"], [
            [m.member_id, m.client_id, m.host,
             ";".join(f"{t}:{','.join(map(str, ps))}" for t, ps in m.assignment.items())]
            for m in desc.members])
    if offsets:
        print()
        _print_table(["TOPIC", "PARTITION", "START-OFFSET", "LAG"], _offset_rows(offsets))
    return 0


def _cmd_groups_lag(args: argparse.Namespace) -> int:
    with _group_admin(args) as admin:
        offsets = admin.offsets(args.group)
        total = admin.total_lag(args.group, offsets)
    if args.json:
        _print_json({"group": args.group, "total_lag": total,
                     "partitions": _offset_dicts(offsets)})
        return 0
    _print_table(["TOPIC", "PARTITION", "START-OFFSET", "LAG"], _offset_rows(offsets))
    print(f"TOTAL-LAG {total}")
    return 0


def _cmd_groups_reset(args: argparse.Namespace) -> int:
    topics = args.topic or None
    with _group_admin(args) as admin:
        if args.dry_run:
            plan = admin.plan_reset(args.group, args.to, topics)
        else:
            plan = admin.reset(args.group, args.to, topics)
    rows = [[t, p, o] for t, parts in sorted(plan.items()) for p, o in sorted(parts.items())]
    target = args.to.isoformat() if isinstance(args.to, datetime) else args.to
    if args.json:
        _print_json({"group": args.group, "to": target, "dry_run": args.dry_run,
                     "offsets": [{"topic": t, "partition": p, "start_offset": o}
                                 for t, p, o in rows]})
        return 0
    _print_table(["TOPIC", "PARTITION", "NEW-START-OFFSET"], rows)
    if args.dry_run:
        print(f"# dry run: share group {args.group!r} was not changed")
    else:
        print(f"# share group {args.group!r} reset to {target}")
    return 0


def _cmd_groups_delete(args: argparse.Namespace) -> int:
    with _group_admin(args) as admin:
        if args.topic:
            admin.delete_offsets(args.group, args.topic)
        else:
            admin.delete_group(args.group)
    if args.json:
        _print_json({"group": args.group, "deleted": "offsets" if args.topic else "group",
                     "topics": args.topic or []})
    elif args.topic:
        print(f"deleted the offsets of share group {args.group!r} for {', '.join(args.topic)}")
    else:
        print(f"deleted share group {args.group!r}")
    return 0


def _add_groups_parser(sub: Any) -> None:
    from pyspark_kafka_share.localkafka import ENV_BOOTSTRAP

    common = argparse.ArgumentParser(add_help=False)
    default_bootstrap = os.environ.get(ENV_BOOTSTRAP)
    common.add_argument("--bootstrap-server", default=default_bootstrap,
                        required=default_bootstrap is None, metavar="HOST:PORT",
                        help=f"broker(s), plaintext only (default: ${ENV_BOOTSTRAP})")
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    common.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="bound on each broker operation (default: 30)")
    groups = sub.add_parser("groups", help="list, watch, reset and delete share groups")
    gsub = groups.add_subparsers(dest="groups_command", required=True)
    cmd = gsub.add_parser("list", parents=[common], help="list the share groups")
    cmd.set_defaults(func=_cmd_groups_list)
    cmd = gsub.add_parser("describe", parents=[common],
                          help="state, members, assignments, start offsets and lag of a group")
    cmd.add_argument("group")
    cmd.set_defaults(func=_cmd_groups_describe)
    cmd = gsub.add_parser("lag", parents=[common], help="per-partition and total lag of a group")
    cmd.add_argument("group")
    cmd.set_defaults(func=_cmd_groups_lag)
    cmd = gsub.add_parser("reset", parents=[common],
                          help="move a group's start offsets (the group must have no members)")
    cmd.add_argument("group")
    cmd.add_argument("--to", required=True, type=_reset_target, metavar="earliest|latest|TIME",
                     help="earliest, latest, or an ISO-8601 time (no zone: local time)")
    cmd.add_argument("--topic", action="append", metavar="TOPIC",
                     help="reset every partition of this topic (repeatable; default: every "
                          "partition the group has offsets for)")
    cmd.add_argument("--dry-run", action="store_true",
                     help="print the new start offsets without changing anything")
    cmd.set_defaults(func=_cmd_groups_reset)
    cmd = gsub.add_parser("delete", parents=[common],
                          help="delete a group, or only its offsets for some topics "
                               "(the group must have no members)")
    cmd.add_argument("group")
    cmd.add_argument("--topic", action="append", metavar="TOPIC",
                     help="delete only the group's offsets for this topic (repeatable)")
    cmd.set_defaults(func=_cmd_groups_delete)


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
    _add_groups_parser(sub)
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
