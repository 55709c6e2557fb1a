"""The journal on S3, GCS and Azure Blob Storage through obstore: exclusive create is a
conditional put (``If-None-Match: *``, ``ifGenerationMatch=0``).

Object stores are reached through `obstore <https://developmentseed.org/obstore/>`_ (Rust's
``object_store``), an optional dependency: the extras ``s3``, ``gcs`` and ``azure`` install it.
Credentials and endpoints come from the standard environment variables of each store
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*``), instance/workload identities, or ``journal.<key>``
source options (``object_store`` configuration keys such as ``aws_endpoint``), which are never
logged nor shown in errors.

Every call rides out an outage of the store for ``journalRetryTimeoutMs`` (obstore's own
retries, and ours for what they leave: :mod:`.retry`), then raises
:class:`~pyspark_kafka_share.errors.JournalUnavailable`. An authorization error is raised at
once, never retried and never read as "absent".
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, cast

from pyspark_kafka_share.errors import JournalError, OptionError
from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.stores.base import Store, first_line
from pyspark_kafka_share.source.journal.stores.retry import (
    DEFAULT_RETRY_TIMEOUT_MS,
    StoreRetry,
    http_status,
)

T = TypeVar("T")

__all__ = ["ObjectStore", "require_obstore", "store_env"]

# obstore's client (HTTP) options; every other journal.<key> is a store configuration key.
_CLIENT_KEYS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host",
    "proxy_url", "proxy_ca_certificate", "proxy_excludes", "randomize_addresses",
    "read_timeout", "timeout", "user_agent",
})
_S3_ENDPOINT_KEYS = ("aws_endpoint", "aws_endpoint_url", "endpoint", "endpoint_url")
_S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")


def require_obstore(loc: JournalLocation) -> Any:
    """The obstore module; an :class:`OptionError` naming the extra to install without it."""
    try:
        import obstore
    except ImportError:
        raise OptionError(
            "journalPath", loc.uri,
            f"a journal on {loc.store} needs the optional '{loc.extra}' dependencies: "
            f"pip install 'pyspark-kafka-share[{loc.extra}]' on the driver and every executor",
        ) from None
    return obstore


def _redact(text: str, options: Mapping[str, str]) -> str:
    """``text`` without any of the option values (secrets must never reach a log)."""
    for value in sorted(options.values(), key=len, reverse=True):
        if len(value) >= 3:
            text = text.replace(value, "***")
    return text


def _split_options(loc: JournalLocation, options: Mapping[str, str]
                   ) -> tuple[dict[str, str], dict[str, str]]:
    """(store config, client options) for obstore, from ``journal.<key>`` options."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in options.items():
        k = key.lower()
        if k in _CLIENT_KEYS:
            client[k] = value
        else:
            config[k] = value
    if loc.extra == "s3":
        # An explicit http:// endpoint (a local or on-premises S3) is what the user asked for;
        # object_store would otherwise refuse it unless allow_http is also set.
        endpoint = next((config[k] for k in _S3_ENDPOINT_KEYS if k in config), None) or next(
            (os.environ[k] for k in _S3_ENDPOINT_ENV if os.environ.get(k)), None)
        if endpoint and endpoint.lower().startswith("http://"):
            client.setdefault("allow_http", "true")
    return config, client


_STORES: dict[tuple[Any, ...], Any] = {}
_STORES_LOCK = threading.Lock()
_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")


def store_env() -> tuple[tuple[str, str], ...]:
    """The environment variables the stores read (part of a cached store's identity)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))


def _open_object_store(loc: JournalLocation, options: Mapping[str, str], *,
                       probe: bool = False, retry: StoreRetry | None = None) -> Any:
    """The obstore store of ``loc`` (cached per process: its connection pool is reused);
    ``retry``: its bound on an outage (obstore's ``retry_config``)."""
    key = (loc.bucket_url, tuple(sorted(options.items())), probe, store_env(),
           retry.timeout_s if retry is not None else None)
    with _STORES_LOCK:
        hit = _STORES.get(key)
    if hit is not None:
        return hit
    obstore = require_obstore(loc)
    from obstore.store import from_url

    config, client = _split_options(loc, options)
    retry_config: Any = retry.obstore_config() if retry is not None else None
    if probe:  # load() must answer soon, also when the endpoint does not
        retry_config = {"max_retries": 2, "retry_timeout": timedelta(seconds=10)}
        client.setdefault("connect_timeout", "5s")
        client.setdefault("timeout", "20s")
    try:
        store = from_url(loc.bucket_url, config=cast(Any, config or None),
                         client_options=cast(Any, client or None), retry_config=retry_config)
    except obstore.exceptions.UnknownConfigurationKeyError as exc:
        bad = next((k for k in options if f"'{k.lower()}'" in str(exc)), None)
        raise OptionError(
            f"journal.{bad}" if bad else "journal.*", None,
            f"not a configuration key of obstore's {loc.store} store (see the object_store / "
            "obstore documentation for the keys, e.g. aws_endpoint, aws_region, "
            "google_service_account, azure_storage_account_key)") from None
    except Exception as exc:  # noqa: BLE001 - reworded without option values
        raise OptionError("journal.*", None,
                          f"the {loc.store} store for {loc.uri!r} could not be configured: "
                          f"{_redact(first_line(exc), options)}") from None
    except BaseException as exc:  # pyo3 PanicException derives from BaseException
        if type(exc).__name__ != "PanicException":
            raise
        raise OptionError("journal.*", None,
                          f"obstore rejected the {loc.store} configuration for {loc.uri!r}: "
                          f"{_redact(first_line(exc), options)}") from None
    with _STORES_LOCK:
        _STORES[key] = store
    return store


class ObjectStore(Store):
    """S3, GCS or Azure Blob Storage through obstore (paths are keys inside the bucket).

    ``retry_timeout_ms``: how long a call rides out an outage (``journalRetryTimeoutMs``);
    the probe at ``load()`` (``probe=True``) keeps its own short bound instead."""

    renames = False

    def __init__(self, loc: JournalLocation, options: Mapping[str, str], *,
                 probe: bool = False, retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS) -> None:
        self.loc = loc
        self._options = dict(options)
        self._probe = probe
        self._retry_timeout_ms = retry_timeout_ms
        self._setup()

    def _setup(self) -> None:
        self.retry = StoreRetry(0 if self._probe else self._retry_timeout_ms / 1000)
        self.store = _open_object_store(self.loc, self._options, probe=self._probe,
                                        retry=None if self._probe else self.retry)
        import obstore

        self._ob = obstore
        self._exists_errors: tuple[type[BaseException], ...] = (
            obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError)
        self._denied_errors: tuple[type[BaseException], ...] = (
            obstore.exceptions.PermissionDeniedError, obstore.exceptions.UnauthenticatedError,
            PermissionError)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with the stream reader: the obstore handle is re-opened where it lands.
        return {"loc": self.loc, "_options": self._options, "_probe": self._probe,
                "_retry_timeout_ms": self._retry_timeout_ms}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def __repr__(self) -> str:  # never the options
        return f"ObjectStore({self.loc.bucket_url!r})"

    @staticmethod
    def _key(path: str) -> str:
        return path.strip("/")

    def _shown(self, exc: BaseException) -> str:
        return _redact(first_line(exc), self._options)

    def _call(self, op: str, path: str, call: Callable[[], T]) -> T:
        """``call()`` with the store's bound on an outage (:class:`.retry.StoreRetry`)."""
        return self.retry.run(call, store=self.loc.bucket_url,
                              what=f"{op} {self._key(path)!r}", shown=self._shown)

    def _error(self, op: str, path: str, exc: BaseException) -> JournalError:
        if isinstance(exc, JournalError):  # JournalUnavailable: says it all already
            return exc
        where = f"{self.loc.bucket_url}/{self._key(path)}"
        # A listing's refusal comes as a generic error with its status (measured)
        if isinstance(exc, self._denied_errors) or http_status(exc) in (401, 403):
            return JournalError(
                f"journal {op} {where} was refused by {self.loc.store}: {self._shown(exc)}. "
                "Not retried: give the journal's credentials (journal.* options or the "
                "store's environment) read, write, list and delete on the journal's prefix")
        return JournalError(f"journal {op} {where} failed: {self._shown(exc)}")

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        # A PUT that succeeded is durable; fsync has nothing to add. use_multipart=False: the
        # condition applies to one request (obstore also forces this for mode="create").
        # Tried again after an outage: a try that was applied then answers "exists", which
        # the journal tells from another writer's object by its bytes (fencing.PartLog).
        try:
            self._call("create", path, lambda: self._ob.put(
                self.store, self._key(path), data, mode="create", use_multipart=False))
        except self._exists_errors:
            # Exists -- or, on S3, 409 ConditionalRequestConflict (a concurrent conditional
            # write in flight), which object_store reports the same way. The journal reads
            # the path next and retries if nothing is there.
            return False
        except NotImplementedError as exc:
            raise JournalError(
                f"{self.loc.store} at {self.loc.bucket_url} is configured without conditional "
                f"create (e.g. aws_conditional_put=disabled), which the journal needs: {exc}"
            ) from None
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - one error type for the task
            raise self._error("create", path, exc) from None
        return True

    def read(self, path: str) -> bytes:
        try:
            return self._call("read", path, lambda: bytes(
                self._ob.get(self.store, self._key(path)).bytes()))
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("read", path, exc) from None

    def read_head(self, path: str, size: int) -> bytes:
        try:
            return self._call("read", path, lambda: bytes(
                self._ob.get_range(self.store, self._key(path), start=0, length=size)))
        except (FileNotFoundError, JournalError):
            raise
        except self._denied_errors as exc:
            raise self._error("read", path, exc) from None
        except Exception:  # noqa: BLE001 - e.g. an object shorter than size: read it whole
            return self.read(path)[:size]

    def write(self, path: str, data: bytes) -> None:
        try:
            self._call("write", path, lambda: self._ob.put(
                self.store, self._key(path), data, use_multipart=False))
        except Exception as exc:  # noqa: BLE001
            raise self._error("write", path, exc) from None

    def listdir(self, path: str) -> list[str]:
        prefix = self._key(path)
        try:
            found = self._call("list", path, lambda: self._ob.list_with_delimiter(
                self.store, f"{prefix}/" if prefix else None))
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise self._error("list", path, exc) from None
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"]]
        names += [o["path"].rsplit("/", 1)[-1] for o in found["objects"]]
        return names

    def files_under(self, path: str) -> list[str]:
        prefix = self._key(path)
        try:
            keys = self._call("list", path, lambda: self._keys_under(path))
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise self._error("list", path, exc) from None
        cut = len(prefix) + 1 if prefix else 0
        return [k[cut:] for k in keys]

    def list_after(self, path: str, start_after: str) -> list[str]:
        prefix = f"{self._key(path)}/"
        def listed() -> list[str]:
            found: list[str] = []
            for chunk in self._ob.list(self.store, prefix,
                                       offset=f"{prefix}{start_after}" if start_after else None):
                found.extend(o["path"] for o in chunk)
            return found

        try:
            keys = self._call("list", path, listed)
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise self._error("list", path, exc) from None
        return sorted(k[len(prefix):] for k in keys if "/" not in k[len(prefix):])

    def remove_all(self, paths: list[str]) -> None:
        keys = [self._key(p) for p in paths]
        try:
            self._delete(paths[0] if paths else "", keys)
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001
            raise self._error("delete", paths[0], exc) from None

    def _delete(self, path: str, keys: list[str]) -> None:
        """Delete ``keys``, a request per 1,000 (a repeated delete is harmless)."""
        for i in range(0, len(keys), 1000):
            self._call("delete", path, functools.partial(self._ob.delete, self.store,
                                                         keys[i:i + 1000]))

    def makedirs(self, path: str) -> None:
        """Object stores have no directories."""

    def _keys_under(self, path: str) -> list[str]:
        prefix = self._key(path)
        keys: list[str] = []
        for chunk in self._ob.list(self.store, f"{prefix}/" if prefix else None):
            keys.extend(o["path"] for o in chunk)
        return keys

    def remove_tree(self, path: str) -> None:
        try:
            keys = self._call("list", path, lambda: self._keys_under(path))
            self._delete(path, keys)
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001
            raise self._error("delete", path, exc) from None

    def mtime(self, path: str) -> float:
        try:
            meta = self._call("head", path, lambda: self._ob.head(self.store, self._key(path)))
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("head", path, exc) from None
        return float(meta["last_modified"].timestamp())

    def remove(self, path: str) -> None:
        try:
            self._call("delete", path, lambda: self._ob.delete(self.store, self._key(path)))
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001
            raise self._error("delete", path, exc) from None

    def retire(self, path: str) -> str:
        """No rename on object stores: the path stays; see ``Journal.commit``."""
        return path
