"""Deprecated: the local harnesses moved to :mod:`pyspark_kafka_share.harness`.

``from pyspark_kafka_share.localkafka import LocalKafka`` (and its submodules ``broker``,
``jars``, ``s3``, ``spark``) keep working for users' tests, with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import sys
import warnings

from pyspark_kafka_share import harness as _harness
from pyspark_kafka_share.harness import *  # noqa: F403
from pyspark_kafka_share.harness import __all__ as __all__
from pyspark_kafka_share.harness import broker, jars, s3, spark

warnings.warn("pyspark_kafka_share.localkafka is deprecated: import pyspark_kafka_share.harness "
              "instead (same names)", DeprecationWarning, stacklevel=2)

for _module in (broker, jars, s3, spark):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _harness, _module
