"""The offset Spark logs for each micro-batch of the ``kafka-share`` source.

Offsets carry no Kafka positions (a share group keeps those on the broker). Spark writes the
offset to its log before running the batch, so a re-run batch gets the same plan, and each
task finds its records in the journal under ``(seq, part)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchOffset"]


@dataclass(frozen=True)
class BatchOffset:
    """Batch ``seq`` runs ``parts`` tasks reading at most ``max_records`` records in all
    (0: unlimited). Logged by Spark as ``{"seq": n, "parts": p, "max": m}``."""

    seq: int
    parts: int
    max_records: int = 0

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> BatchOffset:
        """The offset Spark hands back (its JSON, parsed)."""
        return cls(int(raw["seq"]), int(raw["parts"]), int(raw.get("max", 0)))

    def json(self) -> dict[str, int]:
        """What Spark logs."""
        return {"seq": self.seq, "parts": self.parts, "max": self.max_records}

    def following(self, parts: int, max_records: int) -> BatchOffset:
        """The plan of the next batch."""
        return BatchOffset(self.seq + 1, parts, max_records)
