"""The native share consumer: KIP-932 queue semantics on the project's own protocol client,
with what confluent-kafka's share consumer lacks: RENEW (KIP-1222), the strict
``record_limit`` acquire mode (KIP-1206), each record's acquisition deadline, wakeup.

It fetches only inside :meth:`NativeShareConsumer.poll` (an idle consumer acquires nothing).
Membership runs on a heartbeat thread (:mod:`.membership`); share sessions and the records
held are in :mod:`.session`. Lost connections are reported as librdkafka's ``error_cb``
reports them (:mod:`.events`, :meth:`~NativeShareConsumer.take_errors`): a broker outage is
never just empty polls. Not thread-safe, except :meth:`~NativeShareConsumer.wakeup`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pyarrow as pa

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.native.columns import acquired_batch
from pyspark_kafka_share._kafka.native.events import ConnectionEvent, ConnectionEvents
from pyspark_kafka_share._kafka.native.membership import Membership
from pyspark_kafka_share._kafka.native.session import (
    Held,
    LeaderSession,
    ShareRecord,
)
from pyspark_kafka_share._kafka.protocol import consume
from pyspark_kafka_share._kafka.protocol import messages as msg
from pyspark_kafka_share._kafka.protocol.client import BrokerConnection, parse_bootstrap
from pyspark_kafka_share._kafka.protocol.codec import ApiKey
from pyspark_kafka_share._kafka.protocol.consume import (
    AckType,
    AcquireMode,
    FetchParams,
    ShareAnswer,
    SharePartitionAnswer,
    ShareSessionRequest,
    TopicPartitionId,
)
from pyspark_kafka_share._kafka.protocol.records import decode_batches
from pyspark_kafka_share.errors import (
    ErrorCode,
    KafkaConnectionError,
    KafkaShareError,
    OptionError,
    UnsupportedVersionError,
    WakeupError,
    error_for,
)

__all__ = ["NativeConsumerConfig", "NativeShareConsumer", "ShareRecord"]

_log = logging.getLogger(__name__)

_SESSION_LOST = {ErrorCode.SHARE_SESSION_NOT_FOUND, ErrorCode.INVALID_SHARE_SESSION_EPOCH}
_LEADER_MOVED = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                 ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.LEADER_NOT_AVAILABLE,
                 ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID,
                 ErrorCode.KAFKA_STORAGE_ERROR}
_ACK_NAMES = {"ACCEPT": AckType.ACCEPT, "RELEASE": AckType.RELEASE,
              "REJECT": AckType.REJECT, "RENEW": AckType.RENEW}


@dataclass(frozen=True)
class NativeConsumerConfig:
    """The native consumer's settings (derived by ``ClientSettings.native_consumer``).
    ``record_limit``: acquire at most ``max_poll_records`` records per fetch, strictly
    (KIP-1206), instead of whole producer batches. Without it a poll is strict only near
    the ``max_records`` it is given (:meth:`NativeShareConsumer.poll`)."""

    bootstrap_servers: str
    group_id: str
    client_id: str = "pyspark-kafka-share-native"
    connection: ConnectionConfig | None = None
    max_poll_records: int = 500
    record_limit: bool = False
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 52_428_800
    timeout_s: float = 30.0
    check_crcs: bool = True

    def strict(self, max_records: int | None) -> bool:
        """Whether a poll capped at ``max_records`` fetches strictly: always with
        ``record_limit``, else once the cap is under two polls (whole producer batches of up
        to ``max_poll_records`` then never pass it). Strict fetches split producer batches,
        which the broker then tracks per offset (measured: ShareAcknowledge 3.6x, ShareFetch
        3x slower), so only where needed."""
        return self.record_limit or (max_records is not None and
                                     max_records < 2 * self.max_poll_records)

    def fetch_params(self, max_wait_ms: int, max_records: int, strict: bool) -> FetchParams:
        mode = AcquireMode.RECORD_LIMIT if strict else AcquireMode.BATCH_OPTIMIZED
        return FetchParams(max_wait_ms, self.fetch_min_bytes, self.fetch_max_bytes,
                           max_records, max_records, mode)


class NativeShareConsumer:
    """A share-group consumer of ``topics`` with explicit acknowledgement."""

    def __init__(self, config: NativeConsumerConfig, topics: Sequence[str]) -> None:
        if config.max_poll_records < 1:
            raise OptionError("max.poll.records", config.max_poll_records,
                              "give a positive number")
        self.config = config
        self._bootstrap = parse_bootstrap(config.bootstrap_servers)
        self._conns: dict[int, LeaderSession] = {}
        self._nodes: dict[int, tuple[str, int]] = {}
        self._leaders: dict[TopicPartitionId, int] = {}
        self._names: dict[str, str] = {}
        self._stale = True
        self._held = Held()
        self._results: dict[tuple[str, int], int] = {}
        self._woken = False
        self._error: KafkaShareError | None = None  # a partition's, raised by the next poll
        self._closed = False
        self._events = ConnectionEvents()
        self._sessions_lost = 0  # share sessions dropped or reset, leaders moved
        self._turn = 0  # which leader a poll asks first (each in turn, see _fetch_once)
        self.batch_codecs: Counter[str] = Counter()
        """Record batches decoded, per codec (``"none"``, ``"gzip"``, ...)."""
        self._membership = Membership(config.group_id, tuple(topics), self._connect,
                                      self._bootstrap, config.timeout_s,
                                      events=self._events)
        self._membership.start()

    def __enter__(self) -> NativeShareConsumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def member_id(self) -> str:
        return self._membership.member_id

    # -- the public API --

    def poll(self, timeout_s: float, max_records: int | None = None, *,
             soft_cap: int | None = None) -> list[ShareRecord]:
        """Fetch (and acquire) records for up to ``timeout_s``; piggyback the acknowledgements
        made since. ``max_records``: at most this many, if fewer than ``max_poll_records``
        (strictly with ``record_limit``; without it, strictly once fewer than twice
        ``max_poll_records``, so that whole producer batches of up to ``max_poll_records``
        never take it past ``max_records``). ``soft_cap``: a further cap whole producer
        batches may pass (it never makes a poll strict). Raises :class:`WakeupError` after
        :meth:`wakeup`."""
        records: list[ShareRecord] = self._poll(timeout_s, max_records, None, soft_cap)
        return records

    def poll_arrow(self, timeout_s: float, max_records: int | None = None, *,
                   include_headers: bool = False,
                   soft_cap: int | None = None) -> list[pa.RecordBatch]:
        """:meth:`poll`, its records as Arrow batches of the source's schema (one per
        partition fetched, ``_kafka.arrow.arrow_schema``), decoded without an object per
        record (:mod:`.columns`); acknowledge them with :meth:`acknowledge_offsets`."""
        batches: list[pa.RecordBatch] = self._poll(timeout_s, max_records, include_headers,
                                                   soft_cap)
        return batches

    def _poll(self, timeout_s: float, max_records: int | None, arrow: bool | None,
              soft_cap: int | None = None) -> list[Any]:
        """``arrow``: None for records, else Arrow batches (with headers if True)."""
        self._check_open()
        caps = [n for n in (max_records, soft_cap) if n is not None]
        limit = max(1, min([*caps, self.config.max_poll_records]))
        strict = self.config.strict(max_records)
        deadline = time.monotonic() + timeout_s
        while not self._membership.wait_joined(min(0.1, max(0.0, timeout_s))):
            self._raise_pending()  # a wakeup ends the wait for an assignment too
            if time.monotonic() >= deadline:
                return []
        while True:
            self._raise_pending()
            if self._acknowledge_first():
                self._acknowledge_all(final=False)
            left_ms = int((deadline - time.monotonic()) * 1000)
            records = self._fetch_once(max(0, min(left_ms, self.config.fetch_max_wait_ms)),
                                       limit, arrow, strict, capped=bool(caps))
            if records or time.monotonic() >= deadline:
                return records

    def _acknowledge_first(self) -> bool:
        """Whether pending acknowledgements need a ShareAcknowledge before the fetch: RENEWs
        (sent alone, so that the renewed deadline is known before the next fetch) and those
        of partitions no longer assigned (no fetch carries them)."""
        assigned = {(t, p) for t, parts in self._membership.assignment().items() for p in parts}
        return any(acks and (tp not in assigned or AckType.RENEW in acks.values())
                   for tp, acks in self._held.pending.items())

    def acknowledge(self, record: ShareRecord, kind: str | AckType = AckType.ACCEPT) -> None:
        """Settle ``record`` as ACCEPT, RELEASE or REJECT, or RENEW its lock (it stays held);
        sent with the next poll (RENEW: before its fetch) or :meth:`commit_sync`."""
        ack = _ACK_NAMES.get(kind.upper()) if isinstance(kind, str) else AckType(kind)
        if ack is None or ack == AckType.GAP:
            raise OptionError("kind", kind, "give ACCEPT, RELEASE, REJECT or RENEW")
        tp = self._tp(record.topic, record.partition)
        if not self._held.acknowledge(tp, record.offset, ack):
            raise OptionError("record", f"{record.topic}-{record.partition}@{record.offset}",
                              "it is not held by this consumer (already acknowledged?)")

    def acknowledge_offsets(self, topic: str, partition: int, offsets: Iterable[int],
                            kind: str | AckType = AckType.ACCEPT) -> None:
        """:meth:`acknowledge` the held records at ``offsets`` of ``topic``-``partition``
        (those :meth:`poll_arrow` delivered, or any held); all or none."""
        ack = _ACK_NAMES.get(kind.upper()) if isinstance(kind, str) else AckType(kind)
        if ack is None or ack == AckType.GAP:
            raise OptionError("kind", kind, "give ACCEPT, RELEASE, REJECT or RENEW")
        tp = self._tp(topic, partition)
        offset = self._held.acknowledge_offsets(tp, list(offsets), ack)
        if offset is not None:
            raise OptionError("record", f"{topic}-{partition}@{offset}",
                              "it is not held by this consumer (already acknowledged?)")

    def commit_sync(self) -> dict[tuple[str, int], int]:
        """Send every pending acknowledgement now (ShareAcknowledge); return the error code
        of each partition settled since the last call (0: success)."""
        self._check_open()
        self._acknowledge_all(final=False)
        results, self._results = self._results, {}
        return results

    def held(self) -> list[ShareRecord]:
        """The records delivered and not yet settled (their deadlines included)."""
        return [r for recs in self._held.records.values() for r in recs.values()
                if r is not None]

    def acquisitions_lost(self) -> int:
        """How many times records this consumer acquired may have been released behind its
        back: a share session lost (its connection, or the broker reset it), a partition's
        leader moved, the member fenced. Only grows; a caller holding records across polls
        compares it before and after (the source's slots of several fetches)."""
        return self._sessions_lost + self._membership.rejoins

    def take_errors(self) -> list[ConnectionEvent]:
        """The connection failures since the last call (``_TRANSPORT``: a broker's connection
        lost or refused; ``_ALL_BROKERS_DOWN``: no broker answered), as librdkafka reports
        them through ``error_cb``; thread-safe."""
        return self._events.take()

    def wakeup(self) -> None:
        """Make the current (or next) :meth:`poll` raise :class:`WakeupError`; thread-safe."""
        self._woken = True

    def close(self) -> None:
        """RELEASE every record held, close the share sessions, leave the group."""
        if self._closed:
            return
        self._closed = True
        try:
            self._held.release_all()
            self._acknowledge_all(final=True)
        except KafkaShareError as exc:
            _log.info("native share consumer of %r: releasing on close failed: %s",
                      self.config.group_id, exc)
        finally:
            self._membership.leave()
            for session in self._conns.values():
                session.conn.close()
            self._conns = {}

    # -- fetching --

    def _fetch_once(self, max_wait_ms: int, limit: int, arrow: bool | None,
                    strict: bool, *, capped: bool) -> list[Any]:
        assignment = self._assigned()
        by_node: dict[int, list[TopicPartitionId]] = {}
        for tp in assignment:
            node = self._leaders.get(tp)
            if node is not None:
                by_node.setdefault(node, []).append(tp)
        for node in self._conns:
            by_node.setdefault(node, [])  # forget what it no longer leads for us
        out: list[Any] = []
        got = 0
        nodes = [n for n, tps in by_node.items() if tps or self._conns[n].members]
        if not nodes:
            time.sleep(min(max_wait_ms, 100) / 1000.0)
            return out
        wait = max_wait_ms // len(nodes)
        # each leader is asked first in turn: a capped poll that the first leader fills would
        # otherwise never reach the others' partitions while the first has records waiting
        self._turn = (self._turn + 1) % len(nodes)
        for node in nodes[self._turn:] + nodes[:self._turn]:
            # a capped poll (strict or not) asks each leader for what is left of it: a poll
            # of several leaders stays within its cap, not one cap per leader
            budget = limit - got if strict or capped else limit
            if budget <= 0:
                break  # the other leaders' turn comes with the next poll
            fetched = self._fetch_from(node, by_node[node], wait, budget, arrow, strict=strict)
            got += sum(b.num_rows for b in fetched) if arrow is not None else len(fetched)
            out.extend(fetched)
        return out

    def _assigned(self) -> list[TopicPartitionId]:
        assignment = self._membership.assignment()
        tps = [(t, p) for t, parts in assignment.items() for p in parts]
        if self._stale or any(tp not in self._leaders for tp in tps):
            try:
                self._refresh_metadata(list(assignment))
            except KafkaConnectionError as exc:  # brokers down: retried by the next fetch
                _log.info("native share consumer of %r: metadata: %s", self.config.group_id,
                          exc)
                self._events.all_down(f"metadata of group {self.config.group_id!r}: {exc}")
        return tps

    def _fetch_from(self, node: int, tps: list[TopicPartitionId], wait_ms: int,
                    max_records: int, arrow: bool | None, *, strict: bool) -> list[Any]:
        try:
            session = self._session(node)
        except KafkaConnectionError as exc:
            _log.debug("leader %d unreachable: %s", node, exc)
            self._events.transport(f"leader {node} unreachable: {exc}")
            self._stale = True
            time.sleep(min(wait_ms, 200) / 1000.0)  # no busy loop while it is down
            return []
        acks = self._held.take(tps)
        req = session.request(self.config.group_id, self.member_id, tps, acks)
        version = session.conn.version_for(ApiKey.SHARE_FETCH)
        body = consume.encode_share_fetch_request(  # v1 (refused with record_limit): batches
            version, req, self.config.fetch_params(wait_ms, max_records, strict and version >= 2))
        answer = self._exchange(session, req, ApiKey.SHARE_FETCH, version, body)
        if answer is None:
            return []
        session.advanced(req, fetch=True)
        received = time.monotonic()
        out: list[Any] = []
        for part in answer.partitions:
            self._settled(part, req, answer.lock_timeout_ms)
            try:
                if not self._partition_ok(part) or not part.acquired:
                    continue
                if arrow is None:
                    out.extend(self._acquired(part, received + answer.lock_timeout_ms / 1e3))
                    continue
                batch = acquired_batch(part.records or b"", part.acquired,
                                       self._names[part.topic_id],
                                       (part.topic_id, part.partition), self._held,
                                       check_crc=self.config.check_crcs, include_headers=arrow,
                                       codecs=self.batch_codecs)
                if batch.num_rows:
                    out.append(batch)
            except KafkaShareError as exc:  # the others' records are delivered first
                self._error = self._error or exc
        return out

    def _exchange(self, session: LeaderSession, req: ShareSessionRequest, api: ApiKey,
                  version: int, body: bytes) -> ShareAnswer | None:
        """Send one session request; None when the session or connection was lost (reset,
        its acknowledgements failed). Other top-level errors raise."""
        decode = consume.decode_share_fetch_response if api == ApiKey.SHARE_FETCH \
            else consume.decode_share_acknowledge_response
        deadline = time.monotonic() + self.config.timeout_s + self.config.fetch_max_wait_ms / 1e3
        try:
            r = session.conn.send(api, version, body, deadline)
            answer = decode(version, r)
            r.expect_end(f"{api.name} response")
        except KafkaConnectionError as exc:
            _log.info("share session with broker %d lost: %s", session.node, exc)
            self._events.transport(f"share session with broker {session.node} lost: {exc}")
            self._drop(session)
            self._fail(req, ErrorCode.NETWORK_EXCEPTION)
            return None
        lost = _SESSION_LOST | ({ErrorCode.SHARE_SESSION_LIMIT_REACHED}
                                if api == ApiKey.SHARE_FETCH else set())
        if answer.error_code in lost:  # the broker dropped the session: open a new one
            session.reset()
            self._sessions_lost += 1
            self._fail(req, answer.error_code)
            return None
        if answer.error_code:
            err = error_for(answer.error_code, f"{api.name} for group {self.config.group_id!r}",
                            answer.error_message)
            if not err.retriable:
                raise err
            session.advanced(req, fetch=api == ApiKey.SHARE_FETCH)  # the session goes on
            self._stale = True
            self._fail(req, answer.error_code)
            return None
        for node_id, endpoint in answer.nodes.items():
            self._nodes[node_id] = (endpoint.host, endpoint.port)
        return answer

    def _partition_ok(self, part: SharePartitionAnswer) -> bool:
        if not part.error_code:
            return True
        if part.error_code in _LEADER_MOVED:
            self._moved(part)
            return False
        raise error_for(part.error_code, f"ShareFetch of partition {part.partition} of topic "
                        f"{self._names.get(part.topic_id, part.topic_id)}", part.error_message)

    def _moved(self, part: SharePartitionAnswer) -> None:
        """The partition's leader moved (NOT_LEADER_OR_FOLLOWER, ...): the new one the broker
        names is used at once, and metadata is refreshed before the next fetch."""
        self._stale = True
        self._sessions_lost += 1
        if part.leader_id >= 0 and part.leader_id in self._nodes:
            self._leaders[(part.topic_id, part.partition)] = part.leader_id

    def _acquired(self, part: SharePartitionAnswer, deadline: float) -> list[ShareRecord]:
        if not part.acquired:
            return []
        tp = (part.topic_id, part.partition)
        topic = self._names[part.topic_id]
        batches = decode_batches(part.records or b"", check_crc=self.config.check_crcs)
        self.batch_codecs.update(b.codec for b in batches)
        by_offset = {rec.offset: (rec, b.log_append_time)
                     for b in batches if not b.control for rec in b.records}
        out = []
        for acquired in part.acquired:
            for offset in range(acquired.first_offset, acquired.last_offset + 1):
                found = by_offset.get(offset)
                if found is None:
                    self._held.gap(tp, offset)
                    continue
                rec, log_append = found
                share = ShareRecord(topic, part.partition, offset, rec.timestamp_ms, rec.key,
                                    rec.value, rec.headers, acquired.delivery_count, deadline,
                                    log_append)
                self._held.hold(tp, share)
                out.append(share)
        return out

    # -- acknowledging --

    def _settled(self, part: SharePartitionAnswer, req: ShareSessionRequest,
                 lock_ms: int) -> None:
        """Record the outcome of the acknowledgements ``req`` carried for ``part``."""
        tp = (part.topic_id, part.partition)
        ranges = req.partitions.get(tp)
        if not ranges:
            return
        self._results[(self._names.get(tp[0], tp[0]), tp[1])] = part.ack_error_code
        renewed = [o for first, last, types in ranges if AckType.RENEW in types
                   for o in range(first, last + 1)]
        if renewed and not part.ack_error_code:
            self._held.renewed(tp, renewed, lock_ms)

    def _fail(self, req: ShareSessionRequest, code: int) -> None:
        for (topic_id, partition), ranges in req.partitions.items():
            if ranges:
                self._results[(self._names.get(topic_id, topic_id), partition)] = code

    def _acknowledge_all(self, final: bool) -> None:
        """ShareAcknowledge every pending acknowledgement to its partition's leader (``final``:
        epoch -1, closing each share session)."""
        pending = {tp for tp, acks in self._held.pending.items() if acks}
        for node, session in list(self._conns.items()):
            tps = [tp for tp in pending if self._leaders.get(tp) == node]
            if session.epoch == 0 or (not tps and not final):
                continue  # no session to acknowledge in: the locks expire instead
            req = session.request(self.config.group_id, self.member_id, (),
                                  self._held.take(tps))
            req = ShareSessionRequest(req.group_id, req.member_id, -1 if final else req.epoch,
                                      {tp: r for tp, r in req.partitions.items() if r})
            version = session.conn.version_for(ApiKey.SHARE_ACKNOWLEDGE)
            body = consume.encode_share_acknowledge_request(version, req)
            answer = self._exchange(session, req, ApiKey.SHARE_ACKNOWLEDGE, version, body)
            if answer is None:
                continue
            session.reset() if final else session.advanced(req, fetch=False)
            for part in answer.partitions:
                self._settled(part, req, answer.lock_timeout_ms)
                if part.error_code in _LEADER_MOVED:  # its acknowledgements failed: move on
                    self._moved(part)

    # -- connections and metadata --

    def _connect(self, host: str, port: int, deadline: float) -> BrokerConnection:
        conn = BrokerConnection(host, port, deadline=deadline, client_id=self.config.client_id,
                                config=self.config.connection)
        try:
            conn.negotiate(deadline)
            if self.config.record_limit and conn.version_for(ApiKey.SHARE_FETCH) < 2:
                raise UnsupportedVersionError(
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"record_limit needs ShareFetch v2 (Kafka 4.2+); {host}:{port} has v1",
                    from_broker=False)
        except BaseException:
            conn.close()
            raise
        return conn

    def _session(self, node: int) -> LeaderSession:
        session = self._conns.get(node)
        if session is None:
            host, port = self._nodes[node]
            conn = self._connect(host, port, time.monotonic() + self.config.timeout_s)
            session = self._conns[node] = LeaderSession(node, conn)
        return session

    def _drop(self, session: LeaderSession) -> None:
        self._sessions_lost += 1
        self._conns.pop(session.node, None)
        session.conn.close()
        self._stale = True

    def _refresh_metadata(self, topic_ids: Iterable[str]) -> None:
        """Metadata for ``topic_ids``: on a leader's connection when there is one (no new
        handshake), else on a new connection to a known broker or a bootstrap server."""
        ids = list(topic_ids)
        deadline = time.monotonic() + self.config.timeout_s
        for session in list(self._conns.values()):
            try:
                self._apply_metadata(*self._metadata(session.conn, ids, deadline))
                return
            except KafkaConnectionError:
                self._drop(session)
        for host, port in [*self._nodes.values(), *self._bootstrap]:
            try:
                conn = self._connect(host, port, deadline)
            except KafkaConnectionError:
                continue
            try:
                answer = self._metadata(conn, ids, deadline)
            except KafkaConnectionError:
                continue
            finally:
                conn.close()
            self._apply_metadata(*answer)
            return
        raise KafkaConnectionError("Metadata: no broker answered")

    @staticmethod
    def _metadata(conn: BrokerConnection, ids: list[str], deadline: float
                  ) -> tuple[tuple[msg.BrokerNode, ...], tuple[consume.TopicMetadata, ...]]:
        version = conn.version_for(ApiKey.METADATA)
        r = conn.send(ApiKey.METADATA, version,
                      consume.encode_metadata_topics_request(version, topic_ids=ids), deadline)
        answer = consume.decode_metadata_topics_response(version, r)
        r.expect_end("Metadata response")
        return answer

    def _apply_metadata(self, brokers: Iterable[msg.BrokerNode],
                        topics: Iterable[consume.TopicMetadata]) -> None:
        for b in brokers:
            self._nodes[b.node_id] = (b.host, b.port)
        self._stale = False
        for t in topics:
            if t.error_code or t.name is None:
                self._stale = True
                continue
            self._names[t.topic_id] = t.name
            for p in t.partitions:
                if p.leader_id >= 0:
                    self._leaders[(t.topic_id, p.partition)] = p.leader_id
                else:
                    self._stale = True

    def _tp(self, topic: str, partition: int) -> TopicPartitionId:
        for topic_id, name in self._names.items():
            if name == topic:
                return topic_id, partition
        raise OptionError("record", topic, "no topic of that name was consumed")

    def _check_open(self) -> None:
        if self._closed:
            raise OptionError("consumer", "closed", "the native share consumer is closed")

    def _raise_pending(self) -> None:
        if self._woken:
            self._woken = False
            raise WakeupError("poll() was woken up")
        if self._membership.fatal is not None:
            raise self._membership.fatal
        if self._error is not None:
            error, self._error = self._error, None
            raise error
