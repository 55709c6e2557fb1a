"""Version negotiation against what real brokers answer: each broker line's ApiVersions frames,
recorded from Apache Kafka 4.2.2, 4.3.1 and 4.4.0 (``kafka_api_versions.json``), decoded by
the protocol client, and the version it then sends of every API it speaks. A broker answer
the client cannot trust (a future version, a nonsense range) never picks a schema."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.protocol import messages as msg
from pyspark_kafka_share._kafka.protocol import sasl
from pyspark_kafka_share._kafka.protocol.client import BrokerConnection
from pyspark_kafka_share._kafka.protocol.codec import (
    API_SPECS,
    ApiKey,
    Framer,
    Reader,
    common_version,
    decode_response_header,
)
from pyspark_kafka_share.errors import (
    AuthenticationError,
    LocalKafkaError,
    ProtocolDecodeError,
    UnsupportedVersionError,
)
from pyspark_kafka_share.harness import LocalKafka, jars

RECORDED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "kafka_api_versions.json").read_text())["brokers"]

# What each broker line offers of the APIs the client sends ((min, max), from the recordings).
OFFERED = {
    "4.2.2": {ApiKey.API_VERSIONS: (0, 4), ApiKey.METADATA: (0, 13),
              ApiKey.FIND_COORDINATOR: (0, 6), ApiKey.LIST_GROUPS: (0, 5),
              ApiKey.DELETE_GROUPS: (0, 2), ApiKey.SHARE_GROUP_DESCRIBE: (1, 1),
              ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, 1),
              ApiKey.ALTER_SHARE_GROUP_OFFSETS: (0, 0),
              ApiKey.DELETE_SHARE_GROUP_OFFSETS: (0, 0),
              ApiKey.SHARE_GROUP_HEARTBEAT: (1, 1), ApiKey.SASL_HANDSHAKE: (0, 1),
              ApiKey.SASL_AUTHENTICATE: (0, 2), ApiKey.SHARE_FETCH: (1, 2),
              ApiKey.SHARE_ACKNOWLEDGE: (1, 2)},
}
OFFERED["4.3.1"] = OFFERED["4.2.2"]
OFFERED["4.4.0"] = {**OFFERED["4.2.2"], ApiKey.API_VERSIONS: (0, 5),
                    ApiKey.DELETE_GROUPS: (0, 3)}

# The version the client sends of each, on every line (the highest both sides speak).
CHOSEN = {ApiKey.API_VERSIONS: 4, ApiKey.METADATA: 13, ApiKey.FIND_COORDINATOR: 6,
          ApiKey.LIST_GROUPS: 5, ApiKey.DELETE_GROUPS: 2, ApiKey.SHARE_GROUP_DESCRIBE: 1,
          ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: 1, ApiKey.ALTER_SHARE_GROUP_OFFSETS: 0,
          ApiKey.DELETE_SHARE_GROUP_OFFSETS: 0, ApiKey.SHARE_GROUP_HEARTBEAT: 1,
          ApiKey.SASL_HANDSHAKE: 1, ApiKey.SASL_AUTHENTICATE: 2,
          ApiKey.SHARE_FETCH: 2, ApiKey.SHARE_ACKNOWLEDGE: 2}  # v2: RENEW and record_limit

# The share-group APIs the source and the workers (confluent-kafka / librdkafka) need.
SHARE_CONSUMER = {76: (1, 1), 78: (1, 2), 79: (1, 2)}  # heartbeat, fetch, acknowledge

SHARE_VERSION = {"4.2.2": 1, "4.3.1": 1, "4.4.0": 2}


def _answer(broker: str, asked: int) -> msg.ApiVersionsAnswer:
    """Decode the recorded answer to ApiVersions v``asked`` as the client would."""
    r = Reader(bytes.fromhex(RECORDED[broker][f"v{asked}"]), flexible=False)
    decode_response_header(ApiKey.API_VERSIONS, min(asked, 3), r)
    answer = msg.decode_api_versions_answer(min(asked, 3), r)
    r.expect_end("recorded ApiVersions response")
    return answer


def _connection(versions: Mapping[int, tuple[int, int]]) -> BrokerConnection:
    conn = BrokerConnection.__new__(BrokerConnection)  # no socket: negotiation only
    conn.host, conn.port, conn.versions = "broker", 9092, dict(versions)
    return conn


@pytest.mark.parametrize("broker", sorted(RECORDED))
def test_each_line_offers_what_it_was_recorded_offering(broker: str) -> None:
    answer = _answer(broker, 0)
    assert answer.error_code == 0 and answer.version == 0
    assert {k: answer.versions.get(k) for k in API_SPECS} == OFFERED[broker]
    assert {k: answer.versions.get(k) for k in SHARE_CONSUMER} == SHARE_CONSUMER
    assert _answer(broker, 3).versions == answer.versions  # v3 lists the same APIs


@pytest.mark.parametrize("broker", sorted(RECORDED))
def test_the_client_sends_the_highest_common_version_on_each_line(broker: str) -> None:
    conn = _connection(_answer(broker, 0).versions)
    assert {k: conn.version_for(k) for k in API_SPECS} == CHOSEN
    for key, version in CHOSEN.items():  # never beyond what either side speaks
        lo, hi = OFFERED[broker][key]
        assert max(lo, API_SPECS[key].min_version) <= version <= min(hi, API_SPECS[key].max_version)


@pytest.mark.parametrize("broker", sorted(RECORDED))
def test_feature_levels_are_read_from_api_versions_v3(broker: str) -> None:
    answer = _answer(broker, 3)
    assert answer.version == 3 and answer.error_code == 0
    assert answer.finalized["share.version"] == SHARE_VERSION[broker]
    assert f"Feature: share.version SupportedMinVersion: 0 SupportedMaxVersion: " \
        f"{SHARE_VERSION[broker]} FinalizedVersionLevel: {SHARE_VERSION[broker]}" \
        in " ".join(RECORDED[broker]["features"])  # what Kafka's own feature tool says


@pytest.mark.parametrize("broker", sorted(RECORDED))
def test_a_version_the_broker_does_not_know_is_answered_and_read_as_v0(broker: str) -> None:
    """Asked for ApiVersions v9, every line answers UNSUPPORTED_VERSION in the v0 schema,
    listing its own ApiVersions range; read with v3's schema it would be garbage."""
    answer = _answer(broker, 9)
    assert (answer.version, answer.error_code) == (0, 35)
    assert answer.versions == {ApiKey.API_VERSIONS: OFFERED[broker][ApiKey.API_VERSIONS]}
    assert answer.finalized == {}


def test_a_future_broker_that_dropped_our_versions_is_refused_before_sending() -> None:
    conn = _connection({ApiKey.SHARE_GROUP_DESCRIBE: (2, 3), ApiKey.METADATA: (14, 15)})
    with pytest.raises(UnsupportedVersionError, match=r"ShareGroupDescribe .*v2-3.*speaks v1-1"):
        conn.version_for(ApiKey.SHARE_GROUP_DESCRIBE)
    with pytest.raises(UnsupportedVersionError, match=r"Metadata .*v14-15"):
        conn.version_for(ApiKey.METADATA)


def test_a_future_broker_with_newer_versions_gets_the_newest_we_speak() -> None:
    future: dict[int, tuple[int, int]] = {k: (0, 99) for k in API_SPECS}
    conn = _connection(future)
    assert {k: conn.version_for(k) for k in API_SPECS} == \
        {k: spec.max_version for k, spec in API_SPECS.items()}


@pytest.mark.parametrize("theirs", [None, (-1, -1), (3, 1), (-1, 5)])
def test_a_missing_or_nonsense_range_picks_no_version(theirs: tuple[int, int] | None) -> None:
    assert common_version(ApiKey.SHARE_GROUP_DESCRIBE, theirs) is None


def test_api_versions_v3_request_names_the_client() -> None:
    body = msg.encode_api_versions_request(3)
    name, version = msg.CLIENT_SOFTWARE
    assert body == bytes([len(name) + 1]) + name.encode() + bytes([len(version) + 1]) \
        + version.encode() + b"\x00"
    assert msg.encode_api_versions_request(0) == b""


def test_a_feature_tag_of_the_wrong_size_is_a_decode_error() -> None:
    raw = bytearray(bytes.fromhex(RECORDED["4.4.0"]["v3"]))
    at = raw.rfind(b"\x02\x91\x01")  # tag 2 (FinalizedFeatures), size 145
    assert at > 0
    raw[at + 1] = 0x92  # claims 146 bytes
    r = Reader(bytes(raw), flexible=False)
    decode_response_header(ApiKey.API_VERSIONS, 3, r)
    with pytest.raises(ProtocolDecodeError, match="tagged field 2"):
        msg.decode_api_versions_answer(3, r)


# -- the harness's broker version ------------------------------------------------------------


def test_the_harness_runs_the_version_the_environment_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jars.ENV_KAFKA_VERSION, raising=False)
    assert LocalKafka().version == jars.KAFKA_VERSION == jars.kafka_version()
    assert jars.KAFKA_VERSION in jars.KAFKA_VERSIONS
    monkeypatch.setenv(jars.ENV_KAFKA_VERSION, "4.4.0")
    assert LocalKafka().version == "4.4.0"
    assert LocalKafka(version="4.2.2").version == "4.2.2"  # an explicit version wins


@pytest.mark.parametrize("value", ["4.1.2", "latest", "4.4", "3.9.1"])
def test_a_version_without_share_groups_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(jars.ENV_KAFKA_VERSION, value)
    with pytest.raises(LocalKafkaError, match=rf"{jars.ENV_KAFKA_VERSION}='{value}'.*4\.2\.0"):
        LocalKafka()


def test_the_recorded_lines_are_the_harness_lines() -> None:
    assert sorted(RECORDED) == sorted(jars.KAFKA_VERSIONS)


@pytest.mark.parametrize("handshake, authenticate", [((0, 0), (0, 2)), ((0, 1), (3, 4)),
                                                      ((0, 1), None)])
def test_sasl_versions_without_a_common_one_fail_before_sending(
        handshake: tuple[int, int], authenticate: tuple[int, int] | None) -> None:
    versions: dict[int, tuple[int, int]] = {sasl.SASL_HANDSHAKE: handshake}
    if authenticate is not None:
        versions[sasl.SASL_AUTHENTICATE] = authenticate
    config = ConnectionConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                              username="u", password="p")

    def roundtrip(name: str, payload: bytes, deadline: float) -> bytes:
        raise AssertionError(f"{name} sent")

    with pytest.raises(AuthenticationError, match="SaslHandshake v1 and SaslAuthenticate v0-2"):
        sasl.authenticate(roundtrip, config, versions, framer=Framer("c", "broker:9092"),
                          deadline=1e12)


def test_every_line_offers_the_sasl_versions_the_client_sends() -> None:
    """SaslHandshake v1 and SaslAuthenticate v2 (the highest the client speaks)."""
    for broker in RECORDED:
        versions = _answer(broker, 0).versions
        assert versions[sasl.SASL_HANDSHAKE][0] <= 1 <= versions[sasl.SASL_HANDSHAKE][1]
        assert versions[sasl.SASL_AUTHENTICATE][0] <= 2 <= versions[sasl.SASL_AUTHENTICATE][1]
