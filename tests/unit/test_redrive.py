"""The redrive's selection (``_kafka/redrive.py``) and ``kafka-share dlq replay``'s arguments
(pure unit tests; the replay against a broker: tests/integration/test_workers_retry.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pyspark_kafka_share._kafka import redrive
from pyspark_kafka_share.cli import build_parser, main
from pyspark_kafka_share.workers import DLQ_HEADERS


class DeadMsg:
    """A dead-letter topic's message as confluent-kafka gives it."""

    def __init__(self, offset: int, ts_ms: int, origin: str | None, error: str,
                 error_type: str = "ValueError", partition: int = 0) -> None:
        self._offset, self._ts, self._partition = offset, ts_ms, partition
        ours = [("kafka-share.error", error.encode()),
                ("kafka-share.error.type", error_type.encode()),
                ("kafka-share.attempts", b"3")]
        if origin is not None:
            ours += [("kafka-share.origin.topic", origin.encode()),
                     ("kafka-share.origin.partition", b"0"),
                     ("kafka-share.origin.offset", str(offset).encode()),
                     ("kafka-share.origin.group", b"g")]
        self._headers: list[tuple[str, bytes | None]] = [("trace", b"t1"), *ours]

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers


_MSGS = [DeadMsg(0, 1_000, "orders", "ConnectionError: 503", "ConnectionError"),
         DeadMsg(1, 2_000, "orders", "gave up after 3 attempts: TimeoutError: slow",
                 "TimeoutError"),
         DeadMsg(2, 3_000, "payments", "value_deserializer: JSONDecodeError: x",
                 "JSONDecodeError"),
         DeadMsg(3, 4_000, None, "someone else's record"),
         DeadMsg(4, 5_000, "orders", "ConnectionError: 503", "ConnectionError")]


def _plan(**filt: Any) -> redrive.ReplayPlan:
    return redrive.plan("dlq", _MSGS, redrive.ReplayFilter(**filt), {0: 5})


def test_the_workers_write_the_headers_the_redrive_reads() -> None:
    assert DLQ_HEADERS == redrive.DLQ_HEADERS
    assert redrive.ORIGIN_TOPIC in DLQ_HEADERS and redrive.ERROR in DLQ_HEADERS


def test_every_dead_letter_of_ours_by_default_and_others_left_alone() -> None:
    plan = _plan()
    assert [d.offset for d in plan.selected] == [0, 1, 2, 4]
    assert (plan.read, plan.foreign) == (5, 1)
    assert plan.counts() == [("orders", "ConnectionError", 2), ("orders", "TimeoutError", 1),
                             ("payments", "JSONDecodeError", 1)]
    d = plan.selected[0]
    # As it was delivered: key, value, its own headers; the workers' headers are dropped.
    assert (d.key, d.value, d.headers, d.origin_topic) == (b"k0", b"v0", (("trace", b"t1"),),
                                                           "orders")


def test_selected_by_error_text_or_type_time_and_origin() -> None:
    assert [d.offset for d in _plan(error=re.compile("503")).selected] == [0, 4]
    assert [d.offset for d in _plan(error=re.compile("^Timeout")).selected] == [1]
    assert [d.offset for d in _plan(since_ms=2_000, until_ms=5_000).selected] == [1, 2]
    assert [d.offset for d in _plan(origin="payments").selected] == [2]
    assert _plan(error=re.compile("nothing like it")).selected == []


def test_the_replay_arguments_are_checked() -> None:
    args = build_parser().parse_args(
        ["dlq", "replay", "dlq", "--bootstrap-server", "b:9092", "--error", "503",
         "--since", "2025-01-31T12:00:00Z", "--from-offsets", "0:12,1:7", "--dry-run"])
    assert args.error.pattern == "503" and args.since == 1_738_324_800_000
    assert args.from_offsets == {0: 12, 1: 7} and args.dry_run and not args.execute
    for bad in (["--from-offsets", "0-12"], ["--since", "latest"], ["--error", "("],
                ["--execute", "--dry-run"]):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["dlq", "replay", "dlq", "--bootstrap-server", "b:9092",
                                       *bad])
        assert exit_.value.code == 2


def test_an_empty_time_window_is_refused_before_any_broker_is_asked(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["dlq", "replay", "dlq", "--bootstrap-server", "127.0.0.1:1", "--since",
                 "2025-02-01T00:00:00Z", "--until", "2025-01-01T00:00:00Z", "--dry-run"])
    assert code == 2 and "--until" in capsys.readouterr().err
