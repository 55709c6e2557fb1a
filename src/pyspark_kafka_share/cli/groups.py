"""``kafka-share groups ...``: list, describe, lag, reset, delete, the configs and the
broker's dead-letter queue of share groups, each a command on
:class:`~pyspark_kafka_share.admin.ShareGroupAdmin`, and their parser (options, the broker's
address from the environment)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share.cli.codes import (
    ENV_BOOTSTRAP_FALLBACK,
    ENV_BOOTSTRAP_SERVERS,
    EXIT_CODES_HELP,
    EXIT_GROUP_NOT_FOUND,
    EXIT_LAG_UNKNOWN,
    EXIT_OK,
    EXIT_USAGE,
)
from pyspark_kafka_share.errors import (
    GroupNotFoundError,
    KafkaApiError,
    LagUnavailableError,
    NotAShareGroupError,
    OptionError,
)

if TYPE_CHECKING:
    from pyspark_kafka_share.admin import GroupDescription, PartitionOffset, ShareGroupAdmin

__all__ = ["NeedsBroker", "add_execute_or_dry_run", "add_parser", "admin_from_args",
           "common_options", "connection_options", "default_bootstrap", "not_executed",
           "time_arg"]


def _group_admin(args: argparse.Namespace) -> ShareGroupAdmin:
    from pyspark_kafka_share._kafka.connection_parse import JAVA_PROPERTY_OF
    from pyspark_kafka_share._kafka.settings import OptionNames
    from pyspark_kafka_share.admin import ShareGroupAdmin

    flags = OptionNames("{}", "{}", "--bootstrap-server", "group", "--topic", "--command-config")
    if args.command_config:  # errors name the Java properties the user wrote, in that file
        where = f" (in {args.command_config})".replace("{", "{{").replace("}", "}}")
        flags = OptionNames("{}" + where, "{}" + where, flags.bootstrap, flags.group,
                            flags.topics, flags.settings, tuple(JAVA_PROPERTY_OF.items()))

    class CliAdmin(ShareGroupAdmin):
        """The admin, its errors naming the command line's flags (and with --command-config
        the file's Java properties, not the librdkafka keys they became)."""

        option_names = flags

    if args.command_config:
        return CliAdmin.from_properties_file(args.bootstrap_server, args.command_config,
                                             timeout_s=args.timeout)
    return CliAdmin(args.bootstrap_server, timeout_s=args.timeout)


def admin_from_args(args: argparse.Namespace) -> ShareGroupAdmin:
    """The admin of ``--bootstrap-server``, ``--command-config`` and ``--timeout``, its errors
    naming those flags (the ``groups`` commands' and the exporter's)."""
    return _group_admin(args)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _note(text: str) -> None:
    print(f"kafka-share: note: {text}", file=sys.stderr)


def _offset_rows(offsets: Sequence[PartitionOffset]) -> list[list[object]]:
    return [[o.topic, o.partition, o.start_offset, o.lag] for o in offsets]


def _offset_dicts(offsets: Sequence[PartitionOffset]) -> list[dict[str, Any]]:
    return [{"topic": o.topic, "partition": o.partition, "start_offset": o.start_offset,
             "lag": o.lag} for o in offsets]


def time_arg(text: str) -> str | datetime:
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


def _topic_arg(text: str) -> tuple[str, tuple[int, ...] | None]:
    """``TOPIC`` (every partition) or ``TOPIC:P[,P...]``, as Kafka's tools take it."""
    topic, sep, parts = text.rpartition(":")
    if not sep:
        topic, parts = text, ""
    try:
        partitions = tuple(int(p) for p in parts.split(",")) if sep else None
    except ValueError:
        partitions = ()
    if not topic or partitions == () or any(p < 0 for p in partitions or ()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give TOPIC (every partition) or TOPIC:PARTITIONS with partition "
            "numbers separated by commas, e.g. orders or orders:0,1")
    return topic, partitions


def _topic_selection(
    given: Sequence[tuple[str, tuple[int, ...] | None]] | None,
) -> dict[str, list[int] | None] | None:
    """Repeated ``--topic`` values merged: ``{topic: partitions, or None for all}``."""
    if not given:
        return None
    out: dict[str, list[int] | None] = {}
    for topic, partitions in given:
        if partitions is None or (topic in out and out[topic] is None):
            out[topic] = None
        else:
            out[topic] = sorted({*(out.get(topic) or ()), *partitions})
    return out


def _selection_text(topics: dict[str, list[int] | None]) -> str:
    return ", ".join(t if ps is None else f"{t}:{','.join(map(str, ps))}"
                     for t, ps in topics.items())


def _group_names(args: argparse.Namespace, admin: ShareGroupAdmin) -> list[str]:
    """The group argument, or every share group with ``--all-groups`` (exactly one given)."""
    if args.all_groups and args.group:
        raise OptionError("--all-groups", True, f"give either a group ({args.group!r}) or "
                          "--all-groups, not both")
    if not args.all_groups and not args.group:
        raise OptionError("group", None, "give a share group's name, or --all-groups for "
                          "every share group")
    return admin.list_groups() if args.all_groups else [args.group]


# -- describe ----------------------------------------------------------------------------------


def _describe_json(desc: GroupDescription, offsets: Sequence[PartitionOffset]) -> dict[str, Any]:
    return {
        "group": desc.group, "state": desc.state,
        "members": [{"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                     "assignment": m.assignment} for m in desc.members],
        "offsets": _offset_dicts(offsets),
    }


def _print_description(desc: GroupDescription, offsets: Sequence[PartitionOffset]) -> None:
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


def _cmd_groups_describe(args: argparse.Namespace) -> int:
    found: list[tuple[GroupDescription, list[PartitionOffset]]] = []
    with _group_admin(args) as admin:
        for group in _group_names(args, admin):
            try:
                found.append((admin.describe(group), admin.offsets(group)))
            except GroupNotFoundError:
                if not args.all_groups:
                    raise  # with --all-groups: deleted since it was listed
    if args.json:
        described = [_describe_json(d, o) for d, o in found]
        _print_json(described if args.all_groups else described[0])
        return EXIT_OK
    for i, (desc, offsets) in enumerate(found):
        if i:
            print()
        _print_description(desc, offsets)
    return EXIT_OK


# -- lag ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lag:
    group: str
    offsets: list[PartitionOffset]
    total: int

    @property
    def unknown(self) -> list[str]:
        """Why this group's total is not the whole answer (empty: it is)."""
        if not self.offsets:
            return [f"{self.group!r} (no share state on any partition: no member has fetched "
                    "yet, or its offsets were deleted)"]
        return [f"{self.group!r} on {o.topic}-{o.partition}" for o in self.offsets
                if o.lag is None]

    def as_json(self) -> dict[str, Any]:
        return {"group": self.group, "total_lag": self.total,
                "partitions": _offset_dicts(self.offsets)}


def _group_lag(admin: ShareGroupAdmin, group: str) -> _Lag:
    admin.describe(group)  # an unknown group, or one of another type, has no offsets: say so
    offsets = admin.offsets(group)
    return _Lag(group, offsets, admin.total_lag(group, offsets))


def _print_lags(lags: Sequence[_Lag], all_groups: bool) -> None:
    if not all_groups:
        _print_table(["TOPIC", "PARTITION", "START-OFFSET", "LAG"], _offset_rows(lags[0].offsets))
        print(f"TOTAL-LAG {lags[0].total}")
        return
    _print_table(["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"],
                 [[lag.group, *row] for lag in lags for row in _offset_rows(lag.offsets)])
    print()
    _print_table(["GROUP", "TOTAL-LAG"], [[lag.group, lag.total] for lag in lags])


def _collect_lags(args: argparse.Namespace, admin: ShareGroupAdmin) -> list[_Lag]:
    lags: list[_Lag] = []
    for group in _group_names(args, admin):
        try:
            lags.append(_group_lag(admin, group))
        except GroupNotFoundError:
            if not args.all_groups:
                raise  # with --all-groups: deleted since it was listed
    return lags


def _lags_once_known(args: argparse.Namespace, admin: ShareGroupAdmin) -> list[_Lag]:
    """The lags; with ``--wait S``, asked again each second for up to S seconds while the
    group does not exist yet, some lag is unknown or the broker answers a retriable error
    (a group that is starting)."""
    deadline = time.monotonic() + args.wait
    while True:
        try:
            lags = _collect_lags(args, admin)
            if not any(lag.unknown for lag in lags) or time.monotonic() >= deadline:
                return lags
        except NotAShareGroupError:
            raise  # broken, not starting
        except GroupNotFoundError:
            if time.monotonic() >= deadline:
                raise
        except KafkaApiError as exc:  # e.g. LEADER_NOT_AVAILABLE while share state starts
            if not exc.retriable or time.monotonic() >= deadline:
                raise
        time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))


def _cmd_groups_lag(args: argparse.Namespace) -> int:
    with _group_admin(args) as admin:
        lags = _lags_once_known(args, admin)
    if args.json:
        _print_json([lag.as_json() for lag in lags] if args.all_groups else lags[0].as_json())
    else:
        _print_lags(lags, args.all_groups)
    unknown = [why for lag in lags for why in lag.unknown]
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise LagUnavailableError(
            f"the lag is unknown for {'; '.join(unknown[:5])}{more}: the broker has no share "
            "state there yet, which it creates when a member first fetches from a partition "
            "(an empty partition stays unknown until records arrive and are fetched); the "
            "total counts only the partitions with a known lag")
    return EXIT_OK


# -- reset and delete --------------------------------------------------------------------------


def not_executed(args: argparse.Namespace, action: str) -> None:
    """After printing the plan: the error for neither ``--execute`` nor ``--dry-run``."""
    if not args.execute and not args.dry_run:
        raise OptionError("--execute", None, f"nothing was changed: add --execute to {action} "
                          "as planned above, or --dry-run to only print the plan")


def _membership_note(admin: ShareGroupAdmin, group: str, *, creates: bool) -> str | None:
    """A note on what ``--execute`` would meet: members, or (reset) a group not there yet.

    Raises :class:`NotAShareGroupError` for a group of another type, and (unless ``creates``)
    :class:`GroupNotFoundError` for an unknown group.
    """
    try:
        members = len(admin.describe(group).members)
    except NotAShareGroupError:
        raise
    except GroupNotFoundError:
        if not creates:
            raise
        return f"share group {group!r} does not exist yet: --execute creates it"
    if members:
        return (f"share group {group!r} has {members} member(s): --execute fails until it is "
                "empty (stop its consumers)")
    return None


def _cmd_groups_reset(args: argparse.Namespace) -> int:
    topics = _topic_selection(args.topic)
    with _group_admin(args) as admin:
        note = _membership_note(admin, args.group, creates=True)
        if args.execute:
            plan = admin.reset(args.group, args.to, topics)
        else:
            plan = admin.plan_reset(args.group, args.to, topics)
    rows = [[t, p, o] for t, parts in sorted(plan.items()) for p, o in sorted(parts.items())]
    target = args.to.isoformat() if isinstance(args.to, datetime) else args.to
    if args.json:
        _print_json({"group": args.group, "to": target, "dry_run": args.dry_run,
                     "executed": args.execute,
                     "offsets": [{"topic": t, "partition": p, "start_offset": o}
                                 for t, p, o in rows]})
    else:
        _print_table(["TOPIC", "PARTITION", "NEW-START-OFFSET"], rows)
        print(f"# share group {args.group!r} reset to {target}" if args.execute else
              f"# plan only: share group {args.group!r} was not changed")
    if note and not args.execute:
        _note(note)
    not_executed(args, f"reset share group {args.group!r}")
    return EXIT_OK


def _cmd_groups_dlq(args: argparse.Namespace) -> int:
    """Show, or (with --topic/--off) set, the broker's dead-letter queue of a group."""
    change = args.topic is not None or args.off or args.copy_record is not None
    with _group_admin(args) as admin:
        dlq = admin.dead_letter_queue(args.group)
        if change and args.execute:
            topic = None if args.off else (args.topic if args.topic is not None else dlq.topic)
            copy = None if args.copy_record is None else args.copy_record == "true"
            dlq = admin.set_dead_letter_queue(args.group, topic, copy_record=copy)
    if args.json:
        _print_json({"group": args.group, "share_version": dlq.share_version,
                     "supported": dlq.supported, "active": dlq.active, "topic": dlq.topic,
                     "copy_record": dlq.copy_record, "executed": bool(change and args.execute)})
    else:
        print(f"share group {args.group!r}: the broker's dead-letter queue is {dlq.describe()}")
        if change and not args.execute:
            planned = "off" if args.off else f"topic {args.topic or dlq.topic!r}"
            print(f"# plan only: set it {planned}"
                  + ("" if args.copy_record is None else f", copy records {args.copy_record}")
                  + "; nothing was changed")
    if change:
        not_executed(args, f"set the dead-letter queue of share group {args.group!r}")
    return EXIT_OK


def _config_assignment(text: str) -> tuple[str, str]:
    """``KEY=VALUE``, as ``kafka-configs.sh --add-config`` takes one setting."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r}: give KEY=VALUE, e.g. share.record.lock.duration.ms=60000")
    return key.strip(), value.strip()


def _cmd_groups_config(args: argparse.Namespace) -> int:
    """Show a group's share.* configs, or (with --set) plan, check or apply changes."""
    changes = dict(args.set or ())
    with _group_admin(args) as admin:
        if not changes:
            configs = admin.get_config(args.group)
        else:
            plan = admin.plan_config(args.group, changes)  # keys this broker knows
            if args.execute or args.dry_run:  # --dry-run: the broker validates, no change
                admin.set_configs(args.group, changes, validate_only=args.dry_run)
    if not changes:
        if args.json:
            _print_json({"group": args.group, "configs": configs})
        else:
            _print_table(["NAME", "VALUE"], sorted(configs.items()))
        return EXIT_OK
    if args.json:
        _print_json({"group": args.group, "dry_run": args.dry_run, "executed": args.execute,
                     "changes": [{"name": k, "current": old, "new": new}
                                 for k, (old, new) in plan.items()]})
    else:
        _print_table(["NAME", "CURRENT", "NEW"], [[k, old, new] for k, (old, new) in
                                                  plan.items()])
        print(f"# share group {args.group!r} configs set" if args.execute else
              "# plan only (the broker accepted it)" if args.dry_run else
              f"# plan only: share group {args.group!r} was not changed")
    not_executed(args, f"set the configs of share group {args.group!r}")
    return EXIT_OK


def _delete_topics(args: argparse.Namespace) -> list[str] | None:
    topics = _topic_selection(args.topic)
    if topics is None:
        return None
    if any(ps is not None for ps in topics.values()):
        raise OptionError("--topic", _selection_text(topics), "delete forgets a topic's "
                          "offsets on all of its partitions (Kafka deletes share-group offsets "
                          "per topic): give topic names without ':PARTITIONS'")
    return list(topics)


def _cmd_groups_delete(args: argparse.Namespace) -> int:
    topics = _delete_topics(args)
    with _group_admin(args) as admin:
        note = _membership_note(admin, args.group, creates=False)
        offsets = [o for o in admin.offsets(args.group) if topics is None or o.topic in topics]
        if args.execute and topics:
            admin.delete_offsets(args.group, topics)
        elif args.execute:
            admin.delete_group(args.group)
    what = (f"the offsets of share group {args.group!r} for {', '.join(topics)}" if topics
            else f"share group {args.group!r} and its offsets")
    if args.json:
        _print_json({"group": args.group, "deleted": "offsets" if topics else "group",
                     "topics": topics or [], "dry_run": args.dry_run,
                     "executed": args.execute, "offsets": _offset_dicts(offsets)})
    elif args.execute:
        print(f"deleted {what}")
    else:
        print(f"# plan only: would delete {what}:")
        _print_table(["TOPIC", "PARTITION", "START-OFFSET", "LAG"], _offset_rows(offsets))
    if note and not args.execute:
        _note(note)
    not_executed(args, f"delete {what}")
    return EXIT_OK


def _cmd_groups_list(args: argparse.Namespace) -> int:
    with _group_admin(args) as admin:
        groups = admin.list_groups()
    if args.json:
        _print_json(groups)
    else:
        for group in groups:
            print(group)
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------------


def default_bootstrap() -> str | None:
    """The first of the environment variables :data:`ENV_BOOTSTRAP_SERVERS` and
    ``PYSPARK_KAFKA_SHARE_BOOTSTRAP`` that is set and not empty."""
    return os.environ.get(ENV_BOOTSTRAP_SERVERS) or os.environ.get(ENV_BOOTSTRAP_FALLBACK) \
        or None


def connection_options() -> argparse.ArgumentParser:
    """``--bootstrap-server`` (default from the environment), ``--command-config`` and
    ``--timeout``: the options :func:`admin_from_args` reads."""
    common = argparse.ArgumentParser(add_help=False)
    bootstrap = default_bootstrap()
    now = f"; now: {bootstrap}" if bootstrap else "; neither is set now"
    common.add_argument("--bootstrap-server", default=bootstrap, metavar="HOST:PORT",
                        help=f"the broker(s) to connect to; optional when the environment "
                        f"variable {ENV_BOOTSTRAP_SERVERS} (or {ENV_BOOTSTRAP_FALLBACK}) is "
                        f"set{now}")
    common.add_argument("--command-config", metavar="FILE",
                        help="client security settings in Kafka's properties format, as "
                        "kafka-share-groups.sh takes them (security.protocol, sasl.*, ssl.* "
                        "with PEM files)")
    common.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long to wait for the broker on each step (default: 30)")
    return common


def common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, parents=[connection_options()])
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return common


class NeedsBroker(argparse.ArgumentParser):
    """A ``groups`` command: ``--bootstrap-server`` is optional on the command line (it has an
    environment default) but needed, so a missing one is a usage error (exit code 2)."""

    def parse_known_args(  # type: ignore[override]
            self, args: Sequence[str] | None = None,
            namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if not getattr(parsed, "bootstrap_server", None):
            self.error(f"no broker given: give --bootstrap-server HOST:PORT, or set the "
                       f"environment variable {ENV_BOOTSTRAP_SERVERS}; for a broker on this "
                       "machine, `kafka-share broker` prints its address")
        return parsed, extra


def _add_command(gsub: Any, name: str, common: argparse.ArgumentParser, help_text: str,
                 func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    cmd: argparse.ArgumentParser = gsub.add_parser(
        name, parents=[common], help=help_text, description=help_text, epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.set_defaults(func=func)
    return cmd


def _add_group_or_all(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("group", nargs="?", help="the share group (or --all-groups)")
    cmd.add_argument("--all-groups", action="store_true", help="every share group")


def add_execute_or_dry_run(cmd: argparse.ArgumentParser, action: str) -> None:
    mode = cmd.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help=f"{action} (one of --execute "
                      "and --dry-run is required: with neither, the plan is printed, nothing "
                      f"is changed and the exit code is {EXIT_USAGE})")
    mode.add_argument("--dry-run", action="store_true",
                      help="only print the plan; nothing is changed")


def add_parser(sub: Any) -> None:
    """The ``groups`` command and its subcommands, on the top-level subparsers ``sub``."""
    common = common_options()
    groups = sub.add_parser("groups", help="list, watch, reset and delete share groups",
                            description="List, watch, reset and delete share groups.",
                            epilog=EXIT_CODES_HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    gsub = groups.add_subparsers(dest="groups_command", required=True,
                                 parser_class=NeedsBroker)
    _add_command(gsub, "list", common, "list the share groups", _cmd_groups_list)
    cmd = _add_command(gsub, "describe", common, "state, members, assignments, start offsets "
                       "and lag of a share group", _cmd_groups_describe)
    _add_group_or_all(cmd)
    cmd = _add_command(gsub, "lag", common, "per-partition and total lag of a share group",
                       _cmd_groups_lag)
    _add_group_or_all(cmd)
    cmd.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                     help="a group that is starting: ask again each second, for up to SECONDS, "
                          f"while the group does not exist yet (exit code {EXIT_GROUP_NOT_FOUND}) "
                          f"or some lag is unknown ({EXIT_LAG_UNKNOWN}); then answer as without "
                          "it (default: 0, answer at once)")
    cmd = _add_command(gsub, "reset", common, "move a share group's start offsets (the group "
                       "must have no members)", _cmd_groups_reset)
    cmd.add_argument("group")
    cmd.add_argument("--to", required=True, type=time_arg, metavar="earliest|latest|TIME",
                     help="earliest, latest, or an ISO-8601 time (no zone: local time)")
    cmd.add_argument("--topic", action="append", type=_topic_arg, metavar="TOPIC[:P,P...]",
                     help="reset this topic's partitions: all, or the listed ones as in "
                          "orders:0,1 (repeatable; default: every partition the group has "
                          "offsets for)")
    add_execute_or_dry_run(cmd, "reset the offsets")
    cmd = _add_command(gsub, "delete", common, "delete a share group, or only its offsets for "
                       "some topics (the group must have no members)", _cmd_groups_delete)
    cmd.add_argument("group")
    cmd.add_argument("--topic", action="append", type=_topic_arg, metavar="TOPIC",
                     help="delete only the group's offsets for this topic, on all of its "
                          "partitions (repeatable)")
    add_execute_or_dry_run(cmd, "delete")
    cmd = _add_command(gsub, "config", common, "show or set a share group's configs "
                       "(share.*: lock duration, delivery limit, ...); the broker's version "
                       "decides which exist", _cmd_groups_config)
    cmd.add_argument("group")
    cmd.add_argument("--set", action="append", type=_config_assignment, metavar="KEY=VALUE",
                     help="change this config (repeatable), e.g. "
                          "share.record.lock.duration.ms=60000; without --set the configs "
                          "are shown")
    add_execute_or_dry_run(cmd, "apply --set (--dry-run: the broker checks it, nothing is "
                            "changed)")
    cmd = _add_command(gsub, "dlq", common, "show or set the broker's dead-letter queue of a "
                       "share group (Apache Kafka 4.4+, share.version 2)", _cmd_groups_dlq)
    cmd.add_argument("group")
    target = cmd.add_mutually_exclusive_group()
    target.add_argument("--topic", metavar="TOPIC", help="dead-letter REJECTed records to "
                        "this topic (it needs errors.deadletterqueue.group.enable=true)")
    target.add_argument("--off", action="store_true", help="no dead-letter topic")
    cmd.add_argument("--copy-record", choices=("true", "false"),
                     help="copy the records too, not only the context headers")
    add_execute_or_dry_run(cmd, "apply --topic, --off or --copy-record")

