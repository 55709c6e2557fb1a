"""The ``kafka-share`` command line's contract with scripts: its exit codes (and the error
each stands for) and the environment variables it reads."""

from __future__ import annotations

from pyspark_kafka_share.errors import (
    GroupNotFoundError,
    KafkaShareError,
    LagUnavailableError,
    NotAShareGroupError,
    OptionError,
)

__all__ = [
    "ENV_BOOTSTRAP_FALLBACK",
    "ENV_BOOTSTRAP_SERVERS",
    "EXIT_CODES_HELP",
    "EXIT_ERROR",
    "EXIT_GROUP_NOT_FOUND",
    "EXIT_LAG_UNKNOWN",
    "EXIT_NOT_A_SHARE_GROUP",
    "EXIT_OK",
    "EXIT_USAGE",
    "exit_code",
]

ENV_BOOTSTRAP_SERVERS = "KAFKA_SHARE_BOOTSTRAP_SERVERS"
"""Environment variable: the default of ``--bootstrap-server`` (``host:port[,...]``)."""
ENV_BOOTSTRAP_FALLBACK = "PYSPARK_KAFKA_SHARE_BOOTSTRAP"
"""Also read, after :data:`ENV_BOOTSTRAP_SERVERS`: the local harness's external broker
(``harness.ENV_BOOTSTRAP``), which the CLI's default came from before it had its own."""

EXIT_OK = 0
"""Success: what was printed is the whole answer (for ``lag``: every partition's lag is known)."""
EXIT_ERROR = 1
"""Any other error: broker unreachable, group not empty, unknown topic, ..."""
EXIT_USAGE = 2
"""Bad arguments (argparse's code), or a change (``reset``, ``delete``, ``config --set``,
``dlq --topic``) without ``--execute`` or
``--dry-run``: the plan was printed and nothing was changed."""
EXIT_GROUP_NOT_FOUND = 3
"""No group of that name exists."""
EXIT_NOT_A_SHARE_GROUP = 4
"""A group of that name exists but is not a share group (e.g. a classic consumer group)."""
EXIT_LAG_UNKNOWN = 5
"""``lag``: the lag of some partition is unknown (no share state yet: no member has fetched
from it) or the broker does not report lag; the table is printed, the total counts only the
known partitions."""

# Most specific first: NotAShareGroupError is a GroupNotFoundError.
_EXIT_CODES: tuple[tuple[type[KafkaShareError], int], ...] = (
    (NotAShareGroupError, EXIT_NOT_A_SHARE_GROUP),
    (GroupNotFoundError, EXIT_GROUP_NOT_FOUND),
    (LagUnavailableError, EXIT_LAG_UNKNOWN),
    (OptionError, EXIT_USAGE),
)

EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_OK}  success: the output is the whole answer
  {EXIT_ERROR}  any other error (broker unreachable, group not empty, unknown topic, ...)
  {EXIT_USAGE}  bad arguments, or a change (reset, delete, config --set, dlq --topic,
     dlq replay) without --execute or --dry-run (the plan is printed, nothing is changed); config
     --set of a group config this broker's Kafka line does not have
  {EXIT_GROUP_NOT_FOUND}  no group of that name
  {EXIT_NOT_A_SHARE_GROUP}  the group is not a share group (e.g. a classic consumer group)
  {EXIT_LAG_UNKNOWN}  lag: some partition's lag is unknown (no member has fetched from it yet,
     or the broker predates lag reporting); the table is printed and TOTAL-LAG
     counts the known partitions only
"""


def exit_code(exc: KafkaShareError) -> int:
    """The exit code for an error (see :data:`EXIT_CODES_HELP`)."""
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_ERROR
