"""Integration fixtures for object-store journals.

- ``s3``: one :class:`LocalS3` (moto's S3 on 127.0.0.1) for the session, with a bucket
  (shared with the unit tier's: ``helpers.shared_s3``).
- ``s3_journal``: a fresh ``s3://`` journal on it (a :class:`helpers.JournalAt`: ``.url``,
  ``.options`` with the ``journal.*`` options that reach it, ``.open()`` the ``Journal``).
- ``journal``: the same, parametrized over the journal kinds (``local``: a directory under
  ``tmp_path``; ``s3``): a test taking it runs once per kind.

No test may reach a real cloud: unless the environment already names one, the standard AWS
variables point S3 clients at a closed loopback port with dummy credentials, so a journal URL
without explicit options (e.g. ``s3://bucket/j`` in the bad-input tests) fails at once on
127.0.0.1 instead of contacting AWS or an instance-metadata address. They are set when this
file is imported, before the session's SparkSession starts, so Spark's Python workers inherit
them too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import JournalAt, journal_at, shared_s3
from pyspark_kafka_share.harness.s3 import LocalS3

_CLOSED_LOOPBACK = "http://127.0.0.1:9"  # discard port: nothing listens, refused at once
for _name, _value in {"AWS_ENDPOINT_URL": _CLOSED_LOOPBACK, "AWS_ACCESS_KEY_ID": "none",
                      "AWS_SECRET_ACCESS_KEY": "none", "AWS_REGION": "us-east-1",
                      "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_name, _value)

JOURNAL_KINDS = ["local", "s3"]


@pytest.fixture(scope="session")
def s3() -> Iterator[LocalS3]:
    with shared_s3() as server:
        yield server


@pytest.fixture
def s3_journal(s3: LocalS3, tmp_path: Path) -> JournalAt:
    return journal_at("s3", tmp_path, s3)


@pytest.fixture(params=JOURNAL_KINDS)
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> JournalAt:
    """A fresh journal of each kind: the tests that take it run once per kind."""
    server = request.getfixturevalue("s3") if request.param == "s3" else None
    return journal_at(request.param, tmp_path, server)
