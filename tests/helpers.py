"""Helpers shared by the test tiers (unit, integration, cluster).

``tests/`` is on ``sys.path`` in every pytest run (``tests/conftest.py`` has no package around
it), so test modules and conftests import this module as ``helpers``.

- :func:`read_topic`: every record of a topic, read with a classic consumer.
- :class:`JournalAt`: where a test's journal lives (a local directory or ``s3://`` on the
  session's :class:`LocalS3`), with the reader options it needs and :meth:`JournalAt.open`, the
  package's :class:`Journal` on it: tests inspect journals through it, whatever the store.
- :func:`shared_s3`: one :class:`LocalS3` for the whole pytest process, however many session
  fixtures (unit and integration) ask for it.
- :func:`read_only_dir`: a directory the current user cannot create files in.
- :func:`wait_for`: poll a value until a condition holds, failing with the last value.
- :func:`fails_within`: a call must raise a given error, matching a pattern, within a time.
- :class:`TierReport`, :func:`tier_hooks`: a tier that runs in a pytest process of its own
  and prints what it saw again in the terminal summary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pyspark_kafka_share.harness import LocalKafka, LocalS3
from pyspark_kafka_share.source.journal.journal import Journal

__all__ = [
    "BUCKET",
    "JournalAt",
    "TierReport",
    "journal_at",
    "read_only_dir",
    "read_topic",
    "shared_s3",
    "wait_for",
]

BUCKET = "journals"
T = TypeVar("T")


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


def fails_within(call: Callable[[], object], error: type[Exception], match: str,
                 seconds: float = 5.0) -> str:
    """Run ``call``; it must raise ``error`` matching ``match`` within ``seconds``; its text."""
    start = time.monotonic()
    with pytest.raises(error, match=match) as info:
        call()
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"took {elapsed:.1f}s: {info.value}"
    return str(info.value)


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

    def summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.section(self.title)
            for line in self.lines:
                terminalreporter.write_line(line)


def tier_hooks(marker: str, reason: str, report: TierReport) -> tuple[Any, Any]:
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

    def terminal_summary(terminalreporter: Any) -> None:
        report.summary(terminalreporter)

    return collection_modifyitems, terminal_summary


def read_topic(kafka: LocalKafka, topic: str, expect: int, timeout_s: float = 30.0,
               settle_s: float = 2.0) -> list[Any]:
    """Every record of ``topic`` (classic consumer from the start): waits until ``expect``
    records arrived and then ``settle_s`` without more, or ``timeout_s`` in all."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                  "group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
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


# -- journals ----------------------------------------------------------------------------------

_S3_LOCK = threading.Lock()
_S3: dict[str, Any] = {"server": None, "users": 0}


@contextlib.contextmanager
def shared_s3() -> Iterator[LocalS3]:
    """The process's one :class:`LocalS3` (with bucket :data:`BUCKET`), started by the first
    user and stopped when the last one leaves."""
    with _S3_LOCK:
        if _S3["server"] is None:
            server = LocalS3().start()
            server.create_bucket(BUCKET)
            _S3["server"] = server
        _S3["users"] += 1
        server = _S3["server"]
    try:
        yield server
    finally:
        with _S3_LOCK:
            _S3["users"] -= 1
            if _S3["users"] == 0:
                _S3["server"] = None
                server.stop()


@dataclass(frozen=True)
class JournalAt:
    """Where a test's journal lives: ``journalPath`` and the ``journal.*`` options."""

    kind: str  # "local" or "s3"
    url: str
    options: dict[str, str] = field(default_factory=dict)  # journal.<key> -> value

    @property
    def store_options(self) -> dict[str, str]:
        """The options without the ``journal.`` prefix, as :class:`Journal` takes them."""
        return {k.removeprefix("journal."): v for k, v in self.options.items()}

    @property
    def source_options(self) -> dict[str, str]:
        """``journalPath`` and the ``journal.*`` options, as the source takes them."""
        return {"journalPath": self.url, **self.options}

    def open(self, **kwargs: Any) -> Journal:
        """The package's :class:`Journal` on this location."""
        return Journal(self.url, options=self.store_options, **kwargs)


def journal_at(kind: str, tmp_path: Path, s3: LocalS3 | None = None) -> JournalAt:
    """A fresh journal location of ``kind``: ``tmp_path/journal``, or a new prefix on ``s3``."""
    if kind == "local":
        return JournalAt("local", str(tmp_path / "journal"))
    if kind == "s3" and s3 is not None:
        return JournalAt("s3", f"s3://{BUCKET}/j-{uuid.uuid4().hex[:12]}", s3.journal_options())
    raise AssertionError(f"unknown journal kind {kind!r} (or no S3 server for it)")


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
