"""What every journal store provides: the :class:`Store` operations, built on an exclusive
create (see the package's docstring)."""

from __future__ import annotations

__all__ = ["Store", "first_line"]


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

    def list_after(self, path: str, start_after: str) -> list[str]:
        """Names of the files directly under ``path`` that sort after ``start_after``, in
        order; [] if there is none. One listing request (a page per 1,000 names) on object
        stores, which start it there (S3's ``start-after``)."""
        return sorted(n for n in self.listdir(path) if n > start_after)

    def remove_all(self, paths: list[str]) -> None:
        """Remove the files at ``paths`` (those already gone are skipped)."""
        for path in paths:
            self.remove(path)

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



def first_line(exc: BaseException) -> str:
    """``exc``'s message without obstore's "Debug source" tail (for an error shown to users)."""
    text = str(exc).strip() or type(exc).__name__
    return text.split("\n\nDebug source:")[0].strip()
