"""``python -m tests.tiers``: record each tier's selection (see :mod:`tests.tiers`)."""

from tests.tiers import record

record()
