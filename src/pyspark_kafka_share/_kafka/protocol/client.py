"""A small, typed client for the parts of the Kafka wire protocol that confluent-kafka lacks.

confluent-kafka's ``AdminClient`` has no share-group APIs (KIP-932), so this module speaks them
directly over a TCP socket (plaintext, TLS or SASL, as the cluster's settings say). It
implements, per Kafka's message JSON schemas:

============================  =======  ==========================================
API                           key      versions (flexible from)
============================  =======  ==========================================
ApiVersions                   18       0-4 (0 first; 3+: feature levels; header v0 back)
Metadata                      3        11-13 (all flexible)
FindCoordinator               10       3-6 (3: one key; 4+: CoordinatorKeys batch)
ListGroups                    16       5 (TypesFilter)
SaslHandshake                 17       1 (never flexible; :mod:`.sasl`)
SaslAuthenticate              36       0-2 (flexible from 2; :mod:`.sasl`)
DeleteGroups                  42       0-2 (flexible from 2)
ShareGroupHeartbeat           76       1 (a leave only: the READ check at start)
ShareGroupDescribe            77       1
DescribeShareGroupOffsets     90       0-1 (1 adds Lag)
AlterShareGroupOffsets        91       0
DeleteShareGroupOffsets       92       0
============================  =======  ==========================================

Layers, each usable on its own (``codec``, ``messages``, ``client``):

- :class:`Writer` / :class:`Reader`: primitive encoding (big-endian ints, unsigned varints,
  classic and compact strings/arrays, UUIDs, tagged fields).
- ``encode_*_request(version, ...) -> bytes`` and ``decode_*_response(version, Reader)``: pure
  functions for request/response *bodies*; unit-testable against hand-built bytes.
- :class:`BrokerConnection`: one socket, request framing, headers, correlation ids, deadlines.
- :class:`KafkaProtocolClient`: bootstrap, version negotiation, coordinator discovery with
  bounded retries, and one method per API; group-level errors become exceptions
  (:class:`KafkaApiError` subclasses), partition/topic-level error codes are returned.

Security: a :class:`~pyspark_kafka_share._kafka.connection.ConnectionConfig` (default
plaintext) selects TLS (:mod:`.transport`) and SASL PLAIN, SCRAM-SHA-256/512 or OAUTHBEARER
(:mod:`.sasl`, re-authenticating before the broker's session lifetime ends, KIP-368).
The client is not thread-safe.
"""

from __future__ import annotations

import base64
import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType

from pyspark_kafka_share._kafka.connection import PLAINTEXT, SECURITY_PROTOCOLS, ConnectionConfig
from pyspark_kafka_share._kafka.protocol import messages as msg
from pyspark_kafka_share._kafka.protocol import sasl
from pyspark_kafka_share._kafka.protocol.codec import (
    API_SPECS,
    MAX_FRAME,
    ApiKey,
    Framer,
    Reader,
    T,
    common_version,
)
from pyspark_kafka_share._kafka.protocol.messages import (
    AlterOffsetsResult,
    BrokerNode,
    DeleteOffsetsResult,
    DescribedShareGroup,
    ListedGroup,
    ShareGroupOffsets,
    SharePartitionOffset,
)
from pyspark_kafka_share._kafka.protocol.transport import (
    check_not_tls_alert,
    open_socket,
    remaining_s,
    tls_error,
)
from pyspark_kafka_share.errors import (
    BrokerError,
    CoordinatorNotAvailableError,
    ErrorCode,
    KafkaConnectionError,
    OptionError,
    ProtocolDecodeError,
    SecurityProtocolMismatchError,
    UnsupportedSecurityProtocolError,
    UnsupportedVersionError,
    error_for,
)

__all__ = ["BrokerConnection", "KafkaProtocolClient", "api_versions",
           "check_security_protocol", "iter_partitions", "parse_bootstrap"]


def _check(code: int, context: str, broker_message: str | None = None) -> None:
    if code != 0:
        raise error_for(code, context, broker_message)


# -- connections -------------------------------------------------------------------------------


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """``"h1:9092,PLAINTEXT://h2:9092,[::1]:9092"`` -> ``[(host, port), ...]``.

    Raises :class:`UnsupportedSecurityProtocolError` for an unknown security protocol scheme.
    """
    out: list[tuple[str, int]] = []
    for raw in servers.split(","):
        item = raw.strip()
        if not item:
            continue
        if "://" in item:
            scheme, item = item.split("://", 1)
            check_security_protocol(scheme, option="bootstrap_servers", value=servers)
        host, sep, port_s = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_s.isdigit():
            raise OptionError("bootstrap_servers", servers,
                              "give a comma-separated list of host:port")
        out.append((host, int(port_s)))
    if not out:
        raise OptionError("bootstrap_servers", servers, "give at least one host:port")
    return out


def check_security_protocol(protocol: str, option: str = "security_protocol",
                            value: str | None = None) -> None:
    """Raise :class:`UnsupportedSecurityProtocolError` (an option error naming ``option`` and
    its ``value``, by default ``protocol``) unless ``protocol`` is one of PLAINTEXT, SSL,
    SASL_PLAINTEXT, SASL_SSL."""
    if protocol.strip().upper() not in SECURITY_PROTOCOLS:
        raise UnsupportedSecurityProtocolError(
            option, protocol if value is None else value,
            f"security protocol {protocol!r} is unknown to the share-group admin client: use "
            f"one of {', '.join(SECURITY_PROTOCOLS)}")


class BrokerConnection:
    """One connection to one broker (plaintext, or as ``config`` says: TLS, SASL); requests
    are sent and answered one at a time. SASL runs in :meth:`negotiate`, after ApiVersions."""

    def __init__(self, host: str, port: int, *, deadline: float,
                 client_id: str = "pyspark-kafka-share",
                 config: ConnectionConfig | None = None) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self.config = PLAINTEXT if config is None else config
        self._framer = Framer(client_id, f"{host}:{port}")
        self._reauth_at: float | None = None
        self._responses = 0
        self._answered_at = 0.0
        self.versions: dict[int, tuple[int, int]] = {}
        self._sock = open_socket(host, port, self.config, deadline)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._sock.close()

    def negotiate(self, deadline: float) -> dict[int, tuple[int, int]]:
        """ApiVersions v0: learn (and remember) which API versions the broker supports."""
        r = self.send(ApiKey.API_VERSIONS, 0, msg.encode_api_versions_request(0), deadline)
        code, versions = msg.decode_api_versions_response(0, r)
        if code not in (ErrorCode.NONE, ErrorCode.UNSUPPORTED_VERSION):  # still lists them
            raise error_for(code, f"ApiVersions to {self.address}")
        self.versions = versions
        if self.config.uses_sasl:
            self._authenticate(deadline)
        return versions

    def _authenticate(self, deadline: float) -> None:
        """SASL (again, when the session is about to end: KIP-368 re-authentication)."""
        lifetime_ms = sasl.authenticate(self._roundtrip, self.config, self.versions,
                                        framer=self._framer, deadline=deadline)
        self._reauth_at = sasl.session_deadline(lifetime_ms)

    def version_for(self, api_key: ApiKey) -> int:
        """The highest version both the broker (after :meth:`negotiate`) and this module speak
        (:func:`common_version`); :class:`UnsupportedVersionError` when there is none."""
        spec = API_SPECS[api_key]
        theirs = self.versions.get(api_key)
        best = common_version(api_key, theirs)
        if best is None:
            shown = "not at all" if theirs is None else f"v{theirs[0]}-{theirs[1]}"
            raise UnsupportedVersionError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"{spec.name} (API key {int(api_key)}): the broker at {self.address} supports "
                f"it {shown}; this client speaks v{spec.min_version}-{spec.max_version}",
                from_broker=False)
        return best

    def features(self, deadline: float) -> msg.ApiVersionsAnswer | None:
        """The broker's feature levels (``share.version`` etc.): ApiVersions v3 or newer, as
        negotiated; ``None`` from a broker that does not report features."""
        version = common_version(ApiKey.API_VERSIONS, self.versions.get(ApiKey.API_VERSIONS))
        if version is None or version < 3:
            return None
        r = self.send(ApiKey.API_VERSIONS, version,
                      msg.encode_api_versions_request(version), deadline)
        answer = msg.decode_api_versions_answer(version, r)
        r.expect_end(f"ApiVersions v{answer.version} response")
        if answer.error_code:
            raise error_for(answer.error_code, f"ApiVersions v{version} to {self.address}")
        return answer

    def send(self, api_key: ApiKey, version: int, body: bytes, deadline: float) -> Reader:
        """Send one request, wait for its response; return a Reader positioned at the body."""
        if self._reauth_at is not None and time.monotonic() >= self._reauth_at:
            self._authenticate(deadline)
        return self._framer.send(self._roundtrip, api_key, version, body, deadline)

    def _roundtrip(self, name: str, payload: bytes, deadline: float) -> bytes:
        """Send one request frame, return the response frame (errors named, TLS recognised)."""
        try:
            self._sock.settimeout(remaining_s(deadline))
            self._sock.sendall(struct.pack(">i", len(payload)) + payload)
            head = self._recv(4, deadline)
            check_not_tls_alert(head, self.address, self.config)
            size = struct.unpack(">i", head)[0]
            if not 0 <= size <= MAX_FRAME:
                raise ProtocolDecodeError(f"{name} response from {self.address} has size {size}")
            data = self._recv(size, deadline)
            self._responses += 1
            self._answered_at = time.monotonic()
            return data
        except TimeoutError as exc:
            raise KafkaConnectionError(
                f"{name} to {self.address}: no response within the timeout") from exc
        except ssl.SSLError as exc:
            raise tls_error(exc, self.address, self.config, handshake=False) from None
        except OSError as exc:
            raise KafkaConnectionError(f"{name} to {self.address} failed: {exc}") from exc

    def _recv(self, n: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < n:
            self._sock.settimeout(remaining_s(deadline))
            chunk = self._sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise self._closed_error()
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _closed_error(self) -> BrokerError:
        """The broker closed the connection. Right after ApiVersions (within seconds) a
        non-SASL client is being dropped by a SASL listener: say so, and do not retry."""
        text = f"broker {self.address} closed the connection"
        if self.config.uses_sasl or self._responses > 1:
            return KafkaConnectionError(text)
        if self._responses == 1 and time.monotonic() - self._answered_at < 5.0:
            tls = self.config.uses_tls
            return SecurityProtocolMismatchError(
                f"{text} right after ApiVersions, as a SASL listener drops a client that does "
                f"not authenticate: set security.protocol={'SASL_SSL' if tls else 'SASL_PLAINTEXT'}"
                " with sasl.mechanism and its credentials")
        return KafkaConnectionError(
            f"{text} (if its listener is secured, set security.protocol: SSL or SASL_SSL for "
            "TLS, SASL_PLAINTEXT or SASL_SSL for SASL)")


def api_versions(host: str, port: int, timeout_s: float,
                 config: ConnectionConfig | None = None) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 (after TLS/SASL per ``config``): ``{api_key: (min, max)}``."""
    conn = BrokerConnection(host, port, deadline=time.monotonic() + timeout_s, config=config)
    try:
        return conn.negotiate(time.monotonic() + timeout_s)
    finally:
        conn.close()


# -- the client --------------------------------------------------------------------------------


class KafkaProtocolClient:
    """Share-group admin requests over the Kafka protocol, with bounded timeouts.

    ``connection`` says how to connect (TLS, SASL); without it, ``security_protocol`` alone
    (PLAINTEXT or SSL with the system's CAs; SASL needs a ``connection``). Authentication and
    TLS failures (:class:`AuthenticationError`, :class:`TlsError`) are raised at once, never
    retried.

    Each public method finishes within ``timeout_s`` (or raises :class:`KafkaConnectionError`);
    coordinator moves (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
    COORDINATOR_LOAD_IN_PROGRESS) and lost connections are retried within that time.
    """

    def __init__(self, bootstrap_servers: str, *, timeout_s: float = 30.0,
                 client_id: str = "pyspark-kafka-share-admin",
                 security_protocol: str = "PLAINTEXT",
                 connection: ConnectionConfig | None = None) -> None:
        check_security_protocol(security_protocol)
        if connection is not None and security_protocol.strip().upper() not in (
                "PLAINTEXT", connection.security_protocol):
            raise OptionError("security_protocol", security_protocol,
                              f"it disagrees with connection ({connection.security_protocol}): "
                              "give the connection only")
        self.connection = connection if connection is not None else \
            ConnectionConfig(security_protocol=security_protocol)
        if timeout_s <= 0:
            raise OptionError("timeout_s", timeout_s, "give a positive number of seconds")
        self.bootstrap_servers = bootstrap_servers
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._conns: dict[tuple[str, int], BrokerConnection] = {}
        self._coordinators: dict[str, tuple[str, int]] = {}

    def __enter__(self) -> KafkaProtocolClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close every socket. The client reconnects if used again."""
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()

    # -- plumbing --

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def _connection(self, host: str, port: int, deadline: float) -> BrokerConnection:
        conn = self._conns.get((host, port))
        if conn is None:
            conn = BrokerConnection(host, port, deadline=deadline, client_id=self.client_id,
                                    config=self.connection)
            try:
                conn.negotiate(deadline)
            except BaseException:
                conn.close()
                raise
            self._conns[(host, port)] = conn
        return conn

    def _drop(self, conn: BrokerConnection) -> None:
        self._conns.pop((conn.host, conn.port), None)
        conn.close()

    def _any_connection(self, deadline: float) -> BrokerConnection:
        if self._conns:
            return next(iter(self._conns.values()))
        errors = []
        for host, port in self.bootstrap:
            try:
                return self._connection(host, port, deadline)
            except KafkaConnectionError as exc:
                errors.append(str(exc))
        raise KafkaConnectionError(
            f"no bootstrap server answered within {self.timeout_s:g}s: {'; '.join(errors)}")

    def _call(self, conn: BrokerConnection, api_key: ApiKey, encode: Callable[[int], bytes],
              decode: Callable[[int, Reader], T], deadline: float) -> T:
        version = conn.version_for(api_key)
        try:
            r = conn.send(api_key, version, encode(version), deadline)
        except BrokerError:
            self._drop(conn)  # the stream may be mid-frame: never reuse it
            raise
        result = decode(version, r)
        r.expect_end(f"{API_SPECS[api_key].name} v{version} response")
        return result

    def _retrying(self, deadline: float, what: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` until it succeeds, retrying coordinator and connection errors."""
        backoff = 0.05
        while True:
            try:
                return attempt()
            except (CoordinatorNotAvailableError, KafkaConnectionError) as exc:
                if time.monotonic() + backoff >= deadline:
                    raise KafkaConnectionError(
                        f"{what}: gave up after {self.timeout_s:g}s; last error: {exc}") from exc
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _coordinated(self, group: str, api_key: ApiKey, encode: Callable[[int], bytes],
                     decode: Callable[[int, Reader], T], check: Callable[[T], None]) -> T:
        """Send a request to ``group``'s coordinator; ``check`` raises on group-level errors."""
        deadline = self._deadline()
        what = f"{API_SPECS[api_key].name} for group {group!r}"

        def attempt() -> T:
            conn = self._coordinator_connection(group, deadline)
            try:
                result = self._call(conn, api_key, encode, decode, deadline)
                check(result)
            except (CoordinatorNotAvailableError, KafkaConnectionError):
                self._coordinators.pop(group, None)
                raise
            return result

        return self._retrying(deadline, what, attempt)

    def _coordinator_connection(self, group: str, deadline: float) -> BrokerConnection:
        address = self._coordinators.get(group)
        if address is None:
            node = self._find_coordinator_once(group, deadline)
            address = (node.host, node.port)
            self._coordinators[group] = address
        return self._connection(*address, deadline)

    def _find_coordinator_once(self, group: str, deadline: float) -> BrokerNode:
        conn = self._any_connection(deadline)
        found = self._call(
            conn, ApiKey.FIND_COORDINATOR,
            lambda v: msg.encode_find_coordinator_request(v, [group]),
            msg.decode_find_coordinator_response, deadline)
        match = [c for c in found if c.key in (None, group)]
        if len(match) != 1:
            raise ProtocolDecodeError(f"FindCoordinator did not answer for group {group!r}")
        c = match[0]
        _check(c.error_code, f"FindCoordinator for group {group!r}", c.error_message)
        return BrokerNode(c.node_id, c.host, c.port)

    # -- APIs --

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The bootstrap broker's supported versions (ApiVersions v0)."""
        deadline = self._deadline()
        return dict(self._retrying(deadline, "ApiVersions",
                                   lambda: self._any_connection(deadline)).versions)

    def finalized_features(self) -> dict[str, int] | None:
        """The bootstrap broker's feature levels in force, e.g. ``{"share.version": 2}``
        (ApiVersions v3+); ``None`` from a broker too old to report them."""
        deadline = self._deadline()

        def attempt() -> dict[str, int] | None:
            conn = self._any_connection(deadline)
            try:
                answer = conn.features(deadline)
            except BrokerError:
                self._drop(conn)
                raise
            return None if answer is None else dict(answer.finalized)

        return self._retrying(deadline, "ApiVersions (features)", attempt)

    def brokers(self) -> tuple[BrokerNode, ...]:
        """Every broker of the cluster (Metadata for no topics)."""
        deadline = self._deadline()

        def attempt() -> tuple[BrokerNode, ...]:
            conn = self._any_connection(deadline)
            code, nodes = self._call(conn, ApiKey.METADATA, msg.encode_metadata_request,
                                     msg.decode_metadata_response, deadline)
            _check(code, "Metadata")
            return nodes

        return self._retrying(deadline, "Metadata", attempt)

    def find_coordinator(self, group: str) -> BrokerNode:
        """The broker coordinating ``group`` (FindCoordinator, key type 0 = group)."""
        deadline = self._deadline()
        node = self._retrying(deadline, f"FindCoordinator for group {group!r}",
                              lambda: self._find_coordinator_once(group, deadline))
        self._coordinators[group] = (node.host, node.port)
        return node

    def list_groups(self, types: Sequence[str] = ("share",),
                    states: Sequence[str] = ()) -> list[ListedGroup]:
        """ListGroups v5 on every broker (each lists the groups it coordinates)."""
        deadline = self._deadline()
        seen: dict[str, ListedGroup] = {}
        for node in self.brokers():

            def attempt(node: BrokerNode = node) -> tuple[ListedGroup, ...]:
                conn = self._connection(node.host, node.port, deadline)
                code, groups = self._call(
                    conn, ApiKey.LIST_GROUPS,
                    lambda v: msg.encode_list_groups_request(v, states=states, types=types),
                    msg.decode_list_groups_response, deadline)
                _check(code, f"ListGroups on broker {node.host}:{node.port}")
                return groups

            for g in self._retrying(deadline, "ListGroups", attempt):
                seen[g.group_id] = g
        return sorted(seen.values(), key=lambda g: g.group_id)

    def check_share_group_access(self, group: str) -> int:
        """Whether this principal may consume in ``group`` (READ), changing nothing: a
        ShareGroupHeartbeat that leaves the group as a member it does not have (a random
        member id). The broker checks READ first (:class:`AuthorizationError`), then answers
        UNKNOWN_MEMBER_ID or GROUP_ID_NOT_FOUND; that code is returned."""
        member = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        raised = (ErrorCode.GROUP_AUTHORIZATION_FAILED, ErrorCode.NOT_COORDINATOR,
                  ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)

        def check(result: tuple[int, str | None]) -> None:
            if result[0] in raised:
                _check(result[0], f"joining share group {group!r}", result[1])

        return self._coordinated(
            group, ApiKey.SHARE_GROUP_HEARTBEAT,
            lambda v: msg.encode_share_group_heartbeat_request(v, group, member, -1),
            msg.decode_share_group_heartbeat_response, check)[0]

    def describe_share_group(self, group: str) -> DescribedShareGroup:
        """ShareGroupDescribe for one group; raises for group-level errors."""

        def check(result: tuple[DescribedShareGroup, ...]) -> None:
            if len(result) != 1 or result[0].group_id != group:
                raise ProtocolDecodeError(f"ShareGroupDescribe did not answer for {group!r}")
            _check(result[0].error_code, f"describing share group {group!r}",
                   result[0].error_message)

        return self._coordinated(
            group, ApiKey.SHARE_GROUP_DESCRIBE,
            lambda v: msg.encode_share_group_describe_request(v, [group]),
            msg.decode_share_group_describe_response, check)[0]

    def describe_share_group_offsets(
        self, group: str, topics: Mapping[str, Sequence[int]] | None = None
    ) -> ShareGroupOffsets:
        """DescribeShareGroupOffsets for one group (``topics=None``: every partition)."""

        def check(result: tuple[ShareGroupOffsets, ...]) -> None:
            if len(result) != 1 or result[0].group_id != group:
                raise ProtocolDecodeError(
                    f"DescribeShareGroupOffsets did not answer for {group!r}")
            _check(result[0].error_code, f"describing the offsets of share group {group!r}",
                   result[0].error_message)

        return self._coordinated(
            group, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS,
            lambda v: msg.encode_describe_share_group_offsets_request(v, {group: topics}),
            msg.decode_describe_share_group_offsets_response, check)[0]

    def alter_share_group_offsets(self, group: str,
                                  offsets: Mapping[str, Mapping[int, int]]) -> AlterOffsetsResult:
        """AlterShareGroupOffsets; raises for group-level errors (:class:`GroupNotEmptyError`)."""

        def check(result: AlterOffsetsResult) -> None:
            _check(result.error_code, f"altering the offsets of share group {group!r}",
                   result.error_message)

        return self._coordinated(
            group, ApiKey.ALTER_SHARE_GROUP_OFFSETS,
            lambda v: msg.encode_alter_share_group_offsets_request(v, group, offsets),
            msg.decode_alter_share_group_offsets_response, check)

    def delete_share_group_offsets(self, group: str,
                                   topics: Sequence[str]) -> DeleteOffsetsResult:
        """DeleteShareGroupOffsets; raises for group-level errors."""

        def check(result: DeleteOffsetsResult) -> None:
            _check(result.error_code, f"deleting the offsets of share group {group!r}",
                   result.error_message)

        return self._coordinated(
            group, ApiKey.DELETE_SHARE_GROUP_OFFSETS,
            lambda v: msg.encode_delete_share_group_offsets_request(v, group, topics),
            msg.decode_delete_share_group_offsets_response, check)

    def delete_group(self, group: str) -> None:
        """DeleteGroups for one group; raises :class:`GroupNotEmptyError` etc."""

        def check(result: dict[str, int]) -> None:
            if group not in result:
                raise ProtocolDecodeError(f"DeleteGroups did not answer for {group!r}")
            _check(result[group], f"deleting group {group!r}")

        self._coordinated(group, ApiKey.DELETE_GROUPS,
                          lambda v: msg.encode_delete_groups_request(v, [group]),
                          msg.decode_delete_groups_response, check)


def iter_partitions(offsets: ShareGroupOffsets) -> Iterable[tuple[str, SharePartitionOffset]]:
    """``(topic, partition offset)`` pairs of a DescribeShareGroupOffsets result."""
    for topic in offsets.topics:
        for p in topic.partitions:
            yield topic.topic, p
