"""The checks of a ``journalPath`` made at ``load()``: its location, parsed once by the caller
(:class:`.location.JournalLocation`; :func:`check_journal_uri` parses and checks the store's
client is installed, without I/O), then one probe of that location with the journal's own
store operations (:func:`check_journal`).

Every error is an :class:`OptionError` naming ``journalPath`` (or ``journal.<key>``), the cause
and the fix; never an option value of ``journal.*``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark_kafka_share.errors import JournalError, OptionError
from pyspark_kafka_share.source.journal.index import LAYOUT, LAYOUT_FILE
from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.stores import ObjectStore, Store, store_for
from pyspark_kafka_share.source.journal.stores.base import first_line
from pyspark_kafka_share.source.journal.stores.objectstore import require_obstore, store_env

__all__ = ["check_journal", "check_journal_uri"]


def check_journal_uri(uri: str) -> JournalLocation:
    """``uri`` parsed into its location, refusing locations without an atomic exclusive
    create and object-store URLs whose optional dependencies are missing (no I/O)."""
    location = JournalLocation.parse(uri)
    if location.kind == "object":
        require_obstore(location)
    return location


_PROBED: set[tuple[Any, ...]] = set()


def check_journal(location: JournalLocation,
                  options: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
    """A probe of ``location`` (parsed once, by the caller) with the journal's own store
    operations: create one probe file or object twice with the exclusive create (the second
    must be refused), see it in a listing, read it back, delete it.

    On a filesystem (local, mounted, HDFS) the probe first creates the journal directory as
    the journal would, and removes again the directories it created: ``load()`` leaves the
    filesystem as it found it. On an object store it makes four requests, once per process and
    configuration (after checking, without I/O, that its client is installed). Raises
    :class:`OptionError` naming ``journalPath``, the cause (not a directory, permission denied,
    read-only filesystem, unreachable store, ...) and the fix; never an option value of
    ``journal.*``.
    """
    opts = dict(options.items() if isinstance(options, Mapping) else options)
    if location.kind != "object":
        if opts:
            key = next(iter(opts))
            raise OptionError(f"journal.{key}", None, "journal.* options configure object-store "
                              "journals (s3://, gs://, abfs://); this journalPath is a "
                              "filesystem path. Remove them")
        _probe_filesystem(location)
        return
    require_obstore(location)
    cache_key = (location, tuple(sorted(opts.items())), store_env())
    if cache_key in _PROBED:
        return
    _probe_object_store(location, opts)
    _PROBED.add(cache_key)


_SLOT_FILE = re.compile(r"[0-9]+/[0-9]+/[0-9]+")  # a slot under batches/


def _check_layout(uri: str, store: Store, root: str, names: frozenset[str]) -> None:
    """Refuse a journal written in another layout, from the names the probe listed at its top
    level (and a read of ``layout``, or a listing of ``batches/``, where needed).

    A journal of the layout before the index (``dedup/`` entries, slots without index
    entries) cannot be searched by this version's lookup, which would miss its records:
    ``OptionError`` naming the fix. The driver writes ``layout``; a journal without it but
    with ``index/`` was written by tasks of this version without a driver (tests), and one
    without slots or dedup entries holds nothing to miss."""
    top = root.rstrip("/")
    if LAYOUT_FILE in names:
        try:
            found = store.read(f"{top}/{LAYOUT_FILE}" if top else LAYOUT_FILE).strip()
        except FileNotFoundError:
            return
        if found == LAYOUT:
            return
        why = f"it was written in journal layout {found.decode(errors='replace')!r}"
    elif "dedup" in names or ("index" not in names and "batches" in names and any(
            _SLOT_FILE.fullmatch(rel)
            for rel in store.files_under(f"{top}/batches" if top else "batches"))):
        why = "it was written by an earlier development version (no index/, a dedup/ directory)"
    else:
        return
    raise OptionError("journalPath", uri,
                      f"{why}, which this version cannot search for duplicates (it expects "
                      f"layout {LAYOUT.decode()!r}). Start the query with a new checkpoint "
                      "and a new journalPath (an empty directory or prefix); the old batches "
                      "of that checkpoint cannot be replayed by this version")


@dataclass(frozen=True)
class _ProbeResult:
    first: bool     # the first exclusive create created the probe
    second: bool    # the second one did too (it must have been refused)
    listed: bool    # the probe was in a listing of its directory
    content: bytes  # what reading the probe returned
    names: frozenset[str]  # what the listing showed (the journal's top level)


def _run_probe(store: Store, directory: str) -> _ProbeResult:
    """Exclusive create twice, list, read, delete: the journal's operations on one probe."""
    name = f".probe-{uuid.uuid4().hex}"
    probe = f"{directory.rstrip('/')}/{name}" if directory else name
    try:
        # A first create reported as existing may be our own, applied by a try whose answer
        # was lost (a retry then meets it): the probe's name is new, so its bytes tell.
        first = store.create_exclusive(probe, b"probe 1", True) or _holds(store, probe,
                                                                         b"probe 1")
        second = store.create_exclusive(probe, b"probe 2", True)
        names = frozenset(store.listdir(directory))
        content = store.read(probe)
    finally:
        with contextlib.suppress(Exception):
            store.remove(probe)
    return _ProbeResult(first, second, name in names, content, names)


def _holds(store: Store, path: str, data: bytes) -> bool:
    """Whether ``path`` exists and holds ``data``."""
    try:
        return store.read(path) == data
    except FileNotFoundError:
        return False


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


def _probe_object_store(loc: JournalLocation, opts: Mapping[str, str]) -> None:
    store = ObjectStore(loc, opts, probe=True)
    why = f"the journal needs the store's atomic create-if-absent (conditional put) on {loc.store}"
    try:
        result = _run_probe(store, loc.path)
    except (JournalError, OSError) as exc:
        raise OptionError("journalPath", loc.uri, f"{why}, and probing it failed: {exc}. Check "
                          "the bucket, the credentials and the endpoint (journal.* options or "
                          "the store's standard environment variables)") from None
    _judge_probe(loc.uri, why, result, "store", "Use a store that honours conditional writes "
                 "(If-None-Match) and lists what it just stored")
    _check_layout(loc.uri, store, loc.path, result.names)


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


def _probe_filesystem(location: JournalLocation) -> None:
    """The journal's operations on a probe file in the journal directory (created as the
    journal would, then removed again if the probe created it)."""
    uri = location.uri
    try:
        store, root = store_for(location)
    except Exception as exc:  # noqa: BLE001 - e.g. no libhdfs, an unreachable name node
        raise OptionError("journalPath", uri, f"the filesystem could not be opened: "
                          f"{first_line(exc)}. {_USE_INSTEAD}") from None
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
    _check_layout(uri, store, root, result.names)
