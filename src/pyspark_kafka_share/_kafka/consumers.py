"""Which share consumer a front-end gets: the one seam between the two clients.

Both front-ends take ``client``: ``"librdkafka"`` (confluent-kafka's ``ShareConsumer``) or
``"native"`` (the package's own, ``_kafka/native/``: strict ``record_limit`` polls, RENEW).
Each front-end names its own default (the source's ``source.options.DEFAULT_CLIENT``,
``"native"``; the workers' ``workers.config.DEFAULT_CLIENT``, ``"librdkafka"``); the kernel
has none. A :class:`ConsumerRecipe` says which client, with what settings and poll size;
:meth:`ConsumerRecipe.open` is the one place a share consumer is made (the workers'
``open_consumer``, the source's consumer pool), and :meth:`ConsumerRecipe.check` refuses
before anything starts, by name, a setting the chosen client would not honour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pyspark_kafka_share._kafka.native.adapter import NativeSession
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share._kafka.share import ConsumerSession, ShareSession
from pyspark_kafka_share.errors import OptionError

__all__ = ["CLIENTS", "ConsumerRecipe", "PolledSession", "ShareClient", "check_client"]

ShareClient = Literal["librdkafka", "native"]
CLIENTS: tuple[ShareClient, ...] = ("librdkafka", "native")


def check_client(value: object, name: str = "client") -> ShareClient:
    """``value`` as a :data:`ShareClient` (case and spaces ignored), or an
    :class:`OptionError` naming option ``name``, the value and the choices."""
    text = str(value).strip().lower()
    for client in CLIENTS:
        if text == client:
            return client
    raise OptionError(name, value, "use 'native' (the package's own: strict record_limit polls, "
                      "RENEW) or 'librdkafka' (confluent-kafka's share consumer)")


class PolledSession(ConsumerSession, Protocol):
    """A :class:`ConsumerSession` with what a pool and a poll loop read of it (both
    :class:`ShareSession` and :class:`NativeSession` have these)."""

    created: float
    last_poll: float
    """When the last poll returned (``time.monotonic()``)."""
    fetch_pending: bool
    """The last poll came back empty and a fetch may still be acquiring records (librdkafka;
    never for the native client, which fetches only inside a poll)."""


@dataclass(frozen=True)
class ConsumerRecipe:
    """How to make one share consumer: the client, its settings, its poll size.

    ``max_poll_records`` caps the settings' own ``max.poll.records`` (None: theirs).
    ``record_limit`` (native only): acquire at most that many records per poll, strictly
    (KIP-1206), instead of whole producer batches. ``arrow`` (native only): polls come as
    ``_kafka.arrow.ColumnarPoll``s of the source's schema, decoded without an object per
    record (with headers if True); None: as messages.
    """

    settings: ClientSettings
    client: ShareClient
    client_id: str = "pyspark-kafka-share"
    max_poll_records: int | None = None
    record_limit: bool = False
    arrow: bool | None = None

    def key(self) -> tuple[tuple[str, str], ...]:
        """What tells consumers of this recipe apart (the pool's key)."""
        if self.client == "librdkafka":
            return tuple(sorted((k, str(v)) for k, v in self.confluent_config().items()))
        return (("client", "native"), ("bootstrap.servers", self.settings.bootstrap_servers),
                ("group.id", self.settings.group_id), ("client.id", self.client_id),
                ("max.poll.records", str(self.max_poll_records)),
                ("record_limit", str(self.record_limit)), ("arrow", str(self.arrow)),
                *sorted(self.settings.extra))

    def check(self) -> None:
        """Refuse, by name, a setting the chosen client would not honour (the native client:
        any consumer setting outside ``settings.NATIVE_CONSUMER_KEYS`` and the connection's,
        or security settings the protocol client cannot use). librdkafka's settings are
        judged by ``settings.check_client_config``."""
        if self.client == "native":
            self.settings.native_consumer(client_id=self.client_id,
                                          max_poll_records=self.max_poll_records,
                                          record_limit=self.record_limit)

    def open(self, topics: Sequence[str], timeout_s: float) -> ShareSession | NativeSession:
        """A new consumer subscribed to ``topics`` (``timeout_s``: librdkafka's commits)."""
        if self.client == "native":
            return NativeSession.open(
                self.settings.native_consumer(client_id=self.client_id,
                                              max_poll_records=self.max_poll_records,
                                              record_limit=self.record_limit), topics,
                arrow=self.arrow, settings=self.settings)
        return ShareSession.open(self.confluent_config(), topics, timeout_s)

    def confluent_config(self) -> dict[str, object]:
        """The librdkafka share consumer's configuration (``ClientSettings.consumer``)."""
        return self.settings.consumer(client_id=self.client_id,
                                      max_poll_records=self.max_poll_records)
