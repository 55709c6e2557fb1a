"""The Kafka kernel: everything that talks to Kafka, and nothing that needs Spark.

Both front-ends, the ``kafka-share`` source (:mod:`pyspark_kafka_share.source`) and the queue
workers (:mod:`pyspark_kafka_share.workers`), stand on it, as Spark's ``kafka010`` source stands
on its ``consumer`` package, and so does the admin façade (:mod:`pyspark_kafka_share.admin`).
It imports nothing of them, nor Spark (``tests/unit/test_layers.py``):

- ``partition``: :class:`TopicPartition`, the one type for a partition inside the package;

- ``settings``: the one place that derives consumer, producer and admin client configs, and
  has librdkafka judge them before anything starts (``clientconf``: its refusals as option
  errors, with a "did you mean");
- ``logs``: every client's log lines through Python logging, quiet by default, summarized;
- ``group``: broker checks, group configs, ListOffsets, the group's backlog (lag) and start
  offsets, the check that subscribed topics still exist;
- ``progress``: the group's start offsets and lag as the broker reports them (the one reader);
- ``share``: the share-consumer kernel: acknowledge + commit, lock deadlines, the split of
  records on their last delivery, client-error checks;
- ``pool``: share consumers pooled per Python worker process;
- ``arrow``: messages to Arrow record batches;
- ``protocol``: the share-group admin wire protocol confluent-kafka lacks.
"""

from __future__ import annotations

__all__: list[str] = []
