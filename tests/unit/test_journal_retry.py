"""An object-store journal through an outage (``journalRetryTimeoutMs``; stores/retry.py).

Two kinds of test: the journal on obstore's in-memory store with faults injected at the
client's calls and a fake clock (a create applied whose answer was lost, an outage shorter
and longer than the bound, a refusal), and obstore's real HTTP client against a stub S3
endpoint on loopback that answers 503 or 403 (what obstore itself retries, and for how
long)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from obstore.exceptions import GenericError, PermissionDeniedError
from obstore.store import MemoryStore

from pyspark_kafka_share.errors import JournalError, JournalUnavailable, OptionError
from pyspark_kafka_share.source.journal import probe
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.stores import objectstore
from pyspark_kafka_share.source.journal.stores.objectstore import ObjectStore
from pyspark_kafka_share.source.journal.stores.retry import StoreRetry, transient_cause
from pyspark_kafka_share.source.options import parse_options
from tests.fixtures.journal import end_marker, record_batch

URL = "s3://bucket/j"
# What obstore 0.12.1 raised against a stub endpoint (measured): the classifier's inputs.
_503 = ("Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 3.1s, after 8 "
        "retries, max_retries: 1000, retry_timeout: 3s  - Server returned non-2xx status "
        "code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>")
_NO_ANSWER = ("Generic S3 error: Error performing PUT http://127.0.0.1:1/b/k in 1.0s - HTTP "
              "error: error sending request")
_400 = ("Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 4ms - Server "
        "returned non-2xx status code: 400 Bad Request: <Error/>")


@pytest.mark.parametrize(("exc", "cause"), [
    (GenericError(_503), "HTTP 503"),
    (GenericError(_503.replace("503 Service Unavailable", "429 Too Many Requests")), "HTTP 429"),
    (GenericError(_NO_ANSWER), "no answer"),
    (GenericError(_400), None),
    (PermissionDeniedError("lacked the necessary privileges: 403 Forbidden"), None),
    (FileNotFoundError("Object at location k not found"), None),
])
def test_only_an_outage_is_retried(exc: BaseException, cause: str | None) -> None:
    assert transient_cause(exc) == cause


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


class _FaultyObstore:
    """obstore's functions on a :class:`MemoryStore`, with faults: every call answers 503
    while ``clock() < down_until``, or is refused (403) while ``denied``; a create of a key
    in ``lose`` is applied and then answered as obstore reports a request without an answer
    (it does not retry a conditional PUT that timed out)."""

    def __init__(self, clock: _Clock) -> None:
        import obstore

        self.real = obstore
        self.exceptions = obstore.exceptions
        self.clock = clock
        self.down_until = -1.0
        self.denied = False
        self.lose: set[str] = set()
        self.calls: Counter[str] = Counter()

    def _gate(self, op: str, key: str) -> None:
        self.calls[op] += 1
        if self.denied:
            raise PermissionDeniedError(f"lacked the necessary privileges for path {key}: "
                                        "403 Forbidden")
        if self.clock() < self.down_until:
            raise GenericError(_503)

    def put(self, store: Any, key: str, data: bytes, **kwargs: Any) -> Any:
        self._gate(f"put:{kwargs.get('mode', 'overwrite')}", key)
        result = self.real.put(store, key, data, **kwargs)
        if kwargs.get("mode") == "create" and key in self.lose:
            self.lose.discard(key)
            raise GenericError(_NO_ANSWER)
        return result

    def get(self, store: Any, key: str) -> Any:
        self._gate("get", key)
        return self.real.get(store, key)

    def get_range(self, store: Any, key: str, **kwargs: Any) -> Any:
        self._gate("get", key)
        return self.real.get_range(store, key, **kwargs)

    def head(self, store: Any, key: str) -> Any:
        self._gate("head", key)
        return self.real.head(store, key)

    def list(self, store: Any, prefix: str | None = None, **kwargs: Any) -> Any:
        self._gate("list", prefix or "")
        return self.real.list(store, prefix, **kwargs)

    def list_with_delimiter(self, store: Any, prefix: str | None = None) -> Any:
        self._gate("list", prefix or "")
        return self.real.list_with_delimiter(store, prefix)

    def delete(self, store: Any, keys: Any) -> Any:
        self._gate("delete", str(keys))
        return self.real.delete(store, keys)


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Journal, _FaultyObstore]]:
    """A journal at ``s3://bucket/j`` on an in-memory store with :class:`_FaultyObstore`,
    whose calls ride out an outage for 60 s of a fake clock."""
    memory = MemoryStore()
    monkeypatch.setattr(objectstore, "_open_object_store", lambda *a, **k: memory)
    journal = Journal(URL, retry_timeout_ms=60_000)
    store = journal.store
    assert isinstance(store, ObjectStore) and store.retry.timeout_s == 60
    clock = _Clock()
    flaky = _FaultyObstore(clock)
    store._ob = flaky  # type: ignore[assignment]  # obstore's functions, with faults
    store.retry = StoreRetry(60, clock=clock, sleep=clock.sleep)
    yield journal, flaky


def test_a_slot_create_applied_whose_answer_was_lost_is_our_slot(
    faulty: tuple[Journal, _FaultyObstore],
) -> None:
    j, flaky = faulty
    log = j.part_log(1, 0)
    log.open()
    flaky.lose.add(log.slot_path(0).strip("/"))
    assert log.append(record_batch("t", [5]), attempt=7) == 0
    assert flaky.calls["put:create"] == 3, "index entry, the lost create, its retry"
    assert not flaky.lose, "the fault was not met"
    assert j.part_log(1, 0).scan().data_slots == [0], "the batch was written twice"
    assert j.find_journaled({("t", 0, 5)}) == {("t", 0, 5)}


def test_another_attempts_slot_met_after_a_lost_answer_is_not_ours(
    faulty: tuple[Journal, _FaultyObstore],
) -> None:
    j, flaky = faulty
    log = j.part_log(1, 0)
    log.open()
    j.part_log(1, 0).append(record_batch("t", [1]), attempt=3)  # another attempt won slot 0
    log._next, log._next_known = 0, True  # as if it had not seen it
    flaky.lose.add(log.slot_path(1).strip("/"))
    assert log.append(record_batch("t", [2]), attempt=7) == 1
    assert j.part_log(1, 0).scan().data_slots == [0, 1]
    assert log.writer(0) == 3 and log.writer(1) == 7


def test_an_end_whose_answer_was_lost_is_our_end(faulty: tuple[Journal, _FaultyObstore]) -> None:
    j, flaky = faulty
    log = j.part_log(1, 0)
    log.open()
    log.append(record_batch("t", [0]), attempt=7)
    flaky.lose.add(log.slot_path(1).strip("/"))
    scan = log.end(end_marker(7))
    assert scan.end is not None and scan.end.attempt == 7 and scan.data_slots == [0]
    again = j.part_log(1, 0).scan()
    assert again.end == scan.end and again.data_slots == [0] and again.next_slot == 1


def test_the_drivers_calls_ride_out_an_outage_shorter_than_the_bound(
    faulty: tuple[Journal, _FaultyObstore],
) -> None:
    j, flaky = faulty
    log = j.part_log(1, 0)
    log.open()
    log.append(record_batch("t", [0]), attempt=1)
    log.end(end_marker(1))
    flaky.down_until = flaky.clock() + 40  # 40 s of 503s, within the 60 s bound
    assert set(j.batch_ends(1)) == {0}  # latestOffset's metrics
    j.commit(1, dedup_retention_ms=0)  # the driver's commit: fence, dedup entries, delete
    assert flaky.clock() >= flaky.down_until and flaky.calls["list"] > 2
    assert j.committed_seq() == 1 and j.batches() == []


def test_an_outage_past_the_bound_fails_naming_store_call_and_option(
    faulty: tuple[Journal, _FaultyObstore],
) -> None:
    j, flaky = faulty
    flaky.down_until = 1e9
    with pytest.raises(JournalUnavailable) as info:
        j.committed_seq()
    text = str(info.value)
    assert "s3://bucket" in text and "read 'j/committed'" in text, text
    assert "HTTP 503" in text and "journalRetryTimeoutMs=60000" in text, text
    assert "raise journalRetryTimeoutMs" in text and "restart the query" in text, text
    assert 60 <= flaky.clock() <= 66, "the bound, plus at most one backoff"
    assert flaky.calls["get"] > 5


def test_a_refusal_is_raised_at_once_and_never_read_as_absent(
    faulty: tuple[Journal, _FaultyObstore],
) -> None:
    j, flaky = faulty
    flaky.denied = True
    with pytest.raises(JournalError, match=r"refused by S3.*Not retried") as info:
        j.committed_seq()  # a fence read as "none yet" would be -1
    assert not isinstance(info.value, JournalUnavailable) and flaky.calls["get"] == 1
    with pytest.raises(JournalError, match="refused"):
        j.batches()  # a listing read as empty would be []
    with pytest.raises(JournalError, match="refused"):
        j.part_log(1, 0).scan()
    assert flaky.clock() == 0, "a refusal waited"


def test_the_bound_travels_with_the_store_to_the_executors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pickle

    monkeypatch.setattr(objectstore, "_open_object_store", lambda *a, **k: MemoryStore())
    store = ObjectStore(JournalLocation.parse(URL), {}, retry_timeout_ms=7_000)
    assert pickle.loads(pickle.dumps(store)).retry.timeout_s == 7
    config = store.retry.obstore_config()
    assert config is not None and config["retry_timeout"].total_seconds() == 7
    assert config["max_retries"] >= 1_000, "the time bound must end obstore's retries"
    assert ObjectStore(JournalLocation.parse(URL), {}, probe=True).retry.obstore_config() \
        is None, "the probe at load() keeps its own short bound"


# -- the option -----------------------------------------------------------------------------

_BASE = {"kafka.bootstrap.servers": "h:9092", "kafka.group.id": "g", "subscribe": "t"}


def test_the_option_reaches_the_journal_and_defaults_to_two_minutes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe, "check_journal", lambda *a: None)  # no store to probe here
    default = parse_options({**_BASE, "journalPath": URL}).journal_settings()
    assert default is not None and default.retry_timeout_ms == 120_000
    set_ = parse_options({**_BASE, "journalPath": URL, "JOURNALRETRYTIMEOUTMS": "8000"})
    settings = set_.journal_settings()
    assert settings is not None and settings.retry_timeout_ms == 8_000


@pytest.mark.parametrize(("path", "value", "fix"), [
    (URL, "500", "at least 1000 and at most 300000"),
    (URL, "600000", "under 5 minutes"),
    (URL, "2m", "whole number"),
    ("/tmp/j", "8000", "not on an object store; remove it"),
])
def test_a_bad_bound_names_the_option_the_value_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, path: str, value: str, fix: str,
) -> None:
    monkeypatch.setattr(probe, "check_journal", lambda *a: None)
    with pytest.raises(OptionError, match=f"'journalRetryTimeoutMs' = '{value}'") as info:
        parse_options({**_BASE, "journalPath": path, "journalRetryTimeoutMs": value})
    assert fix in str(info.value)


# -- obstore's own retry, over HTTP -----------------------------------------------------------


class _StubS3:
    """A loopback HTTP endpoint that answers every request ``status`` until ``until``
    (monotonic) and for its first ``at_least`` requests, then 404 (an absent key); counts
    requests."""

    def __init__(self) -> None:
        self.status = 503
        self.until = 0.0
        self.at_least = 0
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                stub.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                down = time.monotonic() < stub.until or stub.requests <= stub.at_least
                code = stub.status if down else 404
                body = b"<Error><Code>SlowDown</Code></Error>"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def store(self, timeout_ms: int) -> ObjectStore:
        return ObjectStore(JournalLocation.parse(URL), {
            "aws_endpoint": f"http://127.0.0.1:{self.server.server_address[1]}",
            "aws_access_key_id": "a", "aws_secret_access_key": "b", "aws_region": "us-east-1",
        }, retry_timeout_ms=timeout_ms)


@pytest.fixture
def stub_s3() -> Iterator[_StubS3]:
    stub = _StubS3()
    yield stub
    stub.server.shutdown()
    stub.server.server_close()


def test_obstore_retries_503s_past_its_ten_retries_until_the_bound(stub_s3: _StubS3) -> None:
    # obstore's default gives up after 10 retries (1.7-3.6 s); with the bound it goes on. The
    # outage lasts 4 s and 12 requests at least (a loaded machine makes fewer in 4 s).
    stub_s3.until, stub_s3.at_least = time.monotonic() + 4.0, 12
    started = time.monotonic()
    with pytest.raises(FileNotFoundError):  # the store answered again: the key is absent
        stub_s3.store(20_000).read("j/committed")
    assert time.monotonic() - started >= 4.0 and stub_s3.requests > 11


def test_obstore_stops_at_the_bound_and_the_error_names_it(stub_s3: _StubS3) -> None:
    stub_s3.until = time.monotonic() + 600
    started = time.monotonic()
    with pytest.raises(JournalUnavailable, match=r"journalRetryTimeoutMs=2000"):
        stub_s3.store(2_000).read("j/committed")
    assert 2.0 <= time.monotonic() - started < 2.0 + StoreRetry.MAX_BACKOFF_S + 2


def test_obstore_does_not_retry_a_refusal(stub_s3: _StubS3) -> None:
    stub_s3.status, stub_s3.until = 403, time.monotonic() + 600
    with pytest.raises(JournalError, match="refused"):
        stub_s3.store(20_000).listdir("j/batches")
    assert stub_s3.requests == 1


def test_the_probes_create_applied_whose_answer_was_lost_passes_the_probe(
    tmp_path: Any,
) -> None:
    from pyspark_kafka_share.source.journal.stores.local import LocalStore

    store = LocalStore()
    real = store.create_exclusive
    calls: list[bytes] = []

    def lost_once(path: str, data: bytes, fsync: bool) -> bool:
        calls.append(data)
        created = real(path, data, fsync)
        return created and len(calls) > 1  # the first try applied, its answer lost

    store.create_exclusive = lost_once  # type: ignore[method-assign]
    result = probe._run_probe(store, str(tmp_path))
    assert calls == [b"probe 1", b"probe 2"] and result.first and not result.second
    probe._judge_probe("s3://bucket/j", "why", result, "store", "fix")  # raises if refused
