"""Where the journal lives: the storage back ends and the checks made at ``load()``.

Every back end provides the one primitive the journal is built on, an **exclusive create**:
of all writers that try to create the same path, exactly one succeeds and the others learn
that the path exists. See ``docs/design.md`` ("The journal on object stores") and
``docs/guarantees.md`` for why that, plus strongly consistent reads and listings, is enough.

===========================  ===================================================
``journalPath``              exclusive create
===========================  ===================================================
``/path``, ``file://``        ``link(2)`` of a fully written temporary file
``hdfs://``, ``viewfs://``    HDFS ``rename``, which refuses an existing target
``s3://``, ``s3a://``         ``PutObject`` with ``If-None-Match: *``
``gs://``                     upload with ``ifGenerationMatch=0``
``abfs://``, ``abfss://``     ``Put Blob`` with ``If-None-Match: *``
===========================  ===================================================

Object stores are reached through `obstore <https://developmentseed.org/obstore/>`_ (Rust's
``object_store``), an optional dependency: the extras ``s3``, ``gcs`` and ``azure`` install it.
Credentials and endpoints come from the standard environment variables of each store
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*``), instance/workload identities, or ``journal.<key>``
source options (``object_store`` configuration keys such as ``aws_endpoint``), which are never
logged nor shown in errors.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlparse

from pyspark_kafka_share.errors import JournalError, OptionError

__all__ = ["OBJECT_STORE_SCHEMES", "Store", "check_journal", "check_journal_uri", "store_for"]

_LOCAL_SCHEMES = ("", "file")
_HADOOP_SCHEMES = ("hdfs", "viewfs")
# URL scheme -> (store kind, the pip extra that installs its client)
OBJECT_STORE_SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("S3", "s3"), "s3a": ("S3", "s3"),
    "gs": ("GCS", "gcs"),
    "abfs": ("Azure Blob Storage", "azure"), "abfss": ("Azure Blob Storage", "azure"),
}

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


class Store:
    """The filesystem operations the journal needs. Paths are ``/``-separated strings."""

    #: ``retire`` really moves a directory aside atomically (a rename). Object stores have
    #: no rename: there the ``committed`` fence alone keeps late attempts out.
    renames = True

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        """Create ``path`` with ``data`` unless it exists: True if this call created it."""
        raise NotImplementedError

    def read(self, path: str) -> bytes:
        raise NotImplementedError

    def read_head(self, path: str, size: int) -> bytes:
        """The first ``size`` bytes of ``path`` (fewer if it is shorter)."""
        return self.read(path)[:size]

    def write(self, path: str, data: bytes) -> None:
        """Atomically create or replace ``path``."""
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        """Names directly under ``path`` (files and sub-directories); [] if there is none."""
        raise NotImplementedError

    def files_under(self, path: str) -> list[str]:
        """Every file below ``path``, as ``/``-separated paths relative to it; [] if there is
        none. One listing request on object stores (the journal calls it on every poll)."""
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def remove_tree(self, path: str) -> None:
        raise NotImplementedError

    def mtime(self, path: str) -> float:
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def retire(self, path: str) -> str:
        """Atomically move ``path`` aside to a hidden sibling; return the new path."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """Whether anything (a file, a directory, a link) is at ``path`` (the probe at
        ``load()`` uses it on filesystems to undo the directories it created)."""
        raise NotImplementedError

    def rmdir(self, path: str) -> None:
        """Remove ``path`` if it is an empty directory; otherwise do nothing."""
        raise NotImplementedError


class LocalStore(Store):
    """A local or mounted (NFS, FUSE with atomic ``link``) filesystem."""

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a failed write (no space, EIO) leaves no temporary file
            raise
        os.close(fd)
        try:
            os.link(tmp, path)  # atomic; fails if path exists. Never creates the directory.
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if fsync:
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return True

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_head(self, path: str, size: int) -> bytes:
        with open(path, "rb") as f:
            return f.read(size)

    def write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def files_under(self, path: str) -> list[str]:
        found: list[str] = []
        for directory, _, files in os.walk(path):
            rel = os.path.relpath(directory, path)
            found.extend(name if rel == "." else f"{rel}/{name}" for name in files)
        return found

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def mtime(self, path: str) -> float:
        return os.stat(path).st_mtime

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def retire(self, path: str) -> str:
        target = os.path.join(os.path.dirname(path), f".gc-{uuid.uuid4().hex}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, target)
        return target

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def rmdir(self, path: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.rmdir(path)


class ArrowFsStore(Store):  # pragma: no cover - needs a Hadoop cluster; see docs/design.md
    """HDFS through ``pyarrow.fs``: ``move`` is HDFS rename, which refuses an existing target."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs as pafs

        self.fs, _ = pafs.FileSystem.from_uri(uri)

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        tmp = f"{os.path.dirname(path)}/.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        try:
            self.fs.move(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            if self._exists(path):
                return False
            raise
        return True

    def _exists(self, path: str) -> bool:
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read())

    def read_head(self, path: str, size: int) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read(size))

    def write(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def listdir(self, path: str) -> list[str]:
        from pyarrow import fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except FileNotFoundError:
            return []
        return [os.path.basename(i.path) for i in infos]

    def files_under(self, path: str) -> list[str]:
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        base = path.rstrip("/") + "/"
        return [i.path[len(base):] for i in self.fs.get_file_info(selector)
                if i.type == pafs.FileType.File and i.path.startswith(base)]

    def makedirs(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def remove_tree(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_dir(path)

    def mtime(self, path: str) -> float:
        info = self.fs.get_file_info(path)
        return float(info.mtime.timestamp()) if info.mtime else time.time()

    def remove(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)

    def retire(self, path: str) -> str:
        target = f"{os.path.dirname(path)}/.gc-{uuid.uuid4().hex}"
        with contextlib.suppress(OSError):
            self.fs.move(path, target)
        return target

    def exists(self, path: str) -> bool:
        return self._exists(path)

    def rmdir(self, path: str) -> None:
        with contextlib.suppress(OSError):
            if not self.listdir(path):
                self.fs.delete_dir(path)


# -- object stores ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Location:
    scheme: str
    kind: str       # "S3", "GCS", "Azure Blob Storage"
    extra: str      # pip extra
    bucket_url: str  # the store's URL (bucket / container), handed to obstore
    prefix: str     # the journal's key prefix inside it, no leading or trailing "/"


def _object_location(uri: str) -> _Location | None:
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme not in OBJECT_STORE_SCHEMES:
        return None
    kind, extra = OBJECT_STORE_SCHEMES[scheme]
    if not parsed.netloc:
        where = "container@account" if extra == "azure" else "bucket"
        raise OptionError("journalPath", uri, f"name the {where}: {scheme}://<{where}>/<path>")
    return _Location(scheme, kind, extra, f"{scheme}://{parsed.netloc}", parsed.path.strip("/"))


def _require_obstore(loc: _Location, uri: str) -> Any:
    try:
        import obstore
    except ImportError:
        raise OptionError(
            "journalPath", uri,
            f"a journal on {loc.kind} needs the optional '{loc.extra}' dependencies: "
            f"pip install 'pyspark-kafka-share[{loc.extra}]' on the driver and every executor",
        ) from None
    return obstore


def _redact(text: str, options: Mapping[str, str]) -> str:
    """``text`` without any of the option values (secrets must never reach a log)."""
    for value in sorted(options.values(), key=len, reverse=True):
        if len(value) >= 3:
            text = text.replace(value, "***")
    return text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.split("\n\nDebug source:")[0].strip()


def _split_options(loc: _Location, options: Mapping[str, str]
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


def _store_env() -> tuple[tuple[str, str], ...]:
    """The environment variables the stores read (part of a cached store's identity)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))


def _open_object_store(loc: _Location, uri: str, options: Mapping[str, str], *,
                       probe: bool = False) -> Any:
    """The obstore store of ``loc`` (cached per process: its connection pool is reused)."""
    key = (loc.bucket_url, tuple(sorted(options.items())), probe, _store_env())
    with _STORES_LOCK:
        hit = _STORES.get(key)
    if hit is not None:
        return hit
    obstore = _require_obstore(loc, uri)
    from obstore.store import from_url

    config, client = _split_options(loc, options)
    retry: Any = None
    if probe:  # load() must answer soon, also when the endpoint does not
        retry = {"max_retries": 2, "retry_timeout": timedelta(seconds=10)}
        client.setdefault("connect_timeout", "5s")
        client.setdefault("timeout", "20s")
    try:
        store = from_url(loc.bucket_url, config=cast(Any, config or None),
                         client_options=cast(Any, client or None), retry_config=retry)
    except obstore.exceptions.UnknownConfigurationKeyError as exc:
        bad = next((k for k in options if f"'{k.lower()}'" in str(exc)), None)
        raise OptionError(
            f"journal.{bad}" if bad else "journal.*", None,
            f"not a configuration key of obstore's {loc.kind} store (see the object_store / "
            "obstore documentation for the keys, e.g. aws_endpoint, aws_region, "
            "google_service_account, azure_storage_account_key)") from None
    except Exception as exc:  # noqa: BLE001 - reworded without option values
        raise OptionError("journal.*", None,
                          f"the {loc.kind} store for {uri!r} could not be configured: "
                          f"{_redact(_first_line(exc), options)}") from None
    except BaseException as exc:  # pyo3 PanicException derives from BaseException
        if type(exc).__name__ != "PanicException":
            raise
        raise OptionError("journal.*", None,
                          f"obstore rejected the {loc.kind} configuration for {uri!r}: "
                          f"{_redact(_first_line(exc), options)}") from None
    with _STORES_LOCK:
        _STORES[key] = store
    return store


class ObjectStore(Store):
    """S3, GCS or Azure Blob Storage through obstore (paths are keys inside the bucket)."""

    renames = False

    def __init__(self, uri: str, loc: _Location, options: Mapping[str, str], *,
                 probe: bool = False) -> None:
        self.uri = uri
        self.loc = loc
        self._options = dict(options)
        self._probe = probe
        self._setup()

    def _setup(self) -> None:
        self.store = _open_object_store(self.loc, self.uri, self._options, probe=self._probe)
        import obstore

        self._ob = obstore
        self._exists_errors: tuple[type[BaseException], ...] = (
            obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with the stream reader: the obstore handle is re-opened where it lands.
        return {"uri": self.uri, "loc": self.loc, "_options": self._options,
                "_probe": self._probe}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def __repr__(self) -> str:  # never the options
        return f"ObjectStore({self.loc.bucket_url!r})"

    @staticmethod
    def _key(path: str) -> str:
        return path.strip("/")

    def _error(self, op: str, path: str, exc: BaseException) -> JournalError:
        return JournalError(f"journal {op} {self.loc.bucket_url}/{self._key(path)} failed: "
                            f"{_redact(_first_line(exc), self._options)}")

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        # A PUT that succeeded is durable; fsync has nothing to add. use_multipart=False: the
        # condition applies to one request (obstore also forces this for mode="create").
        try:
            self._ob.put(self.store, self._key(path), data, mode="create", use_multipart=False)
        except self._exists_errors:
            # Exists -- or, on S3, 409 ConditionalRequestConflict (a concurrent conditional
            # write in flight), which object_store reports the same way. The journal reads
            # the path next and retries if nothing is there.
            return False
        except NotImplementedError as exc:
            raise JournalError(
                f"{self.loc.kind} at {self.loc.bucket_url} is configured without conditional "
                f"create (e.g. aws_conditional_put=disabled), which the journal needs: {exc}"
            ) from None
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - one error type for the task
            raise self._error("create", path, exc) from None
        return True

    def read(self, path: str) -> bytes:
        try:
            return bytes(self._ob.get(self.store, self._key(path)).bytes())
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("read", path, exc) from None

    def read_head(self, path: str, size: int) -> bytes:
        try:
            return bytes(self._ob.get_range(self.store, self._key(path), start=0, length=size))
        except FileNotFoundError:
            raise
        except Exception:  # noqa: BLE001 - e.g. an object shorter than size: read it whole
            return self.read(path)[:size]

    def write(self, path: str, data: bytes) -> None:
        try:
            self._ob.put(self.store, self._key(path), data, use_multipart=False)
        except Exception as exc:  # noqa: BLE001
            raise self._error("write", path, exc) from None

    def listdir(self, path: str) -> list[str]:
        prefix = self._key(path)
        try:
            found = self._ob.list_with_delimiter(self.store, f"{prefix}/" if prefix else None)
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
            keys = self._keys_under(path)
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise self._error("list", path, exc) from None
        cut = len(prefix) + 1 if prefix else 0
        return [k[cut:] for k in keys]

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
            keys = self._keys_under(path)
            for i in range(0, len(keys), 1000):
                self._ob.delete(self.store, keys[i:i + 1000])
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001
            raise self._error("delete", path, exc) from None

    def mtime(self, path: str) -> float:
        try:
            meta = self._ob.head(self.store, self._key(path))
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error("head", path, exc) from None
        return float(meta["last_modified"].timestamp())

    def remove(self, path: str) -> None:
        try:
            self._ob.delete(self.store, self._key(path))
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001
            raise self._error("delete", path, exc) from None

    def retire(self, path: str) -> str:
        """No rename on object stores: the path stays; see ``Journal.commit``."""
        return path


def store_for(uri: str, options: Mapping[str, str] | Iterable[tuple[str, str]] = ()
              ) -> tuple[Store, str]:
    """The back end of journal ``uri`` and the journal's root path in it."""
    opts = dict(options.items() if isinstance(options, Mapping) else options)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in _LOCAL_SCHEMES:
        return LocalStore(), os.path.abspath(parsed.path if parsed.scheme else uri)
    loc = _object_location(uri)
    if loc is not None:
        return ObjectStore(uri, loc, opts), loc.prefix
    return ArrowFsStore(uri), parsed.path


# -- checks at load() -------------------------------------------------------------------------


def check_journal_uri(uri: str) -> None:
    """Refuse journal locations without an atomic exclusive create, and object-store URLs
    whose optional dependencies are missing (no I/O)."""
    scheme = urlparse(uri).scheme.lower()
    if scheme in _LOCAL_SCHEMES or scheme in _HADOOP_SCHEMES:
        return
    loc = _object_location(uri)
    if loc is None:
        raise OptionError(
            "journalPath", uri,
            f"the '{scheme}' filesystem is not known to have the atomic create-if-absent the "
            "journal needs so that exactly one task attempt wins each slot. Use a local or "
            "mounted shared path, hdfs://, s3:// (or s3a://), gs://, abfs:// or abfss://",
        )
    _require_obstore(loc, uri)


_PROBED: set[tuple[Any, ...]] = set()


def check_journal(uri: str, options: Mapping[str, str] | Iterable[tuple[str, str]] = ()
                  ) -> None:
    """:func:`check_journal_uri`, then a probe of the location with the journal's own store
    operations: create one probe file or object twice with the exclusive create (the second
    must be refused), see it in a listing, read it back, delete it.

    On a filesystem (local, mounted, HDFS) the probe first creates the journal directory as
    the journal would, and removes again the directories it created: ``load()`` leaves the
    filesystem as it found it. On an object store it makes four requests, once per process and
    configuration. Raises :class:`OptionError` naming ``journalPath``, the cause (not a
    directory, permission denied, read-only filesystem, unreachable store, ...) and the fix;
    never an option value of ``journal.*``.
    """
    opts = dict(options.items() if isinstance(options, Mapping) else options)
    check_journal_uri(uri)
    loc = _object_location(uri)
    if loc is None:
        if opts:
            key = next(iter(opts))
            raise OptionError(f"journal.{key}", None, "journal.* options configure object-store "
                              "journals (s3://, gs://, abfs://); this journalPath is a "
                              "filesystem path. Remove them")
        _probe_filesystem(uri)
        return
    cache_key = (uri, tuple(sorted(opts.items())), _store_env())
    if cache_key in _PROBED:
        return
    _probe_object_store(uri, loc, opts)
    _PROBED.add(cache_key)


@dataclass(frozen=True)
class _ProbeResult:
    first: bool     # the first exclusive create created the probe
    second: bool    # the second one did too (it must have been refused)
    listed: bool    # the probe was in a listing of its directory
    content: bytes  # what reading the probe returned


def _run_probe(store: Store, directory: str) -> _ProbeResult:
    """Exclusive create twice, list, read, delete: the journal's operations on one probe."""
    name = f".probe-{uuid.uuid4().hex}"
    probe = f"{directory.rstrip('/')}/{name}" if directory else name
    try:
        first = store.create_exclusive(probe, b"probe 1", True)
        second = store.create_exclusive(probe, b"probe 2", True)
        listed = name in store.listdir(directory)
        content = store.read(probe)
    finally:
        with contextlib.suppress(Exception):
            store.remove(probe)
    return _ProbeResult(first, second, listed, content)


def _judge_probe(uri: str, why: str, result: _ProbeResult, kind: str, fix: str) -> None:
    """Refuse a location whose probe showed creates that cannot be told apart, or listings
    that miss what was just created (``kind``: "store", "filesystem")."""
    if not result.first:
        raise OptionError("journalPath", uri, f"{why}; a new probe was reported as existing, "
                          f"so creates cannot be told apart. {fix}")
    if result.second or result.content != b"probe 1":
        raise OptionError("journalPath", uri, f"{why}, and this {kind} accepted a second "
                          f"exclusive create of the same probe: two task attempts could both "
                          f"win a slot. {fix}")
    if not result.listed:
        raise OptionError("journalPath", uri, f"{why} and strongly consistent listings; a "
                          f"probe just created was missing from a listing. {fix}")


def _probe_object_store(uri: str, loc: _Location, opts: Mapping[str, str]) -> None:
    store = ObjectStore(uri, loc, opts, probe=True)
    why = f"the journal needs the store's atomic create-if-absent (conditional put) on {loc.kind}"
    try:
        result = _run_probe(store, loc.prefix)
    except (JournalError, OSError) as exc:
        raise OptionError("journalPath", uri, f"{why}, and probing it failed: {exc}. Check the "
                          "bucket, the credentials and the endpoint (journal.* options or the "
                          "store's standard environment variables)") from None
    _judge_probe(uri, why, result, "store", "Use a store that honours conditional writes "
                 "(If-None-Match) and lists what it just stored")


# -- the probe on filesystems -----------------------------------------------------------------

_USE_INSTEAD = ("Set journalPath to a directory that the driver and every executor can create "
                "files in: a local path (one machine), a shared mount, hdfs:// or an object "
                "store (s3://, gs://, abfss://)")
# errno -> the cause, with {failed} (the path an operation failed on), {existing} (the
# journal directory's nearest existing ancestor), {user} and {reason} (the system's words).
_FS_CAUSES: dict[int, str] = {
    errno.ENOTDIR: "{existing} is a file, not a directory, so the journal directory cannot "
                   "be created under it",
    errno.EEXIST: "{failed} exists and is not a directory (a regular file, or a symbolic link "
                  "to nothing)",
    errno.EACCES: "permission denied creating {failed}: {user} needs write access to "
                  "{existing}",
    errno.EPERM: "operation not permitted: {existing} does not let {user} create {failed}",
    errno.EROFS: "read-only file system: {existing} is on a filesystem mounted read-only",
    errno.ENOENT: "{existing} refuses to create {failed} ({reason}): it is on a virtual "
                  "filesystem like /proc, not one that stores files",
    errno.ENOSPC: "no space left on the filesystem of {existing}",
    errno.EDQUOT: "disk quota exceeded on the filesystem of {existing}",
}
# errno of link(2) on a filesystem without hard links (some FUSE, SMB and object-store mounts)
_NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)


def _user() -> str:
    """Who this process runs as, for a permission error."""
    if not hasattr(os, "getuid"):
        return "this process's user"
    uid = os.getuid()
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _missing_dirs(store: Store, root: str) -> list[str]:
    """``root`` and its ancestors that do not exist, innermost first."""
    missing: list[str] = []
    path = root.rstrip("/") or "/"
    while not store.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _filesystem_fix(exc: BaseException, store: Store, root: str) -> str:
    """The cause of ``exc`` (raised probing journal directory ``root``) and the fix."""
    code = getattr(exc, "errno", None)
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    failed = getattr(exc, "filename", None) or root
    if os.path.basename(str(failed)).startswith((".tmp-", ".probe-")):
        failed = f"a file in {os.path.dirname(str(failed))}"  # the probe's own file
    if code in _NO_LINK and getattr(exc, "filename2", None):
        cause = (f"this filesystem refuses hard links ({reason}), and the journal's exclusive "
                 "create is link(2) of a fully written temporary file")
    elif code in _FS_CAUSES:
        missing = _missing_dirs(store, root)
        existing = os.path.dirname(missing[-1]) if missing else root
        cause = _FS_CAUSES[code].format(failed=failed, existing=existing, user=_user(),
                                        reason=reason)
    else:
        cause = f"the journal directory is not usable: {reason} ({failed})"
    return f"{cause}. {_USE_INSTEAD}"


def _probe_filesystem(uri: str) -> None:
    """The journal's operations on a probe file in the journal directory (created as the
    journal would, then removed again if the probe created it)."""
    try:
        store, root = store_for(uri)
    except Exception as exc:  # noqa: BLE001 - e.g. no libhdfs, an unreachable name node
        raise OptionError("journalPath", uri, f"the filesystem could not be opened: "
                          f"{_first_line(exc)}. {_USE_INSTEAD}") from None
    why = "the journal needs an atomic create-if-absent (link(2), HDFS rename) in its directory"
    for attempt in range(3):
        created: list[str] = []  # by this probe, innermost first: removed again
        try:
            created = _missing_dirs(store, root)
            store.makedirs(root)
            result = _run_probe(store, root)
            break
        except FileNotFoundError as exc:
            # Also when another load() of this path removed the directory it had created
            # between our makedirs and our probe: try again.
            if attempt == 2:
                raise OptionError("journalPath", uri, _filesystem_fix(exc, store, root)) \
                    from None
        except (OSError, ValueError, JournalError) as exc:  # ValueError: a NUL in the path
            raise OptionError("journalPath", uri, _filesystem_fix(exc, store, root)) from None
        finally:
            for directory in created:
                store.rmdir(directory)
    _judge_probe(uri, why, result, "filesystem", _USE_INSTEAD)
