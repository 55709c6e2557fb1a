"""How long an object-store journal rides out an outage: ``journalRetryTimeoutMs``.

Two layers, one deadline per call (measured; docs/design.md, "A store outage"):

* **obstore's own retry** (``retry_config``): it retries 5xx answers (503 SlowDown, 500), 429,
  refused connections and requests that were never sent, for *every* request, and a timed-out
  or interrupted request when it is a GET, HEAD, listing or unconditional PUT. Its default
  gives up after 10 retries (1.7-3.6 s against the S3 fault proxy); here it runs until
  :attr:`StoreRetry.timeout_s` instead (``max_retries`` high, ``retry_timeout`` the option).
* **this loop** (:meth:`StoreRetry.run`), for what obstore leaves: a *conditional* create
  (``If-None-Match: *``) or a bulk delete whose request timed out or whose connection was
  reset is not retried by obstore (not idempotent). The loop tries it again until the same
  deadline; a create whose first try was applied then meets its own object ("exists"), which
  the journal recognises by its bytes (``fencing.PartLog.append``).

What ends a call is classified by :func:`transient_cause`: only an outage (a 5xx/429/408
answer, or a transport error without an answer) is retried; an authorization error, a missing
object, a refused condition or another 4xx is raised at once, unchanged. Past the deadline the
call raises :class:`~pyspark_kafka_share.errors.JournalUnavailable` naming the store, the call
and the option to raise.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from pyspark_kafka_share.errors import JournalUnavailable

__all__ = ["DEFAULT_RETRY_TIMEOUT_MS", "RETRY_OPTION", "StoreRetry", "http_status",
           "transient_cause"]

T = TypeVar("T")

RETRY_OPTION = "journalRetryTimeoutMs"
DEFAULT_RETRY_TIMEOUT_MS = 120_000
"""Two minutes: longer than the outages a store has without being down for good (an S3
503 storm, a load balancer's or DNS failover, a proxy restart: seconds to tens of seconds);
below obstore's advice to keep a request's retries under 5 minutes (they reuse its signed
credentials); and a task blocked that long only sees its records' acquisition locks expire
(they come back and are found in the journal)."""

# obstore's message for an answer it got: "... Server returned non-2xx status code: 503 ..."
_STATUS = re.compile(r"non-2xx status code: (\d{3})")
# ... and for a request without an answer: "... HTTP error: error sending request"
_TRANSPORT = ("HTTP error", "error sending request", "timed out", "connection reset",
              "connection closed", "broken pipe")
_OUTAGE_STATUSES = frozenset({408, 429})


def http_status(exc: BaseException) -> int | None:
    """The HTTP status the store answered, from obstore's message (None: no answer)."""
    status = _STATUS.search(str(exc))
    return int(status.group(1)) if status is not None else None


def transient_cause(exc: BaseException) -> str | None:
    """Why ``exc`` (an obstore error) is an outage worth waiting out, or None when it is not
    (retried, it would fail the same way: a refusal, a missing object, a bad request)."""
    if type(exc).__name__ != "GenericError":  # PermissionDenied, NotFound, AlreadyExists, ...
        return None
    code = http_status(exc)
    if code is not None:
        return f"HTTP {code}" if code >= 500 or code in _OUTAGE_STATUSES else None
    lowered = str(exc).lower()
    if any(marker.lower() in lowered for marker in _TRANSPORT):
        return "no answer"
    return None


@dataclass(frozen=True)
class StoreRetry:
    """The deadline of one store's calls: ``timeout_s`` seconds from a call's start (0: one
    try, obstore's default retries; the probe at ``load()`` uses its own short bound)."""

    timeout_s: float
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    #: the loop's backoff: from this, doubling, at most ``MAX_BACKOFF_S`` (and never past the
    #: deadline); obstore's own uses the same cap.
    FIRST_BACKOFF_S = 0.2
    MAX_BACKOFF_S = 5.0

    def obstore_config(self) -> dict[str, Any] | None:
        """obstore's ``retry_config`` for this bound (None: obstore's defaults)."""
        if self.timeout_s <= 0:
            return None
        return {"max_retries": 100_000,  # the time bound ends the retries, not the count
                "retry_timeout": timedelta(seconds=self.timeout_s),
                "backoff": {"init_backoff": timedelta(milliseconds=100),
                            "max_backoff": timedelta(seconds=self.MAX_BACKOFF_S), "base": 2}}

    def run(self, call: Callable[[], T], *, store: str, what: str,
            shown: Callable[[BaseException], str] = str) -> T:
        """``call()``, tried again after an outage (:func:`transient_cause`) until the
        deadline; past it :class:`JournalUnavailable`. Other errors are raised unchanged.
        ``store`` and ``what`` name the store and the call in that error, ``shown(exc)`` the
        client's last error (without secrets)."""
        started = self.clock()
        backoff = self.FIRST_BACKOFF_S
        tries = 0
        while True:
            tries += 1
            try:
                return call()
            except Exception as exc:  # classified: an outage is retried, the rest raised
                cause = transient_cause(exc)
                if cause is None or self.timeout_s <= 0:
                    raise
                elapsed = self.clock() - started
                left = self.timeout_s - elapsed
                if left <= 0:
                    raise JournalUnavailable(
                        f"the journal's store {store} gave no usable answer to {what} for "
                        f"{elapsed:.0f} s ({cause}; {tries} call(s), each with obstore's "
                        f"retries; {RETRY_OPTION}={self.timeout_s * 1000:.0f}): {shown(exc)}. "
                        "Nothing unjournaled was acknowledged: restart the query from its "
                        f"checkpoint once the store answers, or raise {RETRY_OPTION} to ride "
                        "out longer outages") from None
            self.sleep(min(backoff, left))
            backoff = min(backoff * 2, self.MAX_BACKOFF_S)
