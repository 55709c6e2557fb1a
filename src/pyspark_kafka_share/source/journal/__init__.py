"""The acknowledgement journal: records are durable here before they are ACCEPTed."""

from __future__ import annotations

from pyspark_kafka_share.source.journal.journal import (
    EndMarker,
    Journal,
    JournalSettings,
    PartLog,
    ScanResult,
    check_journal,
    check_journal_uri,
)

__all__ = ["EndMarker", "Journal", "JournalSettings", "PartLog", "ScanResult", "check_journal",
           "check_journal_uri"]
