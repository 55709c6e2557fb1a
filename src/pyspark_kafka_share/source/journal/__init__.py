"""The acknowledgement journal: each poll is durable here (its offsets and a checksum of its
rows, or its records) before its records are ACCEPTed."""

from __future__ import annotations

from pyspark_kafka_share.source.journal.journal import (
    EndMarker,
    Journal,
    JournalLocation,
    JournalSettings,
    PartLog,
    ScanResult,
    check_journal,
    check_journal_uri,
)

__all__ = ["EndMarker", "Journal", "JournalLocation", "JournalSettings", "PartLog", "ScanResult",
           "check_journal", "check_journal_uri"]
