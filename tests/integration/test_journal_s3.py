"""The journal on S3: what only an object store has (a real S3 server, moto via LocalS3, that
honours ``If-None-Match``).

The server's conditional create itself; a late attempt's create succeeding after the commit
(no rename on object stores); the probe and the ``journal.*`` options at ``load()``; the
server's lifetime. The slot protocol and the failure tests run on S3 *and* on a local
directory, parametrized over the ``journal`` fixture: ``tests/unit/test_journal.py`` (slots,
races, dedup, commit, owner, retried creates), ``test_source.py`` and ``test_reader.py``
(racing attempts, a Python worker killed after publish, a failed batch restarted from the
checkpoint, a query stopped mid-batch).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pyspark_kafka_share.errors import JournalClosed, OptionError
from pyspark_kafka_share.harness.s3 import LocalS3
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.options import parse_options
from tests.fixtures.journal import JournalAt, end_marker, record_batch

if TYPE_CHECKING:
    from obstore.store import S3Config


def _keys_under(where: JournalAt, sub: str) -> list[str]:
    j = where.open()
    store = j.store
    return sorted(store._keys_under(j._p(sub)))  # type: ignore[attr-defined]


# -- the server --------------------------------------------------------------------------------


def test_the_server_refuses_a_second_exclusive_create_also_under_races(
    s3: LocalS3, s3_journal: JournalAt
) -> None:
    import obstore
    from obstore.exceptions import AlreadyExistsError
    from obstore.store import S3Store

    opts = s3_journal.store_options
    bucket, prefix = s3_journal.url.removeprefix("s3://").split("/", 1)
    config: S3Config = {"endpoint": opts["aws_endpoint"], "region": opts["aws_region"],
                        "access_key_id": opts["aws_access_key_id"],
                        "secret_access_key": opts["aws_secret_access_key"]}
    store = S3Store(bucket, config=config, client_options={"allow_http": True})
    obstore.put(store, f"{prefix}/once", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, f"{prefix}/once", b"second", mode="create")
    assert bytes(obstore.get(store, f"{prefix}/once").bytes()) == b"first"
    wins: Counter[int] = Counter()
    lock = threading.Lock()

    def racer(i: int) -> None:
        for k in range(25):
            try:
                obstore.put(store, f"{prefix}/race/{k}", b"%d" % i, mode="create")
            except AlreadyExistsError:
                continue
            with lock:
                wins[k] += 1

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins == Counter(dict.fromkeys(range(25), 1)), "a key had no or several winners"


# -- the journal's protocol on S3 ----------------------------------------------------------------


def test_a_late_attempt_after_the_deletion_gives_back_and_its_orphans_are_swept(
    s3_journal: JournalAt,
) -> None:
    # No rename on S3: once the commit deleted batch 1 (no retention here, so at once), a late
    # attempt's create succeeds; it is old (no retention), so it re-reads the fence.
    j = s3_journal.open()
    late = j.part_log(1, 0)
    late.open()  # opened while batch 1 was running
    done = j.part_log(1, 0)
    done.append(record_batch("t", [0]), attempt=1)
    done.end(end_marker(1, acked=(0,)))
    j.commit(1, dedup_retention_ms=3_600_000)
    slot = late.append(record_batch("t", [1]), attempt=2)  # succeeds: nothing is there any more
    assert j.committed_seq() >= 1, "the fence an old task re-reads after every append"
    with pytest.raises(JournalClosed):
        j.part_log(1, 0).open()  # a new attempt sees the fence at once
    # The task would give its records back now; suppose it died first. Never ACCEPTed,
    # so they must not become dedup keys, and the next commit deletes the orphan.
    assert slot == 0  # its scan at open saw an empty log
    nxt = j.part_log(2, 0)
    nxt.open()
    nxt.append(record_batch("t", [2]), attempt=3)
    nxt.end(end_marker(3, acked=(0,)))
    j.commit(2, dedup_retention_ms=3_600_000)
    assert j.find_journaled({("t", 0, 1)}) == set(), "an orphan slot was taken as published"
    assert _keys_under(s3_journal, "batches") == [], "the orphan was not swept"


# -- configuration and the checks at load() ----------------------------------------------------


_BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "kafka.group.id": "g", "subscribe": "t"}


def test_load_probes_the_store_and_carries_the_options_unshown(s3_journal: JournalAt) -> None:
    opts = parse_options({**_BASE, "journalPath": s3_journal.url, **s3_journal.options})
    assert dict(opts.journal_options) == s3_journal.store_options
    assert "testing" not in repr(opts)
    assert _keys_under(s3_journal, "") == [], "the probe object was left behind"
    settings = opts.journal_settings()
    assert settings is not None
    j = Journal.of(settings)
    j.part_log(1, 0).open()
    assert j.part_log(1, 0).append(record_batch("t", [0]), attempt=1) == 0


def test_load_refuses_settings_without_conditional_create_and_unreachable_stores(
    s3_journal: JournalAt,
) -> None:
    with pytest.raises(OptionError, match="conditional create"):
        parse_options({**_BASE, "journalPath": s3_journal.url, **s3_journal.options,
                       "journal.aws_conditional_put": "disabled"})
    with pytest.raises(OptionError, match="atomic create-if-absent") as info:
        parse_options({**_BASE, "journalPath": "s3://no-such-bucket-here/j",
                       **s3_journal.options})
    assert "testing" not in str(info.value)


def test_credentials_and_endpoint_from_the_standard_environment(
    s3: LocalS3, s3_journal: JournalAt, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    parse_options({**_BASE, "journalPath": s3_journal.url})  # probe, no journal.* options
    j = Journal(s3_journal.url)
    j.part_log(1, 0).open()
    j.part_log(1, 0).append(record_batch("t", [0]), attempt=1)
    assert s3_journal.open().part_log(1, 0).scan().data_slots == [0]


# -- the harness ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["exit", "sigterm", "sigkill"])
def test_the_s3_server_never_outlives_its_owner(how: str, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, time\n"
        "from pyspark_kafka_share.harness import LocalS3\n"
        "s3 = LocalS3().start()\n"
        "print(s3.pid, flush=True)\n"
        f"time.sleep(0 if {how == 'exit'!r} else 60)\n")
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    server = int(owner.stdout.readline())
    assert _alive(server)
    if how != "exit":
        os.kill(owner.pid, signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    owner.wait(30)
    deadline = time.monotonic() + 15
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server), f"the S3 server outlived its owner ({how})"
