"""Where the journal lives: the storage back ends, one module each, and :func:`store_for`,
which picks one for a ``journalPath``. The checks made at ``load()`` are in ``..probe``.

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
from urllib.parse import urlparse

from pyspark_kafka_share.source.journal.stores.base import Store
from pyspark_kafka_share.source.journal.stores.hdfs import ArrowFsStore
from pyspark_kafka_share.source.journal.stores.local import LocalStore
from pyspark_kafka_share.source.journal.stores.objectstore import (
    OBJECT_STORE_SCHEMES,
    ObjectStore,
    object_location,
)

__all__ = ["HADOOP_SCHEMES", "LOCAL_SCHEMES", "OBJECT_STORE_SCHEMES", "ArrowFsStore",
           "LocalStore", "ObjectStore", "Store", "store_for"]

LOCAL_SCHEMES = ("", "file")
HADOOP_SCHEMES = ("hdfs", "viewfs")


def store_for(uri: str, options: Mapping[str, str] | Iterable[tuple[str, str]] = ()
              ) -> tuple[Store, str]:
    """The back end of journal ``uri`` and the journal's root path in it."""
    opts = dict(options.items() if isinstance(options, Mapping) else options)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in LOCAL_SCHEMES:
        return LocalStore(), os.path.abspath(parsed.path if parsed.scheme else uri)
    loc = object_location(uri)
    if loc is not None:
        return ObjectStore(uri, loc, opts), loc.prefix
    return ArrowFsStore(uri), parsed.path
