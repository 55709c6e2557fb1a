"""The kernel's single derivations: a group's own topics (``_kafka/topics.py``, against a fake
admin client), each client's configuration (``ClientSettings``) and the client-error
classifier (``errors.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pyspark_kafka_share._kafka import group as _group
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share._kafka.topics import (
    CONTROL,
    MARKERS,
    ensure_group_topic,
    group_topic_name,
)
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    OptionError,
    UnknownTopicError,
    denied_resource,
    error_code,
    from_client_error,
    is_denied,
    is_fenced,
    is_retriable,
    is_unknown_topic,
)

SECURE = (("security.protocol", "SASL_SSL"), ("sasl.mechanism", "SCRAM-SHA-512"),
          ("sasl.username", "alice"), ("sasl.password", "pw"), ("ssl.ca.location", "ca.pem"),
          ("fetch.max.bytes", "1048576"), ("max.poll.records", "100"),
          ("socket.timeout.ms", "20000"))


def _token(_config: str) -> tuple[str, float]:
    return "t", 0.0


SETTINGS = ClientSettings("h:9093", "orders", SECURE, timeout_s=2.0, token_provider=_token)


# -- names ------------------------------------------------------------------------------------

# The marker topic's names as exactly-once outputs first made them: a running job's markers
# live there, so they must never change.
MARKER_NAMES = {
    "scorers": "kafka-share-markers.scorers",
    "my group/\u00e9": "kafka-share-markers.my_group__-e73406ac098a",
    "g" * 200: "kafka-share-markers." + "g" * 200,
    "g" * 201: "kafka-share-markers." + "g" * 180 + "-8e534d2689dc",
}


@pytest.mark.parametrize("group", sorted(MARKER_NAMES))
def test_the_marker_topics_names_are_unchanged(group: str) -> None:
    assert group_topic_name(group, MARKERS.purpose) == MARKER_NAMES[group]


def test_every_purpose_is_named_by_one_rule() -> None:
    for group, marker in MARKER_NAMES.items():
        control = group_topic_name(group, CONTROL.purpose)
        assert control == marker.replace("kafka-share-markers.", "kafka-share-control.", 1)
        assert len(control) <= 249
    assert group_topic_name("a/b", "control") != group_topic_name("a_b", "control")


# -- ensure_group_topic against a fake admin ------------------------------------------------


@dataclass
class _Partition:
    leader: int = 1


@dataclass
class _TopicMeta:
    partitions: dict[int, _Partition]
    error: Any = None


@dataclass
class _Listing:
    topics: dict[str, _TopicMeta]


class _Future:
    def __init__(self, result: Any = None, error: Exception | None = None) -> None:
        self._result, self._error = result, error

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


@dataclass
class _Config:
    value: str


@dataclass
class FakeAdmin:
    """Topics by name; ``create_error`` / ``describe_error``: what those calls raise."""

    topics: dict[str, _TopicMeta] = field(default_factory=dict)
    configs: dict[str, dict[str, _Config]] = field(default_factory=dict)
    create_error: Exception | None = None
    describe_error: Exception | None = None
    created: list[Any] = field(default_factory=list)
    listings: list[dict[str, _TopicMeta]] = field(default_factory=list)
    """Listings to answer first (another creator's topic appearing), then ``topics``."""

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> _Listing:
        return _Listing(self.listings.pop(0) if self.listings else dict(self.topics))

    def create_topics(self, new: list[Any], request_timeout: float = 0) -> dict[str, _Future]:
        t = new[0]
        self.created.append(t)
        if self.create_error is not None:
            return {t.topic: _Future(error=self.create_error)}
        self.topics[t.topic] = _TopicMeta({p: _Partition() for p in range(t.num_partitions)})
        self.configs[t.topic] = {k: _Config(v) for k, v in t.config.items()}
        return {t.topic: _Future()}

    def describe_configs(self, resources: list[Any], request_timeout: float = 0) \
            -> dict[Any, _Future]:
        r = resources[0]
        if self.describe_error is not None:
            return {r: _Future(error=self.describe_error)}
        return {r: _Future(self.configs[r.name])}


def _denied() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    fake = FakeAdmin()
    monkeypatch.setattr(_group, "admin_client", lambda _settings: fake)
    return fake


def test_a_missing_topic_is_created_as_its_kind_says(admin: FakeAdmin) -> None:
    assert ensure_group_topic(SETTINGS, CONTROL) == 2
    assert ensure_group_topic(SETTINGS, MARKERS) == 1
    assert [(t.topic, t.num_partitions, t.config) for t in admin.created] == [
        ("kafka-share-control.orders", 2, dict(CONTROL.config)),
        ("kafka-share-markers.orders", 1, dict(MARKERS.config))]
    assert ensure_group_topic(SETTINGS, CONTROL, "mine") == 2  # a topic the user names
    assert len(admin.created) == 3
    assert ensure_group_topic(SETTINGS, CONTROL, "mine") == 2  # exists: not created again
    assert len(admin.created) == 3


def test_a_denied_create_names_the_grant_and_the_option(admin: FakeAdmin) -> None:
    admin.create_error = _denied()
    with pytest.raises(AuthorizationError, match=r"(?s)creating the workers' control topic "
                       r"\(ctl; or create it beforehand: 2 partitions.*Create.*'x'"):
        ensure_group_topic(SETTINGS, CONTROL, "x", "ctl")


def test_a_topic_the_principal_may_not_describe_is_a_denial(admin: FakeAdmin) -> None:
    admin.topics["kafka-share-control.orders"] = _TopicMeta(
        {}, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(AuthorizationError, match=r"\(control_topic\).*Read/Write"):
        ensure_group_topic(SETTINGS, CONTROL)
    assert admin.created == []


def test_a_race_lost_to_another_creator_is_fine(admin: FakeAdmin) -> None:
    topic = "kafka-share-markers.orders"
    admin.create_error = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))
    admin.listings = [{}]  # missing at first; then the other creator's topic is listed
    admin.topics[topic] = _TopicMeta({0: _Partition()})
    admin.configs[topic] = {"cleanup.policy": _Config("compact")}
    assert ensure_group_topic(SETTINGS, MARKERS) == 1
    assert len(admin.created) == 1


def test_the_marker_topic_must_be_compacted_and_its_configs_readable(admin: FakeAdmin) -> None:
    topic = "kafka-share-markers.orders"
    admin.topics[topic] = _TopicMeta({0: _Partition()})
    admin.configs[topic] = {"cleanup.policy": _Config("compact,delete")}
    with pytest.raises(OptionError, match=r"exactly_once_outputs.*cleanup.policy='compact,del"):
        ensure_group_topic(SETTINGS, MARKERS)
    admin.describe_error = _denied()
    with pytest.raises(AuthorizationError, match=r"exactly_once_outputs.*DescribeConfigs"):
        ensure_group_topic(SETTINGS, MARKERS)
    admin.describe_error = KafkaException(KafkaError(KafkaError.INVALID_CONFIG, "odd"))
    with pytest.raises(BrokerError, match=r"could not be described.*DESCRIBE_CONFIGS"):
        ensure_group_topic(SETTINGS, MARKERS)


def test_a_marker_topic_of_more_than_one_partition_is_refused(admin: FakeAdmin) -> None:
    # The commit check reads the markers in their one order (issue 37; docs/design.md).
    from pyspark_kafka_share.workers.exactly_once import ensure_marker_topic

    topic = "kafka-share-markers.orders"
    admin.topics[topic] = _TopicMeta({0: _Partition(), 1: _Partition()})
    admin.configs[topic] = {"cleanup.policy": _Config("compact")}
    with pytest.raises(OptionError, match=r"'exactly_once_outputs'.*has 2 partitions.*one "
                                          r"partition.*Delete it"):
        ensure_marker_topic(SETTINGS)
    admin.topics[topic] = _TopicMeta({0: _Partition()})
    assert ensure_marker_topic(SETTINGS) == topic


def test_a_topic_without_leaders_fails_by_the_timeout(admin: FakeAdmin) -> None:
    admin.topics["t"] = _TopicMeta({0: _Partition(leader=-1)})
    fast = ClientSettings("h:9093", "orders", timeout_s=0.3)
    with pytest.raises(OptionError, match=r"no leader for all its partitions"):
        ensure_group_topic(fast, CONTROL, "t")


# -- client configurations ------------------------------------------------------------------


def _security(conf: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in conf.items() if k.startswith(("security.", "sasl.", "ssl."))}


@pytest.mark.parametrize("derive", [
    lambda s: s.replay_consumer(isolation_level="read_committed"),
    lambda s: s.control_consumer("driver"),
    lambda s: s.marker_reader(isolation_level="read_committed"),
    lambda s: s.admin(),
    lambda s: s.producer(),
    lambda s: s.consumer(client_id="c"),
], ids=["replay", "control", "markers", "admin", "producer", "share-consumer"])
def test_every_client_carries_the_same_security_settings(derive: Any) -> None:
    conf = derive(SETTINGS)
    assert _security(conf) == _security(dict(SECURE))
    assert conf["oauth_cb"] is _token and conf["bootstrap.servers"] == "h:9093"


def test_the_assigned_consumers_keep_connection_keys_and_fetch_sizes_only() -> None:
    for conf in (SETTINGS.replay_consumer(isolation_level="read_committed"),
                 SETTINGS.control_consumer("worker"),
                 SETTINGS.marker_reader(isolation_level="read_uncommitted")):
        assert "max.poll.records" not in conf and conf["fetch.max.bytes"] == "1048576"
        assert conf["enable.auto.commit"] is False
        assert conf["enable.auto.offset.store"] is False
    control = SETTINGS.control_consumer("worker")
    assert (control["group.id"], control["client.id"]) == ("orders", "kafka-share-control-worker")
    assert control["fetch.wait.max.ms"] == 100 and control["socket.timeout.ms"] == 2000
    replay = SETTINGS.replay_consumer(isolation_level="read_uncommitted")
    assert (replay["group.id"], replay["auto.offset.reset"]) == ("orders", "error")
    markers = SETTINGS.marker_reader(isolation_level="read_committed", fetch_wait_ms=20,
                                     error_cb=print)
    assert markers["group.id"].startswith("kafka-share-markers-")
    assert markers["group.id"] != SETTINGS.marker_reader(isolation_level="x")["group.id"]
    assert (markers["auto.offset.reset"], markers["fetch.wait.max.ms"]) == ("earliest", 20)
    assert markers["socket.timeout.ms"] == "20000"  # the user's, as the admin's
    assert markers["error_cb"] is print and markers["enable.partition.eof"] is True


# -- the error classifier -------------------------------------------------------------------


def test_the_classifier_reads_every_form_of_a_client_error() -> None:
    err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")
    wrapped = KafkaException(err)
    assert error_code(err) == error_code(wrapped) == 29
    try:
        raise from_client_error(wrapped, "x") from wrapped
    except BrokerError as exc:
        assert error_code(exc) == 29  # its cause's
    assert error_code(UnknownTopicError(3, "x")) == 3
    assert error_code(ValueError("29")) is None and error_code(None) is None
    assert denied_resource(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)) == "group"
    assert is_denied(wrapped) and not is_denied(KafkaError(KafkaError._TRANSPORT))
    assert all(is_unknown_topic(KafkaError(c)) for c in (
        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_TOPIC_ID,
        KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION))
    assert is_retriable(KafkaException(KafkaError(KafkaError._TRANSPORT, retriable=True)))
    assert is_retriable(ErrorCode.NOT_COORDINATOR) and not is_retriable(29)
    assert is_fenced(KafkaError(KafkaError._FENCED)) and is_fenced(90) and not is_fenced(29)
