"""The parts of the Kafka wire protocol that confluent-kafka lacks (share-group admin).

``codec``: API keys, versions, primitive encoding, headers. ``messages``: request and response
bodies and their typed results. ``client``: connections and :class:`KafkaProtocolClient`.
"""

from __future__ import annotations

from pyspark_kafka_share._kafka.protocol.client import (
    BrokerConnection,
    KafkaProtocolClient,
    api_versions,
    check_security_protocol,
    iter_partitions,
    parse_bootstrap,
)

__all__ = ["BrokerConnection", "KafkaProtocolClient", "api_versions",
           "check_security_protocol", "iter_partitions", "parse_bootstrap"]
