"""The exception tree of pyspark-kafka-share: every error this package raises on purpose.

::

    KafkaShareError                     root: ``except KafkaShareError`` catches them all
    ├── OptionError (ValueError)        an option or argument is missing or bad; raised before
    │                                   a query or a worker job starts
    │   └── UnsupportedSecurityProtocolError   a security protocol or SASL mechanism the
    │                                          protocol client does not speak (e.g. GSSAPI)
    ├── SetupError                      this Python, or the Python Spark runs, lacks the
    │                                   package or a dependency (names the fix)
    ├── BrokerError                     the broker or a client reported an error; never
    │   │                               swallowed and never turned into "no data"
    │   ├── KafkaConnectionError        a broker could not be reached or did not answer
    │   ├── ProtocolDecodeError         a broker's response could not be decoded
    │   ├── LagUnavailableError         the broker does not report share-group lag
    │   ├── KafkaApiError               a broker answered with an error code (.code, .error)
    │   │   ├── CoordinatorNotAvailableError
    │   │   ├── GroupNotEmptyError
    │   │   ├── GroupNotFoundError
    │   │   │   └── NotAShareGroupError     a group of that name exists, of another type
    │   │   ├── UnknownTopicError
    │   │   ├── AuthorizationError
    │   │   └── UnsupportedVersionError
    │   ├── AuthenticationError         SASL authentication failed (wrong credentials,
    │   │                               mechanism not enabled); never retried
    │   ├── TlsError                    the TLS handshake failed (untrusted CA, hostname
    │   │                               mismatch, missing client certificate); never retried
    │   ├── Fenced                      a worker's transactional producer was fenced by a
    │   │                               newer attempt of its slot: the attempt stops
    │   ├── TransactionFailed           a worker's transaction was aborted or its outcome is
    │   │                               unknown (.fatal: replace the producer); its records
    │   │                               are RELEASEd (handled inside the workers)
    │   └── SecurityProtocolMismatchError  client and port speak different protocols (TLS
    │                                   or SASL to a port without, or the other way round)
    ├── WorkerJobError                  a worker job stopped itself, or Spark gave up on one of
    │   │                               its tasks; ``.summary``: what the workers did
    │   ├── ConfigurationMistakeError   a result the job's configuration cannot honour (an
    │   │                               output without ``output_topic``); names the argument
    │   ├── CircuitBreakerError         too many records failing over a window (the cause and
    │   │                               the counts); the workers RELEASEd what they held
    │   └── SparkGaveUpError            Spark failed a worker task for good (names the fix:
    │                                   ``local[N, F]``, ``spark.task.maxFailures``)
    ├── WakeupError                     a native share consumer's poll() was woken from
    │                                   another thread
    ├── JournalError                    the acknowledgement journal could not be read/written
    │   ├── DataLossError               a replay found journaled offsets gone from Kafka
    │   │                               (retention, compaction) or changed (a re-created
    │   │                               topic: checksum); failOnDataLoss=false skips them
    │   ├── JournalUnavailable          the journal's object store did not answer a call
    │   │                               within journalRetryTimeoutMs (names store, call)
    │   └── JournalClosed               a partition log was ENDed or its batch committed (a
    │                                   late task attempt; handled inside the source)
    └── LocalKafkaError                 a local harness (broker, S3 server, Spark cluster)
        │                               could not be set up
        ├── ArtifactNotFoundError       Maven Central has no such jar
        └── NotReady                    a harness is not ready yet (retried until a deadline)

Errors from confluent-kafka are mapped into this tree by :func:`from_client_error`, and Kafka
protocol error codes by :func:`error_for`, which reads the one table of the codes' facts
(:class:`ErrorCode`: Kafka's name; per code: retriable or not, the exception class, a hint).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Literal

__all__ = [
    "ArtifactNotFoundError",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerError",
    "CircuitBreakerError",
    "ConfigurationMistakeError",
    "CoordinatorNotAvailableError",
    "DataLossError",
    "ErrorCode",
    "Fenced",
    "GroupNotEmptyError",
    "GroupNotFoundError",
    "JournalClosed",
    "JournalError",
    "JournalUnavailable",
    "KafkaApiError",
    "KafkaConnectionError",
    "KafkaShareError",
    "LagUnavailableError",
    "LocalKafkaError",
    "NotAShareGroupError",
    "NotReady",
    "OptionError",
    "ProtocolDecodeError",
    "SecurityProtocolMismatchError",
    "SetupError",
    "SparkGaveUpError",
    "TlsError",
    "TransactionFailed",
    "UnknownTopicError",
    "UnsupportedSecurityProtocolError",
    "UnsupportedVersionError",
    "WakeupError",
    "WorkerJobError",
    "error_for",
    "error_name",
    "from_client_error",
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


class SetupError(KafkaShareError):
    """A Python environment lacks this package or a dependency; the message says which
    Python (this one, or the one Spark starts) and the command that fixes it."""


class UnsupportedSecurityProtocolError(OptionError):
    """A security protocol or SASL mechanism the protocol client does not speak (GSSAPI, an
    unknown name); ``option`` names the setting, the fix says what to use instead."""


class BrokerError(KafkaShareError):
    """The Kafka broker or client reported an error."""


class KafkaConnectionError(BrokerError):
    """A broker could not be reached, closed the connection or did not answer in time."""


class ProtocolDecodeError(BrokerError):
    """A broker's response could not be decoded (truncated, malformed or unexpected)."""


class LagUnavailableError(BrokerError):
    """The broker does not report share-group lag (DescribeShareGroupOffsets v1, Kafka 4.2+)."""


class Fenced(BrokerError):
    """This attempt's transactional producer was fenced (a newer attempt of the worker slot
    called ``init_transactions``) or failed fatally: the attempt stops."""


class TransactionFailed(BrokerError):
    """A transaction was aborted (or its outcome is unknown): its records are RELEASEd, and a
    redelivery finds the marker if the commit went through after all. ``fatal``: the producer
    is unusable (e.g. its transaction state was lost with a broker restart) and is replaced,
    and the outcome is unknown until the new producer's ``init_transactions``. ``locks``:
    whether the worker still holds the transaction's records (``"held"``: a new transaction
    of the same records may commit), or they were handed to another attempt (``"elsewhere"``),
    or nobody can tell (``"unknown"``: a connection lost, a RENEW refused)."""

    def __init__(self, text: str, *, fatal: bool = False,
                 locks: Literal["held", "elsewhere", "unknown"] = "held") -> None:
        super().__init__(text)
        self.fatal = fatal
        self.locks = locks


class ErrorCode(IntEnum):
    """The Kafka protocol error codes this package names (Kafka's own names); the facts of
    each are in :data:`_FACTS`."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    OFFSET_NOT_AVAILABLE = 78
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    UNKNOWN_TOPIC_ID = 100
    FENCED_MEMBER_EPOCH = 110
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    SHARE_SESSION_LIMIT_REACHED = 133


def error_name(code: int) -> str:
    """Kafka's name for an error code (``NON_EMPTY_GROUP`` for 68), or ``ERROR_<code>``."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"


class KafkaApiError(BrokerError):
    """A broker answered a request with a non-zero error code.

    Attributes: ``code`` (Kafka's numeric code), ``error`` (its name, e.g. ``NON_EMPTY_GROUP``),
    ``retriable`` (Kafka's judgement of the code), ``broker_message`` (the broker's own error
    message, if it sent one). The message ends with the code's hint (:data:`_FACTS`) unless
    ``hint`` is given.
    """

    default_hint = ""
    """A subclass's own hint, before the code's (a fact about the subclass, not the code)."""

    def __init__(self, code: int, context: str, broker_message: str | None = None,
                 hint: str | None = None, *, from_broker: bool = True) -> None:
        facts = _facts(code)
        self.code = int(code)
        self.error = error_name(code)
        self.retriable = facts.retriable
        # Brokers end their messages with '.'; this text adds its own punctuation.
        self.broker_message = broker_message.rstrip(". ") or None if broker_message else None
        broker_message = self.broker_message
        text = f"{context}: the broker answered {self.error} (error code {code})" \
            if from_broker else context
        if broker_message:
            text += f": {broker_message}"
        if hint is None:
            hint = self.default_hint or facts.hint
        if hint:
            text += f". {hint}"
        super().__init__(text)


class CoordinatorNotAvailableError(KafkaApiError):
    """The group coordinator is moving or loading (retriable; retried until the timeout)."""


class GroupNotEmptyError(KafkaApiError):
    """The share group still has members (``NON_EMPTY_GROUP``, a.k.a. GROUP_NOT_EMPTY)."""


class GroupNotFoundError(KafkaApiError):
    """The group does not exist, or is not a share group (``GROUP_ID_NOT_FOUND``)."""


class NotAShareGroupError(GroupNotFoundError):
    """A group of that name exists but is of another type, e.g. a classic consumer group."""

    default_hint = ("kafka-share manages share groups only; use kafka-consumer-groups.sh for "
                    "consumer groups")


class UnknownTopicError(KafkaApiError):
    """A topic or partition does not exist (``UNKNOWN_TOPIC_OR_PARTITION``/``UNKNOWN_TOPIC_ID``)."""


class AuthorizationError(KafkaApiError):
    """The principal is not allowed to do this (topic, group or cluster authorization)."""


class UnsupportedVersionError(KafkaApiError):
    """The broker does not support a version of an API this module can speak."""


@dataclass(frozen=True)
class _Facts:
    retriable: bool = False
    exception: type[KafkaApiError] = KafkaApiError
    hint: str = ""


_COORDINATOR_MOVING = _Facts(True, CoordinatorNotAvailableError,
                             "The group coordinator is unavailable or moving; retry later")
_AUTHORIZATION = _Facts(
    False, AuthorizationError,
    "An ACL is missing: grant the principal the operation with kafka-acls.sh --add "
    "--allow-principal User:<name> --operation <OPERATION> --topic <name> | --group <name> "
    "(docs/security.md lists the ACLs each feature needs)")

_FACTS: dict[ErrorCode, _Facts] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: _Facts(),
    ErrorCode.NONE: _Facts(),
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: _Facts(True, UnknownTopicError),
    ErrorCode.LEADER_NOT_AVAILABLE: _Facts(True),
    ErrorCode.NOT_LEADER_OR_FOLLOWER: _Facts(True),
    ErrorCode.REQUEST_TIMED_OUT: _Facts(True),
    ErrorCode.BROKER_NOT_AVAILABLE: _Facts(),
    ErrorCode.NETWORK_EXCEPTION: _Facts(True),
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: _COORDINATOR_MOVING,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: _COORDINATOR_MOVING,
    ErrorCode.NOT_COORDINATOR: _COORDINATOR_MOVING,
    ErrorCode.INVALID_TOPIC_EXCEPTION: _Facts(),
    ErrorCode.INVALID_GROUP_ID: _Facts(),
    ErrorCode.UNKNOWN_MEMBER_ID: _Facts(),
    ErrorCode.REBALANCE_IN_PROGRESS: _Facts(),
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: _AUTHORIZATION,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: _AUTHORIZATION,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: _AUTHORIZATION,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: _AUTHORIZATION,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: _Facts(),
    ErrorCode.ILLEGAL_SASL_STATE: _Facts(),
    ErrorCode.TOPIC_ALREADY_EXISTS: _Facts(),
    ErrorCode.UNSUPPORTED_VERSION: _Facts(
        False, UnsupportedVersionError,
        "Share-group administration needs Apache Kafka 4.1 or newer (4.2+ for GA)"),
    ErrorCode.INVALID_CONFIG: _Facts(),
    ErrorCode.INVALID_REQUEST: _Facts(),
    ErrorCode.KAFKA_STORAGE_ERROR: _Facts(True),
    ErrorCode.FENCED_LEADER_EPOCH: _Facts(True),
    ErrorCode.UNKNOWN_LEADER_EPOCH: _Facts(True),
    ErrorCode.SASL_AUTHENTICATION_FAILED: _Facts(),
    ErrorCode.NON_EMPTY_GROUP: _Facts(
        False, GroupNotEmptyError,
        "A share group's offsets can only be reset or deleted, and the group itself deleted, "
        "while the group is empty: stop all of its consumers (a crashed member leaves after "
        "the group's session timeout) and retry"),
    ErrorCode.GROUP_ID_NOT_FOUND: _Facts(
        False, GroupNotFoundError,
        "No share group of that name exists (check the name and the group type)"),
    ErrorCode.OFFSET_NOT_AVAILABLE: _Facts(True),
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: _Facts(),
    ErrorCode.UNKNOWN_TOPIC_ID: _Facts(True, UnknownTopicError),
    ErrorCode.FENCED_MEMBER_EPOCH: _Facts(),
    ErrorCode.INVALID_RECORD_STATE: _Facts(),
    ErrorCode.SHARE_SESSION_NOT_FOUND: _Facts(True),
    ErrorCode.INVALID_SHARE_SESSION_EPOCH: _Facts(True),
    ErrorCode.FENCED_STATE_EPOCH: _Facts(),
    ErrorCode.SHARE_SESSION_LIMIT_REACHED: _Facts(True),
}
"""Each Kafka error code's facts, the one place: retriable (as Kafka's ``Errors`` enum says),
the exception :func:`error_for` raises, the hint its message ends with. Kafka's name for the
code is the :class:`ErrorCode` member's; codes not listed are not retriable, raise
:class:`KafkaApiError` and have no hint."""


def _facts(code: int) -> _Facts:
    try:
        return _FACTS[ErrorCode(code)]
    except ValueError:
        return _Facts()


def error_for(code: int, context: str, broker_message: str | None = None,
              hint: str | None = None) -> KafkaApiError:
    """The exception for a non-zero Kafka error code (the most specific subclass known)."""
    if code == 0:
        raise ValueError("error code 0 means success; there is no error to raise")
    return _facts(code).exception(code, context, broker_message, hint)


# -- classifying a client's errors: the one place ---------------------------------------------
# librdkafka's own (negative) codes this package tells apart; Kafka's are ErrorCode members.
_LOCAL_FENCED = -144
_LOCAL_ALL_BROKERS_DOWN = -187
_LOCAL_PARTITION_EOF = -191
_LOCAL_UNKNOWN_PARTITION = -190
_LOCAL_UNKNOWN_TOPIC = -188
_LOCAL_AUTO_OFFSET_RESET = -140
_OFFSET_OUT_OF_RANGE = 1

DENIED: dict[int, str] = {
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: "topic",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "group",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional-id",
}
"""The authorization failures, and the kind of resource each names."""
_UNKNOWN_TOPIC = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID,
                            _LOCAL_UNKNOWN_TOPIC, _LOCAL_UNKNOWN_PARTITION})


def kafka_error(exc: BaseException) -> Any | None:
    """The confluent-kafka ``KafkaError`` an exception carries (``KafkaException``, a future's
    failure), or None."""
    err = exc.args[0] if exc.args else None
    return err if callable(getattr(err, "code", None)) and \
        callable(getattr(err, "str", None)) else None


def error_code(error: object) -> int | None:
    """The error code of ``error``: an int, a confluent-kafka ``KafkaError``, an exception
    carrying one (``KafkaException``, a future's failure), a :class:`KafkaApiError`, or a
    :class:`BrokerError` raised from one of those (its ``__cause__``); None when it has none."""
    if isinstance(error, KafkaApiError):
        return error.code
    if isinstance(error, int) and not isinstance(error, bool):
        return int(error)
    code = getattr(error, "code", None)
    if callable(code):
        return int(code())
    if not isinstance(error, BaseException):
        return None
    inner = error.args[0] if error.args else None
    if inner is not None and not isinstance(inner, (str, int)):
        return error_code(inner)
    return error_code(error.__cause__) if isinstance(error, BrokerError) else None


def denied_resource(error: object) -> str | None:
    """``topic``, ``group``, ``cluster`` or ``transactional-id`` when ``error`` is an
    authorization failure (an ACL is missing), else None."""
    code = error_code(error)
    return None if code is None else DENIED.get(code)


def is_denied(error: object) -> bool:
    """``error`` is an authorization failure (any ``*_AUTHORIZATION_FAILED``)."""
    return denied_resource(error) is not None


def is_unknown_topic(error: object) -> bool:
    """The topic or partition does not exist (Kafka's codes or librdkafka's local ones)."""
    return error_code(error) in _UNKNOWN_TOPIC


def is_already_exists(error: object) -> bool:
    """A topic to be created exists already."""
    return error_code(error) == ErrorCode.TOPIC_ALREADY_EXISTS


def is_out_of_range(error: object) -> bool:
    """A fetch offset outside the log (the broker's answer, or librdkafka's refusal to reset)."""
    return error_code(error) in (_OFFSET_OUT_OF_RANGE, _LOCAL_AUTO_OFFSET_RESET)


def is_partition_eof(error: object) -> bool:
    """A consumer reached the end of a partition (``enable.partition.eof``): not a failure."""
    return error_code(error) == _LOCAL_PARTITION_EOF


def is_all_brokers_down(error: object) -> bool:
    """librdkafka lost every broker (an outage; it keeps reconnecting)."""
    return error_code(error) == _LOCAL_ALL_BROKERS_DOWN


def is_fenced(error: object) -> bool:
    """A transactional producer was fenced (a newer one of its ``transactional.id``, or its
    epoch is stale): librdkafka's ``_FENCED``, Kafka's PRODUCER_FENCED (90) and
    INVALID_PRODUCER_EPOCH (47)."""
    return error_code(error) in (_LOCAL_FENCED, 90, 47)


def is_record_own(error: object) -> bool:
    """A produce refusal of the record's own size or bytes: CORRUPT_MESSAGE (2), INVALID_MSG_SIZE
    (4), MESSAGE_TOO_LARGE (10, also librdkafka's message.max.bytes), RECORD_LIST_TOO_LARGE
    (18), INVALID_RECORD (87). Any other (a timeout, a leader or coordinator moving, a purged
    or aborted transaction, a skewed clock's INVALID_TIMESTAMP) is not the record's."""
    return error_code(error) in (2, 4, 10, 18, 87)


def is_retriable(error: object) -> bool:
    """Retrying may succeed: the client's own judgement when it has one (``KafkaError``),
    else Kafka's (:data:`_FACTS`)."""
    inner = error.args[0] if isinstance(error, BaseException) and error.args else error
    retriable = getattr(inner, "retriable", None)
    if callable(retriable):
        return bool(retriable())
    code = error_code(error)
    return code is not None and _facts(code).retriable


class WakeupError(KafkaShareError):
    """A native share consumer's ``poll()`` was interrupted by ``wakeup()`` from another
    thread (the consumer stays usable)."""


class ForgedControlMessage(KafkaShareError):
    """A message on the workers' control topic under this job's key whose signature is not
    the job's secret's (refused and counted; never raised to the user)."""


class WorkerJobError(KafkaShareError):
    """A worker job ended on a failure of the job, not of a record: the message names the
    cause and the fix and ends with the summary; ``summary`` is the
    :class:`~pyspark_kafka_share.workers.WorkerSummary` (None if none could be made)."""

    def __init__(self, message: str, summary: Any = None) -> None:
        self.summary = summary
        super().__init__(f"{message}\n{summary}" if summary is not None else message)


class ConfigurationMistakeError(WorkerJobError):
    """The function returned a result the job's configuration cannot honour (an output value
    without ``output_topic``, a result of the wrong type, a batch of results of the wrong
    length): a mistake of the job, not of a record. Raised at its first occurrence; the
    records the workers held were RELEASEd, none REJECTed. ``option``: the argument to fix."""

    def __init__(self, option: str, fix: str, summary: Any = None) -> None:
        self.option = option
        self.fix = fix
        super().__init__(f"configuration mistake, {option!r}: {fix}", summary)


class CircuitBreakerError(WorkerJobError):
    """The workers' circuit breaker tripped: too large a share of the records were rejected,
    dead-lettered or failed with the same exception type over its window
    (``circuit_breaker``, ``circuit_breaker_window``). The workers RELEASEd what they held."""


class SparkGaveUpError(WorkerJobError):
    """Spark failed a worker task for good (a killed Python worker or executor on a master
    that retries nothing): the message names the fix (``local[N, F]``,
    ``spark.task.maxFailures``) and the summary counts the attempts' last reports."""


class JournalError(KafkaShareError):
    """The acknowledgement journal could not be read or written."""


class JournalClosed(JournalError):
    """The partition log was closed (END) by another attempt, or its batch was committed."""


class JournalUnavailable(JournalError):
    """The journal's object store answered a call only with outages (5xx, 429, no answer)
    until ``journalRetryTimeoutMs`` passed: the message names the store, the call and the
    option. Nothing was acknowledged without its slot: a restart from the checkpoint resumes."""


class DataLossError(JournalError):
    """A replay of journaled offsets found records gone from Kafka, or different from the
    ones first yielded (``failOnDataLoss=true``)."""


class LocalKafkaError(KafkaShareError):
    """A local harness (Kafka broker, S3 server, Spark cluster) could not be set up."""


class ArtifactNotFoundError(LocalKafkaError):
    """Maven Central has no artifact of the coordinates (or version) asked for."""


class NotReady(LocalKafkaError):
    """Raised by a harness's readiness probe: not ready yet, and why (the last error shown)."""


def from_client_error(exc: BaseException, context: str, fix: str = "") -> BrokerError:
    """A confluent-kafka failure (``KafkaException``, a ``KafkaError`` in a future, a timeout)
    as a :class:`BrokerError` that says what was being done, the client's error name and text,
    and ``fix``. The one place client errors enter the tree; chain it with ``from exc``."""
    if isinstance(exc, BrokerError):
        return exc
    err: Any = exc.args[0] if exc.args else None
    if err is not None and callable(getattr(err, "name", None)) and \
            callable(getattr(err, "str", None)):
        detail = f"{err.name()}: {err.str()}"
    else:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = f"{context} ({detail})"
    return BrokerError(f"{text}. {fix}" if fix else text)


class AuthenticationError(BrokerError):
    """SASL authentication failed: wrong username/password/token, or the mechanism is not
    enabled on the listener. The message names the mechanism and the options to check (never
    a secret). Not retried: the same credentials fail the same way."""


class TlsError(BrokerError):
    """The TLS handshake with a broker failed: its certificate is not trusted (``ssl.ca.location``),
    does not name the host (``ssl.endpoint.identification.algorithm``), or the broker wants a
    client certificate (``ssl.certificate.location``/``ssl.key.location``). Not retried."""


class SecurityProtocolMismatchError(BrokerError):
    """Client and broker port speak different protocols: a plaintext client to a TLS port (the
    broker answers with a TLS alert), a TLS client to a plaintext port, a SASL client to a
    listener without SASL or the other way round. The message names ``security.protocol`` and
    the value that fits. Not retried."""
