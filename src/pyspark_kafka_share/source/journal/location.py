"""Where a journal lives: ``journalPath`` parsed once, at the edge, into a
:class:`JournalLocation` that the probe, the store factory and the stores take.

The string is read here only: the source parses it when it validates its options
(``parse_options``), a direct user of :class:`~.journal.Journal` when it opens one. Everything
below works on the typed value, which pickles (it travels to the executors inside the source's
options) and holds no client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlparse

from pyspark_kafka_share.errors import OptionError

__all__ = ["HADOOP_SCHEMES", "LOCAL_SCHEMES", "OBJECT_STORE_SCHEMES", "JournalLocation",
           "StoreKind"]

LOCAL_SCHEMES = ("", "file")
HADOOP_SCHEMES = ("hdfs", "viewfs")
# URL scheme -> (store name, the pip extra that installs its client)
OBJECT_STORE_SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("S3", "s3"), "s3a": ("S3", "s3"),
    "gs": ("GCS", "gcs"),
    "abfs": ("Azure Blob Storage", "azure"), "abfss": ("Azure Blob Storage", "azure"),
}

StoreKind = Literal["local", "hadoop", "object"]


@dataclass(frozen=True)
class JournalLocation:
    """A ``journalPath``, parsed: which back end, and where in it.

    ``path``: the journal directory on a filesystem (``local``: as given, so a relative path
    resolves against the working directory of each process that opens it, which the driver's
    marker check catches on a cluster; ``hadoop``: the path inside the filesystem), or the key
    prefix inside the bucket (``object``: no leading or trailing ``/``).
    ``bucket_url``, ``store``, ``extra``: an object store's URL (bucket or container, handed to
    obstore), its name in messages ("S3", "GCS", "Azure Blob Storage") and the pip extra that
    installs its client; empty on filesystems.
    """

    uri: str         # journalPath as given: messages and per-journal caches
    scheme: str      # lower-case URL scheme; "" for a plain path
    kind: StoreKind
    path: str
    bucket_url: str = ""
    store: str = ""
    extra: str = ""

    @classmethod
    def parse(cls, uri: str) -> JournalLocation:
        """``uri`` parsed (no I/O). Raises :class:`OptionError` naming ``journalPath`` for a
        scheme without an atomic exclusive create, and for an object-store URL without a
        bucket."""
        parsed = urlparse(uri)
        scheme = parsed.scheme.lower()
        if scheme in LOCAL_SCHEMES:
            return cls(uri, scheme, "local", parsed.path if parsed.scheme else uri)
        if scheme in HADOOP_SCHEMES:
            return cls(uri, scheme, "hadoop", parsed.path)
        if scheme not in OBJECT_STORE_SCHEMES:
            raise OptionError(
                "journalPath", uri,
                f"the '{scheme}' filesystem is not known to have the atomic create-if-absent "
                "the journal needs so that exactly one task attempt wins each slot. Use a local "
                "or mounted shared path, hdfs://, s3:// (or s3a://), gs://, abfs:// or abfss://",
            )
        store, extra = OBJECT_STORE_SCHEMES[scheme]
        if not parsed.netloc:
            where = "container@account" if extra == "azure" else "bucket"
            raise OptionError("journalPath", uri,
                              f"name the {where}: {scheme}://<{where}>/<path>")
        return cls(uri, scheme, "object", parsed.path.strip("/"),
                   bucket_url=f"{scheme}://{parsed.netloc}", store=store, extra=extra)
