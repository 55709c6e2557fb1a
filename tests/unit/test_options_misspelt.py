"""A misspelt required kafka.* key is named, also when it stands alone (no broker needed)."""

from __future__ import annotations

import pytest

from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.source.options import parse_options

BASE = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "orders",
        "delivery": "at-most-once"}


def test_a_misspelt_group_id_alone_is_named_with_did_you_mean() -> None:
    with pytest.raises(OptionError) as err:
        parse_options({**BASE, "kafka.group.idd": "orders"})
    assert err.value.option == "kafka.group.id"
    text = str(err.value)
    assert "'kafka.group.idd'" in text and "did you mean 'kafka.group.id'?" in text
    assert "'orders'" in text


def test_a_misspelt_bootstrap_is_named_too() -> None:
    options = {"kafka.bootstrap.server": "localhost:9092", "kafka.group.id": "g",
               "subscribe": "orders", "delivery": "at-most-once"}
    with pytest.raises(OptionError) as err:
        parse_options(options)
    assert err.value.option == "kafka.bootstrap.servers"
    assert "did you mean 'kafka.bootstrap.servers'?" in str(err.value)


def test_a_missing_group_without_a_near_key_keeps_the_plain_error() -> None:
    with pytest.raises(OptionError) as err:
        parse_options({**BASE, "kafka.client.id": "me"})
    assert err.value.option == "kafka.group.id"
    assert "did you mean" not in str(err.value)
