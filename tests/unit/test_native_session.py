"""The native consumer's pure parts: share-session bookkeeping (``_kafka/native/session.py``),
the consumer APIs' bodies (``_kafka/protocol/consume.py``, against bytes built here from the
message schemas), its membership against a scripted coordinator, its configuration
(``ClientSettings.native_consumer``), and its connection failures reported as librdkafka's
(``_kafka/native/events.py``: a consumer whose bootstrap server refuses connections)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_kafka_share._kafka.native import membership
from pyspark_kafka_share._kafka.native.consumer import NativeConsumerConfig, NativeShareConsumer
from pyspark_kafka_share._kafka.native.events import ConnectionEvents
from pyspark_kafka_share._kafka.native.membership import Membership
from pyspark_kafka_share._kafka.native.session import (
    INT32_MAX,
    Held,
    LeaderSession,
    ShareRecord,
    ranges,
)
from pyspark_kafka_share._kafka.protocol import consume
from pyspark_kafka_share._kafka.protocol.codec import ApiKey, Reader, Writer
from pyspark_kafka_share._kafka.protocol.consume import AckType, AcquireMode, FetchParams
from pyspark_kafka_share._kafka.settings import WORKER_NAMES, ClientSettings
from pyspark_kafka_share._kafka.share import BrokerWatch
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    KafkaConnectionError,
    OptionError,
    is_all_brokers_down,
)

TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"  # a topic id as Kafka prints it
A, B, C = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)


def _session() -> LeaderSession:
    return LeaderSession(1, conn=None)  # type: ignore[arg-type]  # no I/O here


def test_a_new_session_names_every_partition_then_only_changes() -> None:
    s = _session()
    req = s.request("g", "m", [A, B], {})
    assert (req.epoch, set(req.partitions), list(req.forgotten)) == (0, {A, B}, [])
    s.advanced(req, fetch=True)
    req = s.request("g", "m", [A, B], {A: [(5, 6, [1])]})
    assert (req.epoch, dict(req.partitions), list(req.forgotten)) == (1, {A: [(5, 6, [1])]}, [])
    s.advanced(req, fetch=True)
    req = s.request("g", "m", [B, C], {})
    assert (req.epoch, set(req.partitions), list(req.forgotten)) == (2, {C}, [A])
    s.advanced(req, fetch=True)
    assert s.members == {B, C}


def test_the_epoch_wraps_to_1_and_a_reset_reopens() -> None:
    s = _session()
    s.epoch = INT32_MAX
    s.advanced(s.request("g", "m", [A], {}), fetch=True)
    assert s.epoch == 1
    s.reset()
    assert (s.epoch, s.members) == (0, set())
    assert set(s.request("g", "m", [A], {}).partitions) == {A}


def test_an_acknowledgement_does_not_add_a_partition_to_the_session() -> None:
    s = _session()
    s.advanced(s.request("g", "m", [A], {}), fetch=True)
    s.advanced(s.request("g", "m", [A], {B: [(1, 1, [1])]}), fetch=False)
    assert s.members == {A}


def _rec(offset: int) -> ShareRecord:
    return ShareRecord("t", 0, offset, 0, None, b"v", (), 1, 100.0)


def test_held_records_settle_once_and_renew_keeps_them() -> None:
    held = Held()
    for offset in (3, 4, 5, 7):
        held.hold(A, _rec(offset))
    held.gap(A, 6)
    assert held.acknowledge(A, 3, AckType.ACCEPT)
    assert not held.acknowledge(A, 3, AckType.ACCEPT)  # settled already
    assert held.acknowledge(A, 4, AckType.RENEW)
    held.renewed(A, [4], lock_ms=60_000)
    renewed = held.records[A][4]
    assert renewed is not None and renewed.deadline > 100.0  # monotonic clock, now + 60 s
    assert held.take([A]) == {A: [(3, 3, [1]), (4, 4, [4]), (6, 6, [0])]}
    held.release_all()
    assert held.take([A]) == {A: [(4, 5, [2]), (7, 7, [2])]}
    assert held.records == {}


def test_held_offsets_settle_together_all_or_none() -> None:
    held = Held()
    held.hold_offsets(A, range(10, 20))
    assert held.acknowledge_offsets(A, [12, 13, 99, 14], AckType.ACCEPT) == 99  # not held
    assert held.acknowledge_offsets(A, [12, 13, 12], AckType.ACCEPT) == 12  # given twice
    assert held.pending == {} and len(held.records[A]) == 10  # nothing settled by either
    assert held.acknowledge_offsets(A, [15, 16], AckType.RENEW) is None  # they stay held
    assert held.acknowledge_offsets(A, [12, 13], AckType.ACCEPT) is None
    assert held.acknowledge_offsets(A, [13], AckType.ACCEPT) == 13  # settled already
    assert sorted(held.records[A]) == [10, 11, 14, 15, 16, 17, 18, 19]
    assert held.acknowledge_offsets(A, list(range(10, 20)), AckType.RELEASE) == 12
    rest = [10, 11, 14, 15, 16, 17, 18, 19]
    assert held.acknowledge_offsets(A, rest, AckType.RELEASE) is None
    assert held.records[A] == {}
    assert held.take([A]) == {A: [(10, 11, [2]), (12, 13, [1]), (14, 19, [2])]}


def test_ranges_merge_consecutive_offsets_of_one_type() -> None:
    acks = {1: AckType.ACCEPT, 2: AckType.ACCEPT, 3: AckType.REJECT, 5: AckType.REJECT}
    assert ranges(acks) == [(1, 2, [1]), (3, 3, [3]), (5, 5, [3])]
    unordered = {9: AckType.GAP, 4: AckType.ACCEPT, 8: AckType.GAP, 3: AckType.ACCEPT,
                 5: AckType.RELEASE, 7: AckType.GAP}
    assert ranges(unordered) == [(3, 4, [1]), (5, 5, [2]), (7, 9, [0])]
    assert ranges({}) == []


# -- bodies ----------------------------------------------------------------------------------


def _heartbeat_response(assignment: dict[str, list[int]] | None, *, code: int = 0,
                        member_id: str | None = "member", epoch: int = 3,
                        interval_ms: int = 1_000) -> bytes:
    """A ShareGroupHeartbeat v1 response; ``assignment`` None: none sent."""
    w = Writer(flexible=True).int32(0).int16(code).string(None).string(member_id).int32(epoch)
    w.int32(interval_ms)
    if assignment is None:
        w.int8(-1)
    else:
        w.int8(1).array_header(len(assignment))
        for topic_id, parts in assignment.items():
            w.uuid(topic_id).int32_array(parts).tags()
        w.tags()
    return w.tags().getvalue()


@pytest.mark.parametrize("assignment", [None, {}, {TOPIC: [0, 2]}])
def test_heartbeat_response_with_and_without_an_assignment(
        assignment: dict[str, list[int]] | None) -> None:
    r = Reader(_heartbeat_response(assignment), flexible=True)
    answer = consume.decode_heartbeat_response(1, r)
    r.expect_end("heartbeat")
    want = None if assignment is None else {k: tuple(v) for k, v in assignment.items()}
    assert (answer.member_id, answer.member_epoch, answer.assignment) == ("member", 3, want)


def _session_request(acks: dict[Any, Any]) -> consume.ShareSessionRequest:
    return consume.ShareSessionRequest("g", "m", 1, acks)


def test_record_limit_and_renew_need_version_2() -> None:
    strict = FetchParams(acquire_mode=AcquireMode.RECORD_LIMIT)
    with pytest.raises(ValueError, match="v2"):
        consume.encode_share_fetch_request(1, _session_request({}), strict)
    with pytest.raises(ValueError, match="v2"):
        consume.encode_share_acknowledge_request(1, _session_request({A: [(1, 1, [4])]}))


def test_share_fetch_v2_carries_the_acquire_mode_and_the_renew_flag() -> None:
    body = consume.encode_share_fetch_request(
        2, _session_request({A: [(1, 1, [4])]}),
        FetchParams(max_records=7, batch_size=5, acquire_mode=AcquireMode.RECORD_LIMIT))
    r = Reader(body, flexible=True)
    assert (r.string(), r.string(), r.int32()) == ("g", "m", 1)
    r.int32(), r.int32(), r.int32()  # MaxWaitMs, MinBytes, MaxBytes
    assert (r.int32(), r.int32(), r.int8(), r.boolean()) == (7, 5, 1, True)


def _fetch_response() -> bytes:
    w = Writer(flexible=True).int32(0).int16(0).string(None).int32(15_000)
    w.array_header(1).uuid(TOPIC).array_header(1)
    w.int32(0).int16(0).string(None).int16(0).string(None)
    w.int32(1).int32(5).tags()  # CurrentLeader
    w.uvarint(4).int8(1).int8(2).int8(3)  # Records: 3 bytes
    w.array_header(1).int64(10).int64(12).int16(2).tags()
    w.tags().tags()
    w.array_header(1).int32(1).string("h").int32(9092).string(None).tags()
    return w.tags().getvalue()


def test_share_fetch_response_is_read_to_its_end() -> None:
    r = Reader(_fetch_response(), flexible=True)
    answer = consume.decode_share_fetch_response(2, r)
    r.expect_end("ShareFetch")
    (part,) = answer.partitions
    assert answer.lock_timeout_ms == 15_000
    assert (part.topic_id, part.partition, part.leader_id, part.leader_epoch) == (TOPIC, 0, 1, 5)
    assert part.records == b"\x01\x02\x03"
    assert part.acquired == (consume.AcquiredRange(10, 12, 2),)
    assert answer.nodes[1].port == 9092


# -- configuration ---------------------------------------------------------------------------


def test_settings_derive_the_config_and_refuse_what_it_cannot_honour() -> None:
    settings = ClientSettings("h:9092", "g", extra=(("max.poll.records", "9"),),
                              names=WORKER_NAMES)
    config = settings.native_consumer(client_id="w", max_poll_records=5, record_limit=True)
    assert (config.max_poll_records, config.record_limit, config.client_id) == (5, True, "w")
    assert (config.bootstrap_servers, config.group_id) == ("h:9092", "g")
    bad = ClientSettings("h:9092", "g", extra=(("queued.min.messages", "9"),),
                         names=WORKER_NAMES)
    with pytest.raises(OptionError, match=r"consumer_config\['queued.min.messages'\]"):
        bad.native_consumer(client_id="w")


# -- membership (a scripted coordinator: no sockets) ------------------------------------------


class _Coordinator:
    """Answers FindCoordinator with itself and ShareGroupHeartbeat from a script; records
    each heartbeat's (member epoch, subscribed topics). Answers give ``interval_ms``; with
    ``repeat_last`` the script's last answer is given to every heartbeat after it."""

    def __init__(self, script: list[tuple[int, int, dict[str, list[int]] | None]], *,
                 interval_ms: int = 1_000, repeat_last: bool = False) -> None:
        self.script = script
        self.interval_ms, self.repeat_last = interval_ms, repeat_last
        self.sent: list[tuple[int, tuple[str, ...] | None]] = []

    def version_for(self, api_key: ApiKey) -> int:
        return {ApiKey.FIND_COORDINATOR: 6, ApiKey.SHARE_GROUP_HEARTBEAT: 1}[api_key]

    def send(self, api_key: ApiKey, version: int, body: bytes, deadline: float) -> Reader:
        if api_key == ApiKey.FIND_COORDINATOR:
            w = Writer(flexible=True).int32(0).array_header(1)
            w.string("g").int32(1).string("h").int32(9092).int16(0).string(None).tags()
            return Reader(w.tags().getvalue(), flexible=True)
        r = Reader(body, flexible=True)
        r.string(), r.string()
        epoch = r.int32()
        r.nullable_string()
        n = r.uvarint() - 1
        self.sent.append((epoch, None if n < 0 else tuple(r.string() for _ in range(n))))
        last = self.repeat_last and len(self.script) == 1
        code, new_epoch, assignment = self.script[0] if last else self.script.pop(0)
        body = _heartbeat_response(assignment, code=code, member_id=None, epoch=new_epoch,
                                   interval_ms=self.interval_ms)
        return Reader(body, flexible=True)

    def close(self) -> None:
        pass


def _membership(coordinator: _Coordinator) -> Membership:
    return Membership("g", ("t",), lambda host, port, deadline: coordinator,  # type: ignore[arg-type,return-value]
                      [("h", 9092)], 5.0)


def test_a_member_joins_then_is_fenced_and_rejoins_with_its_id() -> None:
    fenced = int(ErrorCode.FENCED_MEMBER_EPOCH)
    coordinator = _Coordinator([(0, 3, {TOPIC: [0, 1]}), (0, 3, None), (fenced, 0, None),
                                (0, 5, {TOPIC: [1]})])
    m = _membership(coordinator)
    member = m.member_id
    m._beat()
    assert (m.epoch, m.assignment()) == (3, {TOPIC: (0, 1)})
    m._beat()  # no assignment sent: unchanged
    assert m.assignment() == {TOPIC: (0, 1)}
    with pytest.raises(BrokerError):  # retried by the heartbeat loop
        m._beat()
    assert (m.epoch, m.assignment()) == (0, {})
    m._beat()
    assert (m.epoch, m.assignment(), m.member_id) == (5, {TOPIC: (1,)}, member)
    assert coordinator.sent == [(0, ("t",)), (3, None), (3, None), (0, ("t",))]


def test_a_member_without_partitions_beats_again_soon_then_at_the_brokers_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator assigns a partition only after the join's answer (its share state
    initialized, its assignment interval passed): until one comes the member beats again
    every EAGER_S, for up to EAGER_WINDOW_S; then at the broker's interval; eager again
    after a rejoin."""
    fenced = int(ErrorCode.FENCED_MEMBER_EPOCH)
    coordinator = _Coordinator([(0, 3, {})] + [(0, 3, None)] * 3 + [
        (0, 4, {TOPIC: [0]}), (0, 4, None), (fenced, 0, None), (0, 6, {}), (0, 6, None),
        (0, 7, {TOPIC: [0]})], interval_ms=2_000)
    m = _membership(coordinator)
    waits = []
    for _ in range(6):
        m._beat()
        waits.append(m._next_wait())
    with pytest.raises(BrokerError):  # fenced: rejoined by the heartbeat loop
        m._beat()
    m._beat()
    waits.append(m._next_wait())
    monkeypatch.setattr(membership, "EAGER_WINDOW_S", 0.0)  # the window has passed
    for _ in range(2):
        m._beat()
        waits.append(m._next_wait())
    eager = membership.EAGER_S
    assert waits == [eager] * 4 + [2.0, 2.0] + [eager] + [2.0, 2.0]


def test_the_heartbeat_thread_brings_the_assignment_before_the_brokers_interval() -> None:
    """The heartbeat loop itself: the join's answer has no partition and the broker's interval
    is 60 s, yet the assignment arrives on the eager beats (at the interval it would take
    60 s; the bound only guards a hang)."""
    coordinator = _Coordinator([(0, 3, {}), (0, 3, None), (0, 4, {TOPIC: [0]}), (0, 4, None)],
                               interval_ms=60_000, repeat_last=True)
    m = _membership(coordinator)
    m.start()
    try:
        assert m.wait_joined(30)
        deadline = time.monotonic() + 30
        while not m.assignment():
            assert time.monotonic() < deadline, coordinator.sent
            time.sleep(0.01)
        assert m.assignment() == {TOPIC: (0,)}
        assert m.fatal is None
    finally:
        m._stop.set()
        m._thread.join(5)
    assert [epoch for epoch, _ in coordinator.sent[:3]] == [0, 3, 3]


def test_an_authorization_error_is_fatal_not_retried() -> None:
    m = _membership(_Coordinator([(int(ErrorCode.GROUP_AUTHORIZATION_FAILED), 0, None)]))
    with pytest.raises(AuthorizationError):
        m._beat()


def _closed_port() -> int:
    """A local port nobody listens on (connections to it are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_no_broker_answering_is_reported_as_all_brokers_down_not_empty_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real consumer whose bootstrap server refuses connections: its polls come back empty,
    and ``take_errors`` says why (``_ALL_BROKERS_DOWN``, as librdkafka's ``error_cb``), so
    that the workers' ``BrokerWatch`` fails it after its limit instead of reading no data."""
    config = NativeConsumerConfig(f"127.0.0.1:{_closed_port()}", "g", timeout_s=1.0)
    errors: list[Any] = []
    with NativeShareConsumer(config, ["t"]) as consumer:
        deadline = time.monotonic() + 30  # only guards a hang: refusals come in milliseconds
        while not any(is_all_brokers_down(e) for e in errors):
            assert time.monotonic() < deadline, f"no outage reported: {errors}"
            assert consumer.poll(0.2) == []
            errors.extend(consumer.take_errors())
    down = next(e for e in errors if is_all_brokers_down(e))
    assert (down.name(), down.fatal()) == ("_ALL_BROKERS_DOWN", False)
    assert "no bootstrap server answered" in down.str(), down
    monkeypatch.setattr(BrokerWatch, "_cluster_answers", lambda self: False)
    watch = BrokerWatch(ClientSettings("h:1", "g", names=WORKER_NAMES), ["t"], limit_s=0.2,
                        every_s=0.05)
    watch.observe(errors, got_records=False)
    assert watch.down
    with pytest.raises(BrokerError, match=r"all brokers down for more than 0s.*"
                       r"_ALL_BROKERS_DOWN: .*no bootstrap server answered"):
        while True:
            time.sleep(0.06)
            watch.observe([], got_records=False)


def test_connection_events_are_bounded_and_taken_once() -> None:
    events = ConnectionEvents(limit=3)
    for i in range(5):
        events.transport(f"lost {i}")
    events.all_down("none answered")
    taken = events.take()
    assert [str(e) for e in taken] == ["_TRANSPORT: lost 3", "_TRANSPORT: lost 4",
                                       "_ALL_BROKERS_DOWN: none answered"]
    assert [is_all_brokers_down(e) for e in taken] == [False, False, True]
    assert events.take() == []


def _acknowledge_response(code: int, leader: int, top: int = 0) -> bytes:
    """A ShareAcknowledge v2 response: partition 0 of TOPIC answered ``code``, the current
    leader ``leader`` and its endpoint; ``top``: the response's own error code."""
    w = Writer(flexible=True).int32(0).int16(top).string(None).int32(15_000)
    w.array_header(1).uuid(TOPIC).array_header(1)
    w.int32(0).int16(code).string(None)
    w.int32(leader).int32(7).tags()  # CurrentLeader
    w.tags().tags()
    w.array_header(1).int32(leader).string("h2").int32(9093).string(None).tags()
    return w.tags().getvalue()


class _AnsweringConn:
    """A leader's connection that answers every request with ``response``."""

    def __init__(self, response: bytes) -> None:
        self.response, self.sent = response, list[ApiKey]()

    def version_for(self, api: ApiKey) -> int:
        return 2

    def send(self, api: ApiKey, version: int, body: bytes, deadline: float) -> Reader:
        self.sent.append(api)
        return Reader(self.response, flexible=True)

    def close(self) -> None:
        pass


def test_an_acknowledgement_answered_not_leader_moves_to_the_named_leader() -> None:
    """A RENEW (as the exactly-once commit check sends) to a leader that moved: it fails with
    the code, and the partition's leader becomes the one the broker named, metadata to be
    refreshed before the next fetch."""
    config = NativeConsumerConfig(f"127.0.0.1:{_closed_port()}", "g", timeout_s=1.0)
    with NativeShareConsumer(config, ["t"]) as consumer:
        conn = _AnsweringConn(_acknowledge_response(ErrorCode.NOT_LEADER_OR_FOLLOWER, 2))
        consumer._names, consumer._nodes = {TOPIC: "t"}, {1: ("h1", 9092), 2: ("h2", 9093)}
        consumer._leaders, consumer._stale = {A: 1}, False
        consumer._conns = {1: LeaderSession(1, conn, epoch=1, members={A})}  # type: ignore[arg-type]
        record = ShareRecord("t", 0, 10, 1, None, b"v", (), 1, time.monotonic() + 30)
        consumer._held.hold(A, record)
        consumer.acknowledge(record, "RENEW")
        assert consumer.commit_sync() == {("t", 0): ErrorCode.NOT_LEADER_OR_FOLLOWER}
        assert conn.sent == [ApiKey.SHARE_ACKNOWLEDGE]
        assert (consumer._leaders[A], consumer._stale) == (2, True)
        assert consumer.held() == [record]  # a RENEW keeps it held (its lock is the broker's)
        assert consumer.acquisitions_lost() == 1, "a moved leader may have released it"


class _LostConn(_AnsweringConn):
    """A leader's connection that is lost on the first request."""

    def send(self, api: ApiKey, version: int, body: bytes, deadline: float) -> Reader:
        raise KafkaConnectionError("reset by peer")


@pytest.mark.parametrize("conn", [
    _LostConn(b""), _AnsweringConn(_acknowledge_response(0, 1, ErrorCode.SHARE_SESSION_NOT_FOUND))],
    ids=["connection-lost", "session-not-found"])
def test_a_lost_share_session_is_counted_as_acquisitions_lost(conn: _AnsweringConn) -> None:
    """The broker releases what a member acquired in a share session it no longer has: a
    caller holding records across polls (the source's slots of several fetches) reads that
    from ``acquisitions_lost``."""
    config = NativeConsumerConfig(f"127.0.0.1:{_closed_port()}", "g", timeout_s=1.0)
    with NativeShareConsumer(config, ["t"]) as consumer:
        consumer._names, consumer._nodes = {TOPIC: "t"}, {1: ("h1", 9092)}
        consumer._leaders, consumer._stale = {A: 1}, False
        consumer._conns = {1: LeaderSession(1, conn, epoch=1, members={A})}  # type: ignore[arg-type]
        record = ShareRecord("t", 0, 10, 1, None, b"v", (), 1, time.monotonic() + 30)
        consumer._held.hold(A, record)
        assert consumer.acquisitions_lost() == 0
        consumer.acknowledge(record, "ACCEPT")
        consumer.commit_sync()
        assert consumer.acquisitions_lost() == 1


def test_a_poll_is_strict_with_record_limit_or_near_its_cap() -> None:
    """Strict fetches split producer batches (costly on the broker): without record_limit a
    poll is strict only once its cap is under two polls, so whole batches never pass it."""
    batches = NativeConsumerConfig("b:9092", "g", max_poll_records=2_000)
    assert not batches.strict(None)
    assert not batches.strict(4_000), "two polls left: one batch-optimized poll cannot pass it"
    assert batches.strict(3_999)
    assert batches.strict(1)
    strict = NativeConsumerConfig("b:9092", "g", max_poll_records=2_000, record_limit=True)
    assert strict.strict(None) and strict.strict(1_000_000)
    assert strict.fetch_params(100, 7, True).acquire_mode == AcquireMode.RECORD_LIMIT
    assert batches.fetch_params(100, 7, False).acquire_mode == AcquireMode.BATCH_OPTIMIZED


HANDS_OUT = [1_200, 500, 2_000]


def _three_leaders(consumer: NativeShareConsumer, monkeypatch: pytest.MonkeyPatch,
                   fetch_from: Callable[..., list[Any]]) -> None:
    """``consumer`` assigned partitions 0-2 of one topic, led by nodes 1-3, its fetches from
    a leader answered by ``fetch_from``."""
    monkeypatch.setattr(consumer._membership, "assignment", lambda: {TOPIC: [0, 1, 2]})
    consumer._names, consumer._stale = {TOPIC: "t"}, False
    consumer._leaders = {A: 1, B: 2, C: 3}
    monkeypatch.setattr(consumer, "_fetch_from", fetch_from)


@pytest.mark.parametrize(("max_records", "record_limit", "asked"), [
    (4_000, False, [2_000, 800, 300]),  # capped, batch-optimized: what is left of the poll
    (3_000, True, [2_000, 800, 300]),  # strict: the same
    (1_000, False, [1_000]),  # the first leader fills it: the others wait their turn
    (None, False, [2_000, 2_000, 2_000]),  # no cap: a full poll from every leader
], ids=["capped", "strict", "filled", "uncapped"])
def test_a_capped_poll_asks_each_leader_for_what_is_left_of_it(
    monkeypatch: pytest.MonkeyPatch, max_records: int | None, record_limit: bool,
    asked: list[int],
) -> None:
    """A poll of partitions led by three brokers stays within its cap: each leader in turn is
    asked for what the ones before left of it, strict or not (a batch-optimized poll under a
    cap asked each leader for a full poll, and a task took more than its share)."""
    config = NativeConsumerConfig(f"127.0.0.1:{_closed_port()}", "g", timeout_s=1.0,
                                  max_poll_records=2_000, record_limit=record_limit)
    sent: list[int] = []
    gives = iter(HANDS_OUT)  # what each leader has, handed out up to what it is asked

    def fetch_from(node: int, tps: list[Any], wait_ms: int, budget: int, arrow: bool | None,
                   *, strict: bool) -> list[Any]:
        sent.append(budget)
        return [node] * min(budget, next(gives))

    with NativeShareConsumer(config, ["t"]) as consumer:
        _three_leaders(consumer, monkeypatch, fetch_from)
        limit = 2_000 if max_records is None else min(max_records, 2_000)
        got = consumer._fetch_once(100, limit, None, config.strict(max_records),
                                   capped=max_records is not None)
    assert sent == asked
    assert len(got) == sum(min(a, g) for a, g in zip(asked, HANDS_OUT, strict=False))


def test_each_leader_is_asked_first_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls that the first leader asked fills would never reach the other leaders'
    partitions while it has records waiting: the leader asked first rotates from poll to
    poll."""
    config = NativeConsumerConfig(f"127.0.0.1:{_closed_port()}", "g", timeout_s=1.0,
                                  max_poll_records=2_000)
    first: list[int] = []

    def fetch_from(node: int, tps: list[Any], wait_ms: int, budget: int, arrow: bool | None,
                   *, strict: bool) -> list[Any]:
        if budget == 2_000:
            first.append(node)
        return [node] * budget  # every leader has more than a poll waiting

    with NativeShareConsumer(config, ["t"]) as consumer:
        _three_leaders(consumer, monkeypatch, fetch_from)
        for _ in range(3):
            got = consumer._fetch_once(100, 2_000, None, False, capped=True)
            assert len(got) == 2_000 and set(got) == {first[-1]}, "one leader fills the poll"
    assert sorted(first) == [1, 2, 3], f"the leaders asked first: {first}"


@pytest.mark.parametrize(("max_records", "soft_cap", "want"), [
    (None, 250, (250, False)),  # the hold's share of the in-flight limit: whole batches
    (100_000, 250, (250, False)),  # a budget far off: still whole batches
    (3_000, 250, (250, True)),  # the budget within two polls: strict, so it is met exactly
    (None, None, (2_000, False)),
], ids=["soft-only", "budget-far", "budget-near", "uncapped"])
def test_a_soft_cap_limits_a_poll_without_making_it_strict(
    monkeypatch: pytest.MonkeyPatch, max_records: int | None, soft_cap: int | None,
    want: tuple[int, bool],
) -> None:
    """The source's share of a partition's in-flight limit caps a native poll, but only the
    task's budget makes it strict: strict polls split producer batches, which the broker then
    tracks per offset (measured 3x slower)."""
    config = NativeConsumerConfig(f"127.0.0.1:{_closed_port()}", "g", timeout_s=1.0,
                                  max_poll_records=2_000)
    asked: list[tuple[int, bool]] = []

    def fetch_once(wait_ms: int, limit: int, arrow: bool | None, strict: bool, *,
                   capped: bool) -> list[Any]:
        asked.append((limit, strict))
        return ["r"]

    with NativeShareConsumer(config, ["t"]) as consumer:
        monkeypatch.setattr(consumer._membership, "wait_joined", lambda timeout: True)
        monkeypatch.setattr(consumer, "_fetch_once", fetch_once)
        consumer.poll(1.0, max_records, soft_cap=soft_cap)
    assert asked == [want]
