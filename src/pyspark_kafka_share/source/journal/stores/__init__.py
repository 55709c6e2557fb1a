"""Where the journal lives: the storage back ends, one module each, and :func:`store_for`,
which picks one for a parsed ``journalPath`` (a :class:`..location.JournalLocation`). The
checks made at ``load()`` are in ``..probe``.

Every back end provides the one primitive the journal is built on, an **exclusive create**:
of all writers that try to create the same path, exactly one succeeds and the others learn
that the path exists. See ``docs/design.md`` ("The journal on object stores") and
``docs/guarantees.md`` for why that, plus strongly consistent reads and listings, is enough.

===========================  ===================================================  ===============
``journalPath``              exclusive create                                     module
===========================  ===================================================  ===============
``/path``, ``file://``        ``link(2)`` of a fully written temporary file        ``local``
``hdfs://``, ``viewfs://``    HDFS ``rename``, which refuses an existing target    ``hdfs``
``s3://``, ``s3a://``         ``PutObject`` with ``If-None-Match: *``              ``objectstore``
``gs://``                     upload with ``ifGenerationMatch=0``                  ``objectstore``
``abfs://``, ``abfss://``     ``Put Blob`` with ``If-None-Match: *``               ``objectstore``
===========================  ===================================================  ===============
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.stores.base import Store
from pyspark_kafka_share.source.journal.stores.hdfs import ArrowFsStore
from pyspark_kafka_share.source.journal.stores.local import LocalStore
from pyspark_kafka_share.source.journal.stores.objectstore import ObjectStore
from pyspark_kafka_share.source.journal.stores.retry import DEFAULT_RETRY_TIMEOUT_MS

__all__ = ["ArrowFsStore", "LocalStore", "ObjectStore", "Store", "store_for"]


def store_for(location: JournalLocation,
              options: Mapping[str, str] | Iterable[tuple[str, str]] = (), *,
              retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS) -> tuple[Store, str]:
    """The back end of the journal at ``location`` and the journal's root path in it (a local
    path made absolute here, in the process that opens it). ``options``: ``journal.<key>``
    settings of an object store, without the prefix; ``retry_timeout_ms``: how long an object
    store's call rides out an outage (``journalRetryTimeoutMs``)."""
    if location.kind == "local":
        return LocalStore(), os.path.abspath(location.path)
    if location.kind == "object":
        opts = dict(options.items() if isinstance(options, Mapping) else options)
        return ObjectStore(location, opts, retry_timeout_ms=retry_timeout_ms), location.path
    return ArrowFsStore(location), location.path
