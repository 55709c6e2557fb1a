"""Helpers shared by the test tiers (unit, integration, cluster, chaos): ``tests.helpers``.

- :func:`read_topic`: every record of a topic, read with a classic consumer.
- :func:`record_key`: a consumed record's ``(topic, partition, offset)``.
- :func:`read_only_dir`: a directory the current user cannot create files in.
- :func:`wait_for`: poll a value until a condition holds, failing with the last value.
- :class:`TierReport`, :func:`tier_hooks`: a tier that runs in a pytest process of its own
  and prints what it saw again in the terminal summary.

Where a test's journal lives (``JournalAt``, the ``journal`` fixture) is in
:mod:`tests.fixtures.journal`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import Consumer, Message

from pyspark_kafka_share.harness import LocalKafka

__all__ = [
    "CollectionHook",
    "SummaryHook",
    "TierReport",
    "read_only_dir",
    "read_topic",
    "record_key",
    "tier_hooks",
    "wait_for",
]

T = TypeVar("T")
CollectionHook = Callable[[pytest.Config, list[pytest.Item]], None]
SummaryHook = Callable[[pytest.TerminalReporter], None]


def wait_for(get: Callable[[], T], ok: Callable[[T], bool], timeout_s: float = 30.0,
             what: str = "condition") -> T:
    """Call ``get`` until ``ok(value)``; fail with the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    value = get()
    while not ok(value):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout_s}s; last value: {value!r}")
        time.sleep(0.3)
        value = get()
    return value


@dataclass
class TierReport:
    """What a tier saw (seeds, kills, retries): each line is printed when noted and again, under
    ``title``, in the terminal summary (call :meth:`summary` from the conftest's
    ``pytest_terminal_summary``)."""

    title: str
    lines: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.lines:
            terminalreporter.section(self.title)
            for line in self.lines:
                terminalreporter.write_line(line)


def tier_hooks(marker: str, reason: str,
               report: TierReport) -> tuple[CollectionHook, SummaryHook]:
    """A tier's two conftest hooks, ``(pytest_collection_modifyitems,
    pytest_terminal_summary)``: the tier's tests (marked ``marker``) are skipped with ``reason``
    when the run, after -m/-k deselection, holds others (the tier needs a pytest process of its
    own), and ``report`` is printed in the terminal summary."""

    @pytest.hookimpl(trylast=True)  # after -m/-k deselection
    def collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        tier = [i for i in items if i.get_closest_marker(marker) is not None]
        if tier and len(tier) < len(items):
            for item in tier:
                item.add_marker(pytest.mark.skip(reason=reason))

    def terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
        report.summary(terminalreporter)

    return collection_modifyitems, terminal_summary


def record_key(m: Message) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a consumed record (which has all three)."""
    topic, partition, offset = m.topic(), m.partition(), m.offset()
    assert topic is not None and partition is not None and offset is not None, m
    return topic, partition, offset


def read_topic(kafka: LocalKafka, topic: str, expect: int, timeout_s: float = 30.0,
               settle_s: float = 2.0) -> list[Message]:
    """Every record of ``topic`` (classic consumer from the start): waits until ``expect``
    records arrived and then ``settle_s`` without more, or ``timeout_s`` in all."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                  "group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if len(out) >= expect:
                    quiet_until = quiet_until or time.monotonic() + settle_s
                    if time.monotonic() >= quiet_until:
                        break
                continue
            assert m.error() is None, m.error()
            out.append(m)
    finally:
        c.close()
    return out


# -- a directory nobody here may write to --------------------------------------------------------


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[str]:
    """Create ``path`` so that this user cannot create files in it; yield the cause the probe
    must name. Not root: ``chmod 555`` (permission denied). Root, whom file modes do not stop:
    a read-only tmpfs mounted there (read-only file system), if this process may mount;
    otherwise the test is skipped."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "permission denied"
        finally:
            path.chmod(0o755)
        return
    mount = shutil.which("mount")
    done = mount is not None and subprocess.run(
        [mount, "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
        capture_output=True, check=False).returncode == 0
    if not done:
        pytest.skip("running as root (file modes do not stop it) and cannot mount a "
                    "read-only tmpfs")
    try:
        yield "read-only file system"
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)
