"""``kafka-share exporter``: Prometheus metrics of share groups (docs/operations.md, "Metrics").

:mod:`.collect` reads the groups through :class:`~pyspark_kafka_share.admin.ShareGroupAdmin`
(no Prometheus there); :mod:`.serve` collects in a background thread and serves the last
collection over HTTP with prometheus_client (the ``[exporter]`` extra); :mod:`.query` serves a
driver's own ``kafka-share`` queries from their progress. The command line is
:mod:`pyspark_kafka_share.cli.exporter`.
"""
