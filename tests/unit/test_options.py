"""Option parsing: every error names the option, the value and the fix."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest

from pyspark_kafka_share.errors import KafkaShareError, OptionError
from pyspark_kafka_share.source.options import DEFAULT_CLIENT, parse_options

BASE = {"kafka.bootstrap.servers": "h:9092", "kafka.group.id": "g", "subscribe": "a,b",
        "journalPath": "/tmp/j"}


def test_keys_are_case_insensitive_and_parsed_once_into_a_frozen_picklable_object() -> None:
    opts = parse_options({"KAFKA.BOOTSTRAP.SERVERS": "h:9092", "Kafka.Group.Id": "g",
                          "SUBSCRIBE": " a , b ", "JOURNALPATH": "/tmp/j",
                          "numpartitions": "8", "MaxRecordsPerTrigger": "100",
                          "kafka.client.id": "me", "includeHeaders": "TRUE"})
    assert opts.topics == ("a", "b")
    assert (opts.num_partitions, opts.max_records_per_trigger) == (8, 100)
    assert opts.include_headers
    assert opts.client.consumer(client_id="default")["client.id"] == "me"
    assert opts.client.consumer(client_id="default")["share.acknowledgement.mode"] == "explicit"
    assert pickle.loads(pickle.dumps(opts)) == opts
    with pytest.raises(AttributeError):
        opts.group_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(("extra", "option", "fix"), [
    ({"journalPath": ""}, "journalPath", "at-most-once"),
    ({"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset", "startingOffsets"),
    ({"kafka.share.acknowledgement.mode": "implicit"}, "kafka.share.acknowledgement.mode",
     "delivery"),
    ({"kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit", "remove"),
    ({"kafka.isolation.level": "read_committed"}, "kafka.isolation.level",
     "share.isolation.level"),
    ({"kafka.group.instance.id": "x"}, "kafka.group.instance.id", "static membership"),
    ({"subscribePattern": "a.*"}, "subscribePattern", "subscribe"),
    ({"subscribe": "a,a"}, "subscribe", "twice"),
    ({"subscribe": "bad topic"}, "subscribe", "not a valid topic name"),
    ({"numPartitions": "x"}, "numPartitions", "whole number"),
    ({"numPartitions": "0"}, "numPartitions", "at least 1"),
    ({"delivery": "exactly_once"}, "delivery", "exactly-once"),
    ({"startingOffsets": "5"}, "startingOffsets", "ISO-8601"),
    ({"includeHeaders": "yes please"}, "includeHeaders", "true or false"),
    ({"lockSafetyFraction": "0.95"}, "lockSafetyFraction", "between 0.1 and 0.9"),
    ({"journalPath": "ftp://b/j"}, "journalPath", "atomic"),  # s3:// is probed: see test_journal
    ({"pollTimeoutMS": "5"}, "pollTimeoutMs", "at least 10"),
    ({"maxRecordPerTrigger": "5"}, "maxRecordPerTrigger", "did you mean 'maxRecordsPerTrigger'"),
    ({"journalContent": "keys"}, "journalContent", "'records'"),
    ({"failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
])
def test_bad_values_name_option_value_and_fix(extra: dict[str, str], option: str,
                                              fix: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, **extra})
    assert info.value.option == option
    assert fix in str(info.value)
    assert isinstance(info.value, KafkaShareError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("missing", ["kafka.bootstrap.servers", "kafka.group.id", "subscribe"])
def test_required_options(missing: str) -> None:
    with pytest.raises(OptionError, match=missing):
        parse_options({k: v for k, v in BASE.items() if k != missing})


def test_empty_options_explain_the_catalog_table_limitation() -> None:
    with pytest.raises(OptionError, match="createOrReplaceTempView"):
        parse_options({})


def test_starting_offsets_map_to_group_config() -> None:
    assert parse_options({**BASE, "startingOffsets": "EARLIEST"}).starting_offsets == "earliest"
    assert parse_options({**BASE, "startingOffsets": "pt1h"}).starting_offsets == \
        "by_duration:PT1H"
    assert parse_options({**BASE, "startingOffsets": "P1DT2H"}).starting_offsets == \
        "by_duration:P1DT2H"


def test_at_most_once_needs_no_journal() -> None:
    opts = parse_options({**BASE, "journalPath": "", "delivery": "At-Most-Once"})
    assert not opts.exactly_once and opts.journal_path is None


def test_table_properties_are_ignored_and_option_prefix_stripped() -> None:
    opts = parse_options({"provider": "kafka-share", "owner": "root",
                          **{f"option.{k}": v for k, v in BASE.items()}})
    assert opts.group_id == "g"


def test_journal_fsync_defaults_on_and_can_be_turned_off() -> None:
    assert parse_options(BASE).journal_fsync is True
    assert parse_options({**BASE, "JOURNALFSYNC": "false"}).journal_fsync is False


def test_the_journal_keeps_offsets_and_fails_on_data_loss_by_default() -> None:
    opts = parse_options(BASE)
    settings = opts.journal_settings()
    assert settings is not None and settings.content == "offsets" and opts.fail_on_data_loss
    opts = parse_options({**BASE, "journalcontent": "Records", "FAILONDATALOSS": "false"})
    settings = opts.journal_settings()
    assert settings is not None and settings.content == "records"
    assert opts.fail_on_data_loss is False


def test_a_task_polls_10_s_by_default_30_s_under_available_now_and_as_long_as_set() -> None:
    from pyspark_kafka_share.source.poller import Poller
    from pyspark_kafka_share.source.task import TaskSpec

    default, drain = parse_options(BASE), parse_options({**BASE, "maxBatchDurationMs": "500"})
    assert (default.batch_duration_ms(False), default.batch_duration_ms(True)) == \
        (10_000, 30_000)
    assert (drain.batch_duration_ms(False), drain.batch_duration_ms(True)) == (500, 500)

    class Pooled:  # what Poller reads of a pooled consumer
        session, uses = None, 2

    spec = TaskSpec(default, seq=1, part=0, parts=1, task_max_records=None, lock_ms=30_000,
                    available_now=True)
    assert Poller(spec, Pooled(), None, Counter()).max_batch_s == 30  # type: ignore[arg-type]


def test_client_defaults_to_native_and_takes_librdkafka() -> None:
    from pyspark_kafka_share._kafka.native.consumer import NativeConsumerConfig

    # The source's default is the native client (the workers' stays librdkafka: issue 39 is
    # the source's; tests/unit/test_worker_native.py).
    assert parse_options(BASE).share_client == "native" == DEFAULT_CLIENT
    librdkafka = parse_options({**BASE, "CLIENT": " LibRdKafka "})
    assert librdkafka.share_client == "librdkafka"
    assert librdkafka.consumer_recipe(max_poll_records=300).record_limit is False
    opts = parse_options({**BASE, "kafka.max.poll.records": "800",
                          "kafka.fetch.wait.max.ms": "100", "kafka.client.id": "me"})
    assert opts.share_client == "native"
    recipe = opts.consumer_recipe(max_poll_records=300)
    assert recipe.record_limit, "the source's native polls are strict: maxRecordsPerTrigger"
    # without a cap, whole producer batches: strict polls that split them cost the broker
    assert opts.consumer_recipe().record_limit is False
    native = recipe.settings.native_consumer(client_id=recipe.client_id,
                                             max_poll_records=recipe.max_poll_records,
                                             record_limit=recipe.record_limit)
    assert isinstance(native, NativeConsumerConfig)
    assert (native.max_poll_records, native.fetch_max_wait_ms, native.client_id) == \
        (300, 100, "me")
    # pooled apart: a native consumer never serves a librdkafka task, nor another poll size
    keys = {recipe.key(), opts.consumer_recipe(max_poll_records=600).key(),
            librdkafka.consumer_recipe(max_poll_records=300).key()}
    assert len(keys) == 3
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_a_bad_client_names_the_option_the_value_and_the_choices() -> None:
    with pytest.raises(OptionError) as err:
        parse_options({**BASE, "client": "kafka-python"})
    assert err.value.option == "client" and err.value.value == "kafka-python"
    assert "'librdkafka'" in err.value.fix and "'native'" in err.value.fix


@pytest.mark.parametrize(("key", "value"), [("kafka.receive.message.max.bytes", "100000000"),
                                            ("kafka.socket.keepalive.enable", "true"),
                                            ("kafka.statistics.interval.ms", "1000")])
def test_the_native_client_refuses_at_load_the_kafka_settings_it_would_not_honour(
        key: str, value: str) -> None:
    parse_options({**BASE, key: value, "client": "librdkafka"})  # librdkafka takes it
    with pytest.raises(OptionError) as err:
        parse_options({**BASE, key: value})  # the default, native, refuses it
    assert err.value.option == key, "the error names the user's option, kafka. prefix and all"
    assert "native share client does not honour it" in err.value.fix
    assert "client='librdkafka'" in err.value.fix
