"""Decoding one real ShareFetch response of 2,000 records: the protocol client's decoder
(``_kafka/protocol/consume.py`` + ``records.py``) against ``kio`` (docs/design.md, "A share
consumer of our own").

Capture (a LocalKafka broker; confluent-kafka produces, the native consumer fetches and the
largest ShareFetch response frame is saved)::

    .venv/bin/python bench/native_decode.py capture /tmp/sharefetch.bin [--records 2000]

Decode it, with this venv's decoder or with kio (which needs Python 3.11+: install it in a
scratch venv with ``pip install kio``, and run this file there with ``--decoder kio``; the
file imports nothing of the package then)::

    .venv/bin/python bench/native_decode.py decode /tmp/sharefetch.bin --decoder ours
    /tmp/kio-venv/bin/python bench/native_decode.py decode /tmp/sharefetch.bin --decoder kio

The machine is shared: report the fastest run beside the median.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

BODY_AT = 5  # a flexible response frame: correlation id (4), empty header tagged fields (1)


def capture(path: str, n: int) -> None:
    from pyspark_kafka_share._kafka.native import NativeConsumerConfig, NativeShareConsumer
    from pyspark_kafka_share._kafka.protocol import client
    from pyspark_kafka_share.harness import LocalKafka

    frames: list[bytes] = []
    original = client.BrokerConnection._roundtrip

    def keep(self: Any, name: str, payload: bytes, deadline: float) -> bytes:
        frame = original(self, name, payload, deadline)
        if name == "ShareFetch":
            frames.append(frame)
        return frame

    client.BrokerConnection._roundtrip = keep  # type: ignore[method-assign]
    with LocalKafka(heap="512m") as kafka:
        topic, group = kafka.create_topic("decode", 1), "decode"
        kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
        values = [f"value-{i:06d}-".encode() + b"x" * 80 for i in range(n)]
        kafka.produce(topic, values, producer_config={"linger.ms": "50"})
        config = NativeConsumerConfig(kafka.bootstrap_servers, group, max_poll_records=n)
        with NativeShareConsumer(config, [topic]) as consumer:
            got = 0
            deadline = time.monotonic() + 60
            while got < n and time.monotonic() < deadline:
                records = consumer.poll(2.0)
                for r in records:
                    consumer.acknowledge(r)
                got += len(records)
    if got != n:
        raise SystemExit(f"fetched {got} records, produced {n}")
    with open(path, "wb") as f:
        f.write(max(frames, key=len))


def ours(frame: bytes) -> Callable[[], int]:
    from pyspark_kafka_share._kafka.protocol.codec import Reader
    from pyspark_kafka_share._kafka.protocol.consume import decode_share_fetch_response
    from pyspark_kafka_share._kafka.protocol.records import decode_batches

    def run() -> int:
        answer = decode_share_fetch_response(2, Reader(frame, True, BODY_AT))
        return sum(len(b.records) for p in answer.partitions
                   for b in decode_batches(p.records or b""))

    return run


def kio(frame: bytes) -> Callable[[], int]:
    from kio.records.readers import read_batch
    from kio.schema.share_fetch.v2.response import ShareFetchResponse
    from kio.serial import entity_reader

    read = entity_reader(ShareFetchResponse)

    def run() -> int:
        response, _ = read(frame, BODY_AT)
        n = 0
        for topic in response.responses:
            for part in topic.partitions:
                data, pos = bytes(part.records), 0
                while pos < len(data):
                    batch, size = read_batch(data, pos)
                    pos += size
                    n += len(batch.records)
        return n

    return run


def decode(path: str, decoder: str, rounds: int) -> None:
    with open(path, "rb") as f:
        frame = f.read()
    run = ours(frame) if decoder == "ours" else kio(frame)
    count = run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(f"{decoder}: {count} records, {len(frame)} bytes: fastest "
          f"{min(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms "
          f"over {rounds} decodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["capture", "decode"])
    parser.add_argument("path")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--decoder", choices=["ours", "kio"], default="ours")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.path, args.records)
    else:
        decode(args.path, args.decoder, args.rounds)


if __name__ == "__main__":
    main()
