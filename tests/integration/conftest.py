"""Integration fixtures for object-store journals.

- ``s3``: one :class:`LocalS3` (moto's S3 on 127.0.0.1) for the session, with a bucket.
- ``s3_journal``: a fresh ``s3://`` journal URL on it and the ``journal.*`` options that
  reach it (endpoint and test credentials).

No test may reach a real cloud: unless the environment already names one, the standard AWS
variables point S3 clients at a closed loopback port with dummy credentials, so a journal URL
without explicit options (e.g. ``s3://bucket/j`` in the bad-input tests) fails at once on
127.0.0.1 instead of contacting AWS or an instance-metadata address. They are set when this
file is imported, before the session's SparkSession starts, so Spark's Python workers inherit
them too.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from pyspark_kafka_share.localkafka.s3 import LocalS3

_CLOSED_LOOPBACK = "http://127.0.0.1:9"  # discard port: nothing listens, refused at once
for _name, _value in {"AWS_ENDPOINT_URL": _CLOSED_LOOPBACK, "AWS_ACCESS_KEY_ID": "none",
                      "AWS_SECRET_ACCESS_KEY": "none", "AWS_REGION": "us-east-1",
                      "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_name, _value)

BUCKET = "journals"


@pytest.fixture(scope="session")
def s3() -> Iterator[LocalS3]:
    with LocalS3() as server:
        server.create_bucket(BUCKET)
        yield server


@dataclass(frozen=True)
class S3Journal:
    """A journal location on the test server."""

    url: str
    options: dict[str, str]  # journal.<key> -> value, as source options

    @property
    def store_options(self) -> dict[str, str]:
        """The same without the ``journal.`` prefix, as :class:`Journal` takes them."""
        return {k.removeprefix("journal."): v for k, v in self.options.items()}


@pytest.fixture
def s3_journal(s3: LocalS3) -> S3Journal:
    return S3Journal(f"s3://{BUCKET}/j-{uuid.uuid4().hex[:12]}", s3.journal_options())
