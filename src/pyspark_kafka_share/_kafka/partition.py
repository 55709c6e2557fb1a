"""One type for a topic-partition inside the package; strings only at the JSON edge.

Spark's own Kafka source keeps ``TopicPartition`` objects inside and writes ``"topic"`` /
partition pairs only in its offset JSON; so does this package: the kernel, the source and the
workers pass :class:`TopicPartition`, and ``"topic:partition"`` strings appear only where the
source's offset JSON, progress metrics or the journal's files are written or read
(:meth:`TopicPartition.key` / :meth:`TopicPartition.parse`).

A ``NamedTuple``, so it hashes, sorts and unpacks like the ``(topic, partition)`` pairs that
numpy, Arrow and confluent-kafka hand over.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition"]


class TopicPartition(NamedTuple):
    """A partition of a topic: ``TopicPartition("orders", 2)``."""

    topic: str
    partition: int

    def key(self) -> str:
        """The JSON spelling, ``"orders:2"``; :meth:`parse` reads the partition after the
        last ``:``."""
        return f"{self.topic}:{self.partition}"

    @classmethod
    def parse(cls, key: str) -> TopicPartition:
        """The inverse of :meth:`key`; a ``ValueError`` for anything else."""
        topic, sep, partition = key.rpartition(":")
        if not sep or not topic or not partition.isdigit():
            raise ValueError(f"not a 'topic:partition' key: {key!r}")
        return cls(topic, int(partition))
