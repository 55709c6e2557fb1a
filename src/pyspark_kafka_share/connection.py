"""How to reach a secured Kafka cluster: :class:`ConnectionConfig`, one typed, validated
value of the security protocol, SASL and TLS settings.

The admin (:class:`~pyspark_kafka_share.admin.ShareGroupAdmin`, ``connection=``) and the queue
workers (:func:`~pyspark_kafka_share.workers.run_workers`, ``connection=``) take it; both also
take the same settings as librdkafka's keys (a dict), and the ``kafka-share`` source takes
them as ``kafka.*`` options. Build one directly, or from either dialect::

    from pyspark_kafka_share import ConnectionConfig

    scram = ConnectionConfig(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                             username="alice", password="...", ca_file="ca.pem")
    same = ConnectionConfig.from_client_settings({"security.protocol": "SASL_SSL", ...})
    typed, librdkafka = ConnectionConfig.from_properties(open("client.properties").read())
    scram.client_settings()      # back to librdkafka's keys

Secrets never appear in ``repr``/``str`` or in an error; a bad setting is an
:class:`~pyspark_kafka_share.errors.OptionError` naming it and the fix (docs/security.md).
"""

from __future__ import annotations

from pyspark_kafka_share._kafka.connection import (
    MECHANISMS,
    PLAINTEXT,
    SECURITY_PROTOCOLS,
    ConnectionConfig,
    OidcSettings,
    TokenProvider,
    unsecured_jwt,
)

__all__ = [
    "MECHANISMS",
    "PLAINTEXT",
    "SECURITY_PROTOCOLS",
    "ConnectionConfig",
    "OidcSettings",
    "TokenProvider",
    "unsecured_jwt",
]
