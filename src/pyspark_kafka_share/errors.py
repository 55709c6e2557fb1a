"""The exception tree of pyspark-kafka-share.

Every error this package raises on purpose derives from :class:`KafkaShareError`, so
``except KafkaShareError`` catches all of them. Subclasses say where the problem lies:

- :class:`OptionError` -- a source option or argument is missing or has a bad value
  (also a :class:`ValueError`); raised before a query starts.
- :class:`BrokerError` -- the Kafka broker or client reported an error. Never swallowed and
  never turned into "no data".
- :class:`JournalError` -- the acknowledgement journal could not be read or written.
- :class:`LocalKafkaError` -- the local development broker could not be set up or started.
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "JournalError",
    "KafkaShareError",
    "LocalKafkaError",
    "OptionError",
]


class KafkaShareError(Exception):
    """Root of every exception raised by pyspark-kafka-share."""


class OptionError(KafkaShareError, ValueError):
    """A source option or an argument is missing or invalid.

    The message names the option, the value given and how to fix it.
    """

    def __init__(self, option: str, value: object, fix: str) -> None:
        self.option = option
        self.value = value
        self.fix = fix
        shown = "<missing>" if value is None else repr(value)
        super().__init__(f"option {option!r} = {shown}: {fix}")


class BrokerError(KafkaShareError):
    """The Kafka broker or client reported an error."""


class JournalError(KafkaShareError):
    """The acknowledgement journal could not be read or written."""


class LocalKafkaError(KafkaShareError):
    """The local Kafka broker harness could not fetch its jars or start the broker."""
