"""``python -m pyspark_kafka_share.cli``: the ``kafka-share`` command."""

from __future__ import annotations

import sys

from pyspark_kafka_share.cli import main

sys.exit(main())
