"""The test suite's root: the shared fixture modules, loaded as plugins.

Fixtures live in :mod:`tests.fixtures` (loaded here as plugins, available in every tier):

- :mod:`tests.fixtures.kafka`: ``kafka``, ``topic_factory``, ``topic``, ``group``,
  ``share_consumer``, ``chaos_kafka``.
- :mod:`tests.fixtures.spark`: ``spark`` (``local[2, 4]``), ``cluster``, ``cluster_spark``.
- :mod:`tests.fixtures.journal`: ``s3``, ``s3_journal``, ``journal`` (one test per store).
- :mod:`tests.fixtures.connect`: ``connect_server`` (a local Spark Connect server, a JVM of its
  own), ``connect_spark`` (a Spark Connect session on it).
- :mod:`tests.fixtures.brokers`: ``toxiproxy``, ``kafka_cluster`` (three brokers, each behind a
  proxy), ``cluster_broker``, ``cluster_topic_factory``, ``cluster_group``.

Tests using the session broker's fixtures are marked ``broker``, tests using ``spark`` are
marked ``spark`` and tests using the Connect fixtures ``connect``, automatically (by a hook in
each of those modules); ``make unit`` runs the rest. Each tier's own hooks (the cluster, chaos,
Connect and brokers tiers run in pytest processes of their own) are in its folder's ``conftest.py``.
"""

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.spark", "tests.fixtures.journal",
                  "tests.fixtures.connect", "tests.fixtures.brokers"]
