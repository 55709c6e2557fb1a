"""The exception tree and the one table of Kafka error codes' facts."""

from __future__ import annotations

import pytest

from pyspark_kafka_share import errors
from pyspark_kafka_share.errors import (
    CoordinatorNotAvailableError,
    ErrorCode,
    GroupNotEmptyError,
    KafkaApiError,
    OptionError,
    UnknownTopicError,
    UnsupportedSecurityProtocolError,
    error_for,
    error_name,
)


def test_every_named_code_has_one_row_of_facts() -> None:
    assert set(errors._FACTS) == set(ErrorCode)
    assert error_name(68) == "NON_EMPTY_GROUP" and error_name(9999) == "ERROR_9999"


def test_error_for_reads_the_class_retriability_and_hint_from_the_table() -> None:
    exc = error_for(ErrorCode.NOT_COORDINATOR, "ctx")
    assert type(exc) is CoordinatorNotAvailableError and exc.retriable
    assert exc.code == 16 and type(exc.code) is int
    assert str(exc) == ("ctx: the broker answered NOT_COORDINATOR (error code 16). The group "
                        "coordinator is unavailable or moving; retry later")
    assert type(error_for(100, "t")) is UnknownTopicError
    unknown = error_for(9999, "ctx", "it broke.")
    assert type(unknown) is KafkaApiError and not unknown.retriable
    assert str(unknown) == "ctx: the broker answered ERROR_9999 (error code 9999): it broke"
    with pytest.raises(ValueError):
        error_for(0, "ctx")


def test_a_class_built_directly_gets_its_codes_hint_unless_given_one() -> None:
    assert "stop all of its consumers" in str(GroupNotEmptyError(68, "ctx"))
    assert str(GroupNotEmptyError(68, "ctx", hint="")) == \
        "ctx: the broker answered NON_EMPTY_GROUP (error code 68)"


def test_unsupported_security_protocol_is_an_option_error() -> None:
    exc = UnsupportedSecurityProtocolError("security_protocol", "SSL", "use PLAINTEXT")
    assert isinstance(exc, OptionError) and isinstance(exc, ValueError)
    assert (exc.option, exc.value, exc.fix) == ("security_protocol", "SSL", "use PLAINTEXT")
