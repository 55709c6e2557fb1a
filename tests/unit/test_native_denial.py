"""A native share consumer refused READ names the grant that fixes it, as librdkafka's does
(``NativeSession`` with the front-end's settings; ``access.share_consumer_denial``)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from pyspark_kafka_share._kafka.native.adapter import NativeSession
from pyspark_kafka_share._kafka.native.consumer import NativeShareConsumer
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import AuthorizationError, ErrorCode, error_for

SETTINGS = ClientSettings("h:9092", "orders-group")


class _Refused:
    """A consumer whose polls raise ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def poll(self, *_: Any, **__: Any) -> list[Any]:
        raise self.error

    poll_arrow = poll


def _session(error: Exception, settings: ClientSettings | None = SETTINGS,
             arrow: bool | None = None) -> NativeSession:
    return NativeSession(cast(NativeShareConsumer, _Refused(error)), arrow=arrow,
                         settings=settings, topics=("orders", "orders-eu"))


@pytest.mark.parametrize("arrow", [None, False])
def test_a_refused_topic_names_read_on_that_topic(arrow: bool | None) -> None:
    refused = error_for(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        "ShareFetch of partition 1 of topic orders-eu")
    with pytest.raises(AuthorizationError) as info:
        _session(refused, arrow=arrow).poll(1.0)
    text = str(info.value)
    assert info.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert "not allowed to READ topic 'orders-eu'" in text, text
    assert "--operation READ --topic 'orders-eu'" in text, text
    assert info.value.__cause__ is refused


def test_a_refused_group_names_read_on_the_group() -> None:
    refused = error_for(ErrorCode.GROUP_AUTHORIZATION_FAILED, "ShareGroupHeartbeat")
    with pytest.raises(AuthorizationError) as info:
        _session(refused).poll(1.0)
    assert "not allowed to READ group 'orders-group'" in str(info.value)
    assert "--operation READ --group 'orders-group'" in str(info.value)


@pytest.mark.parametrize(("error", "settings"), [
    (error_for(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ShareFetch"), SETTINGS),
    (error_for(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "ShareFetch of topic orders"), None),
])
def test_other_refusals_and_sessions_without_settings_raise_the_brokers_error(
        error: Exception, settings: ClientSettings | None) -> None:
    with pytest.raises(AuthorizationError) as info:
        _session(error, settings).poll(1.0)
    assert info.value is error
