"""The Kafka wire-protocol client: bodies against hand-built bytes, error mapping, timeouts.

Expected bytes are spelled out with ``struct`` and literals (not with the module's own
``Writer``), following Kafka's message JSON schemas field by field.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest

from pyspark_kafka_share import errors
from pyspark_kafka_share._kafka.protocol import client, codec, messages
from pyspark_kafka_share.admin import ShareGroupAdmin, _check_target
from pyspark_kafka_share.errors import BrokerError, KafkaShareError, OptionError

UUID = bytes(range(16))
UUID_STR = "AAECAwQFBgcICQoLDA0ODw"  # URL-safe base64 of UUID, unpadded, as Kafka prints it


def cstr(s: str | None) -> bytes:
    """Compact (nullable) string: unsigned varint length+1, then UTF-8."""
    if s is None:
        return b"\x00"
    data = s.encode()
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def carr(n: int) -> bytes:
    """Compact array length (small n)."""
    assert n < 127
    return bytes([n + 1])


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


NO_TAGS = b"\x00"


def reader(data: bytes, flexible: bool = True) -> codec.Reader:
    return codec.Reader(data, flexible=flexible)


# -- primitives ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "encoded"), [
    (0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
    (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"), (2**32 - 1, b"\xff\xff\xff\xff\x0f"),
])
def test_unsigned_varints_round_trip(value: int, encoded: bytes) -> None:
    assert codec.Writer(flexible=True).uvarint(value).getvalue() == encoded
    r = reader(encoded)
    assert r.uvarint() == value
    assert r.remaining() == 0


def test_malformed_and_out_of_range_varints_are_refused() -> None:
    with pytest.raises(errors.ProtocolDecodeError):
        reader(b"\x80\x80\x80\x80\x80\x01").uvarint()  # six bytes
    with pytest.raises(errors.ProtocolDecodeError):
        reader(b"\x80").uvarint()  # truncated
    with pytest.raises(ValueError):
        codec.Writer(flexible=True).uvarint(-1)
    with pytest.raises(ValueError):
        codec.Writer(flexible=True).uvarint(2**32)


def test_strings_compact_and_classic_with_nulls() -> None:
    assert codec.Writer(flexible=True).string("ab").getvalue() == b"\x03ab"
    assert codec.Writer(flexible=True).string(None).getvalue() == b"\x00"
    assert codec.Writer(flexible=True).string("").getvalue() == b"\x01"
    assert codec.Writer(flexible=False).string("ab").getvalue() == b"\x00\x02ab"
    assert codec.Writer(flexible=False).string(None).getvalue() == b"\xff\xff"
    assert codec.Writer(flexible=True).string("é").getvalue() == b"\x03\xc3\xa9"
    r = reader(b"\x03ab\x00\x01")
    assert (r.string(), r.nullable_string(), r.string()) == ("ab", None, "")
    r = reader(b"\x00\x02ab\xff\xff", flexible=False)
    assert (r.string(), r.nullable_string()) == ("ab", None)
    with pytest.raises(errors.ProtocolDecodeError, match="null"):
        reader(b"\x00").string()


def test_arrays_compact_classic_and_null() -> None:
    w = codec.Writer(flexible=True)
    w.string_array(["a", "b"]).string_array(None).int32_array([7])
    assert w.getvalue() == b"\x03" + b"\x02a\x02b" + b"\x00" + b"\x02" + i32(7)
    w = codec.Writer(flexible=False).string_array(["a"]).string_array(None)
    assert w.getvalue() == i32(1) + b"\x00\x01a" + i32(-1)
    r = reader(b"\x03\x02a\x02b\x02" + i32(7))
    assert r.string_array() == ("a", "b")
    assert r.int32_array() == (7,)
    with pytest.raises(errors.ProtocolDecodeError, match="exceeds"):
        reader(b"\x7f\x00").array_length()  # claims 126 elements, has 1 byte


def test_tagged_fields_are_skipped_and_only_in_flexible_versions() -> None:
    # two tagged fields: tag 0 with 3 bytes, tag 5 with 1 byte; then an int16
    data = b"\x02" + b"\x00\x03abc" + b"\x05\x01z" + i16(9)
    r = reader(data)
    r.skip_tags()
    assert r.int16() == 9
    r = reader(i16(9), flexible=False)
    r.skip_tags()
    assert r.int16() == 9
    assert codec.Writer(flexible=True).tags().getvalue() == b"\x00"
    assert codec.Writer(flexible=False).tags().getvalue() == b""


def test_fixed_width_ints_bool_uuid_and_truncation() -> None:
    data = b"\xff" + i16(-2) + i32(-3) + i64(2**40) + b"\x01" + UUID
    r = reader(data)
    assert (r.int8(), r.int16(), r.int32(), r.int64(), r.boolean()) == (-1, -2, -3, 2**40, True)
    assert r.uuid() == UUID_STR
    assert reader(bytes(16)).uuid() == "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's ZERO_UUID
    with pytest.raises(errors.ProtocolDecodeError, match="truncated"):
        reader(b"\x00\x00\x00").int32()
    r = reader(b"\x00\x01\x02")
    r.int8()
    with pytest.raises(errors.ProtocolDecodeError, match="trailing"):
        r.expect_end("test")


# -- headers ---------------------------------------------------------------------------------------


def test_request_header_v2_for_flexible_apis_and_v1_otherwise() -> None:
    assert codec.encode_request_header(codec.ApiKey(77), 1, 7, "cid") == \
        i16(77) + i16(1) + i32(7) + b"\x00\x03cid" + NO_TAGS
    assert codec.encode_request_header(codec.ApiKey(18), 0, 1, "cid") == \
        i16(18) + i16(0) + i32(1) + b"\x00\x03cid"
    delete_groups = codec.ApiKey(42)
    assert codec.encode_request_header(delete_groups, 1, 2, None) == \
        i16(42) + i16(1) + i32(2) + b"\xff\xff"
    assert codec.encode_request_header(delete_groups, 2, 2, "c").endswith(b"\x00\x01c" + NO_TAGS)


def test_response_header_v1_has_tags_except_for_api_versions() -> None:
    r = codec.Reader(i32(5) + b"\x01\x00\x01x" + b"body", flexible=False)
    assert codec.decode_response_header(codec.ApiKey(90), 1, r) == 5
    assert r.data[r.pos:] == b"body"
    r = codec.Reader(i32(6) + b"body", flexible=False)
    assert codec.decode_response_header(codec.ApiKey(18), 3, r) == 6  # ApiVersions: header v0
    assert r.data[r.pos:] == b"body"


# -- request bodies --------------------------------------------------------------------------------


def test_api_versions_v0() -> None:
    assert messages.encode_api_versions_request(0) == b""
    body = i16(0) + i32(2) + i16(77) + i16(1) + i16(1) + i16(90) + i16(0) + i16(1)
    assert messages.decode_api_versions_response(0, reader(body, flexible=False)) == \
        (0, {77: (1, 1), 90: (0, 1)})


def test_metadata_v12_for_brokers_only() -> None:
    assert messages.encode_metadata_request(12) == carr(0) + b"\x00" + b"\x00" + NO_TAGS
    body = (i32(0) + carr(1) + i32(1) + cstr("h") + i32(9092) + cstr(None) + NO_TAGS
            + cstr("cluster") + i32(1) + carr(0) + NO_TAGS)
    node = messages.BrokerNode(1, "h", 9092)
    assert messages.decode_metadata_response(12, reader(body)) == (0, (node,))
    v13 = body[:-1] + i16(0) + NO_TAGS
    assert messages.decode_metadata_response(13, reader(v13)) == (0, (node,))


def test_find_coordinator_v3_single_key_and_v4_batch() -> None:
    assert messages.encode_find_coordinator_request(3, ["g"]) == cstr("g") + b"\x00" + NO_TAGS
    assert messages.encode_find_coordinator_request(6, ["g", "h"]) == \
        b"\x00" + carr(2) + cstr("g") + cstr("h") + NO_TAGS
    with pytest.raises(ValueError, match="exactly one"):
        messages.encode_find_coordinator_request(3, ["g", "h"])
    v3 = i32(0) + i16(0) + cstr(None) + i32(2) + cstr("b2") + i32(9093) + NO_TAGS
    assert messages.decode_find_coordinator_response(3, reader(v3)) == \
        (messages.Coordinator(None, 2, "b2", 9093, 0, None),)
    v4 = (i32(0) + carr(1) + cstr("g") + i32(2) + cstr("b2") + i32(9093) + i16(15)
          + cstr("loading") + NO_TAGS + NO_TAGS)
    assert messages.decode_find_coordinator_response(4, reader(v4)) == \
        (messages.Coordinator("g", 2, "b2", 9093, 15, "loading"),)


def test_list_groups_v5_filters_share_groups() -> None:
    assert messages.encode_list_groups_request(5) == carr(0) + carr(1) + cstr("share") + NO_TAGS
    body = (i32(0) + i16(0) + carr(1) + cstr("g") + cstr("share") + cstr("Empty")
            + cstr("share") + NO_TAGS + NO_TAGS)
    assert messages.decode_list_groups_response(5, reader(body)) == \
        (0, (messages.ListedGroup("g", "share", "Empty", "share"),))
    with pytest.raises(ValueError, match="not implemented"):
        messages.encode_list_groups_request(4)


def test_delete_groups_classic_v1_and_flexible_v2() -> None:
    assert messages.encode_delete_groups_request(1, ["g"]) == i32(1) + b"\x00\x01g"
    assert messages.encode_delete_groups_request(2, ["g"]) == carr(1) + cstr("g") + NO_TAGS
    v1 = i32(0) + i32(1) + b"\x00\x01g" + i16(68)
    assert messages.decode_delete_groups_response(1, reader(v1, flexible=False)) == {"g": 68}
    v2 = i32(0) + carr(1) + cstr("g") + i16(0) + NO_TAGS + NO_TAGS
    assert messages.decode_delete_groups_response(2, reader(v2)) == {"g": 0}


def test_share_group_describe_v1() -> None:
    assert messages.encode_share_group_describe_request(1, ["g"]) == \
        carr(1) + cstr("g") + b"\x00" + NO_TAGS
    assignment = (carr(1) + UUID + cstr("t") + carr(2) + i32(0) + i32(2) + NO_TAGS
                  + NO_TAGS)  # Assignment struct's own tagged fields
    member = (cstr("m1") + cstr(None) + i32(3) + cstr("cli") + cstr("/127.0.0.1")
              + carr(1) + cstr("t") + assignment
              + b"\x01\x07\x02zz")  # the member carries one unknown tagged field
    body = (i32(0) + carr(1) + i16(0) + cstr(None) + cstr("g") + cstr("Stable") + i32(4)
            + i32(4) + cstr("simple") + carr(1) + member + i32(-2147483648) + NO_TAGS
            + NO_TAGS)
    (group,) = messages.decode_share_group_describe_response(1, reader(body))
    assert group == messages.DescribedShareGroup(
        0, None, "g", "Stable", 4, 4, "simple",
        (messages.ShareMember("m1", None, 3, "cli", "/127.0.0.1", ("t",),
                       (messages.TopicAssignment(UUID_STR, "t", (0, 2)),)),),
        -2147483648)


def test_describe_share_group_offsets_requests() -> None:
    assert messages.encode_describe_share_group_offsets_request(1, {"g": None}) == \
        carr(1) + cstr("g") + b"\x00" + NO_TAGS + NO_TAGS  # null Topics = all partitions
    assert messages.encode_describe_share_group_offsets_request(0, {"g": {"t": [0, 1]}}) == \
        (carr(1) + cstr("g") + carr(1) + cstr("t") + carr(2) + i32(0) + i32(1) + NO_TAGS
         + NO_TAGS + NO_TAGS)


def _offsets_body(with_lag: bool) -> bytes:
    part = i32(0) + i64(10) + i32(0) + (i64(5) if with_lag else b"") + i16(0) + cstr(None)
    return (i32(0) + carr(1) + cstr("g") + carr(1) + cstr("t") + UUID + carr(1) + part
            + NO_TAGS + NO_TAGS + i16(0) + cstr(None) + NO_TAGS + NO_TAGS)


def test_describe_share_group_offsets_v0_has_no_lag_and_v1_has_it() -> None:
    (v0,) = messages.decode_describe_share_group_offsets_response(0, reader(_offsets_body(False)))
    (v1,) = messages.decode_describe_share_group_offsets_response(1, reader(_offsets_body(True)))
    assert v0.topics[0].partitions == (messages.SharePartitionOffset(0, 10, 0, None, 0, None),)
    assert v1.topics[0].partitions == (messages.SharePartitionOffset(0, 10, 0, 5, 0, None),)
    assert (v1.group_id, v1.topics[0].topic, v1.topics[0].topic_id) == ("g", "t", UUID_STR)
    assert list(client.iter_partitions(v1)) == [("t", v1.topics[0].partitions[0])]
    # a v0 body read as v1 is caught, not silently misread
    with pytest.raises(errors.ProtocolDecodeError):
        r = reader(_offsets_body(False))
        messages.decode_describe_share_group_offsets_response(1, r)
        r.expect_end("x")


def test_alter_share_group_offsets_v0() -> None:
    assert messages.encode_alter_share_group_offsets_request(0, "g", {"t": {0: 7, 1: 8}}) == (
        cstr("g") + carr(1) + cstr("t") + carr(2)
        + i32(0) + i64(7) + NO_TAGS + i32(1) + i64(8) + NO_TAGS + NO_TAGS + NO_TAGS)
    body = (i32(0) + i16(0) + cstr(None) + carr(1) + cstr("t") + UUID + carr(1)
            + i32(1) + i16(3) + cstr("no such partition") + NO_TAGS + NO_TAGS + NO_TAGS)
    assert messages.decode_alter_share_group_offsets_response(0, reader(body)) == \
        messages.AlterOffsetsResult(0, None, (messages.TopicResult(
            "t", UUID_STR, 0, None, (messages.PartitionResult(1, 3, "no such partition"),)),))
    non_empty = i32(0) + i16(68) + cstr("The group is not empty.") + carr(0) + NO_TAGS
    assert messages.decode_alter_share_group_offsets_response(0, reader(non_empty)) == \
        messages.AlterOffsetsResult(68, "The group is not empty.", ())


def test_delete_share_group_offsets_v0() -> None:
    assert messages.encode_delete_share_group_offsets_request(0, "g", ["a", "b"]) == \
        cstr("g") + carr(2) + cstr("a") + NO_TAGS + cstr("b") + NO_TAGS + NO_TAGS
    body = (i32(0) + i16(0) + cstr(None) + carr(1) + cstr("a") + UUID + i16(3) + cstr(None)
            + NO_TAGS + NO_TAGS)
    assert messages.decode_delete_share_group_offsets_response(0, reader(body)) == \
        messages.DeleteOffsetsResult(0, None, (messages.TopicResult("a", UUID_STR, 3, None),))


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "cls", "name"), [
    (68, errors.GroupNotEmptyError, "NON_EMPTY_GROUP"),
    (69, errors.GroupNotFoundError, "GROUP_ID_NOT_FOUND"),
    (14, errors.CoordinatorNotAvailableError, "COORDINATOR_LOAD_IN_PROGRESS"),
    (15, errors.CoordinatorNotAvailableError, "COORDINATOR_NOT_AVAILABLE"),
    (16, errors.CoordinatorNotAvailableError, "NOT_COORDINATOR"),
    (3, errors.UnknownTopicError, "UNKNOWN_TOPIC_OR_PARTITION"),
    (100, errors.UnknownTopicError, "UNKNOWN_TOPIC_ID"),
    (30, errors.AuthorizationError, "GROUP_AUTHORIZATION_FAILED"),
    (35, errors.UnsupportedVersionError, "UNSUPPORTED_VERSION"),
    (42, errors.KafkaApiError, "INVALID_REQUEST"),
    (-1, errors.KafkaApiError, "UNKNOWN_SERVER_ERROR"),
    (9999, errors.KafkaApiError, "ERROR_9999"),
])
def test_error_codes_map_to_broker_errors(code: int, cls: type[errors.KafkaApiError],
                                          name: str) -> None:
    exc = errors.error_for(code, "doing X", "Broker says no.")
    assert type(exc) is cls
    assert isinstance(exc, BrokerError) and isinstance(exc, KafkaShareError)
    assert (exc.code, exc.error, exc.broker_message) == (code, name, "Broker says no")
    assert str(exc).startswith(f"doing X: the broker answered {name} (error code {code}): "
                               "Broker says no")


def test_group_not_empty_message_says_what_to_do() -> None:
    text = str(errors.error_for(68, "resetting g"))
    assert "NON_EMPTY_GROUP" in text
    assert "while the group is empty" in text and "stop all of its consumers" in text


def test_error_code_zero_is_not_an_error() -> None:
    with pytest.raises(ValueError, match="success"):
        errors.error_for(0, "x")


# -- bootstrap and security ------------------------------------------------------------------------


def test_bootstrap_parsing() -> None:
    assert client.parse_bootstrap("a:1, PLAINTEXT://b:2,[::1]:3") == \
        [("a", 1), ("b", 2), ("::1", 3)]
    for bad in ("", "host", "host:x", ":9092"):
        with pytest.raises(OptionError):
            client.parse_bootstrap(bad)


def test_security_protocols_are_checked() -> None:
    with pytest.raises(errors.UnsupportedSecurityProtocolError, match="unknown"):
        client.parse_bootstrap("TLS://b:9093")
    assert client.parse_bootstrap("SSL://b:9093") == [("b", 9093)]
    with pytest.raises(OptionError, match=r"sasl\.mechanism"):  # SASL needs a ConnectionConfig
        client.KafkaProtocolClient("b:9092", security_protocol="SASL_SSL")
    with pytest.raises(KafkaShareError):
        ShareGroupAdmin("b:9092", connection={"security.protocol": "SASL_PLAINTEXT"})
    client.KafkaProtocolClient("b:9092", security_protocol="plaintext").close()  # no connection yet


def test_reset_targets() -> None:
    from datetime import timezone

    assert _check_target("earliest") == "earliest"
    assert _check_target("latest") == "latest"
    assert _check_target(datetime(2024, 1, 1, tzinfo=timezone.utc)) == 1704067200000
    with pytest.raises(OptionError, match="timezone-aware"):
        _check_target(datetime(2024, 1, 1))  # naive: the point of the test
    with pytest.raises(OptionError):
        _check_target("yesterday")


# -- a fake broker: negotiation, retries and timeouts ----------------------------------------------


def _frame(corr: int, body: bytes, flexible: bool) -> bytes:
    payload = i32(corr) + (NO_TAGS if flexible else b"") + body
    return i32(len(payload)) + payload


Handler = Callable[[int, int, int], bytes | None]  # (api_key, version, corr) -> frame or None


@pytest.fixture
def fake_broker() -> Iterator[Callable[[Handler], tuple[str, int]]]:
    """A loopback server answering each request with ``handler``; None = never answer."""
    servers: list[socket.socket] = []
    stop = threading.Event()

    def start(handler: Handler) -> tuple[str, int]:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        servers.append(srv)

        def serve_conn(conn: socket.socket) -> None:
            with conn:
                conn.settimeout(0.2)
                while not stop.is_set():
                    try:
                        head = conn.recv(4)
                        if not head:
                            return
                        size = struct.unpack(">i", head)[0]
                        data = b""
                        while len(data) < size:
                            data += conn.recv(size - len(data))
                    except TimeoutError:
                        continue
                    except OSError:
                        return
                    key, version, corr = struct.unpack(">hhi", data[:8])
                    reply = handler(key, version, corr)
                    if reply is not None:
                        conn.sendall(reply)

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except OSError:
                    continue
                threading.Thread(target=serve_conn, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        host, port = srv.getsockname()
        return str(host), int(port)

    yield start
    stop.set()
    for srv in servers:
        srv.close()


def _api_versions_frame(corr: int, port_versions: dict[int, tuple[int, int]]) -> bytes:
    body = i16(0) + i32(len(port_versions))
    for key, (lo, hi) in port_versions.items():
        body += i16(key) + i16(lo) + i16(hi)
    return _frame(corr, body, flexible=False)


def test_client_negotiates_and_retries_a_loading_coordinator(
    fake_broker: Callable[[Handler], tuple[str, int]]
) -> None:
    calls: list[tuple[int, int]] = []
    address: list[tuple[str, int]] = []

    def handler(key: int, version: int, corr: int) -> bytes | None:
        calls.append((key, version))
        if key == 18:
            return _api_versions_frame(corr, {10: (0, 6), 42: (0, 2), 77: (0, 1)})
        if key == 10:
            host, port = address[0]
            body = (i32(0) + carr(1) + cstr("g") + i32(1) + cstr(host) + i32(port) + i16(0)
                    + cstr(None) + NO_TAGS + NO_TAGS)
            return _frame(corr, body, flexible=True)
        if key == 42:
            loading = sum(1 for k, _ in calls if k == 42) == 1
            body = i32(0) + carr(1) + cstr("g") + i16(14 if loading else 0) + NO_TAGS + NO_TAGS
            return _frame(corr, body, flexible=True)
        raise AssertionError(key)

    address.append(fake_broker(handler))
    with client.KafkaProtocolClient(f"{address[0][0]}:{address[0][1]}", timeout_s=5) as kc:
        kc.delete_group("g")
    assert calls[0] == (18, 0)
    assert (10, 6) in calls  # FindCoordinator: the highest common version, batched
    assert [c for c in calls if c[0] == 42] == [(42, 2), (42, 2)]  # retried once


def test_unsupported_api_is_reported_without_sending_it(
    fake_broker: Callable[[Handler], tuple[str, int]]
) -> None:
    def handler(key: int, version: int, corr: int) -> bytes | None:
        assert key == 18
        return _api_versions_frame(corr, {77: (0, 0)})  # early-access only

    host, port = fake_broker(handler)
    conn = client.BrokerConnection(host, port, deadline=time.monotonic() + 5)
    try:
        conn.negotiate(time.monotonic() + 5)
        with pytest.raises(errors.UnsupportedVersionError, match=r"ShareGroupDescribe .*v0-0"):
            conn.version_for(codec.ApiKey(77))
        with pytest.raises(errors.UnsupportedVersionError, match="not at all"):
            conn.version_for(codec.ApiKey(90))
    finally:
        conn.close()


def test_a_silent_broker_times_out_within_the_bound(
    fake_broker: Callable[[Handler], tuple[str, int]]
) -> None:
    host, port = fake_broker(lambda key, version, corr: None)
    started = time.monotonic()
    with pytest.raises(errors.KafkaConnectionError), \
            client.KafkaProtocolClient(f"{host}:{port}", timeout_s=1.0) as kc:
        kc.list_groups()
    # The promise is the 1 s timeout_s, not the 30 s default: 10 s (was 3 s) holds on a loaded
    # 2-core machine and still fails a client that ignores it.
    assert time.monotonic() - started < 10.0


def test_an_unreachable_broker_fails_within_the_bound() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        started = time.monotonic()
        with pytest.raises(errors.KafkaConnectionError, match="gave up"):
            client.KafkaProtocolClient(f"127.0.0.1:{port}", timeout_s=1.0).api_versions()
        # As above: 10 s (was 3 s) for a loaded machine, still short of the 30 s default.
        assert time.monotonic() - started < 10.0


def test_api_versions_helper_for_the_broker_probe(
    fake_broker: Callable[[Handler], tuple[str, int]]
) -> None:
    host, port = fake_broker(lambda key, version, corr: _api_versions_frame(corr, {78: (1, 2)}))
    assert client.api_versions(host, port, 5) == {78: (1, 2)}
