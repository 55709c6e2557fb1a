"""The offset Spark logs for each micro-batch of the ``kafka-share`` source.

Offsets carry no Kafka positions (a share group keeps those on the broker). Spark writes the
offset to its log before running the batch, so a re-run batch gets the same plan, and each
task finds its records in the journal under ``(seq, part)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchOffset"]


@dataclass(frozen=True)
class BatchOffset:
    """Batch ``seq`` runs ``parts`` tasks reading at most ``max_records`` records in all
    (0: unlimited). ``backlog`` is the group's lag when the batch was planned (0: unknown),
    which the tasks share out, and ``ends`` the high watermark of each ``"topic:partition"``
    then (empty: unknown): a task that polls a record at or past its partition's end reads
    records produced after the plan, and stops. Logged by Spark as ``{"seq": n, "parts": p,
    "max": m, "backlog": b, "ends": {...}}``."""

    seq: int
    parts: int
    max_records: int = 0
    backlog: int = 0
    ends: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> BatchOffset:
        """The offset Spark hands back (its JSON, parsed)."""
        return cls(int(raw["seq"]), int(raw["parts"]), int(raw.get("max", 0)),
                   int(raw.get("backlog", 0)),
                   {str(k): int(v) for k, v in dict(raw.get("ends") or {}).items()})

    def json(self) -> dict[str, Any]:
        """What Spark logs."""
        return {"seq": self.seq, "parts": self.parts, "max": self.max_records,
                "backlog": self.backlog, "ends": dict(self.ends)}

    def following(self, parts: int, max_records: int, backlog: int | None,
                  ends: Mapping[str, int] | None = None) -> BatchOffset:
        """The plan of the next batch."""
        return BatchOffset(self.seq + 1, parts, max_records, backlog or 0, dict(ends or {}))

    def task_share(self) -> tuple[int | None, int | None]:
        """(records per task under ``max_records``, records per task of ``backlog``); None:
        unbounded. Rounded up: a batch reads at least what was there when it was planned."""
        return (-(-self.max_records // self.parts) if self.max_records else None,
                -(-self.backlog // self.parts) if self.backlog else None)
